/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/* stdbool.h for agent/core/core.{h,c} built inside the kernel module: the
 * kernel's own types (<linux/types.h> has uint*_t, bool, size_t). */
#ifndef SPK_SHIM_STDBOOL_H
#define SPK_SHIM_STDBOOL_H
#include <linux/types.h>
#include <linux/limits.h>
#ifndef UINT32_MAX
#define UINT32_MAX U32_MAX
#endif
#endif
