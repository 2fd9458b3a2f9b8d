/*
 * The bound of an entry-only trace event (issue 32): would writing the
 * record in the site's own stub, as the count handler's entry stub counts
 * (hotpatch/src/stubs.cpp entry_count_stub_bytes), bring the event to the
 * goal, <= 1.3x (rdtsc + count entries only)?  Variants (entry_trace_bound.S),
 * ns an event over a plain call, CPU time, fastest of 15 rounds of 10^6:
 *   count            the count handler's inline entry stub
 *   runtime          today's path: the stub pushes the site's end and the
 *                    id and jumps into the runtime, which keeps 8 registers,
 *                    checks the clock kind, looks the probe up in its table
 *                    (values, timed, --when, stat capacity), finds its TLS
 *                    through @gottpoff, reads the clock, counts, appends,
 *                    and jumps back through the stack
 *   inline           all of it in the site's stub: 6 registers, TLS at
 *                    immediates (%fs:tpoff), the id an immediate, one test
 *                    of the probe's state word at an absolute address,
 *                    direct jmp back to the site's end
 *   inline, no prefetchw / no state check / clock a constant: parts out
 *   inline body entered as today: inline's body, reached and left as
 *                    today's (push, push, jmp *, lea, jmp *-8(%rsp)), so the
 *                    stub's jumps and the body's instructions are apart
 * The slow and ring-full paths are ud2 (never taken: the ring is larger than
 * a round).  Build and run (alone, or under the lock every benchmark on the
 * machine takes):
 *   gcc -O2 -no-pie -o /tmp/entry_trace_bound bench/hotpatch/entry_trace_bound.c bench/hotpatch/entry_trace_bound.S
 *   /tmp/entry_trace_bound
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>

struct producer {  /* runtime/src/trace_fast.h's thread_producer, the words used */
    void* ring;
    void* records;
    uint64_t mask, reserve, tail_seen;
    uint32_t tid, depth;
};
__thread struct producer producer;
__thread uint64_t* stats;
int fast_clock = 1;
uint32_t capacity = 100, stat_capacity = 100, probe_state;
char* probes;

void f_plain(void), f_count(void), f_runtime(void), f_inline(void), f_inline_np(void), f_inline_nc(void),
    f_inline_noclock(void), f_split(void);

#define CALLS 1000000L
#define RING_RECORDS (1ul << 21)
static uint64_t ring_header[8];

static double cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static double per_call(void (*f)(void)) {
    double best = 1e30;
    for (int round = 0; round < 15; round++) {
        producer.reserve = producer.tail_seen = 0;
        const double t0 = cpu_ns();
        for (long i = 0; i < CALLS; i++) {
            f();
            __asm__ __volatile__("");
        }
        const double ns = (cpu_ns() - t0) / CALLS;
        if (ns < best) best = ns;
    }
    return best;
}

static double rdtsc_ns(void) {
    volatile uint64_t acc = 0;
    double best = 1e30;
    for (int round = 0; round < 5; round++) {
        const double t0 = cpu_ns();
        for (long i = 0; i < 10000000; i++) acc += __rdtsc();
        const double ns = (cpu_ns() - t0) / 1e7;
        if (ns < best) best = ns;
    }
    return best;
}

int main(void) {
    probes = calloc(100, 64);
    stats = calloc(100 * 256 / 8, 8);
    producer.ring = ring_header;
    producer.mask = RING_RECORDS - 1;
    producer.records = aligned_alloc(64, 32 * RING_RECORDS);
    memset(producer.records, 0, 32 * RING_RECORDS);
    producer.tid = 77;
    const double rdtsc = rdtsc_ns();
    const double plain = per_call(f_plain);
    const double count = per_call(f_count) - plain;
    const struct {
        const char* name;
        void (*f)(void);
    } variants[] = {{"runtime (today's path)", f_runtime},
                    {"inline", f_inline},
                    {"inline, no prefetchw", f_inline_np},
                    {"inline, no state check", f_inline_nc},
                    {"inline, clock a constant", f_inline_noclock},
                    {"inline body entered as today", f_split}};
    printf("rdtsc %.2f ns a read; plain call %.2f ns; count %.2f ns; rdtsc + count %.2f ns\n\n", rdtsc, plain, count,
           rdtsc + count);
    printf("| variant | ns/event | ratio (entries only) |\n|---|---|---|\n");
    for (unsigned i = 0; i < sizeof variants / sizeof *variants; i++) {
        const double ns = per_call(variants[i].f) - plain;
        printf("| %s | %.2f | %.2f |\n", variants[i].name, ns, ns / (rdtsc + count));
    }
    const uint64_t* record = producer.records;
    if (record[1] != (77ul << 32 | 5) || producer.reserve != CALLS) {
        fprintf(stderr, "records not as written: probe/tid %#lx, reserve %lu\n", record[1], producer.reserve);
        return 1;
    }
    return 0;
}
