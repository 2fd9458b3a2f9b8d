/*
 * `--when` micro-benchmark (bench/hotpatch/when.sh): a loop calling
 * work(i, i) 10^N times, where work is an empty function of two integer
 * arguments.  Waits for SIGUSR1 (probes attached first), then prints
 * "N ns_per_call" (thread CPU time: preemption on a shared machine does not
 * count).  argv: EXPONENT.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "loop_start.h"

__attribute__((noinline)) long work(long n, long m) {
    __asm__ __volatile__("" : "+r"(n) : "r"(m));
    return n;
}

int main(int argc, char** argv) {
    const int exp = argc > 1 ? atoi(argv[1]) : 7;
    wait_for_start();
    long n = 1;
    for (int e = 0; e < exp; e++) n *= 10;
    work(0, 0); /* claims this thread's slot and ring before the clock starts */
    volatile long sink = 0;
    const double t0 = now_ns();
    for (long i = 0; i < n; i++) sink += work(i, i);
    const double t1 = now_ns();
    printf("%ld %.3f\n", n, (t1 - t0) / (double)n);
    fflush(stdout);
    return 0;
}
