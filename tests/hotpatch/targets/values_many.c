/* 3000 functions gen_0000..gen_2999 (`long gen_NNNN(long a, long b)`, each
 * returning a * (NNNN + 3) ^ b), built without -g in one binary and with -g in
 * another, plus values_many_typed.c (always -g): the shape of node's static
 * V8, whose DWARF covers a few units and not most of its functions.
 * With --run it calls every one once, prints the sum and exits; without,
 * it prints "ready", does that on SIGUSR1, prints "done" and waits. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

long typed_add(int a, long b);

#define LEAF_FN(d3, d2, d1, d0)                                              \
    __attribute__((noinline)) long gen_##d3##d2##d1##d0(long a, long b) {    \
        return a * (d3 * 1000 + d2 * 100 + d1 * 10 + d0 + 3) ^ b;          \
    }
#define LEAF_REF(d3, d2, d1, d0) gen_##d3##d2##d1##d0,
#define TEN(L, a, b, c) L(a, b, c, 0) L(a, b, c, 1) L(a, b, c, 2) L(a, b, c, 3) L(a, b, c, 4) \
    L(a, b, c, 5) L(a, b, c, 6) L(a, b, c, 7) L(a, b, c, 8) L(a, b, c, 9)
#define HUNDRED(L, a, b) TEN(L, a, b, 0) TEN(L, a, b, 1) TEN(L, a, b, 2) TEN(L, a, b, 3) TEN(L, a, b, 4) \
    TEN(L, a, b, 5) TEN(L, a, b, 6) TEN(L, a, b, 7) TEN(L, a, b, 8) TEN(L, a, b, 9)
#define THOUSAND(L, a) HUNDRED(L, a, 0) HUNDRED(L, a, 1) HUNDRED(L, a, 2) HUNDRED(L, a, 3) HUNDRED(L, a, 4) \
    HUNDRED(L, a, 5) HUNDRED(L, a, 6) HUNDRED(L, a, 7) HUNDRED(L, a, 8) HUNDRED(L, a, 9)
#define ALL(L) THOUSAND(L, 0) THOUSAND(L, 1) THOUSAND(L, 2)

ALL(LEAF_FN)

static long (*const table[])(long, long) = {ALL(LEAF_REF)};

static volatile sig_atomic_t go;
static void on_usr1(int sig) { (void)sig; go = 1; }

static void call_all(void) {
    long sum = typed_add(7, -3);
    for (long i = 0; i < (long)(sizeof table / sizeof table[0]); i++) sum += table[i](i, 1);
    printf("%zu functions, sum %ld\n", sizeof table / sizeof table[0], sum);
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "--run") == 0) {
        call_all();
        return 0;
    }
    signal(SIGUSR1, on_usr1);
    printf("ready\n");
    fflush(stdout);
    while (!go) pause();
    call_all();
    printf("done\n");
    fflush(stdout);
    for (;;) pause();
}
