/* The relocation cases of tests/relocate, built with plain gcc -O2 (no
 * iprobe-cc): entries written in reloc_cases.S, and C functions the
 * compiler lays out (endbr64 entries with -fcf-protection, a switch's jump
 * table).
 *
 * Commands arrive one per line on the FIFO given as argv[2] (argv[1], a
 * thread count, is ignored), each acknowledged on stdout as
 * "ok <command> <value>":
 *   run N    call every case N times; value = results that were wrong (0)
 *   quit     exit 0 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rip_load(int x);
int rip_lea(int x);
int short_branch(int x);
int loop_to_entry(int n);
int tiny(void);
int endbr_rip(int x);
int call_first(int x);
int jump_first(int x);
int jrcxz_first(int x);
long keeps_registers(long x);
long keeps_r11(long x);

/* A switch gcc compiles to a jump table (the cases are dense). */
__attribute__((noinline)) int table_switch(int x) {
    switch (x & 7) {
    case 0: return x * 3;
    case 1: return x + 11;
    case 2: return x - 5;
    case 3: return x ^ 0x55;
    case 4: return x << 2;
    case 5: return x >> 1;
    case 6: return -x;
    default: return x * x;
    }
}

/* The same results without a switch. */
static int table_switch_expected(int x) {
    const int results[8] = {x * 3, x + 11, x - 5, x ^ 0x55, x << 2, x >> 1, -x, x * x};
    return results[x & 7];
}

static long run(long n) {
    long wrong = 0;
    for (long i = 0; i < n; i++) {
        const int x = (int)(i % 97);
        wrong += rip_load(x) != 1000 + x;
        wrong += rip_lea(x) != 2000 + x;
        wrong += short_branch(x) != (x == 0 ? -1 : x + 1);
        wrong += loop_to_entry(x) != 2 * (x > 1 ? x : 1);
        wrong += tiny() != 0;
        wrong += endbr_rip(x) != 2000 - x;
        wrong += call_first(x) != 2 * x + 1;
        wrong += jump_first(x) != x + 3;
        wrong += table_switch(x) != table_switch_expected(x);
        wrong += jrcxz_first(x) != (x == 0 ? 0 : x + 1);
        wrong += keeps_registers(x) != 8L * x + 28;
        wrong += keeps_r11(x) != 2L * x + 1;
    }
    return wrong;
}

int main(int argc, char** argv) {
    /* what main was given, for `iprobe run` from the program's first instruction on */
    if (argc >= 2 && strcmp(argv[1], "--args") == 0) {
        printf("argc %d:", argc);
        for (int i = 0; i < argc; i++) printf(" %s", argv[i] ? argv[i] : "(null)");
        printf("\n");
        return 0;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: %s THREADS FIFO\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    for (;;) {
        FILE* in = fopen(argv[2], "r");
        if (!in) return 1;
        char line[128];
        while (fgets(line, sizeof line, in)) {
            long n = 0;
            if (sscanf(line, "run %ld", &n) == 1) {
                printf("ok run %ld\n", run(n));
            } else if (strncmp(line, "quit", 4) == 0) {
                printf("ok quit 0\n");
                return 0;
            }
        }
        fclose(in);
    }
}
