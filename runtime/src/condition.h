/* The runtime's evaluator of compiled `--when` conditions
 * (iprobe/formats/condition.h).  C11, no libc on its path but two raw
 * syscalls for string compares; async-signal-safe, no allocation. */
#ifndef IPROBE_RT_CONDITION_H
#define IPROBE_RT_CONDITION_H

#include "iprobe/formats/condition.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when `program` holds for `values`, 0 when not, and 0 for a malformed
 * program (an unknown opcode, an index out of range, a stack under- or
 * overflow): the target can write its region.  An empty program holds. */
int iprobe_cond_evaluate(const struct iprobe_cond_program* program, const struct iprobe_cond_values* values)
    __attribute__((visibility("hidden")));

/* Copies `size` bytes of this process's memory at `address` into `out`
 * without ever faulting (process_vm_readv on itself): the bytes copied,
 * fewer (or 0: NULL, a dangling pointer) when any of them is unreadable. */
uint64_t iprobe_cond_read_memory(void* out, uint64_t address, uint64_t size) __attribute__((visibility("hidden")));

/* The runtime's decision for the values path (rt.c): whether the --when of
 * the function whose entry probe is `entry_probe` holds for `v`; without a
 * condition, 1 for an entry and, for an exit, whether its entry was recorded. */
struct iprobe_rt_control;
struct iprobe_rt_values;
int iprobe_rt_condition_match(const struct iprobe_rt_control* cb, uint32_t entry_probe,
                              const struct iprobe_rt_values* v) __attribute__((visibility("hidden")));

#ifdef __cplusplus
}
#endif

#endif
