/* The entry flow's pad threshold: small_leaf is a leaf of a few
 * instructions, which iprobe-cc leaves without a pad by default and lists as
 * a relocated entry; big_function calls it and keeps its pad.  "calls N"
 * makes N calls of big_function, each calling small_leaf once, and answers
 * their sum.  Protocol of the hotpatch fixture: argv THREADS FIFO,
 * "ready PID", then one "ok NAME VALUE" per command line read from the FIFO. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: small_leaf_target THREADS FIFO\n");
        return 2;
    }
    setvbuf(stdout, 0, _IOLBF, 0);
    printf("ready %d\n", (int)getpid());
    char line[256];
    for (;;) {
        FILE* in = fopen(argv[2], "r");
        if (!in) return 1;
        while (fgets(line, sizeof line, in)) {
            char name[64];
            long n = 0;
            if (sscanf(line, "%63s %ld", name, &n) < 1) continue;
            if (!strcmp(name, "quit")) {
                printf("ok quit 0\n");
                return 0;
            }
            printf("ok %s %ld\n", name, !strcmp(name, "calls") ? calls(n) : -1L);
        }
        fclose(in);
    }
}
