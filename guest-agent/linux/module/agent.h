/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/* What the agent's main file (agent.c) shares with its uprobes (probes.c). */
#ifndef STAGEVM_AGENT_H
#define STAGEVM_AGENT_H

#include <linux/types.h>

#include "stagevm_ioctl.h"
#include "stagevm_layout.h"

/* The shared area as registered: its kernel address, layout (vCPUs, stages,
 * counters) and whether the host accepted it.
 */
struct stagevm_agent_area {
	void *base;
	struct stagevm_layout layout;
	u32 num_stages;
	bool registered;
};

/* STAGEVM_IOC_ATTACH_MAP, _DETACH_MAP, _PROBE_STATS (stagevm_ioctl.h for
 * the errors); called with the agent's lock held. Detach also runs before
 * every UNREGISTER and at unload.
 */
long stagevm_probes_attach(const struct stagevm_agent_area *area,
			   struct stagevm_ioc_attach_map __user *uarg);
long stagevm_probes_detach(void);
long stagevm_probes_stats(struct stagevm_ioc_probe_stats __user *uarg);
/* True while a stage map is attached (its uprobes count into the
 * registration's area); called with the agent's lock held.
 */
bool stagevm_probes_attached(void);

#endif
