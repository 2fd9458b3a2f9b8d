/* The entry flow's pad threshold: small_leaf is a leaf of a few
 * instructions, which iprobe-cc leaves without a pad by default and lists as
 * a relocated entry; big_function calls it and keeps its pad.  "calls N"
 * makes N calls of big_function, each calling small_leaf once, and answers
 * their sum (fixture_serve.h). */
#include "fixture_serve.h"

volatile long sink;

__attribute__((noinline)) long small_leaf(long x) { return x * 3 + (x >> 7); }

__attribute__((noinline)) long big_function(long i) {
    long s = small_leaf(i);
    for (long k = 0; k < (i & 7); k++) {
        s ^= s << 3;
        if (s & 1) sink = s;
    }
    return s & 0xff;
}

static long calls(long n) {
    long sum = 0;
    for (long i = 0; i < n; i++) sum += big_function(i) >= 0;
    return sum;
}

static long answer(const char* name, long n) { return !strcmp(name, "calls") ? calls(n) : -1L; }

int main(int argc, char** argv) { return fixture_serve(argc, argv, "small_leaf_target", answer); }
