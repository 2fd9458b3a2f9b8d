/*
 * libiprobe-rt.so: the in-process side of iprobe.  Loaded into the target
 * (LD_PRELOAD, linked, or dlopen'ed by `iprobe attach`); enabled probe sites
 * reach its handlers through a jump stub near each module.
 *
 * Handler families (the attacher routes each site to one of them):
 *   call-form sites (coldpatched -finstrument-functions calls, C ABI; the
 *   compiler's argument set-up is still in front of the site):
 *     iprobe_rt_{trace,count}_{enter,exit}(void* fn, void* call_site)
 *     iprobe_rt_{trace,count}_point(a0, a1, a2, a3)
 *   NOP-form sites (LLVM pass / IPROBE_POINT_ARGS: a bare 5-byte NOP, nothing
 *   saved by the compiler) go through register-preserving trampolines:
 *     iprobe_rt_{trace,count}_{enter,exit,point}_nop
 * All find the probe from their return address; none locks, allocates or
 * makes a syscall except once per thread (claiming a ring).
 *
 * Other handler libraries (fperf) identify probes with iprobe_rt_probe_at().
 */
#ifndef IPROBE_RT_H
#define IPROBE_RT_H

#include <stdint.h>

#include "iprobe/formats/rt_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

#define IPROBE_RT_STATE_MAGIC "IPRBSTAT"

/* Read by the attacher through /proc/PID/mem (exported as `iprobe_rt_state`). */
struct iprobe_rt_state {
    char magic[8];
    uint32_t version;
    uint32_t mapped_pid;         /* pid that mapped `control`; differs in a forked child */
    uint64_t control;            /* address of the mapped region, 0 when none */
    uint64_t region_size;
    uint64_t early_events;       /* handler ran before any region was mapped */
    uint64_t fork_child_events;  /* events in a forked child (dropped, counted here) */
    uint64_t nested_drops;       /* re-entrant event while claiming a ring or slot (dropped) */
    int32_t region_fd;           /* the region's memfd in this process, -1 when none */
    uint32_t pad;
    /* %fs offset of the calling thread's pointer to its sums (initial-exec
     * TLS: the same in every thread), so count stubs can inline the count
     * handler's fast path (hotpatch/src/stubs.h); 0 when unknown. */
    int64_t stats_tpoff;
    /* In a child forked from a probed process: a private copy of the
     * parent's module table (struct iprobe_rt_module[count]), made at the
     * fork, whose code the child still runs patched; what `iprobe status`
     * and `detach` find its inherited sites by.  0 elsewhere. */
    uint64_t inherited_modules;
    uint32_t inherited_module_count;
    uint32_t forked_from;        /* the probed parent's pid (in the runtime's namespace), 0 if none */
};

extern struct iprobe_rt_state iprobe_rt_state;

/* Called by the attacher inside the stopped target, in this order:
 * iprobe_rt_create_region makes the region's memfd (`size` bytes, sparse)
 * and returns its descriptor or -errno; the attacher takes a copy of it
 * (pidfd_getfd), seals its size and fills the control block; then
 * iprobe_rt_map_region(fd) maps it and starts serving it (0 or -errno).
 * The descriptor stays open (iprobe_rt_state.region_fd) so that readers can
 * reach the region; nothing of it outlives the process. */
int iprobe_rt_create_region(uint64_t size);
int iprobe_rt_map_region(int fd);

/* Global probe index of the enabled site whose call returns to
 * `return_address`, or -1.  Lock-free; safe in signal handlers. */
int32_t iprobe_rt_probe_at(uintptr_t return_address);

/* The mapped control block, or 0 (not attached, or in a forked child). */
const struct iprobe_rt_control* iprobe_rt_get_control(void);

/* The run-time address of the function a site (by its return address)
 * belongs to, for handlers that key on functions (fperf's NOP-form entry
 * points); 0 when unknown.  Lock-free, async-signal-safe. */
uint64_t iprobe_rt_function_at(uintptr_t return_address);

/* Return hooks for handler libraries at function-entry sites (the entry and
 * LLVM flows), the mechanism the runtime's own exit probes use.  Called from
 * a handler an ENTRY_SITE_CALL entry point (save_call_restore.inc) serves,
 * with `slot` = the function's return-address slot it was given: prepares
 * the hook and returns the unit the handler must return to ENTRY_SITE_CALL
 * (0: not hooked, the thread is deeper than its return stack; counted in
 * the region's unhooked_returns).  The function's return then goes through
 * a trampoline that calls `on_return(cookie, slot)` with the function's
 * return registers saved, and goes on to the real caller.  on_return must
 * not use the x87 stack (a long double result is live in it).
 * Async-signal-safe, no allocation. */
typedef void (*iprobe_rt_return_callback)(uint64_t cookie, uintptr_t slot);
uint64_t iprobe_rt_hook_return(const uint64_t* slot, iprobe_rt_return_callback on_return, uint64_t cookie);

/* The run-time address of the function of a probe (its global index, what
 * a function-entry site's stub passes), 0 when unknown.  Lock-free. */
uint64_t iprobe_rt_function_of(uint32_t probe);

/* Whether `address` is one of the return trampolines, and the real return
 * address behind it (itself when it is none): for stack walkers that read
 * return addresses without the trampolines' CFI (frame pointers). */
int iprobe_rt_is_return_trampoline(uint64_t address);
uint64_t iprobe_rt_real_return_address(uint64_t address);

void iprobe_rt_trace_enter(void* fn, void* call_site);
void iprobe_rt_trace_exit(void* fn, void* call_site);
void iprobe_rt_trace_point(uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3);
void iprobe_rt_count_enter(void* fn, void* call_site);
void iprobe_rt_count_exit(void* fn, void* call_site);
void iprobe_rt_count_point(uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3);

/* Register-preserving entry points for NOP-form sites (not C-callable). */
void iprobe_rt_trace_enter_nop(void);
void iprobe_rt_trace_exit_nop(void);
void iprobe_rt_trace_point_nop(void);
void iprobe_rt_count_enter_nop(void);
void iprobe_rt_count_exit_nop(void);
void iprobe_rt_count_point_nop(void);

/* Function-entry sites (the entry and LLVM flows), reached by a jump from
 * the site's own stub, as ENTRY_SITE_CALL (save_call_restore.inc) says: the
 * site id pushed, r11 = the site's end.  The id is, for count, the byte
 * offset of the function's `calls` in a thread's sums; for trace, the entry
 * probe's global index (its exit probe is the next one).  One entry point
 * per combination of the function's entry and exit probes enabled; an exit
 * is served by a return trampoline.  Not C-callable. */
void iprobe_rt_count_counter_nop(void);        /* entry only (slow path of the inlined count) */
void iprobe_rt_count_return_nop(void);         /* exit only */
void iprobe_rt_count_enter_return_nop(void);   /* entry and exit */
void iprobe_rt_trace_enter_id_nop(void);
void iprobe_rt_trace_return_nop(void);
void iprobe_rt_trace_enter_return_nop(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* IPROBE_RT_H */
