/* A program with a known call structure, for fperf's tests.  Built with
 * -finstrument-functions.  Exact call counts per run (mode "once"):
 *   main 1, hot_loop 1, hot_leaf 1000000, once_a 1, once_b 1,
 *   fib 21891 (fib(20)), thread_main 2, thread_work 2000, stray_exit_caller 1,
 *   fault_pages 1 (takes at least FAULTED_PAGES page faults), nap 1 (sleeps:
 *   at least one context switch).
 * Mode "serve SECONDS": repeats hot_leaf in rounds with short sleeps, so a
 * profiler can attach while it runs; prints the checksum and exits 0.
 * Mode "churn N": N threads one after another, each thread_main once. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) void hot_leaf(unsigned long i) { sink += i * 2654435761u; }

__attribute__((noinline)) void hot_loop(unsigned long n)
{
    for (unsigned long i = 0; i < n; i++) hot_leaf(i);
}

__attribute__((noinline)) void once_a(void) { sink ^= 0xa; }
__attribute__((noinline)) void once_b(void)
{
    /* long enough to stand out per call */
    for (int i = 0; i < 200000; i++) sink += (unsigned long)i;
}

/* gcc can merge the exit hook calls of functions inlined into one caller
 * into one call; when the probes of one of them are removed, the others'
 * exits arrive with no entry.  This caller delivers such a stray exit (of
 * once_a) while its own sample is open. */
void __cyg_profile_func_exit(void* this_fn, void* call_site);
__attribute__((noinline)) void stray_exit_caller(void)
{
    __cyg_profile_func_exit((void*)once_a, __builtin_return_address(0));
    sink += 1;
}

__attribute__((noinline)) unsigned long fib(unsigned n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

__attribute__((noinline)) void thread_work(int i) { sink += (unsigned long)i; }

void* thread_main(void* arg)
{
    (void)arg;
    for (int i = 0; i < 1000; i++) thread_work(i);
    return NULL;
}

#define FAULTED_PAGES 64
__attribute__((noinline)) void fault_pages(void)
{
    const size_t page = 4096;
    volatile char* p = mmap(NULL, FAULTED_PAGES * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) abort();
    for (size_t i = 0; i < FAULTED_PAGES; i++) p[i * page] = 1;
    munmap((void*)p, FAULTED_PAGES * page);
}

__attribute__((noinline)) void nap(void)
{
    struct timespec pause = {0, 2000000};
    nanosleep(&pause, NULL);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char** argv)
{
    if (argc > 2 && strcmp(argv[1], "serve") == 0) {
        double until = now_s() + atof(argv[2]);
        unsigned long rounds = 0;
        while (now_s() < until) {
            hot_loop(100000);
            rounds++;
            struct timespec pause = {0, 5000000};
            nanosleep(&pause, NULL);
        }
        printf("rounds %lu ok\n", rounds);
        return 0;
    }
    if (argc > 2 && strcmp(argv[1], "churn") == 0) {
        const int n = atoi(argv[2]);
        for (int i = 0; i < n; i++) {
            pthread_t thread;
            pthread_create(&thread, NULL, thread_main, NULL);
            pthread_join(thread, NULL);
        }
        printf("churn %d ok\n", n);
        return 0;
    }
    pthread_t threads[2];
    for (int t = 0; t < 2; t++) pthread_create(&threads[t], NULL, thread_main, NULL);
    hot_loop(1000000);
    once_a();
    once_b();
    stray_exit_caller();
    fault_pages();
    nap();
    unsigned long f = fib(20);
    for (int t = 0; t < 2; t++) pthread_join(threads[t], NULL);
    printf("fib %lu\n", f);
    return f == 6765 ? 0 : 1;
}
