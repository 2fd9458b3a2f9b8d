/* A program with many functions, for the first attach of many sites
 * (hotpatch.cpp, prepare_in_stop): 512 functions many_000 .. many_777 (three
 * octal digits).  THREADS threads call busy() in a loop (the load, never
 * counted exactly); on the FIFO (fixture_serve.h):
 *   calls N    the serving thread calls every many_* N times; answers N
 *   dlopen 0   loads libm (the maps change); answers 1 when it is loaded */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

#include "fixture_serve.h"

static volatile long sink;

#define ONE(a, b, c) __attribute__((noinline)) void many_##a##b##c(long x) { sink += x ^ 0##a##b##c; }
#define EIGHT(a, b) ONE(a, b, 0) ONE(a, b, 1) ONE(a, b, 2) ONE(a, b, 3) ONE(a, b, 4) ONE(a, b, 5) ONE(a, b, 6) ONE(a, b, 7)
#define SIXTY_FOUR(a) EIGHT(a, 0) EIGHT(a, 1) EIGHT(a, 2) EIGHT(a, 3) EIGHT(a, 4) EIGHT(a, 5) EIGHT(a, 6) EIGHT(a, 7)
SIXTY_FOUR(0) SIXTY_FOUR(1) SIXTY_FOUR(2) SIXTY_FOUR(3) SIXTY_FOUR(4) SIXTY_FOUR(5) SIXTY_FOUR(6) SIXTY_FOUR(7)
#undef ONE
#define ONE(a, b, c) many_##a##b##c,
static void (*const table[])(long) = {SIXTY_FOUR(0) SIXTY_FOUR(1) SIXTY_FOUR(2) SIXTY_FOUR(3)
                                      SIXTY_FOUR(4) SIXTY_FOUR(5) SIXTY_FOUR(6) SIXTY_FOUR(7)};

__attribute__((noinline)) void busy(long x) { sink += x; }

static void* spin(void* arg) {
    (void)arg;
    for (long i = 0;; i++) {
        busy(i);
        if ((i & 1023) == 0) usleep(100);
    }
    return 0;
}

static long answer(const char* name, long n) {
    if (!strcmp(name, "calls")) {
        for (long k = 0; k < n; k++)
            for (unsigned long f = 0; f < sizeof table / sizeof table[0]; f++) table[f](k);
        return n;
    }
    if (!strcmp(name, "dlopen")) return dlopen("libm.so.6", RTLD_NOW) != 0;
    return -1;
}

int main(int argc, char** argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 1;
    for (int i = 0; i < threads; i++) {
        pthread_t t;
        pthread_create(&t, 0, spin, 0);
    }
    return fixture_serve(argc, argv, "many_target", answer);
}
