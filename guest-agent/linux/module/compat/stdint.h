/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/* Kernel builds have no <stdint.h>: stagevm_abi.h's fixed-width types come
 * from <linux/types.h> (uint8_t .. uint64_t).
 */
#ifndef STAGEVM_COMPAT_STDINT_H
#define STAGEVM_COMPAT_STDINT_H
#include <linux/types.h>
#endif
