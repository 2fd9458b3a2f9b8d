/* The return trampolines' C interface inside the runtime (return_stack.c). */
#ifndef IPROBE_RT_RETURN_STACK_INTERNAL_H
#define IPROBE_RT_RETURN_STACK_INTERNAL_H

#include "return_stack.h"
#include "iprobe/runtime/rt.h"

#define IPROBE_RT_HIDDEN __attribute__((visibility("hidden")))

extern __thread struct iprobe_rt_thread_state iprobe_rt_thread
    __attribute__((tls_model("initial-exec"), visibility("hidden")));

/* Hooks the return of the function whose return address is at `slot`:
 * 1 when hooked, 0 when this thread has no room (deep recursion, pool
 * exhausted, thread exiting, nested in a slow path).  Async-signal-safe. */
IPROBE_RT_HIDDEN int iprobe_rt_return_push(uint64_t* slot, uint32_t handler, uint32_t arg, uint64_t cookie);

/* The index of a callback for IPROBE_RT_RETURN_CALLBACK + index, or -1. */
IPROBE_RT_HIDDEN int iprobe_rt_return_register(iprobe_rt_return_callback callback);
IPROBE_RT_HIDDEN void iprobe_rt_return_callback_run(const struct iprobe_rt_return* e);

IPROBE_RT_HIDDEN void iprobe_rt_return_retire(void);
IPROBE_RT_HIDDEN void iprobe_rt_return_after_fork(void);

#endif
