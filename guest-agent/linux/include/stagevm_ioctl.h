/* SPDX-License-Identifier: Apache-2.0 */
/*
 * /dev/stagevm user-space interface (the Linux guest agent module).
 *
 * mmap: the whole area, MAP_SHARED, offset 0, length `area_size` from
 * STAGEVM_IOC_INFO. The first STAGEVM_RO_BYTES (one page: header, stage
 * descriptors, stage map, vCPU states) may only be mapped read-only; the
 * rest (the per-vCPU rings) may be mapped read-write. libstage maps the two
 * parts separately at consecutive addresses.
 */
#ifndef STAGEVM_IOCTL_H
#define STAGEVM_IOCTL_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define STAGEVM_DEVICE_PATH "/dev/stagevm"
#define STAGEVM_IOC_MAGIC 0xb7

struct stagevm_ioc_info {
	__u64 area_size;    /* bytes to mmap */
	__u64 area_phys;    /* guest-physical address of the area */
	__u32 num_vcpus;    /* rings (= the VM's vCPUs = CPUs 0..num_vcpus-1) */
	__u32 ring_entries; /* entries per ring */
	__u32 num_stages;   /* registered stages (0 before REGISTER) */
	__u32 registered;   /* 1 while the host accepted the area */
	__u32 last_status;  /* status of the last doorbell (enum stagevm_status) */
	__u32 ro_bytes;     /* leading bytes that map read-only only */
};

struct stagevm_ioc_register {
	__u32 num_stages;   /* 1..STAGEVM_MAX_STAGES */
	__u32 status;       /* out: the host's status (enum stagevm_status) */
	char names[16][32]; /* stage names, NUL-padded (32 bytes need no NUL) */
};

struct stagevm_ioc_stats {
	__u64 registrations;     /* REGISTERs the host accepted */
	__u64 register_failures; /* refused REGISTERs (any status but OK) */
	__u64 unregistrations;
	__u64 attaches;          /* STAGEVM_IOC_ATTACH calls */
	__u64 detaches;
	__u64 mmaps;
	__s64 attached;          /* attaches - detaches */
	__u32 last_status;
	__u32 reserved;
};

/* One uprobe of a stage map on an unmodified binary (`stagectl attach`). */
struct stagevm_ioc_probe {
	__u64 offset; /* file offset of the probed instruction (a function entry) */
	__u32 stage;  /* stage id: < the registered stages */
	__u32 flags;  /* STAGEVM_PROBE_*; other bits 0 */
};

/* The probe is one of the map's `request` symbols (a function where the
 * thread waits for its client's next request): besides entering `stage`,
 * its outermost entry ends the thread's request (counted as a completion,
 * a timed one's latency recorded) and its return - a uretprobe - begins the
 * next one (guest-agent/linux/README.md, "Requests").
 */
#define STAGEVM_PROBE_REQUEST 1u

/* Most probes one map attaches. */
#define STAGEVM_MAX_PROBES 256

struct stagevm_ioc_attach_map {
	__s32 fd;         /* the binary (a regular file), open for reading */
	__u32 num_probes; /* 1..STAGEVM_MAX_PROBES */
	__u64 probes;     /* user address of num_probes struct stagevm_ioc_probe */
	__u64 reserved;   /* 0 */
};

struct stagevm_ioc_probe_stats {
	__u32 attached;          /* probes attached now (0: no map) */
	__u32 num_stages;        /* registered stages when the map was attached */
	__u64 hits[16];          /* probe hits per stage since the last ATTACH_MAP */
	__u64 counted;           /* hits written to the CPU's stage counters */
	__u64 not_counted;       /* hits with no counters (host minor < 2, no block) */
	__u64 migrations;        /* hits after which the thread ran on another vCPU */
	__u64 affinity_failures; /* set_cpus_allowed_ptr refusals */
	__u64 map_attaches;      /* ATTACH_MAPs that took */
	__u64 map_detaches;      /* DETACH_MAPs (and unregistrations) that removed one */
	__u64 threads_reset;     /* threads given all CPUs back at detach */
	__u64 threads_lost;      /* moved threads the module's table (1024) could not
				  * hold: they keep their last stage's vCPUs at detach
				  */
	/* Requests (the map's `request` symbols; ABI minor 4). */
	__u64 requests_begun;    /* begun at a request symbol's return */
	__u64 requests_ended;    /* ended at a request symbol's entry: completions
				  * counted in the CPU's counters
				  */
	__u64 requests_timed;    /* of which timed: latency recorded */
	__u64 requests_dropped;  /* request events of threads the table could not hold */
	__u64 threads_held;      /* threads in the module's table (each a struct pid
				  * reference): 0 whenever no map is attached, also
				  * after an attach that failed part-way
				  */
};

/* Area geometry and state. */
#define STAGEVM_IOC_INFO _IOR(STAGEVM_IOC_MAGIC, 1, struct stagevm_ioc_info)
/* Lays out the area with these stages and sends REGISTER through the
 * doorbell; -EBUSY if registered already, -EIO (with `status` set) if the
 * host refused, -ENODEV if there is no stage device.
 */
#define STAGEVM_IOC_REGISTER _IOWR(STAGEVM_IOC_MAGIC, 2, struct stagevm_ioc_register)
/* A thread starts / stops using the channel (counted; returns the CPU). */
#define STAGEVM_IOC_ATTACH _IO(STAGEVM_IOC_MAGIC, 3)
#define STAGEVM_IOC_DETACH _IO(STAGEVM_IOC_MAGIC, 4)
/* Counters. */
#define STAGEVM_IOC_STATS _IOR(STAGEVM_IOC_MAGIC, 5, struct stagevm_ioc_stats)
/* Sends UNREGISTER (the module also does on unload), detaching an attached
 * stage map first. -ENOENT when nothing is registered; -EBUSY while a stage
 * map is attached and the caller lacks CAP_SYS_ADMIN (detaching the map is
 * root's, as DETACH_MAP; with no map attached any user may unregister).
 */
#define STAGEVM_IOC_UNREGISTER _IO(STAGEVM_IOC_MAGIC, 6)

/* Attaches a stage map to a binary: a uprobe at each probe's offset whose
 * hit counts the stage on the current vCPU's counters and, when the
 * host's map gives the stage other vCPUs, moves the thread to them; a
 * STAGEVM_PROBE_REQUEST probe also ends and begins requests
 * (guest-agent/linux/README.md). All or nothing: when a probe is refused
 * (its error is returned), the ones before it are unregistered and the
 * threads they moved meanwhile get every CPU back. -ENOENT before REGISTER,
 * -EBUSY with a map attached, -EINVAL for a bad count, stage, flag or offset,
 * -EBADF for a bad fd, -EOPNOTSUPP without CONFIG_UPROBES, -EPERM without
 * CAP_SYS_ADMIN (the probes act on every process running the binary).
 */
#define STAGEVM_IOC_ATTACH_MAP _IOW(STAGEVM_IOC_MAGIC, 7, struct stagevm_ioc_attach_map)
/* Removes the attached map's uprobes and gives the probed threads every CPU
 * back; -ENOENT with no map attached, -EPERM without CAP_SYS_ADMIN.
 */
#define STAGEVM_IOC_DETACH_MAP _IO(STAGEVM_IOC_MAGIC, 8)
#define STAGEVM_IOC_PROBE_STATS _IOR(STAGEVM_IOC_MAGIC, 9, struct stagevm_ioc_probe_stats)

#endif /* STAGEVM_IOCTL_H */
