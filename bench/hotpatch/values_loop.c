/*
 * The values benchmark's target (bench/hotpatch/values.sh): a loop calling a
 * function of two integer arguments that returns one, 10^1..10^MAX times.
 * Waits for SIGUSR1 (so probes can be attached first), then prints
 * "N ns_per_call" per size in CPU time of the calling thread (preemption on
 * a shared machine does not count).  argv: MAX_EXPONENT.
 * Built with -DINLINED_COPY add2 is inlined into the loop: in the
 * -finstrument-functions flow its hooks stay there, an inlined copy's.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "loop_start.h"

#ifdef INLINED_COPY
static inline __attribute__((always_inline)) long add2(long a, long b) {
#else
__attribute__((noinline)) long add2(long a, long b) {
#endif
    __asm__ __volatile__("");
    return a + b;
}

int main(int argc, char** argv) {
    const int max_exp = argc > 1 ? atoi(argv[1]) : 6;
    wait_for_start();
    volatile long sink = add2(1, 2); /* claims this thread's ring before the clock starts */
    long n = 1;
    for (int e = 1; e <= max_exp; e++) {
        n *= 10;
        const double t0 = now_ns();
        long sum = 0;
        for (long i = 0; i < n; i++) sum += add2(i, 7);
        const double t = now_ns() - t0;
        sink += sum;
        printf("%ld %.3f\n", n, t / (double)n);
    }
    (void)sink;
    return 0;
}
