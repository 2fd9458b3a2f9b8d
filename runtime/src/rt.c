/*
 * The in-process runtime: finds the probe from the handler's return address,
 * appends a fixed-size record to the calling thread's ring in the shared
 * region (or bumps the probe's counter), never blocking.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "iprobe/rt.h"

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
};

/* NULL until the attacher maps a region, and again in a forked child. */
static struct iprobe_rt_control* g_control;
static int g_forked_child;
static pthread_key_t g_ring_key;
static char g_region_path[IPROBE_RT_PATH_MAX];
static int g_ring_key_ok;

/* Per-thread producer state; initial-exec so access is one %fs-relative load. */
struct thread_producer {
    struct iprobe_rt_ring* ring;
    struct iprobe_rt_record* records;
    uint64_t mask;
    uint64_t reserve;     /* next index to hand out (>= ring->head) */
    uint64_t tail_seen;   /* last tail read from the reader */
    uint32_t tid;
    uint32_t depth;       /* handlers active in this thread (signal nesting) */
    uint8_t claiming;
    uint8_t no_ring;      /* claim failed or thread exiting: drop, counted */
};

static __thread struct thread_producer t_producer __attribute__((tls_model("initial-exec")));

/* Not locked: atomic only against signal handlers of the same thread,
 * which is all a per-thread ring needs. */
static inline uint64_t xadd_local(uint64_t* p, uint64_t v) {
    __asm__ __volatile__("xaddq %0, %1" : "+r"(v), "+m"(*p) : : "memory");
    return v;
}

static inline int cas_local(uint64_t* p, uint64_t expected, uint64_t desired) {
    uint64_t prev;
    __asm__ __volatile__("cmpxchgq %2, %1" : "=a"(prev), "+m"(*p) : "r"(desired), "0"(expected) : "memory", "cc");
    return prev == expected;
}

static inline struct iprobe_rt_control* control(void) {
    return __atomic_load_n(&g_control, __ATOMIC_ACQUIRE);
}

static inline int32_t lookup_site(const struct iprobe_rt_control* cb, uint64_t return_address) {
    const struct iprobe_rt_site* table =
        (const struct iprobe_rt_site*)((const char*)cb + __atomic_load_n(&cb->hash_offset, __ATOMIC_ACQUIRE));
    const uint32_t bits = cb->hash_bits;
    const uint64_t mask = (1ull << bits) - 1;
    uint64_t slot = (return_address * 0x9E3779B97F4A7C15ull) >> (64 - bits);
    for (;;) {
        const uint64_t key = __atomic_load_n(&table[slot].return_address, __ATOMIC_RELAXED);
        if (key == return_address) return (int32_t)table[slot].probe;
        if (key == 0) return -1;
        slot = (slot + 1) & mask;
    }
}

EXPORT int32_t iprobe_rt_probe_at(uintptr_t return_address) {
    const struct iprobe_rt_control* cb = control();
    return cb ? lookup_site(cb, return_address) : -1;
}

EXPORT const struct iprobe_rt_control* iprobe_rt_get_control(void) { return control(); }

EXPORT uint64_t iprobe_rt_function_at(uintptr_t return_address) {
    const struct iprobe_rt_control* cb = control();
    const int32_t probe = cb ? lookup_site(cb, return_address) : -1;
    if (probe < 0 || (uint32_t)probe >= cb->probe_count) return 0;
    const struct iprobe_rt_probe* p =
        (const struct iprobe_rt_probe*)((const char*)cb + cb->probes_offset) + probe;
    if (!p->function || p->module >= cb->module_count) return 0;
    const struct iprobe_rt_module* m =
        (const struct iprobe_rt_module*)((const char*)cb + cb->modules_offset) + p->module;
    return m->load_bias + p->function;
}

static void count_unserved(void) {
    if (g_forked_child)
        __atomic_fetch_add(&iprobe_rt_state.fork_child_events, 1, __ATOMIC_RELAXED);
    else
        __atomic_fetch_add(&iprobe_rt_state.early_events, 1, __ATOMIC_RELAXED);
}

static struct iprobe_rt_ring* ring_at(struct iprobe_rt_control* cb, uint32_t index) {
    return (struct iprobe_rt_ring*)((char*)cb + cb->rings_offset + (uint64_t)index * cb->ring_stride);
}

static int try_take_ring(struct iprobe_rt_ring* ring) {
    uint32_t state = __atomic_load_n(&ring->state, __ATOMIC_ACQUIRE);
    if (state == IPROBE_RT_RING_RETIRED) {
        /* reusable only once the reader has drained it */
        if (__atomic_load_n(&ring->head, __ATOMIC_ACQUIRE) != __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE))
            return 0;
    } else if (state != IPROBE_RT_RING_FREE) {
        return 0;
    }
    return __atomic_compare_exchange_n(&ring->state, &state, IPROBE_RT_RING_OWNED, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_RELAXED);
}

/* Slow path, once per thread: a syscall or two is fine here. */
static int claim_ring(struct thread_producer* t, struct iprobe_rt_control* cb) {
    if (t->claiming || t->no_ring) return 0;
    t->claiming = 1;
    BARRIER();
    for (uint32_t i = 0; i < cb->ring_count; i++) {
        struct iprobe_rt_ring* ring = ring_at(cb, i);
        if (!try_take_ring(ring)) continue;
        ring->tid = (uint32_t)syscall(SYS_gettid);
        ring->owner_pid = (uint32_t)getpid();
        t->tid = ring->tid;
        t->records = (struct iprobe_rt_record*)(ring + 1);
        t->mask = (uint64_t)cb->ring_records - 1;
        t->reserve = __atomic_load_n(&ring->head, __ATOMIC_ACQUIRE);
        t->tail_seen = __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE);
        if (g_ring_key_ok) pthread_setspecific(g_ring_key, ring);
        BARRIER();
        t->ring = ring;
        t->claiming = 0;
        /* Fault the ring's pages in now rather than one by one on the hot
         * path (signal handlers may already log into it meanwhile). */
        madvise(ring, cb->ring_stride, MADV_POPULATE_WRITE);
        return 1;
    }
    t->no_ring = 1;
    t->claiming = 0;
    __atomic_fetch_add(&cb->no_ring_events, 1, __ATOMIC_RELAXED);
    return 0;
}

static void retire_ring(void* value) {
    struct iprobe_rt_ring* ring = value;
    struct thread_producer* t = &t_producer;
    /* later TLS destructors may still hit probes: drop those */
    t->no_ring = 1;
    t->ring = 0;
    BARRIER();
    if (ring) __atomic_store_n(&ring->state, IPROBE_RT_RING_RETIRED, __ATOMIC_RELEASE);
}

/* The probe a handler was entered for; -1 (and counted) when the runtime
 * has no control block yet or the call came from a site it does not know. */
static inline __attribute__((always_inline)) int32_t probe_for(uintptr_t return_address,
                                                               struct iprobe_rt_control** cb_out) {
    struct iprobe_rt_control* cb = control();
    if (UNLIKELY(!cb)) {
        count_unserved();
        return -1;
    }
    const int32_t probe = lookup_site(cb, return_address);
    if (UNLIKELY(probe < 0)) __atomic_fetch_add(&cb->unknown_site_events, 1, __ATOMIC_RELAXED);
    *cb_out = cb;
    return probe;
}

static inline __attribute__((always_inline)) void emit(uintptr_t return_address, uint8_t kind, const uint64_t* args) {
    struct iprobe_rt_control* cb;
    const int32_t probe = probe_for(return_address, &cb);
    if (UNLIKELY(probe < 0)) return;
    struct thread_producer* t = &t_producer;
    if (UNLIKELY(!t->ring)) {
        if (t->no_ring) {
            __atomic_fetch_add(&cb->no_ring_events, 1, __ATOMIC_RELAXED);
            return;
        }
        if (t->claiming) {
            __atomic_fetch_add(&iprobe_rt_state.nested_drops, 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&cb->no_ring_events, 1, __ATOMIC_RELAXED);
            return;
        }
        if (!claim_ring(t, cb)) return;
    }
    const uint64_t need = args ? 2 : 1;
    t->depth++;
    BARRIER();
    /* One instruction, so a signal handler probing in this thread sees the
     * reservation either whole or not at all. */
    const uint64_t index = xadd_local(&t->reserve, need);
    if (UNLIKELY(index + need - t->tail_seen > t->mask + 1)) {
        t->tail_seen = __atomic_load_n(&t->ring->tail, __ATOMIC_ACQUIRE);
        /* Handlers nest LIFO: any nested reservation made after ours has
         * been rolled back already, unless the reader freed room meanwhile,
         * in which case our slots fit too. */
        if (index + need - t->tail_seen > t->mask + 1 && cas_local(&t->reserve, index + need, index)) {
            __atomic_fetch_add(&t->ring->dropped, need, __ATOMIC_RELAXED);
            goto out;
        }
    }
    struct iprobe_rt_record* record = &t->records[index & t->mask];
    record->tsc = __builtin_ia32_rdtsc();
    record->probe = (uint32_t)probe;
    record->tid = t->tid;
    record->kind = kind;
    record->nargs = args ? 4 : 0;
    record->depth = (uint16_t)(t->depth - 1);
    if (args) {
        struct iprobe_rt_args_record* more = (struct iprobe_rt_args_record*)&t->records[(index + 1) & t->mask];
        for (int i = 0; i < 4; i++) more->args[i] = args[i];
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

static inline __attribute__((always_inline)) void count(uintptr_t return_address) {
    struct iprobe_rt_control* cb;
    const int32_t probe = probe_for(return_address, &cb);
    if (UNLIKELY(probe < 0)) return;
    uint64_t* counts = (uint64_t*)((char*)cb + cb->counts_offset);
    __atomic_fetch_add(&counts[probe], 1, __ATOMIC_RELAXED);
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
    count(RETURN_ADDRESS());
}

EXPORT void iprobe_rt_count_exit(void* fn, void* call_site) {
    (void)fn, (void)call_site;
    count(RETURN_ADDRESS());
}

EXPORT void iprobe_rt_count_point(uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3) {
    (void)a0, (void)a1, (void)a2, (void)a3;
    count(RETURN_ADDRESS());
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
__attribute__((visibility("hidden"))) void iprobe_rt_count_at(uintptr_t ret) { count(ret); }

#ifdef IPROBE_RT_HOOK_ALIASES
/* Static variant only: serve live -finstrument-functions hooks directly, the
 * compiled-in floor the benchmarks compare against. */
EXPORT void __cyg_profile_func_enter(void* fn, void* call_site) __attribute__((alias("iprobe_rt_count_enter")));
EXPORT void __cyg_profile_func_exit(void* fn, void* call_site) __attribute__((alias("iprobe_rt_count_exit")));
#endif

EXPORT int iprobe_rt_map_region(const char* shm_name) {
    if (control()) return -EALREADY;
    char path[IPROBE_RT_PATH_MAX] = "/dev/shm";
    const size_t prefix = strlen(path);
    const size_t name_len = strnlen(shm_name, sizeof(path) - prefix - 1);
    memcpy(path + prefix, shm_name, name_len);
    path[prefix + name_len] = 0;
    const int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(struct iprobe_rt_control)) {
        close(fd);
        return -EINVAL;
    }
    void* base = mmap(0, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) return -errno;
    struct iprobe_rt_control* cb = base;
    if (memcmp(cb->magic, IPROBE_RT_MAGIC, 8) != 0 || cb->version != IPROBE_RT_VERSION ||
        cb->owner_pid != (uint32_t)getpid()) {
        munmap(base, (size_t)st.st_size);
        return -EINVAL;
    }
    memcpy(g_region_path, path, sizeof g_region_path);
    iprobe_rt_state.region_size = (uint64_t)st.st_size;
    iprobe_rt_state.mapped_pid = (uint32_t)getpid();
    iprobe_rt_state.control = (uint64_t)(uintptr_t)base;
    g_forked_child = 0;
    __atomic_store_n(&g_control, cb, __ATOMIC_RELEASE);
    return 0;
}

/* The child of fork() shares the parent's mapping: it must not write into
 * the parent's rings.  It drops (and counts) events until attached itself. */
static void after_fork_in_child(void) {
    struct iprobe_rt_control* cb = control();
    __atomic_store_n(&g_control, (struct iprobe_rt_control*)0, __ATOMIC_RELEASE);
    memset(&t_producer, 0, sizeof t_producer);
    if (cb) {
        g_forked_child = 1;
        munmap(cb, (size_t)iprobe_rt_state.region_size);
    }
    iprobe_rt_state.control = 0;
    iprobe_rt_state.region_size = 0;
    iprobe_rt_state.mapped_pid = 0;
    g_region_path[0] = 0;
}

/* A normal exit removes the region (a reader that has it mapped keeps
 * reading); a killed process leaves /dev/shm/iprobe.<pid> for post-mortem
 * `iprobe report`, removed by the user or the next attach to that pid. */
__attribute__((destructor)) static void runtime_fini(void) {
    if (control() && iprobe_rt_state.mapped_pid == (uint32_t)getpid() && g_region_path[0]) unlink(g_region_path);
}

__attribute__((constructor)) static void runtime_init(void) {
    g_ring_key_ok = pthread_key_create(&g_ring_key, retire_ring) == 0;
    pthread_atfork(0, 0, after_fork_in_child);
}
