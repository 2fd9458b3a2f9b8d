/*
 * fperf's shared memory: the one definition of the region the profiler
 * (daemon, in the `fperf` CLI) and the handler library (in the target) share.
 *
 * File: /dev/shm/fperf.<target pid>, mode 0600, created by the daemon before
 * the handler attaches.  Layout:
 *
 *   struct fperf_shm_header          (header_size bytes, rounded to 128)
 *   struct fperf_function_slot [slot_count]   open-addressing hash table
 *
 * Each slot is both the control block entry (quota, written by the daemon,
 * decremented by the handler) and the data table entry (calls seen, samples
 * taken, summed per-call deltas, written by the handler).  Keyed by the
 * function's run-time address, the value the -finstrument-functions hooks
 * receive as `this_fn`.
 */
#ifndef FPERF_SHM_LAYOUT_H
#define FPERF_SHM_LAYOUT_H

#include <stdint.h>

#ifdef __cplusplus
#include <atomic>
#define FPERF_ATOMIC(T) std::atomic<T>
extern "C" {
#else
#include <stdatomic.h>
#define FPERF_ATOMIC(T) _Atomic T
#endif

#define FPERF_SHM_MAGIC 0x31534d4652455046ull /* "FPERFMS1" */
#define FPERF_SHM_VERSION 3u
#define FPERF_SHM_PREFIX "/fperf."           /* shm_open name: /fperf.<pid> */
#define FPERF_MAX_EVENTS 8
#define FPERF_EVENT_NAME_MAX 64
#define FPERF_MAX_MODULES 64
#define FPERF_MODULE_PATH_MAX 240
#define FPERF_MESSAGE_MAX 256

/* A quota this large is never exhausted within an interval: "no budget". */
#define FPERF_QUOTA_UNLIMITED INT64_MAX
/* The function's probes are being removed (too hot to count within the
 * budget): its calls are neither counted nor sampled from now on. */
#define FPERF_QUOTA_SHED INT64_MIN

enum fperf_session_state {
    FPERF_STATE_SETUP = 0,  /* daemon filling the table; handler may attach */
    FPERF_STATE_ACTIVE = 1, /* daemon refilling quotas */
    FPERF_STATE_CLOSED = 2  /* daemon done: handler drops this mapping */
};

enum fperf_event_status {
    FPERF_EVENT_UNTRIED = 0,
    FPERF_EVENT_MEASURED = 1,    /* in the handler's event set */
    FPERF_EVENT_UNAVAILABLE = 2  /* its backend refused it in the target */
};

/* Who counts an event.  PAPI where it can; the kernel's perf_event_open
 * directly where PAPI cannot (libpfm4 does not know the CPU, or PAPI was
 * made unavailable), which always covers the kernel's software events. */
enum fperf_event_backend {
    FPERF_BACKEND_PAPI = 0,
    FPERF_BACKEND_KERNEL = 1
};

struct fperf_event_source {
    uint32_t backend;      /* enum fperf_event_backend */
    uint32_t perf_type;    /* FPERF_BACKEND_KERNEL: perf_event_attr.type */
    uint64_t perf_config;  /* and .config */
};

enum fperf_table_mode {
    FPERF_TABLE_REGISTERED_ONLY = 0, /* profile only functions the daemon put in */
    FPERF_TABLE_OPEN = 1             /* the handler inserts functions it meets */
};

struct fperf_module {
    uint64_t start;  /* lowest mapped address of its PT_LOAD segments */
    uint64_t end;    /* one past the highest */
    uint64_t bias;   /* load bias: run-time address minus link-time vaddr */
    char path[FPERF_MODULE_PATH_MAX];
};

struct fperf_shm_header {
    uint64_t magic;
    uint32_t version;
    uint32_t header_size;  /* offset of the slot table */
    uint64_t total_size;
    uint32_t slot_count;   /* power of two */
    uint32_t slot_shift;   /* 64 - log2(slot_count), for the multiplicative hash */
    uint32_t table_mode;   /* enum fperf_table_mode */
    uint32_t target_pid;
    FPERF_ATOMIC(uint32_t) state; /* enum fperf_session_state */
    uint32_t event_count;
    char event_names[FPERF_MAX_EVENTS][FPERF_EVENT_NAME_MAX];
    struct fperf_event_source event_sources[FPERF_MAX_EVENTS];

    /* Daemon liveness: CLOCK_MONOTONIC ns of its last refill.  The handler
     * checks it only before taking a sample; once it is older than the
     * timeout the handler zeroes that function's quota, so a killed daemon
     * leaves every function on the count-only path. */
    FPERF_ATOMIC(uint64_t) heartbeat_ns;
    uint64_t heartbeat_timeout_ns;

    /* Written by the handler when it attaches. */
    FPERF_ATOMIC(uint32_t) handler_ready;
    int32_t papi_status;                /* PAPI_OK or the PAPI error at init */
    /* The errno perf_event_open gave for each refused kernel-backend event. */
    int32_t event_errno[FPERF_MAX_EVENTS];
    FPERF_ATOMIC(int32_t) event_status[FPERF_MAX_EVENTS]; /* enum fperf_event_status */
    uint64_t sample_cost_ns;  /* measured in the target: one sampled call's extra time */
    uint64_t count_cost_ns;   /* measured in the target: one count-only call's extra time */
    /* What an empty function measures (the clocks' own cost inside the
     * sampled window); the report subtracts it from each sample's mean. */
    uint64_t wall_floor_ns;
    uint64_t cpu_floor_ns;
    uint32_t module_count;
    uint32_t reserved0;
    struct fperf_module modules[FPERF_MAX_MODULES];
    char handler_message[FPERF_MESSAGE_MAX];

    /* Things the handler could not do, counted rather than hidden. */
    FPERF_ATOMIC(uint64_t) table_full;      /* functions not inserted: table full */
    FPERF_ATOMIC(uint64_t) stack_overflow;  /* sampled calls nested deeper than the shadow stack */
    FPERF_ATOMIC(uint64_t) reentrant_skips; /* calls inside the handler (signals) not sampled */
    FPERF_ATOMIC(uint64_t) stale_skips;     /* samples refused: daemon heartbeat stale */
    FPERF_ATOMIC(uint64_t) unmatched_exits; /* sampled entries whose exit never came (longjmp) */
    FPERF_ATOMIC(uint64_t) threads;         /* threads that registered with PAPI */
    FPERF_ATOMIC(uint64_t) thread_failures; /* threads PAPI could not count */
    /* The handler's own time in completed samples, measured live: what the
     * daemon budgets with once there are enough of them. */
    FPERF_ATOMIC(uint64_t) sampling_ns;
    FPERF_ATOMIC(uint64_t) sampling_count;
    /* The same for counted calls.  A calibration loop runs cache-warm, but at
     * a real site in a busy target the count path misses in the caches, which
     * made the calibrated count cost about a third of the real one.  So the
     * handler also times its count-only path, bracketed by two clock reads,
     * on every FPERF_COUNT_TIMING_EVERY-th call of a thread (counting_*), and
     * once cache-warm at calibration (count_warm_ns); the daemon adds the
     * difference to the calibrated cost.  The clock read falls in both and
     * cancels out. */
    uint64_t count_warm_ns;
    FPERF_ATOMIC(uint64_t) counting_ns;
    FPERF_ATOMIC(uint64_t) counting_count;
};

struct fperf_function_slot {
    FPERF_ATOMIC(uint64_t) address; /* run-time function address; 0 = empty */
    FPERF_ATOMIC(int64_t) quota;    /* samples still allowed this interval */
    FPERF_ATOMIC(uint64_t) calls;   /* every call seen, sampled or not */
    FPERF_ATOMIC(uint64_t) samples; /* calls whose deltas were summed below */
    FPERF_ATOMIC(uint64_t) wall_ns;
    FPERF_ATOMIC(uint64_t) cpu_ns;
    FPERF_ATOMIC(uint64_t) events[FPERF_MAX_EVENTS];
    uint64_t reserved[2];
};

#define FPERF_HEADER_ALIGN 128u
#define FPERF_COUNT_TIMING_EVERY 1024u

/* Home slot of a function: Fibonacci hashing, shared by daemon and handler
 * so both probe the same sequence.  slot_count >= 2. */
static inline uint32_t fperf_home_slot(uint64_t address, uint32_t slot_shift)
{
    return (uint32_t)((address * 0x9E3779B97F4A7C15ull) >> slot_shift);
}

#ifdef __cplusplus
} /* extern "C" */
static_assert(sizeof(struct fperf_function_slot) == 128, "slot is two cache lines");
#else
_Static_assert(sizeof(struct fperf_function_slot) == 128, "slot is two cache lines");
#endif

#endif /* FPERF_SHM_LAYOUT_H */
