/*
 * libfperf-handler.so: fperf's in-process half.
 *
 * Loaded into the target (LD_PRELOAD when fperf starts the program, dlopen
 * injected by hotpatch when it attaches to a running one).  Entry and exit of
 * each selected function come here with the function's address; the handler
 * counts the call and, while the function's quota lasts, takes a sample: the
 * deltas of wall time, thread CPU time and the PAPI events over that call.
 *
 * Hot path rules: no malloc, no locks, no syscalls on the count-only path;
 * per-thread state reached through initial-exec TLS.  PAPI set-up happens
 * once per thread, on its first sampled call (PAPI allocates then).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <papi.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "iprobe/fperf/kernel_counter.h"
#include "iprobe/formats/fperf_region.h"
#include "iprobe/runtime/rt.h"

#define FPERF_API __attribute__((visibility("default")))
#define FPERF_TLS __thread __attribute__((tls_model("initial-exec")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Deeper sampled nesting than this is counted in stack_overflow, not sampled. */
#define SHADOW_STACK_DEPTH 512
/* While no session is mapped, a thread looks for one every this many calls. */
#define REATTACH_EVERY_CALLS 65536u
#define CALIBRATION_ROUNDS 100
#define CALIBRATION_TRIES 5

struct frame {
    uint64_t function;
    struct fperf_function_slot* slot;
    int64_t depth;
    uintptr_t sp;      /* the handler's frame at the entry probe */
    uint64_t calls0;   /* this thread's calls and samples when the frame opened */
    uint64_t samples0;
    uint64_t handler_in; /* when sample_enter began, to measure our own cost */
    uint64_t wall0;
    uint64_t cpu0;
    long long events0[FPERF_MAX_EVENTS];
};

struct thread_state {
    const struct fperf_shm_header* session; /* event set built for this session */
    int event_set;                          /* PAPI_NULL when no PAPI event is counted */
    int kernel_fds[FPERF_MAX_EVENTS];       /* kernel-backend counters, [0] leads the group */
    int papi_counted;                       /* events in event_set: positions [0, papi_counted) */
    int kernel_counted;                     /* then the kernel group's, in its order */
    int counted;                            /* papi_counted + kernel_counted */
    int event_index[FPERF_MAX_EVENTS];      /* position -> header event index */
    uint32_t top;
    struct frame frames[SHADOW_STACK_DEPTH];
};

/* Small on purpose: initial-exec TLS of a dlopen'ed library comes from the
 * loader's limited static TLS surplus. */
struct tls {
    struct thread_state* state;
    int64_t depth;        /* enters minus exits seen by this thread */
    uint32_t open_frames; /* sampled calls waiting for their exit */
    int64_t top_depth;    /* depth of the innermost of them: exits deeper than it are not ours */
    uintptr_t top_sp;     /* and its stack position */
    uint32_t busy;        /* inside the handler's slow path */
    uint32_t dead;        /* thread is being torn down */
    uint32_t reattach_countdown;
    uint32_t count_timer;  /* calls until the next one whose count path is timed */
    uint64_t calls;        /* calls entered by this thread */
    uint64_t samples_done; /* samples this thread completed */
};

static FPERF_TLS struct tls t_tls;

static _Atomic(struct fperf_shm_header*) g_session;
static atomic_flag g_attaching = ATOMIC_FLAG_INIT;
static int g_papi_ok;
static pthread_key_t g_thread_key;

/* What one sample (or one counted call) nested inside another sample's
 * window adds to that window, measured by calibrate(); sample_exit takes it
 * back out, so an outer function is not charged for the profiler's work on
 * its callees.  Event costs are in thousandths. */
static uint64_t g_nested_wall_ns, g_nested_cpu_ns, g_count_ns;
static uint64_t g_nested_event_milli[FPERF_MAX_EVENTS];
static int g_thread_key_ok;

static uint64_t clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct fperf_function_slot* slots_of(struct fperf_shm_header* h)
{
    return (struct fperf_function_slot*)((char*)h + h->header_size);
}

/* The slot of `function`, inserting it when the table is open. */
static struct fperf_function_slot* find_slot(struct fperf_shm_header* h, uint64_t function)
{
    struct fperf_function_slot* slots = slots_of(h);
    const uint32_t mask = h->slot_count - 1;
    uint32_t i = fperf_home_slot(function, h->slot_shift);
    for (uint32_t probes = 0; probes < h->slot_count; probes++, i = (i + 1) & mask) {
        uint64_t key = atomic_load_explicit(&slots[i].address, memory_order_acquire);
        if (key == function) return &slots[i];
        if (key != 0) continue;
        if (h->table_mode != FPERF_TABLE_OPEN) return NULL;
        uint64_t expected = 0;
        if (atomic_compare_exchange_strong_explicit(&slots[i].address, &expected, function,
                                                    memory_order_acq_rel, memory_order_acquire))
            return &slots[i];
        if (expected == function) return &slots[i];
    }
    atomic_fetch_add_explicit(&h->table_full, 1, memory_order_relaxed);
    return NULL;
}

/* ---- modules: so the daemon can symbolize addresses after we are gone ---- */

static int record_module(struct dl_phdr_info* info, size_t size, void* data)
{
    (void)size;
    struct fperf_shm_header* h = data;
    if (h->module_count >= FPERF_MAX_MODULES) return 1;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr)* ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        if (ph->p_vaddr < lo) lo = ph->p_vaddr;
        if (ph->p_vaddr + ph->p_memsz > hi) hi = ph->p_vaddr + ph->p_memsz;
    }
    if (hi == 0) return 0;
    struct fperf_module* m = &h->modules[h->module_count++];
    m->bias = info->dlpi_addr;
    m->start = info->dlpi_addr + lo;
    m->end = info->dlpi_addr + hi;
    const char* path = info->dlpi_name;
    char exe[FPERF_MODULE_PATH_MAX];
    if (path == NULL || path[0] == '\0') {
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        exe[n > 0 ? n : 0] = '\0';
        path = exe;
    }
    snprintf(m->path, sizeof m->path, "%s", path);
    return 0;
}

/* ---- PAPI: one event set per thread, built for the current session ---- */

static void release_event_set(struct thread_state* st)
{
    if (st->event_set != PAPI_NULL) {
        long long ignored[FPERF_MAX_EVENTS];
        PAPI_stop(st->event_set, ignored);
        PAPI_cleanup_eventset(st->event_set);
        PAPI_destroy_eventset(&st->event_set);
        st->event_set = PAPI_NULL;
    }
    for (int i = st->kernel_counted - 1; i >= 0; i--) close(st->kernel_fds[i]);
    st->papi_counted = st->kernel_counted = st->counted = 0;
}

static void settle_event_status(struct fperf_shm_header* h, uint32_t e, int measured)
{
    int untried = FPERF_EVENT_UNTRIED;
    atomic_compare_exchange_strong(&h->event_status[e], &untried,
                                   measured ? FPERF_EVENT_MEASURED : FPERF_EVENT_UNAVAILABLE);
}

static void build_papi_events(struct thread_state* st, struct fperf_shm_header* h)
{
    if (!g_papi_ok || PAPI_create_eventset(&st->event_set) != PAPI_OK) {
        st->event_set = PAPI_NULL;
        for (uint32_t e = 0; e < h->event_count; e++)
            if (h->event_sources[e].backend == FPERF_BACKEND_PAPI) settle_event_status(h, e, 0);
        return;
    }
    for (uint32_t e = 0; e < h->event_count; e++) {
        if (h->event_sources[e].backend != FPERF_BACKEND_PAPI) continue;
        int code;
        int ok = PAPI_event_name_to_code(h->event_names[e], &code) == PAPI_OK &&
                 PAPI_add_event(st->event_set, code) == PAPI_OK;
        if (ok) st->event_index[st->papi_counted++] = (int)e;
        settle_event_status(h, e, ok);
    }
    if (st->papi_counted == 0 || PAPI_start(st->event_set) != PAPI_OK) {
        if (st->papi_counted) atomic_fetch_add(&h->thread_failures, 1);
        PAPI_cleanup_eventset(st->event_set);
        PAPI_destroy_eventset(&st->event_set);
        st->event_set = PAPI_NULL;
        st->papi_counted = 0;
    }
}

/* One group per thread, so a sample reads every kernel counter in one read(). */
static void build_kernel_events(struct thread_state* st, struct fperf_shm_header* h)
{
    for (uint32_t e = 0; e < h->event_count; e++) {
        if (h->event_sources[e].backend != FPERF_BACKEND_KERNEL) continue;
        int fd = fperf_open_kernel_counter(&h->event_sources[e], st->kernel_counted ? st->kernel_fds[0] : -1);
        if (fd >= 0) {
            st->kernel_fds[st->kernel_counted] = fd;
            st->event_index[st->papi_counted + st->kernel_counted++] = (int)e;
        } else {
            h->event_errno[e] = -fd;
        }
        settle_event_status(h, e, fd >= 0);
    }
}

static void build_event_set(struct thread_state* st, struct fperf_shm_header* h)
{
    release_event_set(st);
    st->session = h;
    if (h->event_count > FPERF_MAX_EVENTS) return;
    build_papi_events(st, h);
    build_kernel_events(st, h);
    st->counted = st->papi_counted + st->kernel_counted;
}

static void thread_exit(void* arg)
{
    struct thread_state* st = arg;
    t_tls.dead = 1;
    t_tls.state = NULL;
    t_tls.open_frames = 0;
    if (!st) return;
    release_event_set(st);
    if (g_papi_ok) PAPI_unregister_thread();
    munmap(st, sizeof *st);
}

static struct thread_state* thread_register(struct fperf_shm_header* h)
{
    if (t_tls.dead) return NULL;
    struct thread_state* st = mmap(NULL, sizeof *st, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (st == MAP_FAILED) return NULL;
    st->event_set = PAPI_NULL;
    t_tls.state = st;
    if (g_thread_key_ok) pthread_setspecific(g_thread_key, st);
    atomic_fetch_add(&h->threads, 1);
    build_event_set(st, h);
    return st;
}

static inline void read_events(struct thread_state* st, long long* out)
{
    if (st->papi_counted) PAPI_read(st->event_set, out);
    if (st->kernel_counted &&
        fperf_read_kernel_group(st->kernel_fds[0], (uint64_t*)(out + st->papi_counted), (uint32_t)st->kernel_counted) != 0)
        memset(out + st->papi_counted, 0, sizeof(long long) * (size_t)st->kernel_counted);
}

/* ---- sampling ---- */

static void sample_enter(struct fperf_shm_header* h, struct fperf_function_slot* slot,
                         uint64_t function, uintptr_t sp)
{
    if (t_tls.busy) {
        atomic_fetch_add_explicit(&h->reentrant_skips, 1, memory_order_relaxed);
        return;
    }
    t_tls.busy = 1;
    struct thread_state* st = t_tls.state;
    if (UNLIKELY(!st)) st = thread_register(h);
    if (UNLIKELY(!st)) goto out;
    if (UNLIKELY(st->session != h)) build_event_set(st, h);

    const uint64_t now = clock_ns(CLOCK_MONOTONIC);
    uint64_t beat = atomic_load_explicit(&h->heartbeat_ns, memory_order_relaxed);
    if (UNLIKELY(now > beat && now - beat > h->heartbeat_timeout_ns)) {
        atomic_store_explicit(&slot->quota, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&h->stale_skips, 1, memory_order_relaxed);
        goto out;
    }
    if (atomic_fetch_sub_explicit(&slot->quota, 1, memory_order_relaxed) <= 0) goto out;
    if (UNLIKELY(st->top >= SHADOW_STACK_DEPTH)) {
        atomic_fetch_add_explicit(&h->stack_overflow, 1, memory_order_relaxed);
        goto out;
    }
    struct frame* f = &st->frames[st->top++];
    t_tls.open_frames = st->top;
    t_tls.top_depth = t_tls.depth;
    t_tls.top_sp = sp;
    f->function = function;
    f->slot = slot;
    f->depth = t_tls.depth;
    f->sp = sp;
    f->calls0 = t_tls.calls;
    f->samples0 = t_tls.samples_done;
    f->handler_in = now;
    /* Our own reads come before the start time and after the end time, so a
     * sample includes as little of the handler as possible. */
    read_events(st, f->events0);
    f->cpu0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    f->wall0 = clock_ns(CLOCK_MONOTONIC);
out:
    t_tls.busy = 0;
}

static void sample_exit(uint64_t function, uintptr_t sp)
{
    if (t_tls.busy) return;
    struct thread_state* st = t_tls.state;
    if (!st) {
        t_tls.open_frames = 0;
        return;
    }
    t_tls.busy = 1;
    /* An exit above a frame's stack position whose function differs means
     * that frame's activation is gone (longjmp, an exception, or its exit
     * probe removed while it ran): its exit will never come.  The call depth
     * cannot tell: a site gcc shares between two inlined functions (one exit
     * call, this_fn in a register) stays live when the probes of one of them
     * are removed, and its stray exits pull the depth below a live frame's. */
    while (st->top && sp > st->frames[st->top - 1].sp && st->frames[st->top - 1].function != function) {
        st->top--;
        struct fperf_shm_header* h = atomic_load_explicit(&g_session, memory_order_relaxed);
        if (h) atomic_fetch_add_explicit(&h->unmatched_exits, 1, memory_order_relaxed);
    }
    /* The frame's own exit: the same function at the frame's stack position
     * or above it (whatever the depth count says, which stray or missed
     * exits may have moved; it is put right), or at the frame's depth (a
     * function whose stack pointer moved, alloca). */
    if (st->top && st->frames[st->top - 1].function == function &&
        (sp >= st->frames[st->top - 1].sp || st->frames[st->top - 1].depth == t_tls.depth)) {
        t_tls.depth = st->frames[st->top - 1].depth;
        uint64_t wall1 = clock_ns(CLOCK_MONOTONIC);
        struct frame* f = &st->frames[--st->top];
        uint64_t cpu1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        long long events1[FPERF_MAX_EVENTS];
        read_events(st, events1);
        struct fperf_function_slot* slot = f->slot;
        const uint64_t nested = t_tls.samples_done - f->samples0;
        const uint64_t inner_calls = t_tls.calls - f->calls0;
        const uint64_t counted_only = inner_calls > nested ? inner_calls - nested : 0;
        const uint64_t wall_cost = nested * g_nested_wall_ns + counted_only * g_count_ns;
        const uint64_t cpu_cost = nested * g_nested_cpu_ns + counted_only * g_count_ns;
        const uint64_t wall = wall1 - f->wall0;
        const uint64_t cpu = cpu1 >= f->cpu0 ? cpu1 - f->cpu0 : 0;
        atomic_fetch_add_explicit(&slot->wall_ns, wall > wall_cost ? wall - wall_cost : 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&slot->cpu_ns, cpu > cpu_cost ? cpu - cpu_cost : 0, memory_order_relaxed);
        for (int i = 0; i < st->counted; i++) {
            const int e = st->event_index[i];
            const long long d = events1[i] - f->events0[i];
            const uint64_t cost = nested * g_nested_event_milli[e] / 1000;
            atomic_fetch_add_explicit(&slot->events[e], d > 0 && (uint64_t)d > cost ? (uint64_t)d - cost : 0,
                                      memory_order_relaxed);
        }
        atomic_fetch_add_explicit(&slot->samples, 1, memory_order_release);
        t_tls.samples_done++;
        struct fperf_shm_header* h = atomic_load_explicit(&g_session, memory_order_relaxed);
        if (h) {
            const uint64_t out = clock_ns(CLOCK_MONOTONIC);
            atomic_fetch_add_explicit(&h->sampling_ns, (f->wall0 - f->handler_in) + (out - wall1),
                                      memory_order_relaxed);
            atomic_fetch_add_explicit(&h->sampling_count, 1, memory_order_relaxed);
        }
    }
    t_tls.open_frames = st->top;
    t_tls.top_depth = st->top ? st->frames[st->top - 1].depth : 0;
    t_tls.top_sp = st->top ? st->frames[st->top - 1].sp : 0;
    t_tls.busy = 0;
}

/* ---- session attach ---- */

static void calibrate(struct fperf_shm_header* h);

/* NOP-form sites (the LLVM flow) pass no function address; the iprobe
 * runtime's site table knows it.  Looked up on the attach path, never on the
 * hot one (dlopen of an already loaded library, by soname). */
static __typeof__(&iprobe_rt_function_at) _Atomic g_function_at;
/* Function-entry sites (the entry and LLVM flows) pass their probe, and their
 * exits come through the runtime's return trampolines: one mechanism for
 * every handler. */
static __typeof__(&iprobe_rt_function_of) _Atomic g_function_of;
static __typeof__(&iprobe_rt_hook_return) _Atomic g_hook_return;

static void find_site_table(void)
{
    if (atomic_load(&g_function_at) && atomic_load(&g_function_of) && atomic_load(&g_hook_return)) return;
    void* rt = dlopen("libiprobe-rt.so", RTLD_NOW | RTLD_NOLOAD);
    if (!rt) return;
    /* The runtime's own declarations (rt.h) type what dlsym finds. */
    __typeof__(&iprobe_rt_function_at) function_at;
    *(void**)&function_at = dlsym(rt, "iprobe_rt_function_at");
    atomic_store(&g_function_at, function_at);
    __typeof__(&iprobe_rt_function_of) function_of;
    *(void**)&function_of = dlsym(rt, "iprobe_rt_function_of");
    atomic_store(&g_function_of, function_of);
    __typeof__(&iprobe_rt_hook_return) hook_return;
    *(void**)&hook_return = dlsym(rt, "iprobe_rt_hook_return");
    atomic_store(&g_hook_return, hook_return);
    dlclose(rt); /* the runtime stays loaded (-z nodelete) */
}

/* The function a NOP-form site belongs to, by the site's return address; 0
 * before the runtime was found or for a site it does not know. */
static inline uint64_t function_at_site(uintptr_t return_address)
{
    __typeof__(&iprobe_rt_function_at) function_at = atomic_load_explicit(&g_function_at, memory_order_relaxed);
    return function_at ? function_at(return_address) : 0;
}

/* Maps /dev/shm/fperf.<pid> when the daemon has set one up.  Old mappings are
 * never unmapped: another thread may still be writing a sample into one. */
static void try_attach(void)
{
    if (atomic_flag_test_and_set(&g_attaching)) return;
    if (atomic_load(&g_session)) goto out;
    char name[64];
    snprintf(name, sizeof name, "/dev/shm" FPERF_SHM_PREFIX "%d", (int)getpid());
    int fd = open(name, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) goto out;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_uid != geteuid() || (size_t)sb.st_size < sizeof(struct fperf_shm_header)) {
        close(fd);
        goto out;
    }
    struct fperf_shm_header* h = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (h == MAP_FAILED) goto out;
    if (h->magic != FPERF_SHM_MAGIC || h->version != FPERF_SHM_VERSION ||
        h->total_size != (uint64_t)sb.st_size || h->target_pid != (uint32_t)getpid() ||
        atomic_load(&h->state) == FPERF_STATE_CLOSED || h->slot_count < 2 ||
        (h->slot_count & (h->slot_count - 1)) != 0 ||
        h->header_size + (uint64_t)h->slot_count * sizeof(struct fperf_function_slot) > h->total_size) {
        munmap(h, (size_t)sb.st_size);
        goto out;
    }
    h->module_count = 0;
    dl_iterate_phdr(record_module, h);
    find_site_table();
    h->papi_status = g_papi_ok ? PAPI_OK : PAPI_ENOINIT;
    calibrate(h);
    atomic_store(&g_session, h);
    atomic_store(&h->handler_ready, 1);
out:
    atomic_flag_clear(&g_attaching);
}

static inline struct fperf_shm_header* current_session(void)
{
    struct fperf_shm_header* h = atomic_load_explicit(&g_session, memory_order_acquire);
    if (LIKELY(h)) {
        if (LIKELY(atomic_load_explicit(&h->state, memory_order_relaxed) != FPERF_STATE_CLOSED))
            return h;
        struct fperf_shm_header* expected = h;
        atomic_compare_exchange_strong(&g_session, &expected, NULL);
        t_tls.reattach_countdown = 0;
    }
    if (t_tls.reattach_countdown-- == 0) {
        t_tls.reattach_countdown = REATTACH_EVERY_CALLS;
        if (!t_tls.busy && !t_tls.dead) try_attach();
    }
    return NULL;
}

/* ---- the entry points ---- */

/* Counts the call and samples it while its quota lasts.  Returns the session
 * when the call took the count-only path, NULL otherwise. */
static inline struct fperf_shm_header* count_call(struct fperf_shm_header* h, uint64_t function, uintptr_t sp)
{
    if (UNLIKELY(!h)) return NULL;
    struct fperf_function_slot* slot = find_slot(h, function);
    if (UNLIKELY(!slot)) return NULL;
    const int64_t quota = atomic_load_explicit(&slot->quota, memory_order_relaxed);
    /* its probes are on their way out: not even counted (the report says N+) */
    if (UNLIKELY(quota == FPERF_QUOTA_SHED)) return NULL;
    atomic_fetch_add_explicit(&slot->calls, 1, memory_order_relaxed);
    if (LIKELY(quota <= 0)) return h;
    sample_enter(h, slot, function, sp);
    return NULL;
}

/* One call in FPERF_COUNT_TIMING_EVERY: the count path timed as it runs at
 * this site, with whatever the target left in the caches (see iprobe/formats/fperf_region.h,
 * count_warm_ns).  Two clock reads per 1024 calls cost well under 0.1 ns a call. */
static __attribute__((noinline)) void timed_count_call(uint64_t function, uintptr_t sp)
{
    t_tls.count_timer = FPERF_COUNT_TIMING_EVERY - 1;
    const uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
    struct fperf_shm_header* h = count_call(current_session(), function, sp);
    const uint64_t elapsed = clock_ns(CLOCK_MONOTONIC) - t0;
    /* a preemption or interrupt inside the window says nothing about us */
    if (h && elapsed < 20000) {
        atomic_fetch_add_explicit(&h->counting_ns, elapsed, memory_order_relaxed);
        atomic_fetch_add_explicit(&h->counting_count, 1, memory_order_relaxed);
    }
}

static inline void on_function_enter(uint64_t function, uintptr_t sp)
{
    t_tls.depth++;
    t_tls.calls++;
    if (UNLIKELY(t_tls.count_timer-- == 0)) {
        timed_count_call(function, sp);
        return;
    }
    count_call(current_session(), function, sp);
}

static inline void on_function_exit(uint64_t function, uintptr_t sp)
{
    /* depth is still the exiting call's own, as its frame recorded it.
     * Calls nested deeper than the innermost sampled one leave at once: a
     * long-lived sampled caller (main, an event loop) must not put every
     * exit below it on the slow path. */
    if (UNLIKELY(t_tls.open_frames != 0) && (t_tls.depth <= t_tls.top_depth || sp >= t_tls.top_sp))
        sample_exit(function, sp);
    t_tls.depth--;
}

/* Both entry points have the same frame layout, so their frame addresses
 * compare the stack positions of the probes that called them. */
FPERF_API void fperf_enter(void* this_fn, void* call_site)
{
    (void)call_site;
    on_function_enter((uint64_t)(uintptr_t)this_fn, (uintptr_t)__builtin_frame_address(0));
}

FPERF_API void fperf_exit(void* this_fn, void* call_site)
{
    (void)call_site;
    on_function_exit((uint64_t)(uintptr_t)this_fn, (uintptr_t)__builtin_frame_address(0));
}

/* Called by the NOP-form entry points (trampolines.S) with the site's
 * return address and stack pointer.  The stack position is put on the scale
 * of fperf_enter's frame address (the caller's stack pointer less the return
 * address and saved frame pointer), so that both kinds of sites compare. */
FPERF_API void fperf_enter_at(uintptr_t return_address, const uint64_t* saved, uintptr_t site_sp)
{
    (void)saved;
    const uint64_t function = function_at_site(return_address);
    if (LIKELY(function)) on_function_enter(function, site_sp - 16);
}

FPERF_API void fperf_exit_at(uintptr_t return_address, const uint64_t* saved, uintptr_t site_sp)
{
    (void)saved;
    const uint64_t function = function_at_site(return_address);
    if (LIKELY(function)) on_function_exit(function, site_sp - 16);
}

/* Function-entry sites (ENTRY_SITE_CALL, trampolines.S): the site's probe
 * and the function's return-address slot, which is the stack position
 * fperf_enter's frame would have had, plus 16.  The exit comes through the
 * runtime's return trampoline, which calls fperf_returned with that slot. */
static inline uint64_t function_of_probe(uint64_t probe)
{
    __typeof__(&iprobe_rt_function_of) function_of = atomic_load_explicit(&g_function_of, memory_order_relaxed);
    return function_of ? function_of((uint32_t)probe) : 0;
}

static void fperf_returned(uint64_t function, uintptr_t slot)
{
    on_function_exit(function, slot - 16);
}

FPERF_API uint64_t fperf_entry_enter_at(uint64_t probe, const uint64_t* saved, const uint64_t* slot)
{
    (void)saved;
    const uint64_t function = function_of_probe(probe);
    if (LIKELY(function)) on_function_enter(function, (uintptr_t)slot - 16);
    return 0;
}

FPERF_API uint64_t fperf_entry_enter_return_at(uint64_t probe, const uint64_t* saved, const uint64_t* slot)
{
    (void)saved;
    const uint64_t function = function_of_probe(probe);
    if (UNLIKELY(!function)) return 0;
    on_function_enter(function, (uintptr_t)slot - 16);
    __typeof__(&iprobe_rt_hook_return) hook = atomic_load_explicit(&g_hook_return, memory_order_relaxed);
    const uint64_t unit = hook ? hook(slot, fperf_returned, function) : 0;
    /* no exit will come (the thread is deeper than its return stack): the
     * call is counted, its depth given back */
    if (UNLIKELY(!unit)) t_tls.depth--;
    return unit;
}

/* Under LD_PRELOAD these interpose glibc's no-op hooks, so a program built
 * with plain -finstrument-functions is profiled without patching. */
FPERF_API void __cyg_profile_func_enter(void* this_fn, void* call_site)
    __attribute__((alias("fperf_enter")));
FPERF_API void __cyg_profile_func_exit(void* this_fn, void* call_site)
    __attribute__((alias("fperf_exit")));

/* ---- calibration: the cost the daemon budgets with, measured here ---- */

static void __attribute__((noinline)) calibration_target(void) { __asm__ volatile(""); }

/* Stack positions for calibration frames: below any real one, so they nest
 * inside whatever the thread has open. */
#define CALIBRATION_SP_OUTER ((uintptr_t)0x2000)
#define CALIBRATION_SP_INNER ((uintptr_t)0x1000)

static uint64_t time_rounds_n(struct fperf_shm_header* h, struct fperf_function_slot* slot,
                              int64_t quota, int rounds)
{
    const uint64_t fn = (uint64_t)(uintptr_t)&calibration_target;
    struct fperf_function_slot* home = &slots_of(h)[fperf_home_slot(fn, h->slot_shift)];
    uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
    for (int i = 0; i < rounds; i++) {
        t_tls.depth++;
        t_tls.calls++;
        /* what the real path also pays: session state and the table probe */
        (void)atomic_load_explicit(&h->state, memory_order_relaxed);
        (void)atomic_load_explicit(&home->address, memory_order_acquire);
        atomic_fetch_add_explicit(&slot->calls, 1, memory_order_relaxed);
        atomic_store_explicit(&slot->quota, quota, memory_order_relaxed);
        if (atomic_load_explicit(&slot->quota, memory_order_relaxed) > 0)
            sample_enter(h, slot, fn, CALIBRATION_SP_INNER);
        calibration_target();
        on_function_exit(fn, CALIBRATION_SP_INNER);
    }
    return clock_ns(CLOCK_MONOTONIC) - t0;
}

static uint64_t time_rounds(struct fperf_shm_header* h, struct fperf_function_slot* slot, int64_t quota)
{
    return time_rounds_n(h, slot, quota, CALIBRATION_ROUNDS);
}

/* The count-only path as an enabled probe runs it: out of line and reached
 * through a pointer, so the call and return are paid as at a real site. */
static __attribute__((noinline)) void count_only_enter(struct fperf_shm_header* h, uint64_t function)
{
    t_tls.depth++;
    t_tls.calls++;
    if (atomic_load_explicit(&h->state, memory_order_relaxed) == FPERF_STATE_CLOSED) return;
    struct fperf_function_slot* slot = find_slot(h, function);
    if (!slot) return;
    atomic_fetch_add_explicit(&slot->calls, 1, memory_order_relaxed);
    (void)atomic_load_explicit(&slot->quota, memory_order_relaxed);
}

static __attribute__((noinline)) void count_only_exit(uint64_t function)
{
    on_function_exit(function, CALIBRATION_SP_INNER);
}

#define COUNT_ROUNDS 2000
/* ns per counted call (entry and exit), on a private two-slot table holding
 * one function, so the real table is never touched. */
static uint64_t measure_count_cost(uint64_t* bracketed_ns)
{
    const size_t header_size = (sizeof(struct fperf_shm_header) + FPERF_HEADER_ALIGN - 1) / FPERF_HEADER_ALIGN *
                               FPERF_HEADER_ALIGN;
    const size_t size = header_size + 2 * sizeof(struct fperf_function_slot);
    struct fperf_shm_header* fake = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (fake == MAP_FAILED) return 0;
    fake->header_size = (uint32_t)header_size;
    fake->slot_count = 2;
    fake->slot_shift = 63;
    fake->table_mode = FPERF_TABLE_REGISTERED_ONLY;
    atomic_store(&fake->state, FPERF_STATE_ACTIVE);
    const uint64_t fn = (uint64_t)(uintptr_t)&calibration_target;
    atomic_store(&slots_of(fake)[fperf_home_slot(fn, 63)].address, fn);
    void (*volatile enter)(struct fperf_shm_header*, uint64_t) = count_only_enter;
    void (*volatile leave)(uint64_t) = count_only_exit;
    uint64_t best = UINT64_MAX;
    for (int t = 0; t < CALIBRATION_TRIES; t++) {
        uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
        for (int i = 0; i < COUNT_ROUNDS; i++) {
            enter(fake, fn);
            leave(fn);
        }
        uint64_t elapsed = clock_ns(CLOCK_MONOTONIC) - t0;
        if (elapsed < best) best = elapsed;
    }
    /* The count path bracketed by clock reads as timed_count_call() does it,
     * here cache-warm: the baseline its live timings are compared with. */
    uint64_t best_bracketed = UINT64_MAX;
    for (int t = 0; t < CALIBRATION_TRIES; t++) {
        uint64_t sum = 0;
        for (int i = 0; i < COUNT_ROUNDS; i++) {
            const uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
            (void)atomic_load_explicit(&fake->state, memory_order_relaxed);
            (void)count_call(fake, fn, CALIBRATION_SP_INNER);
            sum += clock_ns(CLOCK_MONOTONIC) - t0;
        }
        if (sum < best_bracketed) best_bracketed = sum;
    }
    *bracketed_ns = best_bracketed / COUNT_ROUNDS;
    munmap(fake, size);
    return best / COUNT_ROUNDS;
}

/* Runs sampled and count-only calls of an empty function on a private slot
 * with the session's events: their time per call is what the daemon
 * multiplies by the samples and calls it allows.  The daemon keeps the
 * heartbeat fresh while it waits for us, so these samples are real. */
/* One outer sample around NESTED_ROUNDS sampled empty calls: what each of
 * them added to the outer window, per metric. */
#define NESTED_ROUNDS 200
static void measure_nested_cost_once(struct fperf_shm_header* h, uint64_t* wall, uint64_t* cpu,
                                     uint64_t* event_milli)
{
    struct fperf_function_slot outer, inner;
    memset(&outer, 0, sizeof outer);
    memset(&inner, 0, sizeof inner);
    const uint64_t outer_fn = (uint64_t)(uintptr_t)&measure_nested_cost_once;
    t_tls.depth++;
    t_tls.calls++;
    atomic_store(&outer.quota, 1);
    sample_enter(h, &outer, outer_fn, CALIBRATION_SP_OUTER);
    time_rounds_n(h, &inner, 1, NESTED_ROUNDS);
    sample_exit(outer_fn, CALIBRATION_SP_OUTER);
    t_tls.depth--;
    if (atomic_load(&outer.samples) != 1 || atomic_load(&inner.samples) != NESTED_ROUNDS) return;
    uint64_t w = atomic_load(&outer.wall_ns) / NESTED_ROUNDS;
    uint64_t c = atomic_load(&outer.cpu_ns) / NESTED_ROUNDS;
    if (w < *wall) *wall = w;
    if (c < *cpu) *cpu = c;
    for (int e = 0; e < FPERF_MAX_EVENTS; e++) {
        uint64_t m = atomic_load(&outer.events[e]) * 1000 / NESTED_ROUNDS;
        if (m < event_milli[e]) event_milli[e] = m;
    }
}

/* The least of several tries: a preemption inside one window must not make
 * every later sample look cheaper than it was. */
static void measure_nested_cost(struct fperf_shm_header* h)
{
    g_nested_wall_ns = g_nested_cpu_ns = g_count_ns = 0;
    memset(g_nested_event_milli, 0, sizeof g_nested_event_milli);
    uint64_t wall = UINT64_MAX, cpu = UINT64_MAX, events[FPERF_MAX_EVENTS];
    for (int e = 0; e < FPERF_MAX_EVENTS; e++) events[e] = UINT64_MAX;
    for (int i = 0; i < CALIBRATION_TRIES; i++) measure_nested_cost_once(h, &wall, &cpu, events);
    if (wall == UINT64_MAX) return;
    g_nested_wall_ns = wall;
    g_nested_cpu_ns = cpu;
    for (int e = 0; e < FPERF_MAX_EVENTS; e++) g_nested_event_milli[e] = events[e] == UINT64_MAX ? 0 : events[e];
}

static void calibrate(struct fperf_shm_header* h)
{
    struct fperf_function_slot scratch;
    memset(&scratch, 0, sizeof scratch);
    time_rounds(h, &scratch, 1); /* warm-up, and PAPI thread set-up */
    uint64_t sampled = UINT64_MAX, counted = UINT64_MAX;
    uint64_t wall_floor = UINT64_MAX, cpu_floor = UINT64_MAX;
    for (int i = 0; i < CALIBRATION_TRIES; i++) {
        memset(&scratch, 0, sizeof scratch);
        uint64_t t = time_rounds(h, &scratch, 1);
        if (t < sampled) sampled = t;
        uint64_t n = atomic_load(&scratch.samples);
        if (n && atomic_load(&scratch.wall_ns) / n < wall_floor) wall_floor = atomic_load(&scratch.wall_ns) / n;
        if (n && atomic_load(&scratch.cpu_ns) / n < cpu_floor) cpu_floor = atomic_load(&scratch.cpu_ns) / n;
        t = time_rounds(h, &scratch, 0);
        if (t < counted) counted = t;
    }
    h->wall_floor_ns = wall_floor == UINT64_MAX ? 0 : wall_floor;
    h->cpu_floor_ns = cpu_floor == UINT64_MAX ? 0 : cpu_floor;
    measure_nested_cost(h);
    uint64_t sample_cost = sampled / CALIBRATION_ROUNDS;
    uint64_t count_cost = counted / CALIBRATION_ROUNDS;
    uint64_t bracketed = 0;
    const uint64_t real_count_cost = measure_count_cost(&bracketed);
    h->count_warm_ns = bracketed;
    h->sample_cost_ns = sample_cost > count_cost ? sample_cost - count_cost : 1;
    h->count_cost_ns = real_count_cost ? real_count_cost : 1;
    g_count_ns = count_cost;
    int papi_events = 0;
    for (uint32_t e = 0; e < h->event_count && e < FPERF_MAX_EVENTS; e++)
        papi_events += h->event_sources[e].backend == FPERF_BACKEND_PAPI;
    if (!g_papi_ok && papi_events)
        snprintf(h->handler_message, sizeof h->handler_message,
                 "PAPI could not be initialised in the target; its events are not measured");
}

/* ---- life cycle ---- */

static void after_fork_in_child(void)
{
    /* The child shares the parent's mapping and inherited the parent
     * thread's counters: it must not write into the parent's table. */
    atomic_store(&g_session, NULL);
    struct thread_state* st = t_tls.state;
    if (st) {
        for (int i = st->kernel_counted - 1; i >= 0; i--) close(st->kernel_fds[i]);
        st->kernel_counted = 0;
    }
    t_tls.state = NULL;
    t_tls.open_frames = 0;
    t_tls.reattach_countdown = REATTACH_EVERY_CALLS;
}

__attribute__((constructor)) static void fperf_handler_init(void)
{
    t_tls.busy = 1;
    int version = PAPI_library_init(PAPI_VER_CURRENT);
    g_papi_ok = version == PAPI_VER_CURRENT &&
                PAPI_thread_init((unsigned long (*)(void))pthread_self) == PAPI_OK;
    g_thread_key_ok = pthread_key_create(&g_thread_key, thread_exit) == 0;
    pthread_atfork(NULL, NULL, after_fork_in_child);
    t_tls.busy = 0;
    try_attach();
    const char* stop = getenv("FPERF_STOP_AFTER_INIT");
    if (stop && strcmp(stop, "1") == 0) {
        unsetenv("FPERF_STOP_AFTER_INIT");
        raise(SIGSTOP);
    }
}
