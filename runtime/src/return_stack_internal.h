/* The return trampolines' C interface inside the runtime (return_stack.c). */
#ifndef IPROBE_RT_RETURN_STACK_INTERNAL_H
#define IPROBE_RT_RETURN_STACK_INTERNAL_H

#include "return_stack.h"
#include "iprobe/runtime/rt.h"

#define IPROBE_RT_HIDDEN __attribute__((visibility("hidden")))

extern __thread struct iprobe_rt_thread_state iprobe_rt_thread
    __attribute__((tls_model("initial-exec"), visibility("hidden")));

IPROBE_RT_HIDDEN extern struct iprobe_rt_return iprobe_rt_return_pool[IPROBE_RT_RETURN_ENTRIES];
IPROBE_RT_HIDDEN extern const char iprobe_rt_return_sled[];

static inline uint64_t iprobe_rt_return_unit(const struct iprobe_rt_return* e) {
    return (uint64_t)(uintptr_t)iprobe_rt_return_sled +
           (uint64_t)(e - iprobe_rt_return_pool) * IPROBE_RT_RETURN_UNIT_SIZE;
}

/* Whether the return slot `slot` holds the trampoline of a held entry that
 * hooked it for `handler` and `arg` (a -finstrument-functions exit hook
 * asks whether its function's hooked return will record its exit). */
static inline int iprobe_rt_return_hooked(const uint64_t* slot, uint32_t handler, uint32_t arg) {
    const uint64_t at = *(const volatile uint64_t*)slot;
    const uint64_t sled = (uint64_t)(uintptr_t)iprobe_rt_return_sled;
    if (at < sled || (at - sled) % IPROBE_RT_RETURN_UNIT_SIZE != IPROBE_RT_RETURN_UNIT_TRAMPOLINE) return 0;
    const uint64_t index = (at - sled) / IPROBE_RT_RETURN_UNIT_SIZE;
    if (index >= IPROBE_RT_RETURN_ENTRIES) return 0;
    const struct iprobe_rt_return* e = &iprobe_rt_return_pool[index];
    return __atomic_load_n(&e->ret, __ATOMIC_RELAXED) != 0 && e->slot == (uint64_t)(uintptr_t)slot &&
           e->handler == handler && e->arg == arg;
}

/* A new run of free entries for this thread (return_stack.c); 0 when it has
 * no room at all. */
IPROBE_RT_HIDDEN int iprobe_rt_return_grow(void);

/* Not locked: atomic only against signal handlers of this thread. */
static inline int iprobe_rt_cas_local_ptr(struct iprobe_rt_return** p, struct iprobe_rt_return* expected,
                                          struct iprobe_rt_return* desired) {
    struct iprobe_rt_return* prev;
    __asm__ __volatile__("cmpxchgq %2, %1" : "=a"(prev), "+m"(*p) : "r"(desired), "0"(expected) : "memory", "cc");
    return prev == expected;
}

/* Prepares the hook of the return of the function whose return address is
 * at `slot` (a function-entry site's): the unit it must go on through
 * (ENTRY_SITE_GO_ON), or 0 when this thread has no room (deep recursion,
 * pool exhausted, thread exiting, nested in a slow path).  The unit's
 * `call *%r11` writes the slot: until then the function returns as it would
 * have.  Async-signal-safe; inline, its slow path is not. */
static inline uint64_t iprobe_rt_return_prepare(const uint64_t* slot, uint32_t handler, uint32_t arg,
                                                uint64_t cookie) {
    struct iprobe_rt_thread_state* t = &iprobe_rt_thread;
    struct iprobe_rt_return* e;
    for (;;) {
        e = *(struct iprobe_rt_return* volatile*)&t->next;
        if (__builtin_expect(e >= *(struct iprobe_rt_return* volatile*)&t->limit, 0)) {
            if (!iprobe_rt_return_grow()) return 0;
            continue;
        }
        if (iprobe_rt_cas_local_ptr(&t->next, e, e + 1)) break;
    }
    e->slot = (uint64_t)(uintptr_t)slot;
    e->handler = handler;
    e->arg = arg;
    e->cookie = cookie;
    __atomic_store_n(&e->ret, *slot, __ATOMIC_RELAXED);
    return iprobe_rt_return_unit(e);
}

/* The index of a callback for IPROBE_RT_RETURN_CALLBACK + index, or -1. */
IPROBE_RT_HIDDEN int iprobe_rt_return_register(iprobe_rt_return_callback callback);
IPROBE_RT_HIDDEN void iprobe_rt_return_callback_run(const struct iprobe_rt_return* e);

IPROBE_RT_HIDDEN void iprobe_rt_return_retire(void);
/* Makes sure iprobe_rt_return_retire() runs when this thread exits (rt.c). */
IPROBE_RT_HIDDEN void iprobe_rt_watch_thread(void);
IPROBE_RT_HIDDEN void iprobe_rt_return_after_fork(void);

#endif
