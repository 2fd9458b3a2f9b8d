/* `--when` end to end (tests/hotpatch/when_test.cpp): functions whose calls
 * the test counts by hand, driven line by line through a FIFO:
 *   fib N      one fib(N): 2 F(N+1) - 1 calls, F(N-9) of them with n == 10
 *   lookup K   K calls of lookup(key, i) over {"user:41", "user:42", "other",
 *              NULL, (char*)8 (dangling)}, in that order
 *   sleepy US  one sleepy(US): usleep(US)
 * Built -O2 -g with iprobe-cc's entry flow. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fixture_serve.h"

/* noipa: gcc cannot see through it, so fib's second call is no tail call
 * it could turn into a loop: the calls are the textbook tree. */
__attribute__((noipa)) long mix(long a, long b) { return a + b; }

__attribute__((noinline)) long fib(int n) { return n < 2 ? n : mix(fib(n - 1), fib(n - 2)); }

__attribute__((noinline)) int lookup(const char* key, unsigned long len) {
    return ((unsigned long)key > 4096 ? (int)strlen(key) : -1) + (int)len;
}

__attribute__((noinline)) int sleepy(int us) { return usleep((useconds_t)us); }

static long answer(const char* name, long n) {
    static const char* const keys[] = {"user:41", "user:42", "other", 0, (const char*)8};
    long result = 0;
    if (!strcmp(name, "fib")) result = fib((int)n);
    else if (!strcmp(name, "lookup"))
        for (long i = 0; i < n; i++) result += lookup(keys[i % 5], (unsigned long)i);
    else if (!strcmp(name, "sleepy")) result = sleepy((int)n);
    return result;
}

int main(int argc, char** argv) { return fixture_serve(argc, argv, "when_target", answer); }
