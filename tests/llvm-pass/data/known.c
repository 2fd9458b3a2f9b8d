/* A program with known functions and call counts for the llvm-pass tests. */
#include <stdint.h>
#include <stdio.h>

#include "iprobe/iprobe.h"

#define NOINLINE __attribute__((noinline))

volatile int sink;
static const char known_text[] = "known";

/* A leaf whose locals the compiler would like to keep in the red zone. */
NOINLINE int leaf_redzone(int n) {
    volatile int buf[16];
    for (int i = 0; i < 16; ++i) buf[i] = i * n;
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += buf[i];
    return sum;
}

/* A point in the middle of a leaf, with live red-zone data around it. */
NOINLINE uint64_t point_args(uint64_t a, int b, const char* p, long d) {
    volatile uint64_t around[4] = {a, (uint64_t)b, (uint64_t)(uintptr_t)p, (uint64_t)d};
    IPROBE_POINT_ARGS(known_args, a, b, p, d);
    return around[0] ^ around[1] ^ (around[2] != 0) ^ around[3];
}

NOINLINE int tail_callee(int x) { return x * 3 + sink; }
NOINLINE int tail_caller(int x) { return tail_callee(x + 1); }

NOINLINE int recurse(int n) {
    if (n == 0) return 0;
    const int r = recurse(n - 1);
    sink = r;
    return r + 1;
}

NOINLINE int multi_return(int x) {
    if (x < 3) return -x;
    if (x % 2) return x * 7;
    sink = x;
    return x + 100;
}

NOINLINE double float_work(double x, int n) {
    double acc = x;
    for (int i = 0; i < n; ++i) acc = acc * 1.0001 + (double)i / 3.0;
    return acc;
}

NOINLINE int never_called(int x) { return x + sink; }

IPROBE_NEVER NOINLINE int hidden(int x) { return x - 1; }

IPROBE_ALWAYS NOINLINE int tiny(int x) { return x + sink; }

int main(int argc, char** argv) {
    (void)argv;
    IPROBE_POINT(known_start);
    /* stderr: not part of the output compared with the native build */
    fprintf(stderr, "known_ptr=%#lx\n", (unsigned long)(uintptr_t)known_text);
    long total = 0;
    for (int i = 0; i < 1000; ++i) total += leaf_redzone(i);
    uint64_t x = 0;
    x ^= point_args(0x1122334455667788ull, -1, known_text, 42);
    x ^= point_args(7, 8, (const char*)0, -9);
    x ^= point_args(argc, argc * 2, (const char*)(uintptr_t)0xdeadbeef, 0);
    for (int i = 0; i < 10; ++i) total += tail_caller(i);
    total += recurse(5);
    for (int i = 0; i < 10; ++i) total += multi_return(i);
    total += hidden(10) + tiny(20);
    const double f = float_work(1.5, 1000);
    if (argc > 5) total += never_called(argc);
    printf("total=%ld x=%#llx f=%.17g\n", total, (unsigned long long)x, f);
    return 0;
}
