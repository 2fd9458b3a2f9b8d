/*
 * The trace handler's fast path (trace_fast.S) and the C it shares its
 * per-thread state with (rt.c).
 *
 * The common traced call (an entry probe with its exit probe enabled, no
 * values, no --when, the TSC as the clock, the thread's sums, frames and
 * ring claimed, room in its return stack and its ring) is served in
 * assembler at both ends: the entry takes a return entry, reads the clock,
 * counts the call, pushes its timed frame and appends its record; the exit
 * (return_trampolines.S's common tail) pops the frame into the timed sums
 * and appends its record.  Each step is the C path's own (rt.c:
 * enter_timed, exit_timed, ring_append), in the same order and with the
 * same single-instruction updates (the producer's depth, which a nested
 * handler always gives back before the interrupted one resumes, is a load
 * and a store, as C's t->depth++), so a signal handler probing in between
 * nests exactly as it does in C.  Anything else goes to C before any state
 * changed, except a full ring, which is found only once the record's place
 * is reserved: iprobe_rt_trace_ring_full() then decides as ring_append
 * does (wait in a lossless trace, or give the place back and count the
 * drop; the first to fit after drops puts the GAP record in its place and
 * takes the next).
 *
 * The one source of the offsets both assembler files (trace_fast.S and
 * return_trampolines.S) use: included by them and by rt.c, which asserts
 * each against its struct once (below).
 */
#ifndef IPROBE_RT_TRACE_FAST_H
#define IPROBE_RT_TRACE_FAST_H

/* struct thread_producer (TLS t_producer) */
#define PRODUCER_RING 0
#define PRODUCER_RECORDS 8
#define PRODUCER_MASK 16
#define PRODUCER_RESERVE 24
#define PRODUCER_TAIL_SEEN 32
#define PRODUCER_TID 40
#define PRODUCER_DEPTH 44
#define PRODUCER_SLOT 56

/* rt_layout.h: struct iprobe_rt_probe */
#define FAST_PROBE_SHIFT 6 /* 64 bytes a probe */
#define FAST_PROBE_SIZE (1 << FAST_PROBE_SHIFT)
#define FAST_PROBE_STAT 24
#define FAST_PROBE_TIMED 28
#define FAST_PROBE_RETVAL_HIST 29
#define FAST_PROBE_CONDITION 30
#define FAST_PROBE_VALUES 48
/* The timed byte and the condition in the 32 bits at FAST_PROBE_TIMED, for
 * one test (the entry-only path; the retval histogram's byte between them is
 * the exit's business): two compares measured 0.1-0.3 ns an event more. */
#define FAST_PROBE_TIMED_OR_CONDITION (0xff | 0xffff << ((FAST_PROBE_CONDITION - FAST_PROBE_TIMED) * 8))
/* struct iprobe_rt_fn_stats */
#define FAST_STATS_SIZE 960
#define FAST_STATS_CALLS 0
#define FAST_STATS_COMPLETED 8
#define FAST_STATS_INCLUSIVE 16
#define FAST_STATS_EXCLUSIVE 24
#define FAST_STATS_TIMED 32
#define FAST_STATS_MAX 40
#define FAST_STATS_HISTOGRAM 64
/* struct iprobe_rt_thread and its frames */
#define FAST_THREAD_DEPTH 8
#define FAST_THREAD_STACK 64
#define FAST_FRAME_SIZE 72
#define FAST_FRAME_STAT 0
#define FAST_FRAME_TAG 4 /* low 32 bits of the return slot (rt.c: exit_timed finds a frame by it) */
#define FAST_FRAME_START 8
#define FAST_FRAME_CHILDREN 16
/* struct iprobe_rt_ring, struct iprobe_rt_record */
#define FAST_RING_HEAD 16
#define FAST_RECORD_SHIFT 5 /* 32-byte records */
#define FAST_RECORD_TSC 0
#define FAST_RECORD_PROBE 8 /* probe, then tid: one 8-byte store */
#define FAST_RECORD_TID 12
#define FAST_RECORD_KIND 16 /* kind, nargs, depth, values: one 8-byte store */
#define FAST_RECORD_NARGS 17
#define FAST_RECORD_DEPTH 18
#define FAST_RECORD_VALUES 20
#define FAST_RECORD_FRAME 24
#define FAST_RING_PREFETCH 128 /* records ahead the ring is prefetched (rt.c, here) */

#define FAST_STACK_DEPTH 120 /* IPROBE_RT_STACK_DEPTH */
#define FAST_HIST_BUCKETS 48 /* IPROBE_RT_HIST_BUCKETS */
#define FAST_REC_ENTRY 1
#define FAST_REC_EXIT 2
#define FAST_REC_POINT 3 /* an entry-only event: the entry of a call whose exit is not traced */
#define FAST_COOKIE_TIMED 1 /* rt.c's COOKIE_TIMED */
#define FAST_EXIT_UNSTAMPED 2 /* IPROBE_RT_EXIT_UNSTAMPED (even: its entry's cookie is timed & 1 = 0) */
#define FAST_NO_TIME -1 /* IPROBE_RT_NO_TIME, as a sign-extended immediate */

#ifndef __ASSEMBLER__
#include <stdint.h>

struct iprobe_rt_ring;
struct iprobe_rt_record;
struct iprobe_rt_thread;

/* Per-thread producer state; initial-exec so access is one %fs-relative load. */
struct thread_producer {
    struct iprobe_rt_ring* ring;
    struct iprobe_rt_record* records;
    uint64_t mask;
    uint64_t reserve;     /* next index to hand out (>= ring->head) */
    uint64_t tail_seen;   /* last tail read from the reader */
    uint32_t tid;
    uint32_t depth;       /* handlers active in this thread (signal nesting) */
    uint8_t in_claim;     /* claiming its sums or ring: an event inside is dropped, counted (rt.c) */
    uint8_t no_ring;      /* claim failed or thread exiting: drop, counted */
    uint8_t no_slot;      /* no free thread slot, or thread exiting */
    struct iprobe_rt_thread* slot; /* its sums: iprobe_rt_thread.stats */
    uint64_t gap;         /* events dropped since its last record: a GAP record goes first (rt.c) */
};

#include <stddef.h>

#include "iprobe/formats/rt_layout.h"

_Static_assert(offsetof(struct thread_producer, ring) == PRODUCER_RING &&
                   offsetof(struct thread_producer, records) == PRODUCER_RECORDS &&
                   offsetof(struct thread_producer, mask) == PRODUCER_MASK &&
                   offsetof(struct thread_producer, reserve) == PRODUCER_RESERVE &&
                   offsetof(struct thread_producer, tail_seen) == PRODUCER_TAIL_SEEN &&
                   offsetof(struct thread_producer, tid) == PRODUCER_TID &&
                   offsetof(struct thread_producer, depth) == PRODUCER_DEPTH &&
                   offsetof(struct thread_producer, slot) == PRODUCER_SLOT,
               "trace_fast.S reads the producer");
_Static_assert(FAST_EXIT_UNSTAMPED == IPROBE_RT_EXIT_UNSTAMPED && (FAST_EXIT_UNSTAMPED & FAST_COOKIE_TIMED) == 0 &&
                   (uint64_t)(int64_t)FAST_NO_TIME == IPROBE_RT_NO_TIME &&
                   FAST_COOKIE_TIMED == IPROBE_RT_TIMED,
               "trace_fast.S stamps exits as the layout says");
_Static_assert(sizeof(struct iprobe_rt_probe) == FAST_PROBE_SIZE && offsetof(struct iprobe_rt_probe, stat) == FAST_PROBE_STAT &&
                   offsetof(struct iprobe_rt_probe, timed) == FAST_PROBE_TIMED &&
                   offsetof(struct iprobe_rt_probe, retval_hist) == FAST_PROBE_RETVAL_HIST &&
                   offsetof(struct iprobe_rt_probe, condition) == FAST_PROBE_CONDITION &&
                   sizeof(((struct iprobe_rt_probe*)0)->timed) == 1 &&
                   sizeof(((struct iprobe_rt_probe*)0)->condition) == 2 &&
                   FAST_PROBE_CONDITION - FAST_PROBE_TIMED == 2 &&
                   offsetof(struct iprobe_rt_probe, values) == FAST_PROBE_VALUES &&
                   sizeof(struct iprobe_rt_values_spec) == 8,
               "trace_fast.S and return_trampolines.S read probes");
_Static_assert(sizeof(struct iprobe_rt_fn_stats) == FAST_STATS_SIZE &&
                   offsetof(struct iprobe_rt_fn_stats, calls) == FAST_STATS_CALLS &&
                   offsetof(struct iprobe_rt_fn_stats, completed) == FAST_STATS_COMPLETED &&
                   offsetof(struct iprobe_rt_fn_stats, inclusive_ticks) == FAST_STATS_INCLUSIVE &&
                   offsetof(struct iprobe_rt_fn_stats, exclusive_ticks) == FAST_STATS_EXCLUSIVE &&
                   offsetof(struct iprobe_rt_fn_stats, timed) == FAST_STATS_TIMED &&
                   offsetof(struct iprobe_rt_fn_stats, max_ticks) == FAST_STATS_MAX &&
                   offsetof(struct iprobe_rt_fn_stats, histogram) == FAST_STATS_HISTOGRAM &&
                   IPROBE_RT_HIST_BUCKETS == FAST_HIST_BUCKETS,
               "trace_fast.S writes the sums, return_trampolines.S counts calls");
_Static_assert(offsetof(struct iprobe_rt_thread, depth) == FAST_THREAD_DEPTH &&
                   offsetof(struct iprobe_rt_thread, stack) == FAST_THREAD_STACK &&
                   sizeof(struct iprobe_rt_frame) == FAST_FRAME_SIZE &&
                   offsetof(struct iprobe_rt_frame, stat) == FAST_FRAME_STAT &&
                   offsetof(struct iprobe_rt_frame, tag) == FAST_FRAME_TAG &&
                   offsetof(struct iprobe_rt_frame, start) == FAST_FRAME_START &&
                   offsetof(struct iprobe_rt_frame, children) == FAST_FRAME_CHILDREN &&
                   IPROBE_RT_STACK_DEPTH == FAST_STACK_DEPTH,
               "trace_fast.S pushes and pops frames");
_Static_assert(offsetof(struct iprobe_rt_ring, head) == FAST_RING_HEAD &&
                   sizeof(struct iprobe_rt_record) == 1 << FAST_RECORD_SHIFT &&
                   offsetof(struct iprobe_rt_record, tsc) == FAST_RECORD_TSC &&
                   offsetof(struct iprobe_rt_record, probe) == FAST_RECORD_PROBE &&
                   offsetof(struct iprobe_rt_record, tid) == FAST_RECORD_TID &&
                   offsetof(struct iprobe_rt_record, kind) == FAST_RECORD_KIND &&
                   offsetof(struct iprobe_rt_record, nargs) == FAST_RECORD_NARGS &&
                   offsetof(struct iprobe_rt_record, depth) == FAST_RECORD_DEPTH &&
                   offsetof(struct iprobe_rt_record, values) == FAST_RECORD_VALUES &&
                   offsetof(struct iprobe_rt_record, frame) == FAST_RECORD_FRAME && IPROBE_RT_REC_ENTRY == FAST_REC_ENTRY &&
                   IPROBE_RT_REC_EXIT == FAST_REC_EXIT && IPROBE_RT_REC_POINT == FAST_REC_POINT,
               "trace_fast.S writes records");

/* 1 while the mapped region's clock is the TSC (the fast path reads it with
 * rdtsc); 0 before a region is mapped and with CLOCK_MONOTONIC. */
extern uint32_t iprobe_rt_trace_fast_clock __attribute__((visibility("hidden")));

/* The fast path reserved the record at `index` and found no room: 1 to
 * write it, 0 when it was dropped (counted, the place given back). */
__attribute__((visibility("hidden"))) uint64_t iprobe_rt_trace_ring_full(uint64_t index, uint64_t now);
#endif

#endif
