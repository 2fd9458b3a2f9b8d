/*
 * Target of the hotpatch tests, built with iprobe-cc (placeholders NOP'd).
 * THREADS worker threads call work() -> leaf() in a tight loop (the load).
 * Commands arrive one per line on the FIFO given as argv[2]; each is
 * acknowledged on stdout as "ok <command> <value>":
 *   burst N     every worker calls counted() exactly N times (and lib_counted())
 *   signals N   a thread calls counted() N times while SIGUSR2 keeps arriving;
 *               the handler calls in_signal(); prints how many handlers ran
 *   fork N      a forked child calls counted() N times and exits
 *   spawn N     a forked child calls counted() N times, then again N times at
 *               each SIGUSR1 until it is killed; prints the child's pid
 *   churn T N   T short-lived threads, one after another, each call counted() N times
 *   storm T     T threads start, forever, one short-lived thread after another
 *               (calling stormed()), so threads are created and exit at every
 *               moment of an attach; prints T
 *   hold N      N more threads each call held() once and stay alive (their
 *               return-stack chunks held) until `release`; prints N
 *   release     lets them end, joins them; prints how many ended
 *   exec        re-executes itself (same pid, fresh image, same FIFO)
 *   quit
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "iprobe/iprobe.h"

void lib_counted(long i);

static volatile long sink;
#ifdef OTHER_BUILD
const char* hp_build = "other";
#endif
static volatile long burst_generation;
static volatile long burst_calls;
static volatile long burst_done;
static volatile long signals_seen;

__attribute__((noinline)) void leaf(long i) { sink += i; }
__attribute__((noinline)) void work(long i) { leaf(i); sink ^= i; }
__attribute__((noinline)) void counted(long i) { sink += i; }
__attribute__((noinline)) void in_signal(long i) { sink -= i; }
__attribute__((noinline)) void stormed(long i) { sink |= i; }
__attribute__((noinline)) void held(long i) { sink += i; }

static void* worker(void* arg) {
    (void)arg;
    long seen = 0;
    for (long i = 0;; i++) {
        work(i);
        if (burst_generation != seen) {
            seen = burst_generation;
            for (long k = 0; k < burst_calls; k++) counted(k), lib_counted(k);
            __atomic_fetch_add(&burst_done, 1, __ATOMIC_SEQ_CST);
        }
    }
    return 0;
}

static void on_usr2(int sig) {
    (void)sig;
    in_signal(1);
    signals_seen++;
}

struct signal_run { long calls; volatile int done; };

static void* signal_sender(void* arg) {
    pthread_t target = *(pthread_t*)arg;
    for (int i = 0; i < 2000; i++) {
        pthread_kill(target, SIGUSR2);
        usleep(50);
    }
    return 0;
}

static void* churn_thread(void* arg) {
    long n = (long)arg;
    for (long k = 0; k < n; k++) counted(k);
    return 0;
}

static void* storm_thread(void* arg) {
    stormed((long)arg);
    return 0;
}

static void* storm_spawner(void* arg) {
    for (long i = 0;; i++) {
        pthread_t th;
        if (pthread_create(&th, 0, storm_thread, (void*)i) == 0) pthread_join(th, 0);
    }
    return arg;
}

static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_changed = PTHREAD_COND_INITIALIZER;
static long holding, hold_released, held_count;
static pthread_t held_threads[4096];

static void* hold_thread(void* arg) {
    held((long)arg);
    pthread_mutex_lock(&hold_lock);
    holding++;
    pthread_cond_broadcast(&hold_changed);
    while (!hold_released) pthread_cond_wait(&hold_changed, &hold_lock);
    pthread_mutex_unlock(&hold_lock);
    return 0;
}

static long hold_threads(long n) {
    pthread_attr_t small;
    pthread_attr_init(&small);
    pthread_attr_setstacksize(&small, 64 * 1024);
    hold_released = 0;
    holding = 0;
    for (held_count = 0; held_count < n && held_count < 4096; held_count++)
        if (pthread_create(&held_threads[held_count], &small, hold_thread, (void*)held_count) != 0) break;
    pthread_mutex_lock(&hold_lock);
    while (holding < held_count) pthread_cond_wait(&hold_changed, &hold_lock);
    pthread_mutex_unlock(&hold_lock);
    return held_count;
}

static long release_threads(void) {
    pthread_mutex_lock(&hold_lock);
    hold_released = 1;
    pthread_cond_broadcast(&hold_changed);
    pthread_mutex_unlock(&hold_lock);
    for (long t = 0; t < held_count; t++) pthread_join(held_threads[t], 0);
    return held_count;
}

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: hp_target THREADS FIFO\n");
        return 2;
    }
    const int threads = atoi(argv[1]);
    setvbuf(stdout, 0, _IOLBF, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr2;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR2, &sa, 0);
    pthread_t tids[256];
    for (int i = 0; i < threads && i < 256; i++) pthread_create(&tids[i], 0, worker, 0);
    printf("ready %d\n", (int)getpid());
    char line[256];
    for (;;) {
        /* Read and write: the FIFO always has a writer (this), so it never
         * reads EOF; opened for reading only, a command written between the
         * last writer's EOF and the fclose was thrown away with the pipe
         * (an attach's stop landing there made a test wait for ever). */
        FILE* in = fopen(argv[2], "r+");
        if (!in) return 1;
        while (fgets(line, sizeof line, in)) {
            long a = 0, b = 0;
            if (sscanf(line, "burst %ld", &a) == 1) {
#ifndef HP_PLAIN /* the never-instrumented build carries no probes at all */
                IPROBE_POINT_ARGS(burst_started, a, threads, 42, 43);
#endif
                burst_done = 0;
                burst_calls = a;
                __atomic_fetch_add(&burst_generation, 1, __ATOMIC_SEQ_CST);
                while (burst_done < threads) usleep(1000);
                printf("ok burst %ld\n", a * threads);
            } else if (sscanf(line, "signals %ld", &a) == 1) {
                signals_seen = 0;
                pthread_t self = pthread_self(), sender;
                pthread_create(&sender, 0, signal_sender, &self);
                for (long k = 0; k < a; k++) counted(k);
                pthread_join(sender, 0);
                printf("ok signals %ld\n", (long)signals_seen);
            } else if (sscanf(line, "fork %ld", &a) == 1) {
                pid_t child = fork();
                if (child == 0) {
                    for (long k = 0; k < a; k++) counted(k);
                    _exit(0);
                }
                int status = 0;
                waitpid(child, &status, 0);
                printf("ok fork %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
            } else if (sscanf(line, "spawn %ld", &a) == 1) {
                sigset_t usr1;
                sigemptyset(&usr1);
                sigaddset(&usr1, SIGUSR1);
                pid_t child = fork();
                if (child == 0) {
                    pthread_sigmask(SIG_BLOCK, &usr1, 0);
                    for (;;) {
                        for (long k = 0; k < a; k++) counted(k);
                        int sig = 0;
                        sigwait(&usr1, &sig);
                    }
                }
                printf("ok spawn %d\n", (int)child);
            } else if (sscanf(line, "churn %ld %ld", &a, &b) == 2) {
                for (long t = 0; t < a; t++) {
                    pthread_t th;
                    pthread_create(&th, 0, churn_thread, (void*)b);
                    pthread_join(th, 0);
                }
                printf("ok churn %ld\n", a * b);
            } else if (sscanf(line, "storm %ld", &a) == 1) {
                for (long t = 0; t < a; t++) {
                    pthread_t th;
                    pthread_create(&th, 0, storm_spawner, 0);
                    pthread_detach(th);
                }
                printf("ok storm %ld\n", a);
            } else if (sscanf(line, "hold %ld", &a) == 1) {
                printf("ok hold %ld\n", hold_threads(a));
            } else if (strncmp(line, "release", 7) == 0) {
                printf("ok release %ld\n", release_threads());
            } else if (strncmp(line, "exec", 4) == 0) {
                printf("ok exec 0\n");
                fclose(in);
                execv("/proc/self/exe", argv);
                return 1;
            } else if (strncmp(line, "quit", 4) == 0) {
                printf("ok quit 0\n");
                return 0;
            }
        }
        fclose(in);
    }
}
