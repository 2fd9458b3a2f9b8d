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

/* noipa: gcc cannot see through it, so fib's second call is no tail call
 * it could turn into a loop: the calls are the textbook tree. */
__attribute__((noipa)) long mix(long a, long b) { return a + b; }

__attribute__((noinline)) long fib(int n) { return n < 2 ? n : mix(fib(n - 1), fib(n - 2)); }

__attribute__((noinline)) int lookup(const char* key, unsigned long len) {
    return ((unsigned long)key > 4096 ? (int)strlen(key) : -1) + (int)len;
}

__attribute__((noinline)) int sleepy(int us) { return usleep((useconds_t)us); }

int main(int argc, char** argv) {
    if (argc < 3) { /* THREADS (1: the fixture's protocol) FIFO */
        fprintf(stderr, "usage: when_target 1 FIFO\n");
        return 2;
    }
    setvbuf(stdout, 0, _IOLBF, 0);
    const char* keys[] = {"user:41", "user:42", "other", 0, (const char*)8};
    printf("ready %d\n", (int)getpid());
    char line[256];
    for (;;) {
        FILE* in = fopen(argv[2], "r");
        if (!in) return 1;
        while (fgets(line, sizeof line, in)) {
            char name[64];
            long n = 0, result = 0;
            if (sscanf(line, "%63s %ld", name, &n) < 1) continue;
            if (!strcmp(name, "quit")) {
                printf("ok quit 0\n");
                return 0;
            }
            if (!strcmp(name, "fib")) result = fib((int)n);
            else if (!strcmp(name, "lookup"))
                for (long i = 0; i < n; i++) result += lookup(keys[i % 5], (unsigned long)i);
            else if (!strcmp(name, "sleepy")) result = sleepy((int)n);
            printf("ok %s %ld\n", name, result);
        }
        fclose(in);
    }
}
