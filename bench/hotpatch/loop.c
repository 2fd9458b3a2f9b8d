/*
 * The paper's micro-benchmark: a loop calling an empty function 10^1..10^8
 * times.  Waits for SIGUSR1 (so probes can be attached first), then prints
 * "N ns_per_call" per size (thread CPU time, so preemption on a shared
 * machine does not count).  argv: MAX_EXPONENT [THREADS]; with THREADS
 * every thread runs 10^MAX_EXPONENT calls (logger throughput) instead.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "loop_start.h"

#ifdef WITH_XRAY
#include <stdint.h>
/* extern "C" API of compiler-rt's xray_interface.h (a C++ header) */
int __xray_set_handler(void (*entry)(int32_t, int));
int __xray_patch(void);
static volatile unsigned long xray_events;
__attribute__((xray_never_instrument)) static void xray_count(int32_t fn, int type) {
    (void)fn, (void)type;
    __atomic_fetch_add(&xray_events, 1, __ATOMIC_RELAXED);
}
#endif

/* FIVE_BYTE_BODY (bench/hotpatch/relocated.sh): one 5-byte NOP in the body,
 * so a plain gcc build's entry can be relocated (a bare `ret` is too short). */
#ifdef FIVE_BYTE_BODY
__attribute__((noinline)) void empty(void) { __asm__ __volatile__(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00"); }
#else
__attribute__((noinline)) void empty(void) { __asm__ __volatile__(""); }
#endif

static long calls_per_thread;
static pthread_barrier_t start_line;
static double thread_ns[64];
static void* run(void* arg) {
    const long index = (long)arg;
    empty(); /* claims this thread's ring before the clock starts */
    pthread_barrier_wait(&start_line);
    const double t0 = now_ns();
    for (long i = 0; i < calls_per_thread; i++) empty();
    thread_ns[index] = now_ns() - t0;
    return 0;
}

int main(int argc, char** argv) {
    const int max_exp = argc > 1 ? atoi(argv[1]) : 8;
    const int threads = argc > 2 ? atoi(argv[2]) : 0;  /* 0: the size sweep */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, 0);
#ifdef WITH_XRAY
    __xray_set_handler(xray_count);
    __xray_patch();
#endif
    printf("ready\n");
    fflush(stdout);
    int sig;
    sigwait(&set, &sig);
    if (threads > 0) {
        long n = 1;
        for (int e = 0; e < max_exp; e++) n *= 10;
        calls_per_thread = n;
        pthread_t t[64];
        pthread_barrier_init(&start_line, 0, (unsigned)threads + 1);
        for (long i = 0; i < threads; i++) pthread_create(&t[i], 0, run, (void*)i);
        pthread_barrier_wait(&start_line);
        double total = 0;
        for (int i = 0; i < threads; i++) pthread_join(t[i], 0), total += thread_ns[i];
        /* mean CPU ns per call per thread */
        printf("%ld %.3f\n", n * threads, total / threads / (double)n);
        fflush(stdout);
        sigwait(&set, &sig); /* stay alive for `iprobe report` */
        return 0;
    }
    long n = 1;
    for (int e = 1; e <= max_exp; e++) {
        n *= 10;
        const double t0 = now_ns();
        for (long i = 0; i < n; i++) empty();
        const double t1 = now_ns();
        printf("%ld %.3f\n", n, (t1 - t0) / (double)n);
        fflush(stdout);
    }
    return 0;
}
