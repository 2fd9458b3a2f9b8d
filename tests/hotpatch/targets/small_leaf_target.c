/* The entry flow's pad threshold: small_leaf is a function of a few
 * instructions, which iprobe-cc leaves without a pad by default and lists as
 * a relocated entry; big_function, over the threshold, keeps its pad.  "calls N"
 * makes N calls of big_function, each calling small_leaf once, and answers
 * their sum (fixture_serve.h). */
#include "fixture_serve.h"

volatile long sink;

__attribute__((noinline)) long small_leaf(long x) { return x * 3 + (x >> 7); }

/* Well over the default threshold of 64 instructions: each step is a few
 * dependent instructions gcc cannot fold. */
#define STEP(k) s = s * 31 + (s >> (k % 7 + 1)) + k; if (s & (1L << (k % 13))) sink = s;
__attribute__((noinline)) long big_function(long i) {
    long s = small_leaf(i);
    STEP(1) STEP(2) STEP(3) STEP(4) STEP(5) STEP(6) STEP(7) STEP(8) STEP(9) STEP(10)
    STEP(11) STEP(12) STEP(13) STEP(14) STEP(15) STEP(16) STEP(17) STEP(18) STEP(19) STEP(20)
    return s & 0xff;
}

static long calls(long n) {
    long sum = 0;
    for (long i = 0; i < n; i++) sum += big_function(i) >= 0;
    return sum;
}

static long answer(const char* name, long n) { return !strcmp(name, "calls") ? calls(n) : -1L; }

int main(int argc, char** argv) { return fixture_serve(argc, argv, "small_leaf_target", answer); }
