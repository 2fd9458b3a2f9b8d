/*
 * What every loop benchmark of bench/hotpatch shares: its clock and its
 * start.  The scripts start the loop, attach probes once it says "ready",
 * then send SIGUSR1.
 */
#ifndef IPROBE_BENCH_LOOP_START_H
#define IPROBE_BENCH_LOOP_START_H

#include <signal.h>
#include <stdio.h>
#include <time.h>

/* CPU time of the calling thread: the machine is shared, and time spent
 * preempted is not the probe's cost. */
static inline double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* Says "ready" and waits for SIGUSR1 (blocked first, so none is lost). */
static inline void wait_for_start(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, 0);
    printf("ready\n");
    fflush(stdout);
    int sig;
    sigwait(&set, &sig);
}

#endif
