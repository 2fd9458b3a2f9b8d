/* Several threads calling one function a known number of times. */
#include <pthread.h>
#include <stdio.h>

#include "iprobe/iprobe.h"

#define THREADS 4
#define CALLS 25000

static volatile long sink;

__attribute__((noinline)) long work(long i) {
    long v = i * 2654435761L;
    sink = v;
    return v & 0xff;
}

static void* worker(void* arg) {
    long sum = 0;
    for (long i = 0; i < CALLS; ++i) sum += work(i);
    IPROBE_POINT_ARGS(worker_done, (long)(size_t)arg, sum);
    return (void*)sum;
}

int main(void) {
    pthread_t threads[THREADS];
    for (long t = 0; t < THREADS; ++t) pthread_create(&threads[t], NULL, worker, (void*)t);
    long total = 0;
    for (int t = 0; t < THREADS; ++t) {
        void* result = NULL;
        pthread_join(threads[t], &result);
        total += (long)result;
    }
    printf("total=%ld\n", total);
    return 0;
}
