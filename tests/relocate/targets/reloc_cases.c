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
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <unwind.h>

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
int call_unwound(int x);
int call_unwound_indirect(int x);

static long run(long n);

/* Called first thing by call_unwound(_indirect): x + 7 when the unwinder,
 * walking from here, reaches run().  It finds its way through the return
 * address the call left (or, with returned_from's own return hooked, the
 * one the return trampoline's unwind table gives back): an address in a
 * relocated entry's trampoline, which no unwind table describes, ends the
 * walk there (a C++ throw beneath it called std::terminate). */
static _Unwind_Reason_Code find_run(struct _Unwind_Context* context, void* found) {
    if (_Unwind_FindEnclosingFunction((void*)_Unwind_GetIP(context)) == (void*)run) *(int*)found = 1;
    return _URC_NO_REASON;
}
__attribute__((noinline)) int returned_from(int x) {
    int found = 0;
    _Unwind_Backtrace(find_run, &found);
    return found ? x + 7 : -1;
}
int (*const returned_from_pointer)(int) = returned_from;

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

static __attribute__((noinline)) long run(long n) {
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
        wrong += call_unwound(x) != x + 7;
        wrong += call_unwound_indirect(x) != x + 7;
    }
    return wrong;
}

/* --libc N THREADS: each thread (the main one too) calls sigprocmask and
 * getppid N times: libc's functions, for attach --module libc.so.6 */
static long g_libc_calls;
static void* call_libc(void* unused) {
    (void)unused;
    sigset_t none;
    sigemptyset(&none);
    for (long i = 0; i < g_libc_calls; i++) {
        sigprocmask(SIG_BLOCK, &none, NULL);
        if (getppid() == 0) abort();
    }
    return NULL;
}

static int libc_calls(long n, int threads) {
    g_libc_calls = n;
    pthread_t t[64];
    if (threads > 64) threads = 64;
    for (int i = 1; i < threads; i++) pthread_create(&t[i], NULL, call_libc, NULL);
    call_libc(NULL);
    for (int i = 1; i < threads; i++) pthread_join(t[i], NULL);
    printf("libc calls %ld in %d threads\n", n, threads);
    return 0;
}

int main(int argc, char** argv) {
    if (argc == 4 && strcmp(argv[1], "--libc") == 0) return libc_calls(atol(argv[2]), atoi(argv[3]));
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
        /* Read and write: the FIFO always has a writer (this), so it never
         * reads EOF; opened for reading only, a command written between the
         * last writer's EOF and the fclose was thrown away with the pipe
         * (an attach's stop landing there made a test wait for ever). */
        FILE* in = fopen(argv[2], "r+");
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
