/* The condition hook of the values handler (rt.c): whether a call's event
 * is recorded.  One definition, runtime/src/values_match.c. */
#ifndef IPROBE_RT_VALUES_MATCH_H
#define IPROBE_RT_VALUES_MATCH_H

#include "iprobe/formats/rt_layout.h"

/* Called by the handler of a probe whose iprobe_rt_probe.values is not all
 * zero, at entry (after the argument registers are in `v`) and at exit
 * (return registers and duration in `v`), before anything is written to the
 * ring: 1 records the event, 0 leaves it out.  The call is counted in the
 * sums whatever it returns (`calls` stays exact).  `probe` is the global
 * probe index (the entry probe at entry, the exit probe at exit), `spec` its
 * spec as the handler read it (one load: stable for this event).
 * Runs in the target's thread at every event: no lock, no allocation, no
 * libc, async-signal-safe, and no vector register (the runtime is built
 * -mgeneral-regs-only; a string comparison reads memory through
 * iprobe_rt_copy_string()). */
__attribute__((visibility("hidden"))) int iprobe_rt_values_match(const struct iprobe_rt_control* cb, uint32_t probe,
                                                                 struct iprobe_rt_values_spec spec,
                                                                 const struct iprobe_rt_values* v);

/* Copies at most IPROBE_RT_STRING_BYTES of the C string at `s` into `out`
 * without ever faulting (process_vm_readv on this process: a dangling or
 * PROT_NONE pointer reads as unreadable), zeroing what follows its NUL.
 * Returns the bytes copied (0..64), IPROBE_RT_STRING_NULL for NULL, or
 * IPROBE_RT_STRING_UNREADABLE.  A system call: ~0.3 us. */
__attribute__((visibility("hidden"))) uint64_t iprobe_rt_copy_string(uint64_t s, char out[IPROBE_RT_STRING_BYTES]);

#endif
