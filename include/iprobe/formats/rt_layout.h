/*
 * Layout of a process's iprobe region: an anonymous memfd created by the
 * in-process runtime (so it dies with the process), sized and sealed against
 * shrinking by the attacher, written by the attacher (control block, modules,
 * probes, site hash), by the runtime (thread slots, rings) and read by
 * `iprobe trace/report/status`, which reach it through the process
 * (pidfd_getfd of iprobe_rt_state.region_fd).
 * This header is the single definition; C11 so the runtime can include it.
 *
 *   struct iprobe_rt_control                 at 0
 *   struct iprobe_rt_module  [module_capacity] at modules_offset
 *   struct iprobe_rt_probe   [probe_capacity]  at probes_offset   (global probe index)
 *   struct iprobe_rt_site    [1 << hash_bits]  at hash_offset     (return address -> probe)
 *   struct iprobe_rt_fn_stats[stat_capacity]   at baseline_offset (reader's `--since-last` mark)
 *   struct iprobe_cond_program[condition_capacity] at conditions_offset (`--when`, append-only)
 *   struct iprobe_rt_exit_marks[thread_count] at exit_marks_offset (per thread slot: where a
 *                                            detach lost exits; 0 in a region made before them)
 *   per thread: struct iprobe_rt_thread + struct iprobe_rt_fn_stats[stat_capacity]
 *                                            at threads_offset + i * thread_stride
 *   per ring: struct iprobe_rt_ring + records  at rings_offset + i * ring_stride
 *
 * Aggregates (calls, times, latency histogram per function) live in the
 * thread slots: each slot is written only by the thread that owns it, with
 * plain stores, and readers sum the slots.  A slot keeps its sums when its
 * thread exits and is reused, still summing, by a later thread.  Rings carry
 * the event stream for `iprobe trace` only; their drops never touch the sums.
 * Both are sparse: a slot's or ring's pages cost memory once a thread uses them.
 *
 * The site hash is insert-only open addressing keyed by the return address of
 * the enabled call (site + site size): an entry never moves or disappears, so
 * a thread stopped in the middle of a lookup stays correct across attaches.
 */
#ifndef IPROBE_RT_LAYOUT_H
#define IPROBE_RT_LAYOUT_H

#include <stdint.h>

#include "iprobe/formats/condition.h"

#ifdef __cplusplus
extern "C" {
#endif

#define IPROBE_RT_MAGIC "IPROBERT"
#define IPROBE_RT_VERSION 10u
#define IPROBE_RT_MEMFD_PREFIX "iprobe." /* memfd name iprobe.<pid>: /proc/PID/fd shows /memfd:iprobe.<pid> (deleted) */
#define IPROBE_RT_PATH_MAX 256
#define IPROBE_RT_CACHELINE 64
#define IPROBE_RT_HIST_BUCKETS 48  /* completed calls by floor(log2(inclusive ticks)) */
#define IPROBE_RT_STACK_DEPTH 120  /* timed frames per thread; deeper calls are counted, not timed */
#define IPROBE_RT_RETVAL_BUCKETS 64 /* completed calls by signed log2 of the integer return value */
#define IPROBE_RT_RETVAL_ZERO_BUCKET 32 /* value 0; 32 + bit length for v > 0 (capped 31), 32 - bit length of -v for v < 0 */
#define IPROBE_RT_CONDITIONS 4096  /* compiled `--when` programs a region holds (append-only) */
#define IPROBE_RT_NO_STAT 0xffffffffu
#define IPROBE_RT_RETURN_STACK_FRAMES 1024 /* hooked returns per thread (runtime/src/return_stack.h) */
#define IPROBE_RT_RETURN_POOL_THREADS 1024 /* threads the return pool serves at once (its chunks, return_stack.h) */
#define IPROBE_RT_LOSSLESS_WAIT_S 2        /* longest wait for room in a lossless trace */

#define IPROBE_RT_RETVAL_SIGNED 0x80u

enum iprobe_rt_record_kind {
    IPROBE_RT_REC_ENTRY = 1,
    IPROBE_RT_REC_EXIT = 2,
    IPROBE_RT_REC_POINT = 3,      /* followed by one IPROBE_RT_REC_ARGS record when nargs > 0; at an
                                   * entry probe: the entry of a call whose exit is not traced (none
                                   * of its function's exits on: attach --entry-only), which a reader
                                   * places in its thread's nesting without opening a call */
    IPROBE_RT_REC_ARGS = 4,       /* continuation: the point's integer arguments */
    IPROBE_RT_REC_GAP = 5,        /* just before the next record of its ring: `frame` events of this
                                   * thread its ring dropped there (it was full), so a reader says
                                   * where they were missed and nests what follows afresh */
    IPROBE_RT_REC_EXITS_LOST = 6  /* never in a ring: how a trace file keeps an exit mark
                                   * (struct iprobe_rt_exit_mark): tsc its `at`, tid, probe, and
                                   * `frame` its count */
};

/* ---- values: arguments at entry, return registers at exit, backtraces ----
 * An ENTRY or EXIT record of a probe whose iprobe_rt_probe.values asks for
 * them is followed by `nargs` continuation records (32 bytes each, read as
 * four uint64_t words) holding, in this order:
 *   entry (spec of the entry probe):
 *     gpr[0 .. gprs-1]      rdi, rsi, rdx, rcx, r8, r9 as the function got them
 *     xmm[0 .. xmms-1]      the low 64 bits of xmm0..
 *     per bit i of `strings`, ascending: one word, the bytes copied from gpr[i]
 *       (IPROBE_RT_STRING_NULL, IPROBE_RT_STRING_UNREADABLE, or 0..64; a copy
 *       stops at the first unreadable byte), then 8 words: the bytes
 *     with IPROBE_RT_VALUES_BACKTRACE: one word n, then n return addresses,
 *       the caller's first
 *   exit (spec of the exit probe, IPROBE_RT_VALUES_RETVAL):
 *     rax, rdx, xmm0 (low 64 bits), xmm1 (low 64 bits)
 * The words run on across records; the last record's unused words are 0.
 * Typing is the reader's (DWARF); the target only copies registers. */
#define IPROBE_RT_VALUES_ARGS 0x01u      /* entry probe: capture gprs/xmms/strings */
#define IPROBE_RT_VALUES_RETVAL 0x02u    /* exit probe: capture the return registers */
#define IPROBE_RT_VALUES_BACKTRACE 0x04u /* entry probe: the caller chain, at most `backtrace` frames */
#define IPROBE_RT_VALUES_AT_SITE 0x08u  /* entry probe at a call after the prologue (-finstrument-functions):
                                          * gprs/xmms as its site's recipe (iprobe_rt_site_recipe) finds them */
#define IPROBE_RT_VALUES_HOOK 0x10u     /* with AT_SITE: hook the return through the recipe's return slot;
                                          * the function's exit is then the trampoline's (as its first exit
                                          * probe: spec.distance) */
#define IPROBE_RT_VALUES_COPY 0x20u     /* with AT_SITE: an inlined copy's entry, whose frame is its host's
                                          * return slot: a reader nests it in the call open at that frame
                                          * rather than taking it for a new call there (the old one gone) */
#define IPROBE_RT_VALUES_NO_EXIT 0x40u  /* in a record's spec only (the runtime's, never the attacher's):
                                          * an entry recorded with values whose call's exit is not traced,
                                          * as a plain one is a point at its entry probe (see
                                          * IPROBE_RT_REC_POINT) */
#define IPROBE_RT_VALUES_GPRS 6
#define IPROBE_RT_VALUES_XMMS 8
#define IPROBE_RT_STRING_BYTES 64
#define IPROBE_RT_STRING_NULL UINT64_MAX            /* the pointer was NULL */
#define IPROBE_RT_STRING_UNREADABLE (UINT64_MAX - 1) /* not a single byte readable (dangling) */
#define IPROBE_RT_BACKTRACE_MAX 32
#define IPROBE_RT_VALUES_MAX_WORDS                                                                      \
    (IPROBE_RT_VALUES_GPRS + IPROBE_RT_VALUES_XMMS + IPROBE_RT_VALUES_GPRS * (1 + IPROBE_RT_STRING_BYTES / 8) + \
     1 + IPROBE_RT_BACKTRACE_MAX)

/* A spec as a record carries it: flags, gprs | xmms << 4, strings, backtrace. */
#define IPROBE_RT_VALUES_PACK(s)                                                                      \
    ((uint32_t)(s).flags | (uint32_t)(((s).gprs & 15u) | ((s).xmms & 15u) << 4) << 8 |               \
     (uint32_t)(s).strings << 16 | (uint32_t)(s).backtrace << 24)

/* What a probe captures: written by the attacher (one 8-byte store, so a
 * handler reading it while the attacher changes it sees either whole), read
 * by the handler at each event; all 0 = plain trace. */
struct iprobe_rt_values_spec {
    uint8_t flags;      /* IPROBE_RT_VALUES_* */
    uint8_t gprs;       /* integer argument registers captured, 0..IPROBE_RT_VALUES_GPRS */
    uint8_t xmms;       /* vector argument registers captured, 0..IPROBE_RT_VALUES_XMMS */
    uint8_t strings;    /* bit i: gpr[i] is a char* whose first 64 bytes are copied */
    uint8_t backtrace;  /* caller frames to record, 0..IPROBE_RT_BACKTRACE_MAX */
    uint8_t condition;  /* reserved for --when (runtime/src/values_match.c): 0 = none */
    uint16_t distance;  /* AT_SITE with HOOK: the exit probe its hooked return records is id + distance;
                         * on that exit probe: its entry is id - distance (0: the next, the one
                         * before, as at function-entry sites).  AT_SITE without HOOK (an
                         * inlined copy): not 0 when its exit hooks, id + distance the first,
                         * are on and pop the frame its entry pushes (0: it pushes none) */
};

/* -finstrument-functions flow: the site is a call after the prologue,
 * where the arguments are wherever the compiler moved them.  The attacher
 * evaluates each parameter's DWARF location at the site (and the CFA from
 * the CFI) into a recipe per argument register the reader types by, which
 * the runtime follows without DWARF.  `reg` is a DWARF register number: 0-15
 * the integer registers as at the site (5, rdi, is not: the site's stub
 * takes it), 7 is rsp at the site, 17-32 xmm0-15 (low 64 bits). */
enum iprobe_rt_location_kind {
    IPROBE_RT_LOC_NONE = 0,   /* not there (optimized out at the site): reads 0 */
    IPROBE_RT_LOC_REG = 1,    /* the register's value */
    IPROBE_RT_LOC_MEMORY = 2, /* `size` bytes at reg + offset (reg: rsp, or rbp where it carries the CFA) */
    IPROBE_RT_LOC_VALUE = 3,  /* reg + offset, a value */
    IPROBE_RT_LOC_CONST = 4   /* offset, a value */
};
#define IPROBE_RT_LOC_KIND(k) ((k) & 15u)
#define IPROBE_RT_LOC_SIZE(k) ((k) >> 4)  /* MEMORY: 1, 2, 4 or 8 */
struct iprobe_rt_location {
    uint8_t kind; /* enum iprobe_rt_location_kind | size << 4 */
    uint8_t reg;
    int16_t offset;
};
struct iprobe_rt_site_recipe {
    struct iprobe_rt_location gpr[IPROBE_RT_VALUES_GPRS];
    struct iprobe_rt_location xmm[IPROBE_RT_VALUES_XMMS];
    struct iprobe_rt_location return_slot; /* VALUE: where the return address is (CFA - 8) */
};
/* An exit hook of a function whose entry hooks its return
 * (IPROBE_RT_VALUES_HOOK): its stub goes to a checked exit
 * (runtime/src/site_values.S) that records the exit only when this call's
 * return slot, found at the exit hook as the entry's recipe finds it at
 * the entry, does not hold the trampoline of this function's hooked return:
 * a call entered before values were on (or whose hook failed) keeps its
 * exit, and one entered with them is not recorded twice after values are
 * off again. */
struct iprobe_rt_exit_recipe {
    struct iprobe_rt_location return_slot; /* VALUE: where the return address is (CFA - 8) at the exit hook */
    int32_t hooked_exit;                   /* the exit probe the hooked return records: this probe + hooked_exit */
};
/* Where it lives: in the site's own stub slot (hotpatch/src/stubs.h, 80
 * bytes a probe id at iprobe_rt_module.site_stubs, read-only to the target),
 * after the stub's code; written with the stub, before the site goes live. */
#define IPROBE_RT_SITE_STUB_SIZE 80
#define IPROBE_RT_SITE_RECIPE_OFFSET 20

/* The one place a handler holds a call's values before it records: filled
 * at entry from the argument registers and at exit from the return
 * registers, then handed to iprobe_rt_values_match() (the --when /
 * --min-duration hook); only a call it accepts is recorded.  Only the
 * fields of its kind are set (entry: gpr, xmm when spec.xmms; exit: the
 * rest): the others are not cleared, to keep the hot path short. */
struct iprobe_rt_values {
    uint8_t kind;               /* IPROBE_RT_REC_ENTRY or IPROBE_RT_REC_EXIT */
    uint8_t has_return;         /* exit: 1 when ret/xret hold the function's return registers */
    uint8_t has_duration;       /* exit: 1 when duration is known (the entry was seen by this handler) */
    uint8_t entry_matched;      /* exit: 1 when its entry was recorded (or was not seen: exit-only) */
    uint8_t has_args;           /* exit: 1 when gpr holds the entry's arguments (a --when decided
                                 * at exit kept them in the call's frame) */
    uint8_t pad[3];
    uint64_t gpr[IPROBE_RT_VALUES_GPRS];  /* entry: rdi, rsi, rdx, rcx, r8, r9 */
    uint64_t xmm[IPROBE_RT_VALUES_XMMS];  /* entry: low 64 bits of xmm0-7 */
    uint64_t ret[2];            /* exit: rax, rdx */
    uint64_t xret[2];           /* exit: low 64 bits of xmm0, xmm1 */
    uint64_t duration;          /* exit: clock ticks (iprobe_rt_control.clock) since the entry */
};

/* The TSC where it is invariant (constant_tsc and nonstop_tsc: the cheapest
 * correct clock, bench/hotpatch/clocks.c), else CLOCK_MONOTONIC in ns. */
enum iprobe_rt_clock {
    IPROBE_RT_CLOCK_TSC = 0,
    IPROBE_RT_CLOCK_MONOTONIC = 1
};

enum iprobe_rt_ring_state {
    IPROBE_RT_RING_FREE = 0,
    IPROBE_RT_RING_OWNED = 1,     /* a live thread produces into it */
    IPROBE_RT_RING_RETIRED = 2    /* its thread exited; readable until drained, then reusable */
};

/* Thread slots use the same states; a retired slot keeps its sums. */

/* Which of a function's sums a probe's handler keeps, so a report shows
 * only those (never an estimate): the count handler keeps `calls` from an
 * entry and, only where its exit was asked for, `completed` from the exit;
 * the trace handler also times calls whose entry and exit are both on. */
enum iprobe_rt_kept {
    IPROBE_RT_KEPT_CALLS = 1,
    IPROBE_RT_KEPT_COMPLETED = 2,
    IPROBE_RT_KEPT_TIMES = 4
};

/* iprobe_rt_probe.timed: what a call's exit gets.  An entry probe's byte
 * is derived by the attacher from its function's exit probe (update_timed). */
enum iprobe_rt_timed {
    IPROBE_RT_UNTIMED = 0,        /* entry: no exit of its function on: the call is counted and its
                                   * entry recorded as a point (IPROBE_RT_REC_POINT) */
    IPROBE_RT_TIMED = 1,          /* entry: its exit on: the call gets a timed frame, a duration */
    IPROBE_RT_EXIT_UNSTAMPED = 2  /* entry: its exit on without a time (attach --no-durations): counted
                                   * and completed, no frame, one clock read a call; exit probe (set
                                   * by the attach that turned it on): its EXIT records carry
                                   * IPROBE_RT_NO_TIME, where the time would be */
};
#define IPROBE_RT_NO_TIME UINT64_MAX /* an EXIT record's tsc when its clock was not read (above); a
                                      * GAP record's, when the event after the drops was such an exit */

/* One event; 32 bytes so records never straddle a cache line. */
struct iprobe_rt_record {
    uint64_t tsc;        /* rdtsc at the event (IPROBE_RT_NO_TIME: not read) */
    uint32_t probe;      /* global probe index (iprobe_rt_probe) */
    uint32_t tid;
    uint8_t kind;        /* enum iprobe_rt_record_kind */
    uint8_t nargs;       /* POINT: how many args the next record carries;
                          * ENTRY/EXIT: continuation records of values that follow */
    uint16_t depth;      /* handler nesting in this thread (signal re-entrancy), 0 normally */
    uint32_t values;     /* ENTRY/EXIT recorded with values: the spec they were written under
                          * (IPROBE_RT_VALUES_PACK), so a reader never types its continuation
                          * records by a spec a later attach changed (and sees
                          * IPROBE_RT_VALUES_COPY even with none); 0 otherwise */
    uint64_t frame;      /* ENTRY/EXIT at function-entry sites: the address of the function's
                          * return-address slot (its stack pointer at entry), so a reader
                          * pairs an exit with its entry and sees frames an exception or
                          * longjmp unwound (no exit); 0 elsewhere */
};

/* The ARGS continuation record reuses the slot as four integers. */
struct iprobe_rt_args_record {
    uint64_t args[4];
};

struct iprobe_rt_ring {
    /* producer side (the owning thread) */
    uint32_t state;              /* enum iprobe_rt_ring_state, CAS to claim */
    uint32_t tid;
    uint32_t owner_pid;
    uint32_t waiters;            /* lossless: threads asleep on the futex at `tail` (its low
                                  * 32 bits) until the reader frees room; the reader wakes
                                  * them only when this is non-zero */
    uint64_t head;               /* records published (monotonic); release store */
    uint64_t dropped;            /* records lost because the ring was full */
    uint8_t pad1[IPROBE_RT_CACHELINE - 32];
    /* consumer side (the reader) */
    uint64_t tail;               /* records consumed (monotonic) */
    uint64_t dropped_seen;       /* drops already reported by a reader */
    uint8_t pad2[IPROBE_RT_CACHELINE - 16];
    /* struct iprobe_rt_record records[ring_records] follows */
};

struct iprobe_rt_module {
    char path[IPROBE_RT_PATH_MAX];        /* mapped file, as /proc/PID/maps shows it */
    char probes_path[IPROBE_RT_PATH_MAX]; /* probe source it was enabled from */
    uint8_t build_id[64];
    uint32_t build_id_size;
    uint32_t first_probe;                 /* global index of its probe 0 */
    uint32_t probe_count;
    uint32_t pad;
    uint64_t load_bias;
    uint64_t stub_page;                   /* address of the jump stubs near the module, 0 if none */
    uint32_t stub_used;                   /* stubs written in the page */
    uint32_t pad2;
    uint64_t site_stubs;                  /* per-site stubs near the module, one per probe id, 0 if none */
    uint32_t site_stub_slots;             /* probe ids the area holds */
    uint32_t pad3;
};

struct iprobe_rt_probe {
    uint32_t module;     /* index into the module table */
    uint32_t id;         /* probe id within the module's list */
    uint8_t kind;        /* enum iprobe_probe_kind */
    uint8_t enabled;     /* site currently holds the call */
    uint8_t form;        /* enum iprobe_site_form */
    uint8_t size;
    uint32_t function;   /* link-time address of the probed function (0: unknown,
                          * or beyond 4 GiB); add the module's load_bias */
    uint64_t site;       /* absolute address in the target */
    uint32_t stat;       /* aggregate slot (one per function; entry and exit share it),
                          * IPROBE_RT_NO_STAT when none */
    uint8_t timed;       /* enum iprobe_rt_timed: entry probe: how its calls' exits are kept;
                          * exit probe: IPROBE_RT_EXIT_UNSTAMPED or 0 */
    uint8_t retval_hist; /* exit probe: 0, or the return value's width in bytes (1, 2, 4, 8)
                          * | IPROBE_RT_RETVAL_SIGNED: keep its log2 histogram */
    uint16_t condition;  /* entry probe: 0, or 1 + the index of its `--when` program in the
                          * conditions table (the trace handler; one store switches it) */
    /* Written by the attacher when it turns the site on or off, so a report
     * can say for which part of the time a function's counts were kept. */
    uint64_t live_since_ns;  /* CLOCK_REALTIME when the site last became live; 0 while off */
    uint64_t live_ns;        /* time the site was live before that */
    struct iprobe_rt_values_spec values; /* what the handler captures (0: nothing) */
    uint8_t kept;        /* enum iprobe_rt_kept: what the handlers that turned this
                          * probe on keep for it (OR over attaches; 0: not recorded) */
    uint8_t pad[7];      /* 64 bytes a probe (return_trampolines.S indexes the table) */
};

/* One function's sums in one thread (or summed by a reader). */
struct iprobe_rt_fn_stats {
    uint64_t calls;            /* entries (points: hits) */
    uint64_t completed;        /* exits (timed when their entry was seen by this thread) */
    uint64_t inclusive_ticks;  /* TSC ticks, timed completed calls */
    uint64_t exclusive_ticks;  /* inclusive minus timed callees */
    uint64_t timed;            /* completed calls with a time */
    uint64_t max_ticks;
    uint64_t matched;          /* calls a `--when` condition held for (their events recorded) */
    uint64_t undecided;        /* calls whose exit-time condition could not be evaluated: their
                                * entry had no frame (deeper than IPROBE_RT_STACK_DEPTH) */
    uint64_t histogram[IPROBE_RT_HIST_BUCKETS];
    uint64_t retval_histogram[IPROBE_RT_RETVAL_BUCKETS]; /* with retval_hist on the exit probe */
};

/* A frame's stat once a detach found its exit will never come (its exit
 * hook turned off, its return not hooked): no exit matches it, the next
 * exit below it drops it. */
#define IPROBE_RT_FRAME_ABANDONED 0xffffffffu

struct iprobe_rt_frame {
    uint32_t stat;
    uint32_t tag;              /* low 32 bits of the call's return-address slot, 0 when unknown: the
                                * frame is found again by it at its exit, above frames a longjmp or an
                                * exception abandoned (the runtime's business) */
    uint64_t start;            /* tsc at entry */
    uint64_t children;         /* ticks spent in timed callees */
    uint64_t args[IPROBE_COND_ARGS]; /* integer argument registers at entry, for a condition
                                      * decided at exit (set only then) */
};

struct iprobe_rt_thread {
    uint32_t state;            /* enum iprobe_rt_ring_state, CAS to claim */
    uint32_t tid;              /* last owner */
    uint32_t depth;            /* open frames, may exceed IPROBE_RT_STACK_DEPTH */
    uint32_t pad;
    uint64_t unmatched_exits;  /* exits whose entry this thread never saw (attached mid-call) */
    uint8_t pad1[IPROBE_RT_CACHELINE - 24];
    struct iprobe_rt_frame stack[IPROBE_RT_STACK_DEPTH];
    /* struct iprobe_rt_fn_stats stats[stat_capacity] follows at thread_header_size */
};

/* Where calls in flight lost their exit at a detach (the detacher turned
 * their exit hooks off, their returns not hooked: the -finstrument-functions
 * flow): written by the detacher in its stop, one queue per thread slot,
 * taken by the stream reader (`iprobe trace`), which closes those calls in
 * the thread's nesting just before its first event at or after `at`.  The
 * runtime never touches them. */
#define IPROBE_RT_EXIT_MARKS 8             /* marks a slot keeps until a reader takes them */
#define IPROBE_RT_EXIT_MARK_ANY 0xffffffffu /* probe: calls of more than one function (coalesced) */
struct iprobe_rt_exit_mark {
    uint64_t at;     /* the detach's stop on the region's clock (iprobe_rt_control.clock): every
                      * event of the thread read earlier is before the mark, every later one after */
    uint64_t count;  /* calls of that thread whose exits were lost */
    uint32_t tid;
    uint32_t probe;  /* an exit probe turned off (global index): names their function */
};
/* `state`: marks written (bits 0-15) and taken (bits 16-31), both counting
 * on modulo 2^16 (mark[i % IPROBE_RT_EXIT_MARKS] for taken <= i < written),
 * bumped on each detacher's change (bits 32-62), and bit 63 while a
 * detacher writes.  A reader copies the marks and takes them with one CAS
 * of the whole word, which fails when a detacher touched the queue since
 * it read it; a full queue is coalesced by the detacher, never dropped. */
#define IPROBE_RT_EXIT_MARKS_WRITING (1ull << 63)
struct iprobe_rt_exit_marks {
    uint64_t state;
    struct iprobe_rt_exit_mark mark[IPROBE_RT_EXIT_MARKS];
};

struct iprobe_rt_site {
    uint64_t return_address;  /* 0 == empty slot */
    uint32_t probe;
    uint32_t stat;            /* the probe's aggregate slot: one lookup serves the count handler */
};

struct iprobe_rt_control {
    char magic[8];
    uint32_t version;
    uint32_t header_size;
    uint64_t region_size;
    uint32_t owner_pid;          /* process the region belongs to */
    uint32_t generation;         /* bumped by each attach/detach */
    uint64_t tsc_hz;             /* calibrated by the attacher (1e9 with IPROBE_RT_CLOCK_MONOTONIC) */
    uint64_t tsc_base;           /* tsc (or CLOCK_MONOTONIC ns) at ... */
    uint64_t realtime_ns_base;   /* ... this CLOCK_REALTIME instant */

    uint64_t modules_offset;
    uint32_t module_capacity;
    uint32_t module_count;
    uint64_t probes_offset;
    uint32_t probe_capacity;
    uint32_t probe_count;
    uint64_t hash_offset;
    uint32_t hash_bits;
    uint32_t hash_used;
    uint64_t rings_offset;
    uint64_t ring_stride;        /* bytes per ring incl. its header */
    uint32_t ring_count;
    uint32_t ring_records;       /* power of two */
    uint64_t baseline_offset;    /* stat_capacity sums marked by `report --since-last` */
    uint64_t threads_offset;
    uint64_t thread_stride;      /* bytes per thread slot incl. its stats */
    uint32_t thread_count;
    uint32_t thread_header_size; /* offset of the stats in a slot */
    uint32_t stat_capacity;
    uint32_t stat_count;

    /* counted by the runtime, never blocking */
    uint64_t no_ring_events;     /* a thread found no free ring (trace stream only) */
    uint64_t no_slot_events;     /* no free thread slot, or inside its claim (not in the sums) */
    uint64_t unknown_site_events;/* return address not in the hash */
    uint64_t fork_child_events;  /* (in a forked child's copy, never here) */
    uint32_t clock;              /* enum iprobe_rt_clock: what "tsc" fields count */
    uint32_t pad3;
    uint64_t unhooked_returns;   /* entries whose return could not be hooked (a thread deeper
                                  * than its return stack, the pool exhausted): exits not seen */
    /* Set by a reader that wants every event (`iprobe trace --lossless`): a
     * thread whose ring is full waits for it (spinning, then yielding) instead
     * of dropping; after IPROBE_RT_LOSSLESS_WAIT_S without room the runtime
     * clears it (a reader killed before it could) and drops, counted. */
    uint32_t lossless;
    uint32_t pad4;
    uint64_t lossless_timeouts;  /* waits that gave up (and cleared `lossless`) */
    uint64_t conditions_offset;  /* struct iprobe_cond_program[condition_capacity] */
    uint32_t condition_capacity;
    uint32_t condition_count;    /* programs written so far (never rewritten: a thread may be reading one) */
    /* Written by the detacher, in its stop: calls in flight then whose exit
     * was a site of its own being turned off (the -finstrument-functions
     * flow's exit hooks), their return not hooked: their exits are never
     * recorded (not in completed). */
    uint64_t exits_lost_at_detach;
    uint64_t exit_marks_offset;  /* struct iprobe_rt_exit_marks[thread_count] (0: none) */
    uint64_t exit_marks_written; /* marks written into them so far: a reader looks when it moved */
    uint64_t unhooked_pool_empty;/* of unhooked_returns: the thread held no return-stack chunk and
                                  * found every chunk of the pool held by other threads (more than
                                  * IPROBE_RT_RETURN_POOL_THREADS threads making hooked calls) */
};

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* IPROBE_RT_LAYOUT_H */
