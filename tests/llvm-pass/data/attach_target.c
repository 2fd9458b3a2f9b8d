/*
 * A target for `iprobe attach`: waits until the file DIR/go exists, then
 * runs a known workload on several threads, creates DIR/done, and sleeps
 * until killed (so the tracer can read its rings).
 *
 *   attach_target DIR
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "iprobe/iprobe.h"

#define THREADS 3
#define CALLS 1000

static volatile long sink;
static char dir[4096];

__attribute__((noinline)) long attach_work(long i) {
    sink = i;
    return i & 3;
}

__attribute__((noinline)) long attach_tail(long i) { return attach_work(i + 1); }

static void* worker(void* arg) {
    long sum = 0;
    for (long i = 0; i < CALLS; ++i) sum += attach_work(i) + attach_tail(i);
    IPROBE_POINT_ARGS(attach_point, 0x1234, -5L, (long)(size_t)arg, 0x7fffffffffffffffL);
    return (void*)sum;
}

static int exists(const char* name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    snprintf(dir, sizeof dir, "%s", argv[1]);
    printf("ready\n");
    fflush(stdout);
    while (!exists("go")) usleep(5000);
    pthread_t threads[THREADS];
    for (long t = 0; t < THREADS; ++t) pthread_create(&threads[t], NULL, worker, (void*)t);
    long total = 0;
    for (int t = 0; t < THREADS; ++t) {
        void* result;
        pthread_join(threads[t], &result);
        total += (long)result;
    }
    printf("total=%ld\n", total);
    fflush(stdout);
    char path[4200];
    snprintf(path, sizeof path, "%s/done", dir);
    fclose(fopen(path, "w"));
    for (;;) pause();
}
