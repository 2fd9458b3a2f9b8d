/*
 * The in-process runtime: finds the probe from the handler's return address,
 * adds the call to the calling thread's own aggregate slot in the region
 * (calls, times, latency histogram per function) and, for the trace handler,
 * appends a fixed-size record to the thread's ring, never blocking.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "iprobe/runtime/rt.h"
#include "iprobe/runtime/run_loads.h"
#include "condition_eval.h"
#include "raw_syscall.h"
#include "return_stack_internal.h"
#include "trace_fast.h"
#include "values_match.h"

#define EXPORT __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define BARRIER() __asm__ __volatile__("" ::: "memory")

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

EXPORT struct iprobe_rt_state iprobe_rt_state = {
    .magic = IPROBE_RT_STATE_MAGIC,
    .version = IPROBE_RT_VERSION,
    .region_fd = -1,
};

/* NULL until the attacher maps a region, and again in a forked child. */
static struct iprobe_rt_control* g_control;
static int g_forked_child;
static pthread_key_t g_thread_key;
static int g_thread_key_ok;

/* Not static: the trace handler's fast path (trace_fast.S) reads it too. */
__attribute__((visibility("hidden"))) __thread struct thread_producer t_producer __asm__("iprobe_rt_producer")
    __attribute__((tls_model("initial-exec")));
__attribute__((visibility("hidden"))) uint32_t iprobe_rt_trace_fast_clock;

/* Not locked: atomic only against signal handlers of the same thread,
 * which is all a per-thread ring needs. */
static inline uint64_t xadd_local(uint64_t* p, uint64_t v) {
    __asm__ __volatile__("xaddq %0, %1" : "+r"(v), "+m"(*p) : : "memory");
    return v;
}

/* One instruction, so a signal handler of the same thread never loses an
 * update; no lock prefix: only the owning thread writes its slot. */
static inline void add_local(uint64_t* p, uint64_t v) {
    __asm__ __volatile__("addq %1, %0" : "+m"(*p) : "r"(v) : "cc");
}

static inline int cas_local(uint64_t* p, uint64_t expected, uint64_t desired) {
    uint64_t prev;
    __asm__ __volatile__("cmpxchgq %2, %1" : "=a"(prev), "+m"(*p) : "r"(desired), "0"(expected) : "memory", "cc");
    return prev == expected;
}

static inline struct iprobe_rt_control* control(void) {
    return __atomic_load_n(&g_control, __ATOMIC_ACQUIRE);
}

/* The mapped region's fixed geometry, copied once at map time (before
 * g_control is published) so the hot path does not chase it through the
 * control block. */
static struct {
    const struct iprobe_rt_site* sites;
    uint64_t mask;
    uint32_t shift;
    uint32_t stat_capacity;
    uint32_t monotonic; /* no invariant TSC: timestamps are CLOCK_MONOTONIC ns */
    uint32_t probe_capacity;
    uint64_t stat_bytes; /* a thread's sums: stat_capacity records */
    const struct iprobe_cond_program* conditions;
    uint32_t condition_capacity;
} g_geometry;

static inline __attribute__((always_inline)) uint64_t timestamp(void) {
    if (LIKELY(!g_geometry.monotonic)) return __builtin_ia32_rdtsc();
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* vDSO; async-signal-safe */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline __attribute__((always_inline)) const struct iprobe_rt_site* find_site(uint64_t return_address) {
    const struct iprobe_rt_site* table = g_geometry.sites;
    uint64_t slot = (return_address * 0x9E3779B97F4A7C15ull) >> g_geometry.shift;
    for (;;) {
        const uint64_t key = __atomic_load_n(&table[slot].return_address, __ATOMIC_RELAXED);
        if (LIKELY(key == return_address)) return &table[slot];
        if (key == 0) return 0;
        slot = (slot + 1) & g_geometry.mask;
    }
}

static inline int32_t lookup_site(const struct iprobe_rt_control* cb, uint64_t return_address) {
    (void)cb;
    const struct iprobe_rt_site* site = find_site(return_address);
    return site ? (int32_t)site->probe : -1;
}

EXPORT int32_t iprobe_rt_probe_at(uintptr_t return_address) {
    const struct iprobe_rt_control* cb = control();
    return cb ? lookup_site(cb, return_address) : -1;
}

EXPORT const struct iprobe_rt_control* iprobe_rt_get_control(void) { return control(); }

EXPORT uint64_t iprobe_rt_function_of(uint32_t probe);

EXPORT uint64_t iprobe_rt_function_at(uintptr_t return_address) {
    const struct iprobe_rt_control* cb = control();
    const int32_t probe = cb ? lookup_site(cb, return_address) : -1;
    return probe < 0 ? 0 : iprobe_rt_function_of((uint32_t)probe);
}

static void count_unserved(void) {
    if (g_forked_child)
        __atomic_fetch_add(&iprobe_rt_state.fork_child_events, 1, __ATOMIC_RELAXED);
    else
        __atomic_fetch_add(&iprobe_rt_state.early_events, 1, __ATOMIC_RELAXED);
}

/* The control block, or 0 with the event counted as one nobody could serve. */
static inline __attribute__((always_inline)) struct iprobe_rt_control* served_control(void) {
    struct iprobe_rt_control* cb = control();
    if (UNLIKELY(!cb)) count_unserved();
    return cb;
}

static struct iprobe_rt_ring* ring_at(struct iprobe_rt_control* cb, uint32_t index) {
    return (struct iprobe_rt_ring*)((char*)cb + cb->rings_offset + (uint64_t)index * cb->ring_stride);
}

/* A retired ring is taken over even when no reader drained it: the new
 * thread appends after its records (each record names its thread), and
 * without a trace reader nobody would ever free it. */
static int try_take_ring(struct iprobe_rt_ring* ring) {
    uint32_t state = __atomic_load_n(&ring->state, __ATOMIC_ACQUIRE);
    if (state == IPROBE_RT_RING_OWNED) return 0;
    return __atomic_compare_exchange_n(&ring->state, &state, IPROBE_RT_RING_OWNED, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_RELAXED);
}

/* fn(a, b) with every vector register kept (return_trampolines.S): libc
 * may use them, and at a function-entry site they hold the function's
 * arguments. */
__attribute__((visibility("hidden"))) uint64_t iprobe_rt_vector_safe_call(uint64_t (*fn)(void*, void*), void* a,
                                                                          void* b);

/* Slow path, once per thread: a syscall or two is fine here. */
static int claim_ring_now(struct thread_producer* t, struct iprobe_rt_control* cb) {
    if (t->no_ring) return 0;
    for (uint32_t i = 0; i < cb->ring_count; i++) {
        struct iprobe_rt_ring* ring = ring_at(cb, i);
        if (!try_take_ring(ring)) continue;
        ring->tid = (uint32_t)iprobe_rt_raw_syscall6(SYS_gettid, 0, 0, 0, 0, 0, 0);
        ring->owner_pid = (uint32_t)iprobe_rt_raw_syscall6(SYS_getpid, 0, 0, 0, 0, 0, 0);
        t->tid = ring->tid;
        t->records = (struct iprobe_rt_record*)(ring + 1);
        t->mask = (uint64_t)cb->ring_records - 1;
        t->reserve = __atomic_load_n(&ring->head, __ATOMIC_ACQUIRE);
        t->tail_seen = __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE);
        if (g_thread_key_ok) pthread_setspecific(g_thread_key, t);
        BARRIER();
        t->ring = ring;
        return 1;
    }
    t->no_ring = 1;
    __atomic_fetch_add(&cb->no_ring_events, 1, __ATOMIC_RELAXED);
    return 0;
}

static struct iprobe_rt_thread* slot_at(struct iprobe_rt_control* cb, uint32_t index) {
    return (struct iprobe_rt_thread*)((char*)cb + cb->threads_offset + (uint64_t)index * cb->thread_stride);
}

/* Slow path, once per thread.  Any free or retired slot will do: a retired
 * one keeps summing from where its last thread left it. */
static struct iprobe_rt_fn_stats* claim_slot_now(struct thread_producer* t, struct iprobe_rt_control* cb) {
    if (t->no_slot) return 0;
    for (uint32_t i = 0; i < cb->thread_count; i++) {
        struct iprobe_rt_thread* slot = slot_at(cb, i);
        uint32_t state = __atomic_load_n(&slot->state, __ATOMIC_ACQUIRE);
        if (state == IPROBE_RT_RING_OWNED) continue;
        if (!__atomic_compare_exchange_n(&slot->state, &state, IPROBE_RT_RING_OWNED, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_RELAXED))
            continue;
        slot->tid = (uint32_t)iprobe_rt_raw_syscall6(SYS_gettid, 0, 0, 0, 0, 0, 0);
        slot->depth = 0;
        if (g_thread_key_ok) pthread_setspecific(g_thread_key, t);
        iprobe_rt_thread.stats = (struct iprobe_rt_fn_stats*)((char*)slot + cb->thread_header_size);
        BARRIER();
        t->slot = slot;
        return iprobe_rt_thread.stats;
    }
    t->no_slot = 1;
    __atomic_fetch_add(&cb->no_slot_events, 1, __ATOMIC_RELAXED);
    return 0;
}

/* A claim runs with the thread's signals held off: a handler probing in
 * this thread in between would find its sums or its ring half-claimed, and
 * its events would be left out of the one and kept in the other (a
 * handler's call in the trace with a duration the sums never had).  The
 * synchronous ones stay deliverable (blocked, a fault would kill), and so
 * do glibc's own two (cancellation, setxid), as pthread_sigmask keeps them.
 * System calls of its own, not libc's: libc may be probed (enter_claim). */
static uint64_t hold_signals(void) {
    uint64_t held = ~0ull, was = 0;
    static const int kept[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS, 32, 33};
    for (unsigned i = 0; i < sizeof kept / sizeof *kept; i++) held &= ~(1ull << (kept[i] - 1));
    iprobe_rt_raw_syscall6(SYS_rt_sigprocmask, SIG_BLOCK, (long)&held, (long)&was, sizeof held, 0, 0);
    return was;
}

static void release_signals(uint64_t was) {
    iprobe_rt_raw_syscall6(SYS_rt_sigprocmask, SIG_SETMASK, (long)&was, 0, sizeof was, 0, 0);
}

/* After the claim, signals back: the ring's pages are faulted in now
 * rather than one by one on the hot path (handlers may log into it
 * meanwhile: it is claimed); held for this long, signals sent meanwhile
 * would merge. */
static void populate_ring(struct thread_producer* t, struct iprobe_rt_control* cb) {
    if (t->ring) iprobe_rt_raw_syscall6(SYS_madvise, (long)t->ring, (long)cb->ring_stride, MADV_POPULATE_WRITE, 0, 0, 0);
}

static uint64_t claim_ring_call(void* t, void* cb) {
    const uint64_t was = hold_signals();
    const int claimed = claim_ring_now(t, cb);
    release_signals(was);
    if (claimed) populate_ring(t, cb);
    return (uint64_t)claimed;
}

static uint64_t claim_slot_call(void* t, void* cb) {
    const uint64_t was = hold_signals();
    struct iprobe_rt_fn_stats* stats = claim_slot_now(t, cb);
    release_signals(was);
    return (uint64_t)(uintptr_t)stats;
}

/* A thread's first traced event claims its sums, its ring and its first
 * return-stack chunk in one go, before it reads the clock: a signal that
 * arrived meanwhile is handled as the claim ends, its handler's calls
 * whole and before this event, in the ring as in time.  (Claimed lazily
 * instead, the event's time was read before the claim and its record
 * written after the handler's, a ring's population later.) */
static uint64_t claim_thread_call(void* tp, void* cbp) {
    struct thread_producer* t = tp;
    struct iprobe_rt_control* cb = cbp;
    const uint64_t was = hold_signals();
    if (!t->slot) claim_slot_now(t, cb);
    const int claimed = !t->ring && claim_ring_now(t, cb);
    if (iprobe_rt_thread.count == 0) iprobe_rt_return_grow();
    release_signals(was);
    if (claimed) populate_ring(t, cb);
    return 0;
}

/* The claims call libc (through iprobe_rt_vector_safe_call), and libc may
 * be probed itself (attach --module libc.so.6): a probe in pthread_sigmask
 * or madvise fires inside the claim, finds the thread unclaimed and would
 * claim again, without end.  So a claim is entered once a thread at a time;
 * an event that fires inside it (a probed libc function the claim calls,
 * or a synchronous signal's handler) is dropped and counted, as a thread
 * without a slot or ring drops its events.  Returns 0 when it may not. */
static int enter_claim(struct thread_producer* t, struct iprobe_rt_control* cb, int for_ring) {
    if (!t->in_claim) {
        t->in_claim = 1;
        BARRIER();
        return 1;
    }
    __atomic_fetch_add(&iprobe_rt_state.nested_drops, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(for_ring ? &cb->no_ring_events : &cb->no_slot_events, 1, __ATOMIC_RELAXED);
    return 0;
}

static void leave_claim(struct thread_producer* t) {
    BARRIER();
    t->in_claim = 0;
}

static __attribute__((noinline, cold)) int claim_ring(struct thread_producer* t, struct iprobe_rt_control* cb) {
    if (t->no_ring || !enter_claim(t, cb, 1)) return 0;
    const int claimed = (int)iprobe_rt_vector_safe_call(claim_ring_call, t, cb);
    leave_claim(t);
    return claimed;
}

static __attribute__((noinline, cold)) struct iprobe_rt_fn_stats* claim_slot(struct thread_producer* t,
                                                                             struct iprobe_rt_control* cb) {
    if (t->no_slot || !enter_claim(t, cb, 0)) return 0;
    struct iprobe_rt_fn_stats* stats =
        (struct iprobe_rt_fn_stats*)(uintptr_t)iprobe_rt_vector_safe_call(claim_slot_call, t, cb);
    leave_claim(t);
    return stats;
}

/* Inside a claim, the event's own claim_slot and ring_append count its drop. */
static __attribute__((noinline, cold)) void claim_thread(struct thread_producer* t, struct iprobe_rt_control* cb) {
    if (t->in_claim) return;
    t->in_claim = 1;
    BARRIER();
    iprobe_rt_vector_safe_call(claim_thread_call, t, cb);
    leave_claim(t);
}

/* Before a traced event reads the clock: the thread's claims, once. */
static inline __attribute__((always_inline)) void claim_first(struct iprobe_rt_control* cb) {
    struct thread_producer* t = &t_producer;
    if (UNLIKELY((!t->slot && !t->no_slot) || (!t->ring && !t->no_ring))) claim_thread(t, cb);
}

static uint64_t watch_thread_call(void* t, void* unused) {
    (void)unused;
    pthread_setspecific(g_thread_key, t);
    return 0;
}

/* A thread that hooks returns before it has a ring or a slot (a handler
 * library's hooks) must still give its chunks back when it exits. */
__attribute__((visibility("hidden"))) void iprobe_rt_watch_thread(void) {
    if (g_thread_key_ok) iprobe_rt_vector_safe_call(watch_thread_call, &t_producer, 0);
}

static void retire_thread(void* value) {
    (void)value;
    struct thread_producer* t = &t_producer;
    struct iprobe_rt_ring* ring = t->ring;
    struct iprobe_rt_thread* slot = t->slot;
    /* later TLS destructors may still hit probes: drop those */
    t->no_ring = 1;
    t->no_slot = 1;
    t->ring = 0;
    t->slot = 0;
    iprobe_rt_thread.stats = 0;
    BARRIER();
    iprobe_rt_return_retire();
    if (ring) __atomic_store_n(&ring->state, IPROBE_RT_RING_RETIRED, __ATOMIC_RELEASE);
    if (slot) __atomic_store_n(&slot->state, IPROBE_RT_RING_RETIRED, __ATOMIC_RELEASE);
}

/* The site a handler was entered from; 0 (and counted) when the runtime has
 * no control block yet or the call came from a site it does not know. */
static inline __attribute__((always_inline)) const struct iprobe_rt_site* site_for(uintptr_t return_address,
                                                                                   struct iprobe_rt_control** cb_out) {
    struct iprobe_rt_control* cb = served_control();
    if (UNLIKELY(!cb)) return 0;
    const struct iprobe_rt_site* site = find_site(return_address);
    if (UNLIKELY(!site)) __atomic_fetch_add(&cb->unknown_site_events, 1, __ATOMIC_RELAXED);
    *cb_out = cb;
    return site;
}

/* This thread's sums, claiming a slot on first use; 0 when it has none. */
static inline __attribute__((always_inline)) struct iprobe_rt_fn_stats* thread_stats(struct iprobe_rt_control* cb) {
    struct thread_producer* t = &t_producer;
    if (LIKELY(t->slot != 0)) return iprobe_rt_thread.stats;
    return claim_slot(t, cb);
}

static inline __attribute__((always_inline)) const struct iprobe_rt_probe* probe_of(struct iprobe_rt_control* cb,
                                                                                    int32_t probe) {
    return (const struct iprobe_rt_probe*)((const char*)cb + cb->probes_offset) + probe;
}


static inline uint32_t log2_bucket(uint64_t ticks) {
    const uint32_t b = ticks ? 63u - (uint32_t)__builtin_clzll(ticks) : 0;
    return b < IPROBE_RT_HIST_BUCKETS ? b : IPROBE_RT_HIST_BUCKETS - 1;
}

/* How an event meets the thread's frames.  An exit served by a return
 * trampoline knows whether its entry pushed a frame; an entry whose return
 * could not be hooked must not push one. */
enum frame_use {
    FRAME_MATCH = 0,    /* entry: push a frame when timed; exit: pop the matching one */
    FRAME_NONE = 1,     /* count the call or completion only */
    FRAME_EXIT_HOOK = 2 /* as FRAME_MATCH, the entry's frame popped by the exit's own hook (its
                         * return not hooked): an entry that finds its probe off raced a
                         * detach, which turned that hook off with it, so its exit is lost */
};

/* The return-address slot of the call whose frame is pushed or popped next
 * (0: unknown), set where its return is hooked (hook_return) or served
 * (iprobe_rt_return_at) and taken once by enter_timed or exit_timed.  A
 * signal handler landing in between takes its own and leaves 0: that one
 * frame is then matched by its function alone, as before tags. */
static __thread uint64_t t_frame_slot;

static inline __attribute__((always_inline)) uint64_t take_frame_slot(void) {
    const uint64_t slot = t_frame_slot;
    t_frame_slot = 0;
    return slot;
}

/* A frame stored below `slot` (deeper on the stack than the call at `slot`,
 * on the same stack: within 2 GiB) belongs to a call a longjmp or an
 * exception abandoned; 0 tags are never taken for such. */
static inline int abandoned_below(const struct iprobe_rt_frame* f, uint64_t slot) {
    return f->tag != 0 && (int32_t)(f->tag - (uint32_t)slot) < 0;
}

/* At the frame stack's cap: the frames at its top that lie below the call
 * entering now were abandoned (longjmp, exceptions caught in a function
 * that has not returned, as postgres's PG_TRY or a server's request loop
 * do); without this they piled up past the cap and no later call of the
 * thread was timed.  Returns the index for the new frame. */
static __attribute__((noinline, cold)) uint32_t drop_abandoned(struct iprobe_rt_thread* slot, uint32_t depth,
                                                               uint64_t at) {
    uint32_t top = IPROBE_RT_STACK_DEPTH;
    while (top > 0 && abandoned_below(&slot->stack[top - 1], at)) top--;
    if (top == IPROBE_RT_STACK_DEPTH) return depth; /* genuinely deep: untimed, as ever */
    *(volatile uint32_t*)&slot->depth = top + 1;
    return top;
}

/* Entry of a timed call: one more call, one frame pushed.  The frame index is
 * reserved in one instruction, so a signal handler probing in between nests
 * above it. */
static inline __attribute__((always_inline)) void enter_timed(struct iprobe_rt_control* cb, int32_t probe,
                                                              uint32_t stat, uint64_t now, enum frame_use use,
                                                              const uint64_t* frame_args) {
    struct iprobe_rt_fn_stats* stats = thread_stats(cb);
    if (UNLIKELY(!stats)) return;
    add_local(&stats[stat].calls, 1);
    /* no exit probe would pop a frame, or its exit reads no clock (--no-durations) */
    const struct iprobe_rt_probe* p = probe_of(cb, probe);
    if (UNLIKELY(use == FRAME_NONE || p->timed != IPROBE_RT_TIMED)) return;
    /* Entered through its site as a detach turned it off (the detacher left
     * it timed for this): no exit hook will pop a frame, and the detach's
     * stop did not see this call.  Counted where the detach counts those it
     * saw. */
    if (UNLIKELY(use == FRAME_EXIT_HOOK && !__atomic_load_n(&p->enabled, __ATOMIC_RELAXED))) {
        __atomic_fetch_add(&cb->exits_lost_at_detach, 1, __ATOMIC_RELAXED);
        return;
    }
    struct iprobe_rt_thread* slot = t_producer.slot;
    const uint64_t at = use == FRAME_MATCH ? take_frame_slot() : 0;
    uint32_t depth = 1;
    __asm__ __volatile__("xaddl %0, %1" : "+r"(depth), "+m"(slot->depth) : : "memory");
    if (UNLIKELY(depth >= IPROBE_RT_STACK_DEPTH) && at) depth = drop_abandoned(slot, depth, at);
    if (LIKELY(depth < IPROBE_RT_STACK_DEPTH)) {
        struct iprobe_rt_frame* f = &slot->stack[depth];
        f->stat = stat;
        f->tag = (uint32_t)at;
        f->start = now;
        f->children = 0;
        if (frame_args)
            for (int i = 0; i < IPROBE_COND_ARGS; i++) f->args[i] = frame_args[i];
    }
}

/* Exit of a call: completed, timed against its frame when the frame on top
 * is this function's (frames skipped by longjmp are dropped on the way).
 * With `held`, the call's duration and the arguments its entry kept in the
 * frame go there: 1 when they did, 0 when the call had no frame. */
static inline __attribute__((always_inline)) int exit_timed(struct iprobe_rt_control* cb, uint32_t stat,
                                                            uint64_t now, enum frame_use use,
                                                            struct iprobe_cond_values* held) {
    struct iprobe_rt_fn_stats* stats = thread_stats(cb);
    if (UNLIKELY(!stats)) return 0;
    struct iprobe_rt_fn_stats* s = &stats[stat];
    add_local(&s->completed, 1);
    if (use == FRAME_NONE) return 0;
    struct iprobe_rt_thread* slot = t_producer.slot;
    const uint64_t at = take_frame_slot();
    uint32_t depth = *(volatile uint32_t*)&slot->depth;
    uint32_t top = depth;
    /* Its own frame, found by its slot: the frames above it were abandoned
     * (longjmp, an exception) and go with it, however many. */
    uint32_t tagged = depth < IPROBE_RT_STACK_DEPTH ? depth : IPROBE_RT_STACK_DEPTH;
    while (at && tagged > 0 && slot->stack[tagged - 1].tag != (uint32_t)at) tagged--;
    if (at && tagged > 0 && slot->stack[tagged - 1].stat == stat) top = tagged;
    else
        while (top > 0 && top - 1 < IPROBE_RT_STACK_DEPTH && slot->stack[top - 1].stat != stat) top--;
    if (top == 0 || top - 1 >= IPROBE_RT_STACK_DEPTH) {
        if (depth > IPROBE_RT_STACK_DEPTH) {
            *(volatile uint32_t*)&slot->depth = depth - 1; /* an untimed deep frame */
        } else {
            add_local(&slot->unmatched_exits, 1);
        }
        return 0;
    }
    const struct iprobe_rt_frame* f = &slot->stack[top - 1];
    const uint64_t ticks = now > f->start ? now - f->start : 0;
    const uint64_t self = ticks > f->children ? ticks - f->children : 0;
    if (held) {
        held->duration = ticks;
        for (int i = 0; i < IPROBE_COND_ARGS; i++) held->args[i] = f->args[i];
    }
    if (top >= 2) add_local(&slot->stack[top - 2].children, ticks);
    *(volatile uint32_t*)&slot->depth = top - 1;
    /* A detach that stopped this thread between finding the frame and
     * popping it counted this call's exit lost and marked the frame: the
     * exit came after all. */
    if (UNLIKELY(*(volatile uint32_t*)&f->stat == IPROBE_RT_FRAME_ABANDONED))
        __atomic_fetch_sub(&cb->exits_lost_at_detach, 1, __ATOMIC_RELAXED);
    add_local(&s->timed, 1);
    add_local(&s->inclusive_ticks, ticks);
    add_local(&s->exclusive_ticks, self);
    add_local(&s->histogram[log2_bucket(ticks)], 1);
    if (ticks > s->max_ticks) s->max_ticks = ticks;
    return 1;
}

/* A call's event in this thread's sums.  `frame_args` (an entry) keep the
 * arguments in its frame; `held` (an exit) gets them back with the call's
 * duration: 1 when it did. */
static inline __attribute__((always_inline)) int aggregate(struct iprobe_rt_control* cb, int32_t probe,
                                                           uint32_t stat, uint8_t kind, uint64_t now,
                                                           enum frame_use use, const uint64_t* frame_args,
                                                           struct iprobe_cond_values* held) {
    if (UNLIKELY(stat >= g_geometry.stat_capacity)) return 0;
    if (kind == IPROBE_RT_REC_ENTRY) {
        enter_timed(cb, probe, stat, now, use, frame_args);
    } else if (kind == IPROBE_RT_REC_EXIT) {
        return exit_timed(cb, stat, now, use, held);
    } else {
        struct iprobe_rt_fn_stats* stats = thread_stats(cb);
        if (LIKELY(stats != 0)) add_local(&stats[stat].calls, 1);
    }
    return 0;
}

/* The count handler: calls (entries, points) and completed calls (exits),
 * untimed.  One hash probe gives the aggregate slot. */
static inline __attribute__((always_inline)) void count(uintptr_t return_address, uint8_t kind) {
    /* A thread that has its slot has seen the region mapped (slots are only
     * claimed then, and a forked child starts without one): skip g_control. */
    struct iprobe_rt_fn_stats* own = iprobe_rt_thread.stats;
    if (LIKELY(own != 0)) {
        const struct iprobe_rt_site* site = find_site(return_address);
        if (LIKELY(site != 0 && site->stat < g_geometry.stat_capacity)) {
            add_local(kind == IPROBE_RT_REC_EXIT ? &own[site->stat].completed : &own[site->stat].calls, 1);
            return;
        }
    }
    struct iprobe_rt_control* cb;
    const struct iprobe_rt_site* site = site_for(return_address, &cb);
    if (UNLIKELY(!site)) return;
    const uint32_t stat = site->stat;
    if (UNLIKELY(stat >= g_geometry.stat_capacity)) return;
    struct iprobe_rt_fn_stats* stats = thread_stats(cb);
    if (UNLIKELY(!stats)) return;
    add_local(kind == IPROBE_RT_REC_EXIT ? &stats[stat].completed : &stats[stat].calls, 1);
}

/* Sleeps on the futex at the ring's tail while its low 32 bits are still
 * `seen`, at most a millisecond (so the caller looks at the lossless flag
 * and its patience again).  A raw syscall: no libc, no errno, vector
 * registers untouched.  Shared (not private): the reader is another process. */
static void sleep_on_tail(struct iprobe_rt_ring* ring, uint32_t seen) {
    struct timespec ms = {0, 1000000};
    register long r10 __asm__("r10") = (long)&ms;
    register long r8 __asm__("r8") = 0;
    register long r9 __asm__("r9") = 0;
    long rc = SYS_futex;
    __asm__ __volatile__("syscall"
                         : "+a"(rc)
                         : "D"(&ring->tail), "S"((long)FUTEX_WAIT), "d"((long)seen), "r"(r10), "r"(r8), "r"(r9)
                         : "rcx", "r11", "memory");
}

/* A lossless trace: wait until the reader has freed room for the records
 * up to `end`, spinning a little, then asleep on the ring's tail (the
 * reader wakes the ring's waiters once it has drained it: one wake-up per
 * ring's worth of records, not per page).  0 when the trace is lossy, the
 * reader has stopped asking, or it left the ring full for
 * IPROBE_RT_LOSSLESS_WAIT_S (it died before clearing the flag: cleared
 * here, so no thread waits again). */
static __attribute__((noinline, cold)) int wait_for_room(struct iprobe_rt_control* cb, struct thread_producer* t,
                                                          uint64_t end) {
    const uint64_t start = timestamp(), patience = cb->tsc_hz * IPROBE_RT_LOSSLESS_WAIT_S;
    for (uint32_t spins = 0;; spins++) {
        if (!__atomic_load_n(&cb->lossless, __ATOMIC_ACQUIRE)) return 0;
        t->tail_seen = __atomic_load_n(&t->ring->tail, __ATOMIC_ACQUIRE);
        if (end - t->tail_seen <= t->mask + 1) return 1;
        if (spins < 256) {
            __builtin_ia32_pause();
            continue;
        }
        if (timestamp() - start > patience) {
            __atomic_store_n(&cb->lossless, 0, __ATOMIC_RELEASE);
            __atomic_fetch_add(&cb->lossless_timeouts, 1, __ATOMIC_RELAXED);
            return 0;
        }
        /* Announce, then look again (both sequentially consistent, as the
         * reader's tail store and its look at `waiters`): either it sees
         * us and wakes us, or we see its new tail, or the futex does. */
        __atomic_fetch_add(&t->ring->waiters, 1, __ATOMIC_SEQ_CST);
        const uint64_t tail = __atomic_load_n(&t->ring->tail, __ATOMIC_SEQ_CST);
        if (end - tail > t->mask + 1) sleep_on_tail(t->ring, (uint32_t)tail);
        __atomic_fetch_sub(&t->ring->waiters, 1, __ATOMIC_RELAXED);
    }
}

/* What a values event appends after its record (continuation records), and
 * the function's frame; `record` 0: counted in the sums, not recorded. */
struct payload {
    const uint64_t* words;
    uint32_t nwords;
    uint8_t record;
    uint64_t frame;
    uint32_t spec; /* IPROBE_RT_VALUES_PACK of the spec the words follow */
};

/* The places [index, index + need) are reserved but the ring looked full:
 * 1 when they fit after all (the reader freed room, or a lossless trace
 * waited for it), 0 when they were given back and counted as dropped. */
static __attribute__((noinline, cold)) int make_room(struct iprobe_rt_control* cb, struct thread_producer* t,
                                                      uint64_t index, uint64_t need, uint64_t lead) {
    t->tail_seen = __atomic_load_n(&t->ring->tail, __ATOMIC_ACQUIRE);
    /* Handlers nest LIFO: any nested reservation made after ours has
     * been rolled back already, unless the reader freed room meanwhile,
     * in which case our slots fit too. */
    if (index + need - t->tail_seen > t->mask + 1 &&
        (!__atomic_load_n(&cb->lossless, __ATOMIC_RELAXED) || !wait_for_room(cb, t, index + need)) &&
        cas_local(&t->reserve, index + need, index)) {
        __atomic_fetch_add(&t->ring->dropped, need - lead, __ATOMIC_RELAXED);
        add_local(&t->gap, 1);
        return 0;
    }
    return 1;
}

static void put_gap(struct thread_producer* t, uint64_t index, uint64_t now, uint64_t gap) {
    struct iprobe_rt_record* g = &t->records[index & t->mask];
    g->tsc = now;
    g->probe = 0;
    g->tid = t->tid;
    g->kind = IPROBE_RT_REC_GAP;
    g->nargs = 0;
    g->depth = (uint16_t)(t->depth - 1);
    g->values = 0;
    g->frame = gap;
}

/* The GAP record at `index`, the place found free; the event takes the
 * next: 0 when that one is dropped, else 1 + where to write it. */
static __attribute__((noinline, cold)) uint64_t gap_then_place(struct thread_producer* t, uint64_t index,
                                                                uint64_t now) {
    put_gap(t, index, now, __atomic_exchange_n(&t->gap, 0, __ATOMIC_RELAXED));
    const uint64_t next = xadd_local(&t->reserve, 1);
    if (next + 1 - t->tail_seen > t->mask + 1 && !make_room(control(), t, next, 1, 0)) return 0;
    return next + 1;
}

/* trace_fast.S's one record at `index` looked not to fit (the region is
 * mapped: it checked): 0 when it was dropped, else 1 + where to write it.
 * The first to fit after drops finds room at `index` for the GAP record
 * and takes the next place for itself: the fast path never looks for a gap,
 * since after a drop its thread's next reservation looks full again until
 * this has read the reader's tail. */
__attribute__((visibility("hidden"))) uint64_t iprobe_rt_trace_ring_full(uint64_t index, uint64_t now) {
    struct thread_producer* t = &t_producer;
    if (!make_room(control(), t, index, 1, 0)) return 0;
    if (LIKELY(*(volatile uint64_t*)&t->gap == 0)) return index + 1;
    return gap_then_place(t, index, now);
}

#define RING_PREFETCH FAST_RING_PREFETCH /* records: 4 KiB ahead (bench/hotpatch: 64 to 512 did as well) */

/* Appends one event (two with a point's args, more with values) to this
 * thread's ring.  A full ring drops it, counted, unless the trace is
 * lossless (wait_for_room). */
static inline __attribute__((always_inline)) void ring_append(struct iprobe_rt_control* cb, int32_t probe,
                                                              uint8_t kind, uint64_t now, const uint64_t* args,
                                                              const struct payload* values) {
    struct thread_producer* t = &t_producer;
    if (UNLIKELY(!t->ring)) {
        if (t->no_ring) {
            __atomic_fetch_add(&cb->no_ring_events, 1, __ATOMIC_RELAXED);
            return;
        }
        if (!claim_ring(t, cb)) return;  /* inside a claim: dropped, counted there */
    }
    const uint64_t extra = values ? (values->nwords + 3) / 4 : 0;
    const uint64_t need = args ? 2 : 1 + extra;
    /* An entry whose call's exit is not traced (its probe untimed: no exit
     * of its function on) opens no call in a reader: a point at the entry
     * probe, or with values marked so (rt_layout.h, IPROBE_RT_REC_POINT). */
    uint32_t no_exit = 0;
    if (kind == IPROBE_RT_REC_ENTRY && !probe_of(cb, probe)->timed) {
        if (values) no_exit = IPROBE_RT_VALUES_NO_EXIT;
        else kind = IPROBE_RT_REC_POINT;
    }
    t->depth++;
    BARRIER();
    /* Events dropped since this thread's last record: a GAP record first
     * (one place more, not counted as a drop itself).  Taken in one
     * instruction, so a signal handler writes it once; given back when this
     * event is dropped too. */
    uint64_t gap = 0;
    if (UNLIKELY(*(volatile uint64_t*)&t->gap != 0)) gap = __atomic_exchange_n(&t->gap, 0, __ATOMIC_RELAXED);
    const uint64_t lead = gap != 0;
    /* One instruction, so a signal handler probing in this thread sees the
     * reservation either whole or not at all. */
    const uint64_t first = xadd_local(&t->reserve, need + lead);
    if (UNLIKELY(first + need + lead - t->tail_seen > t->mask + 1) && !make_room(cb, t, first, need + lead, lead)) {
        if (gap) add_local(&t->gap, gap);
        goto out;
    }
    if (UNLIKELY(lead)) put_gap(t, first, now, gap);
    const uint64_t index = first + lead;
    struct iprobe_rt_record* record = &t->records[index & t->mask];
    /* The ring is written once through, a cache line per two records: ask
     * for the line RING_PREFETCH records ahead now, so its fetch is not
     * waited for when a later event writes it (a third of the ring's cost). */
    __builtin_prefetch(&t->records[(index + RING_PREFETCH) & t->mask], 1, 3);
    record->tsc = now;
    record->probe = (uint32_t)probe;
    record->tid = t->tid;
    record->kind = kind;
    record->nargs = args ? 4 : (uint8_t)extra;
    record->depth = (uint16_t)(t->depth - 1);
    record->frame = values ? values->frame : 0;
    record->values = values ? values->spec | no_exit : 0;
    if (args) {
        struct iprobe_rt_args_record* more = (struct iprobe_rt_args_record*)&t->records[(index + 1) & t->mask];
        for (int i = 0; i < 4; i++) more->args[i] = args[i];
    }
    if (values) {
        const uint64_t* from = values->words;
        uint32_t left = values->nwords;
        for (uint64_t r = 0; r < extra; r++, from += 4, left -= 4) {
            uint64_t* to = ((struct iprobe_rt_args_record*)&t->records[(index + 1 + r) & t->mask])->args;
            if (LIKELY(left >= 4)) {
                to[0] = from[0], to[1] = from[1], to[2] = from[2], to[3] = from[3];
            } else {
                to[0] = from[0];
                to[1] = left > 1 ? from[1] : 0;
                to[2] = left > 2 ? from[2] : 0;
                to[3] = 0;
                break;
            }
        }
    }
out:
    BARRIER();
    /* Only the outermost handler publishes, so a signal handler's records
     * never become visible before the interrupted one's.  A signal between
     * reading reserve and storing head may publish more and then see head
     * stepped back by our store: store again until reserve is unchanged
     * (the reader ignores a head below its tail meanwhile). */
    if (--t->depth == 0) {
        uint64_t published;
        do {
            published = *(volatile uint64_t*)&t->reserve;
            __atomic_store_n(&t->ring->head, published, __ATOMIC_RELEASE);
            BARRIER();
        } while (*(volatile uint64_t*)&t->reserve != published);
    }
}

static inline __attribute__((always_inline)) void emit_probe_at(struct iprobe_rt_control* cb, int32_t probe,
                                                                uint32_t stat, uint8_t kind, const uint64_t* args,
                                                                enum frame_use use, uint64_t now,
                                                                const struct payload* values) {
    aggregate(cb, probe, stat, kind, now, use, 0, 0);
    if (values && !values->record) return;
    ring_append(cb, probe, kind, now, args, values);
}

static inline __attribute__((always_inline)) void emit_probe(struct iprobe_rt_control* cb, int32_t probe, uint32_t stat,
                                                             uint8_t kind, const uint64_t* args, enum frame_use use) {
    claim_first(cb);
    /* An exit the attach asked not to stamp (--no-durations): completed,
     * recorded in its place, no clock read.  Not when its entry pushed a
     * frame (FRAME_MATCH: entered before an attach switched the mode), which
     * is timed and popped as it was meant to be, as trace_fast.S does. */
    const int unstamped = kind == IPROBE_RT_REC_EXIT && use == FRAME_NONE &&
                          UNLIKELY(probe_of(cb, probe)->timed == IPROBE_RT_EXIT_UNSTAMPED);
    emit_probe_at(cb, probe, stat, kind, args, use, unstamped ? IPROBE_RT_NO_TIME : timestamp(), 0);
}

static inline __attribute__((always_inline)) void emit(uintptr_t return_address, uint8_t kind, const uint64_t* args) {
    struct iprobe_rt_control* cb;
    const struct iprobe_rt_site* site = site_for(return_address, &cb);
    if (UNLIKELY(!site)) return;
    emit_probe(cb, (int32_t)site->probe, site->stat, kind, args, FRAME_EXIT_HOOK);
}

/* Per-site stubs (hotpatch/src/stubs.h) hand over the site's identity in
 * edi, so these need no hash lookup.  The count handler gets the byte offset
 * of the counter to bump in a thread's sums (slot * sizeof(struct
 * iprobe_rt_fn_stats) + offsetof calls or completed): entry and exit are one
 * handler, and its fast path is a TLS load, a bounds check and an add.  No
 * frame: a leaf whose slow path is a tail call. */
static __attribute__((noinline, cold)) void count_counter_slow(uint32_t offset) {
    struct iprobe_rt_control* cb = served_control();
    if (UNLIKELY(!cb)) return;
    const uint64_t bytes = (uint64_t)g_geometry.stat_capacity * sizeof(struct iprobe_rt_fn_stats);
    if (UNLIKELY(offset % 8 != 0 || offset >= bytes)) return;
    struct iprobe_rt_fn_stats* stats = thread_stats(cb);
    if (LIKELY(stats != 0)) add_local((uint64_t*)((char*)stats + offset), 1);
}

EXPORT __attribute__((optimize("omit-frame-pointer"))) void iprobe_rt_count_counter(uint32_t offset) {
    char* own = (char*)iprobe_rt_thread.stats;
    if (LIKELY(own != 0 && offset < g_geometry.stat_bytes)) {
        add_local((uint64_t*)(own + offset), 1);
        return;
    }
    count_counter_slow(offset);
}

static inline __attribute__((always_inline)) void emit_id(uint32_t probe, uint8_t kind, enum frame_use use) {
    struct iprobe_rt_control* cb = served_control();
    if (UNLIKELY(!cb)) return;
    if (UNLIKELY(probe >= g_geometry.probe_capacity)) return;
    emit_probe(cb, (int32_t)probe, probe_of(cb, (int32_t)probe)->stat, kind, 0, use);
}

EXPORT void iprobe_rt_trace_enter_id(uint32_t probe) { emit_id(probe, IPROBE_RT_REC_ENTRY, FRAME_EXIT_HOOK); }
EXPORT void iprobe_rt_trace_exit_id(uint32_t probe) { emit_id(probe, IPROBE_RT_REC_EXIT, FRAME_MATCH); }

/* ---- function-entry sites: exits through return trampolines ----
 * Called through ENTRY_SITE_CALL (save_call_restore.inc) with the site's id
 * (what its stub pushed), the function's saved registers and its
 * return-address slot; each returns the return trampoline unit the function
 * goes on through, or 0. */
static __attribute__((noinline, cold)) void count_unhooked(void) {
    struct iprobe_rt_control* cb = control();
    if (!cb) return;
    __atomic_fetch_add(&cb->unhooked_returns, 1, __ATOMIC_RELAXED);
    if (iprobe_rt_thread.pool_empty) __atomic_fetch_add(&cb->unhooked_pool_empty, 1, __ATOMIC_RELAXED);
}

static uint64_t hook_return(const uint64_t* slot, uint32_t handler, uint32_t arg, uint64_t cookie) {
    const uint64_t unit = iprobe_rt_return_prepare(slot, handler, arg, cookie);
    t_frame_slot = unit && handler == IPROBE_RT_RETURN_TRACE ? (uint64_t)(uintptr_t)slot : 0;
    if (LIKELY(unit)) return unit;
    count_unhooked();
    return 0;
}

/* `calls` of a function in this thread's sums (claimed on first use), or 0. */
static uint64_t* count_target(uint64_t calls) {
    struct iprobe_rt_control* cb = served_control();
    if (UNLIKELY(!cb)) return 0;
    if (UNLIKELY(calls % 8 != 0 || calls + 16 > g_geometry.stat_bytes)) return 0;
    char* stats = (char*)thread_stats(cb);
    return stats ? (uint64_t*)(stats + calls) : 0;
}

/* ---- values (arguments, return registers, backtraces) ----
 * A probe whose iprobe_rt_probe.values is not all zero goes through these:
 * its values are gathered in one struct iprobe_rt_values, handed to
 * iprobe_rt_values_match() (values_match.c), and appended to the record as
 * continuation records (rt_layout.h).  The return hook's cookie carries
 * what the exit needs: whether the entry pushed a timed frame, was recorded,
 * and when it ran. */
#define COOKIE_TIMED 1u /* the entry pushed a timed frame (its probe IPROBE_RT_TIMED) */
#define COOKIE_VALUES 2u  /* the entry went through values_enter: the bits below are set */
#define COOKIE_MATCHED 4u /* ... and was recorded (a --when decided at entry held) */
#define COOKIE_CONDITIONED 8u /* a --when decides what is recorded (without values) */
#define COOKIE_HELD 16u   /* its --when is decided at exit: the entry kept its arguments in its frame */
#define COOKIE_SHIFT 5    /* values: at this timestamp */
_Static_assert(COOKIE_TIMED == FAST_COOKIE_TIMED, "trace_fast.S hooks timed returns");

/* The return hook's cookie for a call of entry probe `p`: timed only when
 * its exit is on with a time (not IPROBE_RT_EXIT_UNSTAMPED, whose entry
 * pushes no frame). */
static inline uint64_t timed_cookie(const struct iprobe_rt_probe* p) {
    return p->timed == IPROBE_RT_TIMED ? COOKIE_TIMED : 0;
}

/* What the trace handler's assembler entry (return_trampolines.S,
 * iprobe_rt_trace_enter_return_nop) reads to reject a call a fast-form
 * --when does not hold for: set at map, before g_control is published. */
__attribute__((visibility("hidden"))) uint64_t iprobe_rt_when_probes;     /* the probe table */
__attribute__((visibility("hidden"))) uint64_t iprobe_rt_when_programs;   /* the conditions table */
__attribute__((visibility("hidden"))) uint32_t iprobe_rt_when_probe_capacity; /* 0: no region (none yet, a forked child) */
__attribute__((visibility("hidden"))) uint32_t iprobe_rt_when_capacity;   /* programs */
__attribute__((visibility("hidden"))) uint32_t iprobe_rt_when_stat_capacity;
/* The probe and sums offsets it reads: trace_fast.h, asserted there. */
_Static_assert(sizeof(struct iprobe_cond_program) == IPROBE_COND_PROGRAM_SIZE &&
                   offsetof(struct iprobe_cond_program, fast) == IPROBE_COND_FAST &&
                   offsetof(struct iprobe_cond_program, fast_arg) == IPROBE_COND_FAST_ARG &&
                   offsetof(struct iprobe_cond_program, fast_invert) == IPROBE_COND_FAST_INVERT &&
                   offsetof(struct iprobe_cond_program, fast_mask) == IPROBE_COND_FAST_MASK &&
                   offsetof(struct iprobe_cond_program, fast_signbit) == IPROBE_COND_FAST_SIGNBIT &&
                   offsetof(struct iprobe_cond_program, fast_bias) == IPROBE_COND_FAST_BIAS &&
                   offsetof(struct iprobe_cond_program, fast_low) == IPROBE_COND_FAST_LOW &&
                   offsetof(struct iprobe_cond_program, fast_span) == IPROBE_COND_FAST_SPAN,
               "return_trampolines.S reads programs");

/* A function's `--when` program (its entry probe's condition), 0 when none. */
static inline const struct iprobe_cond_program* condition_program(uint32_t condition) {
    return condition - 1 < g_geometry.condition_capacity ? &g_geometry.conditions[condition - 1] : 0;
}

_Static_assert(sizeof(struct iprobe_rt_values_spec) == 8, "one store, one load");
_Static_assert(offsetof(struct iprobe_rt_probe, values) % 8 == 0, "aligned");

static uint32_t g_pid; /* this process, for process_vm_readv on itself (set at map) */

static inline __attribute__((always_inline)) uint64_t spec_word(const struct iprobe_rt_probe* p) {
    return __atomic_load_n((const uint64_t*)&p->values, __ATOMIC_RELAXED);
}

static inline __attribute__((always_inline)) struct iprobe_rt_values_spec spec_of(uint64_t word) {
    struct iprobe_rt_values_spec spec;
    __builtin_memcpy(&spec, &word, sizeof spec);
    return spec;
}

/* The low 64 bits of xmm0-7.  The runtime's C code never touches a vector
 * register (-mgeneral-regs-only) and the entry points before it keep them:
 * here they still hold the function's arguments (at exit, xmm0/xmm1 its
 * return value: return_trampolines.S saves them around this C). */
#define READ_XMM(n, into) __asm__ __volatile__("movq %%xmm" #n ", %0" : "=r"(into))
static inline __attribute__((always_inline)) void read_xmm_args(uint64_t* x) {
    READ_XMM(0, x[0]);
    READ_XMM(1, x[1]);
    READ_XMM(2, x[2]);
    READ_XMM(3, x[3]);
    READ_XMM(4, x[4]);
    READ_XMM(5, x[5]);
    READ_XMM(6, x[6]);
    READ_XMM(7, x[7]);
}


/* process_vm_readv on ourselves rather than a fault guard: it cannot fault
 * whatever the pointer (unmapped, PROT_NONE, a guard page), installs no
 * signal handler in the target (whose own SIGSEGV handler stays in charge)
 * and is async-signal-safe; the price, a system call, is paid only by
 * char* arguments.  The remote range is split at the page boundary, since
 * the kernel never transfers part of one iovec: a string ending just before
 * an unmapped page is still read. */
uint64_t iprobe_rt_copy_string(uint64_t s, char out[IPROBE_RT_STRING_BYTES]) {
    for (int i = 0; i < IPROBE_RT_STRING_BYTES; i++) out[i] = 0;
    if (!s) return IPROBE_RT_STRING_NULL;
    struct iovec_raw {
        uint64_t base, len;
    } local = {(uint64_t)(uintptr_t)out, IPROBE_RT_STRING_BYTES}, remote[2];
    const uint64_t first = 4096 - (s & 4095);
    unsigned n = 1;
    remote[0].base = s;
    remote[0].len = first < IPROBE_RT_STRING_BYTES ? first : IPROBE_RT_STRING_BYTES;
    if (remote[0].len < IPROBE_RT_STRING_BYTES) {
        remote[1].base = s + remote[0].len;
        remote[1].len = IPROBE_RT_STRING_BYTES - remote[0].len;
        n = 2;
    }
    const long got = iprobe_rt_raw_syscall6(SYS_process_vm_readv, (long)g_pid, (long)(uintptr_t)&local, 1,
                                  (long)(uintptr_t)remote, (long)n, 0);
    if (got <= 0) return IPROBE_RT_STRING_UNREADABLE;
    int end = 0;
    while (end < got && out[end]) end++;
    for (int i = end; i < IPROBE_RT_STRING_BYTES; i++) out[i] = 0;
    return (uint64_t)got;
}

/* Return addresses of the callers, nearest first: the function's own
 * (exact: its return slot), then those its probed callers' hooked returns
 * keep in this thread's return entries (return_stack.h), by the stack
 * address of their slots.  No unwinding of unprobed frames: at -O2 there
 * are no frame pointers to follow and CFI is too costly at every call; a
 * slot is trusted only while it still holds its trampoline, read without
 * faulting (an entry of a frame an exception skipped, or of another stack). */
static uint32_t caller_chain(const uint64_t* slot, uint64_t* out, uint32_t max) {
    if (!max || !slot) return 0; /* a -finstrument-functions site without a return slot */
    uint32_t n = 0;
    out[n++] = iprobe_rt_real_return_address(*slot);
    const struct iprobe_rt_thread_state* t = &iprobe_rt_thread;
    uint64_t above = (uint64_t)(uintptr_t)slot;
    while (n < max) {
        /* the nearest slot above: at most one of the entries naming it is
         * live, the one whose trampoline it holds */
        uint64_t nearest = UINT64_MAX;
        for (unsigned c = 0; c < t->count && c < IPROBE_RT_RETURN_MAX_CHUNKS; c++) {
            const struct iprobe_rt_return* e = &iprobe_rt_return_pool[(uint32_t)t->chunks[c] * IPROBE_RT_RETURN_CHUNK];
            for (unsigned i = 0; i < IPROBE_RT_RETURN_CHUNK; i++, e++)
                if (e->ret && e->slot > above && e->slot < nearest) nearest = e->slot;
        }
        if (nearest == UINT64_MAX) break;
        above = nearest;
        uint64_t held = 0;
        struct {
            uint64_t base, len;
        } local = {(uint64_t)(uintptr_t)&held, 8}, remote = {nearest, 8};
        if (iprobe_rt_raw_syscall6(SYS_process_vm_readv, (long)g_pid, (long)(uintptr_t)&local, 1, (long)(uintptr_t)&remote, 1,
                         0) != 8)
            continue;
        for (unsigned c = 0; c < t->count && c < IPROBE_RT_RETURN_MAX_CHUNKS; c++) {
            const struct iprobe_rt_return* e = &iprobe_rt_return_pool[(uint32_t)t->chunks[c] * IPROBE_RT_RETURN_CHUNK];
            for (unsigned i = 0; i < IPROBE_RT_RETURN_CHUNK; i++, e++)
                if (e->ret && e->slot == nearest && held == iprobe_rt_return_unit(e) + IPROBE_RT_RETURN_UNIT_TRAMPOLINE &&
                    n < max)
                    out[n++] = iprobe_rt_real_return_address(e->ret);
        }
    }
    return n;
}

/* The words of an entry's continuation records (rt_layout.h), into `w`. */
static uint32_t entry_words(struct iprobe_rt_values_spec spec, const struct iprobe_rt_values* v, const uint64_t* slot,
                            uint64_t* w) {
    uint32_t n = 0;
    const uint32_t gprs = spec.gprs < IPROBE_RT_VALUES_GPRS ? spec.gprs : IPROBE_RT_VALUES_GPRS;
    const uint32_t xmms = spec.xmms < IPROBE_RT_VALUES_XMMS ? spec.xmms : IPROBE_RT_VALUES_XMMS;
    for (uint32_t i = 0; i < gprs; i++) w[n++] = v->gpr[i];
    for (uint32_t i = 0; i < xmms; i++) w[n++] = v->xmm[i];
    for (uint32_t i = 0; i < gprs; i++) {
        if (!(spec.strings & (1u << i))) continue;
        w[n] = iprobe_rt_copy_string(v->gpr[i], (char*)&w[n + 1]);
        n += 1 + IPROBE_RT_STRING_BYTES / 8;
    }
    if (spec.flags & IPROBE_RT_VALUES_BACKTRACE) {
        const uint32_t depth = spec.backtrace < IPROBE_RT_BACKTRACE_MAX ? spec.backtrace : IPROBE_RT_BACKTRACE_MAX;
        w[n] = caller_chain(slot, &w[n + 1], depth);
        n += 1 + (uint32_t)w[n];
    }
    return n;
}

/* In the frame of an inlined copy's call (its args[0], with args[1] its
 * entry probe): whether its entry was recorded, for iprobe_rt_copy_exit_id. */
#define COPY_VERDICT 0x1c0b7e4d1c7a0000ull

/* An entry whose probe captures values: `hook` says whether its return is
 * hooked too (both probes on), as how far ahead of `id` the exit probe is
 * (1 at function-entry sites); `xmm`, when not 0, the vector words in place
 * of the registers; returns the unit, as the trace handler does. */
static __attribute__((noinline)) uint64_t values_enter(struct iprobe_rt_control* cb, uint32_t id,
                                                       const struct iprobe_rt_probe* p, uint64_t word,
                                                       const uint64_t* saved, const uint64_t* slot, int hook,
                                                       const uint64_t* xmm) {
    struct iprobe_rt_values v;
    const struct iprobe_rt_values_spec spec = spec_of(word);
    if (xmm)
        for (int i = 0; i < IPROBE_RT_VALUES_XMMS; i++) v.xmm[i] = xmm[i];
    else if (spec.xmms)
        read_xmm_args(v.xmm); /* first: before anything that could call out */
    const uint64_t now = timestamp();
    v.kind = IPROBE_RT_REC_ENTRY;
    v.has_return = v.has_duration = 0;
    v.entry_matched = 1;
    /* saved: rdi, rsi, rdx, rcx, rax, r8, r9 (ENTRY_SITE_CALL) */
    v.gpr[0] = saved[0], v.gpr[1] = saved[1], v.gpr[2] = saved[2], v.gpr[3] = saved[3];
    v.gpr[4] = saved[5], v.gpr[5] = saved[6];
    const uint64_t timed = hook ? timed_cookie(p) : 0;
    /* A --when on retval or duration: decided at exit, the arguments kept in the frame. */
    const uint32_t condition = __atomic_load_n(&p->condition, __ATOMIC_RELAXED);
    const struct iprobe_cond_program* program = condition ? condition_program(condition) : 0;
    const int at_exit = program && (program->needs & IPROBE_COND_AT_EXIT);
    const int matched = at_exit ? 0 : iprobe_rt_values_match(cb, id, spec, &v);
    uint64_t unit = 0;
    if (hook)
        unit = hook_return(slot, IPROBE_RT_RETURN_TRACE, id + (uint32_t)hook, /* the exit probe: hook ahead */
                           (now << COOKIE_SHIFT) | COOKIE_VALUES | (matched ? COOKIE_MATCHED : 0) |
                               (at_exit && timed ? COOKIE_HELD : 0) | timed);
    uint64_t words[IPROBE_RT_VALUES_MAX_WORDS];
    struct payload out = {words, 0, (uint8_t)matched, (uint64_t)(uintptr_t)slot, IPROBE_RT_VALUES_PACK(spec)};
    if (matched && (spec.flags & (IPROBE_RT_VALUES_ARGS | IPROBE_RT_VALUES_BACKTRACE)))
        out.nwords = entry_words(spec, &v, slot, words);
    /* Not hooked, at a site whose exit hook (spec.distance ahead: an inlined
     * copy's) pops the frame; it keeps the entry's verdict for the exit. */
    const int popped_by_hook = !hook && (spec.flags & IPROBE_RT_VALUES_AT_SITE) && spec.distance;
    uint64_t verdict[IPROBE_COND_ARGS];
    if (popped_by_hook) {
        verdict[0] = COPY_VERDICT | (uint64_t)(matched != 0), verdict[1] = id;
        for (int i = 2; i < IPROBE_COND_ARGS; i++) verdict[i] = 0;
    }
    aggregate(cb, (int32_t)id, p->stat, IPROBE_RT_REC_ENTRY, now,
              (unit && timed) || popped_by_hook ? FRAME_MATCH : FRAME_NONE,
              at_exit ? v.gpr : popped_by_hook ? verdict : 0, 0);
    struct iprobe_rt_fn_stats* stats = iprobe_rt_thread.stats;
    if (condition && stats && p->stat < g_geometry.stat_capacity) {
        if (matched) add_local(&stats[p->stat].matched, 1);
        if (at_exit && !(unit && timed)) add_local(&stats[p->stat].undecided, 1); /* no frame to decide at exit */
    }
    if (matched) ring_append(cb, (int32_t)id, IPROBE_RT_REC_ENTRY, now, 0, &out);
    return unit;
}

/* The exit of a call whose --when is decided at exit (values_enter held its
 * entry): its arguments and duration from its frame; when the condition
 * holds, the entry's event (at its own time, with its values) and the
 * exit's are written together. */
static __attribute__((noinline)) void held_values_exit(struct iprobe_rt_control* cb, const struct iprobe_rt_return* e,
                                                       struct iprobe_rt_values_spec spec, struct iprobe_rt_values* v,
                                                       uint64_t now) {
    const uint32_t probe = e->arg;
    const uint32_t back = spec.distance ? spec.distance : 1; /* to the entry probe */
    if (UNLIKELY(probe < back)) return;
    const struct iprobe_rt_probe* entry = probe_of(cb, (int32_t)(probe - back));
    const uint32_t stat = probe_of(cb, (int32_t)probe)->stat;
    struct iprobe_cond_values held;
    const int have = aggregate(cb, (int32_t)probe, stat, IPROBE_RT_REC_EXIT, now, FRAME_MATCH, 0, &held);
    struct iprobe_rt_fn_stats* stats = iprobe_rt_thread.stats;
    if (UNLIKELY(!stats || stat >= g_geometry.stat_capacity)) return;
    if (!have) {
        add_local(&stats[stat].undecided, 1);
        return;
    }
    for (int i = 0; i < IPROBE_RT_VALUES_GPRS; i++) v->gpr[i] = held.args[i];
    v->has_args = 1;
    v->duration = held.duration;
    v->has_duration = 1;
    v->entry_matched = 1;
    if (!iprobe_rt_values_match(cb, probe, spec, v)) return;
    add_local(&stats[stat].matched, 1);
    /* The entry's values as it got them, but the vector registers (not kept: 0). */
    const struct iprobe_rt_values_spec entry_spec = spec_of(spec_word(entry));
    struct iprobe_rt_values at_entry = *v;
    at_entry.kind = IPROBE_RT_REC_ENTRY;
    for (int i = 0; i < IPROBE_RT_VALUES_XMMS; i++) at_entry.xmm[i] = 0;
    uint64_t words[IPROBE_RT_VALUES_MAX_WORDS];
    struct payload in = {words, 0, 1, e->slot, IPROBE_RT_VALUES_PACK(entry_spec)};
    if (entry_spec.flags & (IPROBE_RT_VALUES_ARGS | IPROBE_RT_VALUES_BACKTRACE))
        in.nwords = entry_words(entry_spec, &at_entry, (const uint64_t*)(uintptr_t)e->slot, words);
    ring_append(cb, (int32_t)(probe - back), IPROBE_RT_REC_ENTRY, now - held.duration, 0, &in);
    uint64_t ret_words[4] = {v->ret[0], v->ret[1], v->xret[0], v->xret[1]};
    const struct payload out = {ret_words, (spec.flags & IPROBE_RT_VALUES_RETVAL) ? 4u : 0u, 1, e->slot,
                                IPROBE_RT_VALUES_PACK(spec)};
    ring_append(cb, (int32_t)probe, IPROBE_RT_REC_EXIT, now, 0, &out);
}

/* An exit whose entry or exit probe captures values: regs = rax, rdx as the
 * function returned them. */
static __attribute__((noinline)) void values_exit(const struct iprobe_rt_return* e, const uint64_t* regs,
                                                  uint64_t word) {
    struct iprobe_rt_values v;
    uint64_t xret[2];
    READ_XMM(0, xret[0]);
    READ_XMM(1, xret[1]);
    struct iprobe_rt_control* cb = served_control();
    if (UNLIKELY(!cb)) return;
    const uint32_t probe = e->arg;
    if (UNLIKELY(probe >= g_geometry.probe_capacity)) return;
    const struct iprobe_rt_values_spec spec = spec_of(word);
    const uint64_t now = timestamp();
    v.kind = IPROBE_RT_REC_EXIT;
    v.has_args = 0; /* gpr is the entry's only where held_values_exit sets it */
    v.has_return = 1;
    v.ret[0] = regs[0], v.ret[1] = regs[1];
    v.xret[0] = xret[0], v.xret[1] = xret[1];
    v.has_duration = (e->cookie & COOKIE_VALUES) != 0;
    const uint64_t start = e->cookie >> COOKIE_SHIFT;
    v.duration = v.has_duration && now > start ? now - start : 0;
    v.entry_matched = !(e->cookie & COOKIE_VALUES) || (e->cookie & COOKIE_MATCHED);
    if (e->cookie & COOKIE_HELD) {
        held_values_exit(cb, e, spec, &v, now);
        return;
    }
    const int matched = iprobe_rt_values_match(cb, probe, spec, &v);
    uint64_t words[4] = {v.ret[0], v.ret[1], v.xret[0], v.xret[1]};
    struct payload out = {words, (spec.flags & IPROBE_RT_VALUES_RETVAL) ? 4u : 0u, (uint8_t)matched, e->slot,
                          IPROBE_RT_VALUES_PACK(spec)};
    emit_probe_at(cb, (int32_t)probe, probe_of(cb, (int32_t)probe)->stat, IPROBE_RT_REC_EXIT, 0,
                  (e->cookie & COOKIE_TIMED) ? FRAME_MATCH : FRAME_NONE, now, &out);
}

__attribute__((visibility("hidden"))) uint64_t iprobe_rt_count_counter_at(uint64_t id, const uint64_t* saved,
                                                                         const uint64_t* slot) {
    (void)saved, (void)slot;
    iprobe_rt_count_counter((uint32_t)id);
    return 0;
}

__attribute__((visibility("hidden"))) uint64_t iprobe_rt_count_enter_return_at(uint64_t id, const uint64_t* saved,
                                                                               const uint64_t* slot) {
    (void)saved;
    uint64_t* calls = count_target(id);
    if (!calls) return 0;
    add_local(calls, 1);
    return hook_return(slot, IPROBE_RT_RETURN_COUNT, (uint32_t)id + 8, 0);
}

__attribute__((visibility("hidden"))) uint64_t iprobe_rt_count_return_at(uint64_t id, const uint64_t* saved,
                                                                        const uint64_t* slot) {
    (void)saved;
    return count_target(id) ? hook_return(slot, IPROBE_RT_RETURN_COUNT, (uint32_t)id + 8, 0) : 0;
}

__attribute__((visibility("hidden"))) uint64_t iprobe_rt_trace_enter_id_at(uint64_t id, const uint64_t* saved,
                                                                          const uint64_t* slot) {
    struct iprobe_rt_control* cb = control();
    if (LIKELY(cb != 0) && LIKELY(id < g_geometry.probe_capacity)) {
        const struct iprobe_rt_probe* p = probe_of(cb, (int32_t)id);
        const uint64_t word = spec_word(p);
        if (UNLIKELY(word != 0)) return values_enter(cb, (uint32_t)id, p, word, saved, slot, 0, 0);
    }
    emit_id((uint32_t)id, IPROBE_RT_REC_ENTRY, FRAME_EXIT_HOOK);
    return 0;
}

__attribute__((visibility("hidden"))) uint64_t iprobe_rt_trace_return_at(uint64_t id, const uint64_t* saved,
                                                                        const uint64_t* slot) {
    (void)saved;
    if (UNLIKELY(!control())) {
        count_unserved();
        return 0;
    }
    if (UNLIKELY(id + 1 >= g_geometry.probe_capacity)) return 0;
    /* exit only: a values exit still gets its duration */
    const uint64_t cookie = spec_word(probe_of(control(), (int32_t)id + 1))
                                ? (timestamp() << COOKIE_SHIFT) | COOKIE_VALUES | COOKIE_MATCHED
                                : 0;
    return hook_return(slot, IPROBE_RT_RETURN_TRACE, (uint32_t)id + 1, cookie);
}

/* ---- `--when`: conditions on the trace handler at function-entry sites ----
 * Every call is counted and completed as without one (calls and completed
 * stay exact); only what is recorded is filtered.  A condition on the
 * arguments is decided at entry: a call it holds for is timed and its
 * events written, one it does not hold for costs what the count handler
 * does (its exit goes through the count handler's return), so the times
 * and the latency histogram are those of the matching calls.  One on retval
 * or duration is decided at exit: every call is timed (the duration is what
 * it reads), the entry's arguments are kept in the call's frame, and a
 * matching call's two events are written then (the entry's with its own
 * time). */


/* The six integer argument registers from ENTRY_SITE_CALL's saved ones
 * (rdi, rsi, rdx, rcx, rax, r8, r9, ...). */
static inline __attribute__((always_inline)) void entry_args(const uint64_t* saved, uint64_t* args) {
    args[0] = saved[0], args[1] = saved[1], args[2] = saved[2];
    args[3] = saved[3], args[4] = saved[5], args[5] = saved[6];
}

static __attribute__((noinline)) uint64_t conditioned_enter(struct iprobe_rt_control* cb, uint32_t id,
                                                            const struct iprobe_rt_probe* p, uint32_t condition,
                                                            const uint64_t* saved, const uint64_t* slot) {
    const struct iprobe_cond_program* program = condition_program(condition);
    const uint32_t stat = p->stat;
    if (UNLIKELY(stat >= g_geometry.stat_capacity)) return 0;
    struct iprobe_cond_values v;
    entry_args(saved, v.args);
    v.retval = 0;
    v.duration = 0;
    const uint64_t timed = timed_cookie(p);
    if (program && (program->needs & IPROBE_COND_AT_EXIT)) {
        const uint64_t unit =
            timed ? hook_return(slot, IPROBE_RT_RETURN_TRACE, id + 1,
                                COOKIE_TIMED | COOKIE_CONDITIONED | COOKIE_HELD)
                  : 0;
        const uint64_t now = timestamp();
        enter_timed(cb, (int32_t)id, stat, now, unit ? FRAME_MATCH : FRAME_NONE, v.args);
        struct iprobe_rt_fn_stats* stats = iprobe_rt_thread.stats;
        if (!unit && stats) add_local(&stats[stat].undecided, 1); /* its exit will not be seen */
        return unit;
    }
    if (!program || !iprobe_cond_holds(program, &v)) {
        /* Not recorded: counted, and completed through the count handler's
         * return (the cost of a count), not timed. */
        struct iprobe_rt_fn_stats* stats = thread_stats(cb);
        if (UNLIKELY(!stats)) return 0;
        add_local(&stats[stat].calls, 1);
        return hook_return(slot, IPROBE_RT_RETURN_COUNT,
                           stat * (uint32_t)sizeof(struct iprobe_rt_fn_stats) +
                               (uint32_t)__builtin_offsetof(struct iprobe_rt_fn_stats, completed),
                           0);
    }
    const uint64_t unit = hook_return(slot, IPROBE_RT_RETURN_TRACE, id + 1, timed | COOKIE_CONDITIONED | COOKIE_MATCHED);
    const uint64_t now = timestamp();
    enter_timed(cb, (int32_t)id, stat, now, unit && timed ? FRAME_MATCH : FRAME_NONE, 0);
    struct iprobe_rt_fn_stats* stats = iprobe_rt_thread.stats;
    if (stats) add_local(&stats[stat].matched, 1);
    ring_append(cb, (int32_t)id, IPROBE_RT_REC_ENTRY, now, 0, 0);
    return unit;
}

static __attribute__((noinline)) void conditioned_exit(const struct iprobe_rt_return* e, uint64_t retval) {
    struct iprobe_rt_control* cb = served_control();
    if (UNLIKELY(!cb)) return;
    const uint32_t probe = e->arg;
    if (UNLIKELY(probe >= g_geometry.probe_capacity || probe == 0)) return;
    const uint32_t stat = probe_of(cb, (int32_t)probe)->stat;
    if (UNLIKELY(stat >= g_geometry.stat_capacity)) return;
    const uint64_t now = timestamp();
    const uint64_t cookie = e->cookie;
    if (!(cookie & COOKIE_HELD)) {
        exit_timed(cb, stat, now, cookie & COOKIE_TIMED ? FRAME_MATCH : FRAME_NONE, 0);
        if (cookie & COOKIE_MATCHED) ring_append(cb, (int32_t)probe, IPROBE_RT_REC_EXIT, now, 0, 0);
        return;
    }
    struct iprobe_cond_values v;
    v.retval = retval;
    const int have = exit_timed(cb, stat, now, FRAME_MATCH, &v);
    struct iprobe_rt_fn_stats* stats = iprobe_rt_thread.stats;
    if (UNLIKELY(!stats)) return;
    if (!have) {
        add_local(&stats[stat].undecided, 1);
        return;
    }
    /* the function's condition now (an attach may have changed it since the entry) */
    const struct iprobe_cond_program* program = condition_program(probe_of(cb, (int32_t)probe - 1)->condition);
    if (!program || !iprobe_cond_holds(program, &v)) return;
    add_local(&stats[stat].matched, 1);
    ring_append(cb, (int32_t)probe - 1, IPROBE_RT_REC_ENTRY, now - v.duration, 0, 0);
    ring_append(cb, (int32_t)probe, IPROBE_RT_REC_EXIT, now, 0, 0);
}

/* The log2 histogram of an exit probe's integer return value, when the
 * attacher asked for it (iprobe_rt_probe.retval_hist). */
static inline uint32_t retval_bucket(uint64_t raw, uint8_t spec) {
    const uint8_t width = spec & 0x0f;
    int64_t v = (int64_t)raw;
    if (width == 1) v = spec & IPROBE_RT_RETVAL_SIGNED ? (int8_t)raw : (int64_t)(uint8_t)raw;
    else if (width == 2) v = spec & IPROBE_RT_RETVAL_SIGNED ? (int16_t)raw : (int64_t)(uint16_t)raw;
    else if (width == 4) v = spec & IPROBE_RT_RETVAL_SIGNED ? (int32_t)raw : (int64_t)(uint32_t)raw;
    if (v == 0) return IPROBE_RT_RETVAL_ZERO_BUCKET;
    if (v < 0 && (spec & IPROBE_RT_RETVAL_SIGNED)) {
        const uint32_t bits = 64u - (uint32_t)__builtin_clzll(0 - (uint64_t)v);
        return IPROBE_RT_RETVAL_ZERO_BUCKET - (bits < IPROBE_RT_RETVAL_ZERO_BUCKET ? bits : IPROBE_RT_RETVAL_ZERO_BUCKET);
    }
    const uint32_t bits = 64u - (uint32_t)__builtin_clzll((uint64_t)v);
    const uint32_t top = IPROBE_RT_RETVAL_BUCKETS - 1 - IPROBE_RT_RETVAL_ZERO_BUCKET;
    return IPROBE_RT_RETVAL_ZERO_BUCKET + (bits < top ? bits : top);
}

static inline void retval_sample(uint32_t probe, uint64_t retval) {
    struct iprobe_rt_control* cb = control();
    if (!cb || probe >= g_geometry.probe_capacity) return;
    const struct iprobe_rt_probe* p = probe_of(cb, (int32_t)probe);
    const uint8_t spec = p->retval_hist;
    if (LIKELY(spec == 0) || p->stat >= g_geometry.stat_capacity) return;
    struct iprobe_rt_fn_stats* stats = iprobe_rt_thread.stats;
    if (stats) add_local(&stats[p->stat].retval_histogram[retval_bucket(retval, spec)], 1);
}

/* What a -finstrument-functions site's stub slot holds after the stub's
 * code (rt_layout.h: an entry's recipe, a checked exit's), or 0. */
static const void* site_stub_recipe(const struct iprobe_rt_control* cb, const struct iprobe_rt_probe* p) {
    if (p->module >= cb->module_count) return 0;
    const struct iprobe_rt_module* m =
        (const struct iprobe_rt_module*)((const char*)cb + cb->modules_offset) + p->module;
    if (!m->site_stubs || p->id >= m->site_stub_slots) return 0;
    return (const void*)(uintptr_t)(m->site_stubs + (uint64_t)IPROBE_RT_SITE_STUB_SIZE * p->id +
                                    IPROBE_RT_SITE_RECIPE_OFFSET);
}

/* The -finstrument-functions flow's entry with values (site_values.c): the
 * site's recipe and the probe's spec word, or 0 when the probe captures
 * nothing there (a plain trace entry). */
__attribute__((visibility("hidden"))) const struct iprobe_rt_site_recipe* iprobe_rt_site_recipe(uint32_t id,
                                                                                              uint64_t* word) {
    struct iprobe_rt_control* cb = control();
    if (UNLIKELY(!cb) || id >= g_geometry.probe_capacity) return 0;
    const struct iprobe_rt_probe* p = probe_of(cb, (int32_t)id);
    *word = spec_word(p);
    if (!(spec_of(*word).flags & IPROBE_RT_VALUES_AT_SITE)) return 0;
    return (const struct iprobe_rt_site_recipe*)site_stub_recipe(cb, p);
}

/* A checked exit hook (site_values.S, rt_layout.h iprobe_rt_exit_recipe):
 * the exit is the trampoline's when this call's return slot, found from
 * the hook's recipe and rsp and rbp as at the site, holds the trampoline
 * of the function's hooked return; else (entered before values were on,
 * its hook failed) it is recorded here: the trace handler's exit, or
 * (count) the function's `completed`.  One lookup of the control block and
 * the probe for both. */
#define SITE_DWARF_RBP 6
#define SITE_DWARF_RSP 7
#define SITE_SLOT_REACH 4096 /* the slot is in the function's own frame, above the site's rsp */
__attribute__((visibility("hidden"))) void iprobe_rt_site_exit_at(uint32_t id, uint64_t rsp, uint64_t rbp, int count) {
    struct iprobe_rt_control* cb = served_control();
    if (UNLIKELY(!cb)) return;
    if (UNLIKELY(id >= g_geometry.probe_capacity)) return;
    const struct iprobe_rt_probe* p = probe_of(cb, (int32_t)id);
    const struct iprobe_rt_exit_recipe* r = (const struct iprobe_rt_exit_recipe*)site_stub_recipe(cb, p);
    if (LIKELY(r != 0) && IPROBE_RT_LOC_KIND(r->return_slot.kind) == IPROBE_RT_LOC_VALUE &&
        (r->return_slot.reg == SITE_DWARF_RSP || r->return_slot.reg == SITE_DWARF_RBP)) {
        const uint64_t slot =
            (r->return_slot.reg == SITE_DWARF_RSP ? rsp : rbp) + (uint64_t)(int64_t)r->return_slot.offset;
        if ((slot & 7) == 0 && slot >= rsp && slot - rsp <= SITE_SLOT_REACH &&
            iprobe_rt_return_hooked((const uint64_t*)(uintptr_t)slot, IPROBE_RT_RETURN_TRACE,
                                    id + (uint32_t)r->hooked_exit))
            return;
    }
    if (!count) {
        emit_probe(cb, (int32_t)id, p->stat, IPROBE_RT_REC_EXIT, 0, FRAME_MATCH);
        return;
    }
    const uint64_t completed =
        (uint64_t)p->stat * sizeof(struct iprobe_rt_fn_stats) + offsetof(struct iprobe_rt_fn_stats, completed);
    if (p->stat != IPROBE_RT_NO_STAT && completed < UINT32_MAX) iprobe_rt_count_counter((uint32_t)completed);
}

/* ... and, with the argument registers the recipe gathered (`saved` as
 * ENTRY_SITE_CALL lays them out) and the return slot it found, the values
 * path's entry; the function's return is hooked by writing the trampoline
 * into its slot (it is not at the stack pointer here, so no sled call). */
__attribute__((visibility("hidden"))) void iprobe_rt_site_values_enter_at(uint32_t id, uint64_t word,
                                                                          const uint64_t* saved, const uint64_t* xmm,
                                                                          uint64_t* slot) {
    struct iprobe_rt_control* cb = control();
    const struct iprobe_rt_values_spec spec = spec_of(word);
    /* hooked: how far ahead the exit probe it records is */
    const uint32_t hook = slot && (spec.flags & IPROBE_RT_VALUES_HOOK) ? (spec.distance ? spec.distance : 1u) : 0;
    if (UNLIKELY(!cb) || (uint64_t)id + hook >= g_geometry.probe_capacity) return;
    const struct iprobe_rt_probe* p = probe_of(cb, (int32_t)id);
    const uint64_t unit = values_enter(cb, id, p, word, saved, slot, (int)hook, xmm);
    t_frame_slot = 0; /* whatever path took it or not */
    if (!unit) return;
    const uint64_t real = *slot;
    *slot = unit + IPROBE_RT_RETURN_UNIT_TRAMPOLINE;
    __asm__ __volatile__("" ::: "memory");
    /* An attach without values stopped this thread before its hook was in
     * the pool, where the attacher looks for calls in flight, and gave the
     * function's exits back to its exit hooks: they record this call (its
     * entry stays in the pool, dead, until collected). */
    if (UNLIKELY(!(spec_of(spec_word(p)).flags & IPROBE_RT_VALUES_HOOK))) *slot = real;
}

/* The exit hook of an inlined copy whose entry has a --when (values_plan.h):
 * it does not return, so no trampoline carries the entry's verdict; the
 * frame its entry pushed (spec.distance back: values_enter) does, and the
 * exit is recorded as the entry was.  No such frame (an untimed or deeper
 * call, or an entry from before this attach): undecided, counted. */
EXPORT void iprobe_rt_copy_exit_id(uint32_t id) {
    struct iprobe_rt_control* cb = served_control();
    if (UNLIKELY(!cb)) return;
    if (UNLIKELY(id >= g_geometry.probe_capacity)) return;
    const struct iprobe_rt_probe* p = probe_of(cb, (int32_t)id);
    const struct iprobe_rt_values_spec spec = spec_of(spec_word(p));
    const uint32_t back = spec.distance ? spec.distance : 1;
    if (UNLIKELY(id < back || p->stat >= g_geometry.stat_capacity)) return;
    const uint64_t now = timestamp();
    struct iprobe_cond_values held;
    if (!aggregate(cb, (int32_t)id, p->stat, IPROBE_RT_REC_EXIT, now, FRAME_MATCH, 0, &held) ||
        (held.args[0] & ~1ull) != COPY_VERDICT || held.args[1] != id - back) {
        struct iprobe_rt_fn_stats* stats = iprobe_rt_thread.stats;
        if (stats) add_local(&stats[p->stat].undecided, 1);
        return;
    }
    if (held.args[0] & 1) ring_append(cb, (int32_t)id, IPROBE_RT_REC_EXIT, now, 0, 0);
}

/* The return is hooked first: an entry whose exit will not be seen is
 * counted but pushes no frame. */
__attribute__((visibility("hidden"))) uint64_t iprobe_rt_trace_enter_return_at(uint64_t id, const uint64_t* saved,
                                                                               const uint64_t* slot) {
    struct iprobe_rt_control* cb = served_control();
    if (UNLIKELY(!cb)) return 0;
    if (UNLIKELY(id + 1 >= g_geometry.probe_capacity)) return 0;
    claim_first(cb); /* before the return is hooked and the clock read */
    const struct iprobe_rt_probe* p = probe_of(cb, (int32_t)id);
    const uint64_t word = spec_word(p);
    if (UNLIKELY(word != 0)) {
        const uint64_t unit = values_enter(cb, (uint32_t)id, p, word, saved, slot, 1, 0);
        t_frame_slot = 0;
        return unit;
    }
    const uint32_t condition = __atomic_load_n(&p->condition, __ATOMIC_RELAXED);
    if (UNLIKELY(condition != 0)) {
        const uint64_t unit = conditioned_enter(cb, (uint32_t)id, p, condition, saved, slot);
        t_frame_slot = 0;
        return unit;
    }
    const uint64_t timed = timed_cookie(p);
    /* the return stack's fast path inline; hook_return counts a failure */
    uint64_t unit = iprobe_rt_return_prepare(slot, IPROBE_RT_RETURN_TRACE, (uint32_t)id + 1, timed);
    if (UNLIKELY(!unit)) count_unhooked();
    t_frame_slot = unit ? (uint64_t)(uintptr_t)slot : 0;
    emit_probe(cb, (int32_t)id, p->stat, IPROBE_RT_REC_ENTRY, 0, unit && timed ? FRAME_MATCH : FRAME_NONE);
    t_frame_slot = 0; /* whatever path took it or not */
    return unit;
}

/* values_match.c's --when: the program of the function of `entry_probe`
 * against the values the values path holds (condition.h). */
__attribute__((visibility("hidden"))) int iprobe_rt_condition_match(const struct iprobe_rt_control* cb,
                                                                    uint32_t entry_probe,
                                                                    const struct iprobe_rt_values* v) {
    const int otherwise = v->kind == IPROBE_RT_REC_EXIT ? v->entry_matched : 1;
    if (!cb || entry_probe >= g_geometry.probe_capacity) return otherwise;
    const uint32_t condition =
        __atomic_load_n(&probe_of((struct iprobe_rt_control*)cb, (int32_t)entry_probe)->condition, __ATOMIC_RELAXED);
    if (!condition) return otherwise;
    const struct iprobe_cond_program* program = condition_program(condition);
    if (!program) return 0;
    if (!(program->needs & IPROBE_COND_AT_EXIT)) {
        if (v->kind == IPROBE_RT_REC_EXIT) return v->entry_matched;
    } else if (v->kind != IPROBE_RT_REC_EXIT || !v->has_duration) {
        return 0;
    }
    /* Only the fields of the event's kind are set (struct iprobe_rt_values):
     * at exit the arguments are there only when the entry held them. */
    const int at_exit = v->kind == IPROBE_RT_REC_EXIT;
    if (at_exit && (program->needs & IPROBE_COND_NEEDS_ARGS) && !v->has_args) return 0;
    struct iprobe_cond_values values;
    for (int i = 0; i < IPROBE_COND_ARGS; i++) values.args[i] = !at_exit || v->has_args ? v->gpr[i] : 0;
    values.retval = at_exit ? v->ret[0] : 0;
    values.duration = at_exit ? v->duration : 0;
    return iprobe_cond_holds(program, &values);
}

/* A hooked return other than count's (which return_trampolines.S serves
 * itself): the return registers are saved by the caller. */
__attribute__((visibility("hidden"))) void iprobe_rt_return_at(const struct iprobe_rt_return* e, const uint64_t* regs) {
    if (e->handler == IPROBE_RT_RETURN_TRACE) {
        t_frame_slot = e->slot;
        /* the control block and the probe read once for the whole exit */
        struct iprobe_rt_control* cb = control();
        const uint32_t probe = e->arg;
        const struct iprobe_rt_probe* p = cb && probe < g_geometry.probe_capacity ? probe_of(cb, (int32_t)probe) : 0;
        const uint64_t word = p ? spec_word(p) : 0;
        const enum frame_use use = (e->cookie & COOKIE_TIMED) ? FRAME_MATCH : FRAME_NONE;
        if (UNLIKELY(word != 0 || (e->cookie & COOKIE_VALUES)))
            values_exit(e, regs, word);
        else if (UNLIKELY(e->cookie & COOKIE_CONDITIONED))
            conditioned_exit(e, regs[0]);
        else if (LIKELY(p != 0))
            emit_probe(cb, (int32_t)probe, p->stat, IPROBE_RT_REC_EXIT, 0, use);
        else
            emit_id(probe, IPROBE_RT_REC_EXIT, use); /* counts what it cannot serve */
        if (UNLIKELY(p != 0 && p->retval_hist != 0)) retval_sample(probe, regs[0]);
        t_frame_slot = 0; /* whatever path took it or not */
    } else {
        iprobe_rt_return_callback_run(e);
    }
}

EXPORT uint64_t iprobe_rt_hook_return(const uint64_t* slot, iprobe_rt_return_callback on_return, uint64_t cookie) {
    const int k = on_return ? iprobe_rt_return_register(on_return) : -1;
    if (k < 0) return 0;
    return hook_return(slot, IPROBE_RT_RETURN_CALLBACK + (uint32_t)k, 0, cookie);
}

EXPORT uint64_t iprobe_rt_function_of(uint32_t probe) {
    const struct iprobe_rt_control* cb = control();
    if (!cb || probe >= cb->probe_count) return 0;
    const struct iprobe_rt_probe* p = (const struct iprobe_rt_probe*)((const char*)cb + cb->probes_offset) + probe;
    if (!p->function || p->module >= cb->module_count) return 0;
    const struct iprobe_rt_module* m =
        (const struct iprobe_rt_module*)((const char*)cb + cb->modules_offset) + p->module;
    return m->load_bias + p->function;
}

#define RETURN_ADDRESS() ((uintptr_t)__builtin_extract_return_addr(__builtin_return_address(0)))

EXPORT void iprobe_rt_trace_enter(void* fn, void* call_site) {
    (void)fn, (void)call_site;
    emit(RETURN_ADDRESS(), IPROBE_RT_REC_ENTRY, 0);
}

EXPORT void iprobe_rt_trace_exit(void* fn, void* call_site) {
    (void)fn, (void)call_site;
    emit(RETURN_ADDRESS(), IPROBE_RT_REC_EXIT, 0);
}

EXPORT void iprobe_rt_trace_point(uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3) {
    const uint64_t args[4] = {a0, a1, a2, a3};
    emit(RETURN_ADDRESS(), IPROBE_RT_REC_POINT, args);
}

EXPORT void iprobe_rt_count_enter(void* fn, void* call_site) {
    (void)fn, (void)call_site;
    count(RETURN_ADDRESS(), IPROBE_RT_REC_ENTRY);
}

EXPORT void iprobe_rt_count_exit(void* fn, void* call_site) {
    (void)fn, (void)call_site;
    count(RETURN_ADDRESS(), IPROBE_RT_REC_EXIT);
}

EXPORT void iprobe_rt_count_point(uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3) {
    (void)a0, (void)a1, (void)a2, (void)a3;
    count(RETURN_ADDRESS(), IPROBE_RT_REC_POINT);
}

/* Called by the NOP-form trampolines (trampolines.S) with the site's return
 * address and, for points, the saved rdi, rsi, rdx, rcx. */
__attribute__((visibility("hidden"))) void iprobe_rt_trace_enter_at(uintptr_t ret) {
    emit(ret, IPROBE_RT_REC_ENTRY, 0);
}
__attribute__((visibility("hidden"))) void iprobe_rt_trace_exit_at(uintptr_t ret) {
    emit(ret, IPROBE_RT_REC_EXIT, 0);
}
__attribute__((visibility("hidden"))) void iprobe_rt_trace_point_at(uintptr_t ret, const uint64_t* args) {
    emit(ret, IPROBE_RT_REC_POINT, args);
}
__attribute__((visibility("hidden"))) void iprobe_rt_count_enter_at(uintptr_t ret) {
    count(ret, IPROBE_RT_REC_ENTRY);
}
__attribute__((visibility("hidden"))) void iprobe_rt_count_exit_at(uintptr_t ret) {
    count(ret, IPROBE_RT_REC_EXIT);
}
__attribute__((visibility("hidden"))) void iprobe_rt_count_point_at(uintptr_t ret) {
    count(ret, IPROBE_RT_REC_POINT);
}

#ifdef IPROBE_RT_HOOK_ALIASES
/* Static variant only: serve live -finstrument-functions hooks directly, the
 * compiled-in floor the benchmarks compare against. */
EXPORT void __cyg_profile_func_enter(void* fn, void* call_site) __attribute__((alias("iprobe_rt_count_enter")));
EXPORT void __cyg_profile_func_exit(void* fn, void* call_site) __attribute__((alias("iprobe_rt_count_exit")));
#endif

/* The region's descriptor between create and map (a retried attach may
 * create again: the unmapped one is closed then). */
static int g_pending_fd = -1;

EXPORT int iprobe_rt_create_region(uint64_t size) {
    if (control()) return -EALREADY;
    if (size < sizeof(struct iprobe_rt_control)) return -EINVAL;
    if (g_pending_fd >= 0) close(g_pending_fd);
    g_pending_fd = -1;
    char name[32] = IPROBE_RT_MEMFD_PREFIX;
    size_t at = sizeof IPROBE_RT_MEMFD_PREFIX - 1;
    char digits[12];
    size_t n = 0;
    for (unsigned pid = (unsigned)getpid(); n == 0 || pid; pid /= 10) digits[n++] = (char)('0' + pid % 10);
    while (n) name[at++] = digits[--n];
    name[at] = 0;
    const int fd = (int)syscall(SYS_memfd_create, name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -errno;
    if (ftruncate(fd, (off_t)size) != 0) {
        const int err = errno;
        close(fd);
        return -err;
    }
    g_pending_fd = fd;
    return fd;
}

EXPORT int iprobe_rt_map_region(int fd) {
    if (control()) return -EALREADY;
    if (fd < 0 || fd != g_pending_fd) return -EBADF;
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(struct iprobe_rt_control)) return -EINVAL;
    void* base = mmap(0, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (base == MAP_FAILED) return -errno;
    struct iprobe_rt_control* cb = base;
    if (memcmp(cb->magic, IPROBE_RT_MAGIC, 8) != 0 || cb->version != IPROBE_RT_VERSION ||
        cb->owner_pid != (uint32_t)getpid() || cb->region_size != (uint64_t)st.st_size) {
        munmap(base, (size_t)st.st_size);
        return -EINVAL;
    }
    g_pending_fd = -1;
    g_geometry.sites = (const struct iprobe_rt_site*)((const char*)cb + cb->hash_offset);
    g_geometry.mask = (1ull << cb->hash_bits) - 1;
    g_geometry.shift = 64 - cb->hash_bits;
    g_geometry.stat_capacity = cb->stat_capacity;
    g_geometry.probe_capacity = cb->probe_capacity;
    g_geometry.stat_bytes = (uint64_t)cb->stat_capacity * sizeof(struct iprobe_rt_fn_stats);
    g_geometry.monotonic = cb->clock == IPROBE_RT_CLOCK_MONOTONIC;
    g_geometry.conditions = (const struct iprobe_cond_program*)((const char*)cb + cb->conditions_offset);
    g_geometry.condition_capacity = cb->condition_capacity;
    /* The capacity last: the assembler reads it first (x86 keeps both orders). */
    iprobe_rt_when_probes = (uint64_t)((uintptr_t)cb + cb->probes_offset);
    iprobe_rt_when_programs = (uint64_t)(uintptr_t)g_geometry.conditions;
    iprobe_rt_when_capacity = cb->condition_capacity;
    iprobe_rt_when_stat_capacity = cb->stat_capacity;
    iprobe_rt_trace_fast_clock = !g_geometry.monotonic;
    __atomic_store_n(&iprobe_rt_when_probe_capacity, cb->probe_capacity, __ATOMIC_RELEASE);
    g_pid = (uint32_t)getpid();
    iprobe_rt_state.region_fd = fd;
    iprobe_rt_state.region_size = (uint64_t)st.st_size;
    iprobe_rt_state.mapped_pid = (uint32_t)getpid();
    iprobe_rt_state.control = (uint64_t)(uintptr_t)base;
    g_forked_child = 0;
    __atomic_store_n(&g_control, cb, __ATOMIC_RELEASE);
    return 0;
}

/* A child forked from a probed process runs its parent's patched code
 * without the parent's region: keep a private copy of the region's module
 * table (which lists, which bases) so that `iprobe status` and `detach` can
 * find those sites and put them back.  A grandchild inherits the copy as
 * it is.  Only system calls and copies: this runs in the child of fork. */
static void keep_inherited_modules(const struct iprobe_rt_control* cb) {
    uint32_t count = cb->module_count;
    if (count > cb->module_capacity) count = cb->module_capacity;
    if (count == 0 || cb->modules_offset >= iprobe_rt_state.region_size ||
        (uint64_t)count * sizeof(struct iprobe_rt_module) > iprobe_rt_state.region_size - cb->modules_offset)
        return;
    const size_t bytes = (size_t)count * sizeof(struct iprobe_rt_module);
    void* copy = mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (copy == MAP_FAILED) return;
    memcpy(copy, (const char*)cb + cb->modules_offset, bytes);
    if (iprobe_rt_state.inherited_modules)
        munmap((void*)(uintptr_t)iprobe_rt_state.inherited_modules,
               (size_t)iprobe_rt_state.inherited_module_count * sizeof(struct iprobe_rt_module));
    iprobe_rt_state.inherited_modules = (uint64_t)(uintptr_t)copy;
    iprobe_rt_state.inherited_module_count = count;
    iprobe_rt_state.forked_from = iprobe_rt_state.mapped_pid;
}

/* The child of fork() shares the parent's mapping: it must not write into
 * the parent's rings.  It drops (and counts) events until attached itself. */
static void after_fork_in_child(void) {
    struct iprobe_rt_control* cb = control();
    __atomic_store_n(&g_control, (struct iprobe_rt_control*)0, __ATOMIC_RELEASE);
    /* The trace handler's assembler entry stops reading the region too. */
    __atomic_store_n(&iprobe_rt_when_probe_capacity, 0u, __ATOMIC_RELEASE);
    memset(&t_producer, 0, sizeof t_producer);
    iprobe_rt_thread.stats = 0;
    /* Hooked returns of this thread's frames must still find their way back. */
    iprobe_rt_return_after_fork();
    if (cb) {
        g_forked_child = 1;
        keep_inherited_modules(cb);
        munmap(cb, (size_t)iprobe_rt_state.region_size);
    }
    iprobe_rt_state.control = 0;
    iprobe_rt_state.region_size = 0;
    iprobe_rt_state.mapped_pid = 0;
    /* The parent's region is not ours to keep reachable (it is CLOEXEC
     * only, not close-on-fork). */
    if (iprobe_rt_state.region_fd >= 0) close(iprobe_rt_state.region_fd);
    if (g_pending_fd >= 0) close(g_pending_fd);
    iprobe_rt_state.region_fd = -1;
    g_pending_fd = -1;
}

static char** g_environment; /* environ, or before libc has set it the constructor's envp (runtime_init) */

/* The environment's entry `name=...`, or 0.  Read and edited in place,
 * never through getenv/setenv/unsetenv: a program may define its own (bash
 * does, for its shell variables), which take our calls before its main has
 * set them up and do nothing; bash then passed LD_PRELOAD and the channel's
 * descriptor on to every command it ran, which found the descriptor closed
 * and exited 1 without running. */
static char** environment_entry(const char* name) {
    const size_t length = strlen(name);
    for (char** entry = g_environment; entry && *entry; entry++)
        if (strncmp(*entry, name, length) == 0 && (*entry)[length] == '=') return entry;
    return 0;
}

/* Takes `entry` out of the environment, the later ones moved down (as
 * libc's unsetenv does: main's envp is this same array). */
static void environment_remove(char** entry) {
    if (!entry) return;
    do entry[0] = entry[1];
    while (*entry++);
}

/* Puts `name` back as the user had it: `iprobe run` kept the user's value
 * as IPROBE_RUN_<name>=VALUE (empty: none), whose tail is <name>=VALUE.
 * Whether it was kept (`iprobe run` changed `name`). */
static int restore_kept(const char* kept_name, const char* name) {
    char** kept = environment_entry(kept_name);
    char** value = environment_entry(name);
    if (!kept) return 0;
    const char* tail = *kept + strlen(kept_name) - strlen(name);
    if (value && tail[strlen(name) + 1]) *value = (char*)tail;
    else environment_remove(value);
    environment_remove(environment_entry(kept_name));
    return 1;
}

/* Nothing pending: the audit module's copy of the hold channel `fd` (the
 * same socket, run_loads.h) is closed too; the module finds it gone. */
static void close_audit_copy(int fd) {
    struct stat channel, st;
    struct rlimit open_files;
    if (fstat(fd, &channel) != 0 || getrlimit(RLIMIT_NOFILE, &open_files) != 0) return;
    const int floor = iprobe_run_audit_fd_floor(open_files.rlim_cur);
    for (int copy = floor; copy < floor + IPROBE_RUN_AUDIT_FD_SPAN; copy++)
        if (copy != fd && fstat(copy, &st) == 0 && st.st_dev == channel.st_dev && st.st_ino == channel.st_ino) {
            close(copy);
            return;
        }
}

/* `iprobe run` (hotpatch/include/iprobe/hotpatch/run.h) started this
 * program with the runtime preloaded: say so, and wait before any of the
 * program's own code runs until the prober has enabled its probes.  Byte 0
 * goes on (IPROBE_RUN_LOADS_WATCH too: modules are pending, run_loads.h);
 * any other byte is the exit code of a failed attach, which the prober has
 * already explained.  The runtime leaves LD_PRELOAD (and LD_AUDIT) as it
 * found them, so the programs this one starts run as without iprobe. */
static void run_hold(void) {
    static const char kChannel[] = "IPROBE_RUN_FD";
    char** channel = environment_entry(kChannel);
    if (!channel) return;
    const int fd = atoi(*channel + sizeof kChannel);
    /* LD_PRELOAD is always iprobe's now (kept: the user's, maybe none). */
    if (!restore_kept("IPROBE_RUN_LD_PRELOAD", "LD_PRELOAD")) environment_remove(environment_entry("LD_PRELOAD"));
    const int audited = restore_kept(IPROBE_RUN_AUDIT_VARIABLE, "LD_AUDIT");
    environment_remove(environment_entry(kChannel));
    const unsigned char ready = 'r';
    unsigned char reply = 1;
    ssize_t n;
    do n = write(fd, &ready, 1);
    while (n < 0 && errno == EINTR);
    if (n == 1) {
        do n = read(fd, &reply, 1);
        while (n < 0 && errno == EINTR);
        if (n != 1) reply = 1;
    }
    if (reply == IPROBE_RUN_LOADS_WATCH) reply = 0; /* modules pending: the audit module keeps its copy */
    else if (audited) close_audit_copy(fd);
    close(fd);
    if (reply != 0) _exit(reply);
}

/* Linked with -z initfirst (runtime/CMakeLists.txt): preloaded by `iprobe
 * run`, this runs before the constructors of every library the program was
 * linked with, so the hold comes before any of their code and their
 * constructors' calls are counted.  libc's own constructor has not run yet
 * then: `environ` is still unset, and the environment is the one glibc
 * passes every constructor (the array libc adopts as `environ` after). */
__attribute__((constructor)) static void runtime_init(int argc, char** argv, char** envp) {
    (void)argc;
    (void)argv;
    g_environment = environ ? environ : envp;
    uintptr_t thread_pointer;
    __asm__("mov %%fs:0, %0" : "=r"(thread_pointer));
    iprobe_rt_state.stats_tpoff = (int64_t)((uintptr_t)&iprobe_rt_thread.stats - thread_pointer);
    g_thread_key_ok = pthread_key_create(&g_thread_key, retire_thread) == 0;
    pthread_atfork(0, 0, after_fork_in_child);
    run_hold();
}
