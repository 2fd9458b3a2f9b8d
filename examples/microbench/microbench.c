/*
 * The iProbe paper's micro-benchmark: a loop calling an empty, never-inlined
 * function N times.  Built natively, with -finstrument-functions and
 * coldpatched, it shows what a placeholder costs per call.
 *
 *   microbench N      prints: calls=N total_ns=T ns_per_call=X   (thread CPU time)
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline, noipa)) void empty_function(void) {
    __asm__ volatile("");
}

/* CPU time of this thread: on a shared machine, wall time would count the
 * time other processes ran. */
static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: microbench N\n");
        return 2;
    }
    const long long n = atoll(argv[1]);
    if (n < 0) {
        fprintf(stderr, "microbench: N must be >= 0\n");
        return 2;
    }
    const long long start = now_ns();
    for (long long i = 0; i < n; ++i) empty_function();
    const long long total = now_ns() - start;
    printf("calls=%lld total_ns=%lld ns_per_call=%.3f\n", n, total, n ? (double)total / (double)n : 0.0);
    return 0;
}
