/*
 * Target of the killed-injector test (tests/hotpatch/stress_test.cpp): a
 * process that notices if a remote call borrowed one of its threads and gave
 * it back changed.  Four threads: three call probed functions in a tight
 * loop and check their sums; the main thread sleeps in nanosleep (a system
 * call the interrupt restarts) over and over with known values in every
 * vector register (the upper halves of the AVX registers too), in the
 * callee-saved registers and a blocked SIGUSR1, and checks all of them after
 * each sleep.  Any difference: a line on stderr and abort().  Prints "ready"
 * once running; `kill_target` alone runs until killed.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile long sink;

__attribute__((noinline)) long square(long i) { return i * i; }
__attribute__((noinline)) long sum_squares(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += square(i);
    return s;
}

static void* worker(void* arg) {
    (void)arg;
    for (;;) {
        const long s = sum_squares(100);
        if (s != 328350) {
            fprintf(stderr, "kill_target: sum_squares(100) = %ld\n", s);
            abort();
        }
        sink += s;
    }
    return 0;
}

_Alignas(32) uint8_t pattern[16][32] __attribute__((used));

/* Loads every xmm (ymm with AVX) register and rbx, r12-r15 with known
 * values, sleeps `ts` in a raw nanosleep, and returns how many of them
 * changed (0 when all held). */
static int registers_survive_sleep(const struct timespec* sleep_for, int avx) {
    long changed = 0;
    const struct timespec* volatile ts = sleep_for;
#define LOAD(n) "vmovdqu pattern+" #n "*32(%%rip), %%ymm" #n "\n"
#define CHECK(n)                                                   \
    "vpcmpeqb pattern+" #n "*32(%%rip), %%ymm" #n ", %%ymm" #n "\n" \
    "vpmovmskb %%ymm" #n ", %%eax\n"                               \
    "cmp $-1, %%eax\n"                                              \
    "je 1f\n"                                                       \
    "incq %[changed]\n"                                             \
    "1:\n"
#define LOADX(n) "movdqu pattern+" #n "*32(%%rip), %%xmm" #n "\n"
#define CHECKX(n)                                                  \
    "movdqu pattern+" #n "*32(%%rip), %%xmm0\n"                     \
    "pcmpeqb %%xmm" #n ", %%xmm0\n"                                 \
    "pmovmskb %%xmm0, %%eax\n"                                      \
    "cmp $0xffff, %%eax\n"                                          \
    "je 1f\n"                                                       \
    "incq %[changed]\n"                                             \
    "1:\n"
#define GPRS_IN                                                    \
    "mov $0x1111111111111111, %%rbx\n"                              \
    "mov $0x1212121212121212, %%r12\n"                              \
    "mov $0x1313131313131313, %%r13\n"                              \
    "mov $0x1414141414141414, %%r14\n"                              \
    "mov $0x1515151515151515, %%r15\n"
#define GPR_CHECK(reg, value)                                      \
    "mov $" value ", %%rax\n"                                       \
    "cmp %%rax, %%" reg "\n"                                        \
    "je 1f\n"                                                       \
    "incq %[changed]\n"                                             \
    "1:\n"
#define GPRS_OUT                                                   \
    GPR_CHECK("rbx", "0x1111111111111111") GPR_CHECK("r12", "0x1212121212121212") \
    GPR_CHECK("r13", "0x1313131313131313") GPR_CHECK("r14", "0x1414141414141414") \
    GPR_CHECK("r15", "0x1515151515151515")
#define SLEEP "mov $35, %%eax\n mov %[ts], %%rdi\n xor %%esi, %%esi\n syscall\n"
    if (avx)
        __asm__ volatile(GPRS_IN LOAD(0) LOAD(1) LOAD(2) LOAD(3) LOAD(4) LOAD(5) LOAD(6) LOAD(7) LOAD(8) LOAD(9)
                             LOAD(10) LOAD(11) LOAD(12) LOAD(13) LOAD(14) LOAD(15) SLEEP GPRS_OUT CHECK(0) CHECK(1)
                                 CHECK(2) CHECK(3) CHECK(4) CHECK(5) CHECK(6) CHECK(7) CHECK(8) CHECK(9) CHECK(10)
                                     CHECK(11) CHECK(12) CHECK(13) CHECK(14) CHECK(15) "vzeroupper\n"
                         : [changed] "+m"(changed)
                         : [ts] "m"(ts)
                         : "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "rbx", "r12", "r13", "r14",
                           "r15", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                           "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory", "cc");
    else
        __asm__ volatile(GPRS_IN LOADX(1) LOADX(2) LOADX(3) LOADX(4) LOADX(5) LOADX(6) LOADX(7) LOADX(8) LOADX(9)
                             LOADX(10) LOADX(11) LOADX(12) LOADX(13) LOADX(14) LOADX(15) SLEEP GPRS_OUT CHECKX(1)
                                 CHECKX(2) CHECKX(3) CHECKX(4) CHECKX(5) CHECKX(6) CHECKX(7) CHECKX(8) CHECKX(9)
                                     CHECKX(10) CHECKX(11) CHECKX(12) CHECKX(13) CHECKX(14) CHECKX(15)
                         : [changed] "+m"(changed)
                         : [ts] "m"(ts)
                         : "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "rbx", "r12", "r13", "r14",
                           "r15", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                           "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory", "cc");
    return (int)changed;
}

int main(void) {
    for (int r = 0; r < 16; r++)
        for (int b = 0; b < 32; b++) pattern[r][b] = (uint8_t)(r * 37 + b * 11 + 1);
    __builtin_cpu_init();
    const int avx = __builtin_cpu_supports("avx2");
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    for (int i = 0; i < 3; i++) {
        pthread_t t;
        pthread_create(&t, 0, worker, 0);
    }
    pthread_sigmask(SIG_BLOCK, &usr1, 0);
    printf("ready\n");
    fflush(stdout);
    const struct timespec ts = {0, 2000000};
    for (;;) {
        const int changed = registers_survive_sleep(&ts, avx);
        sigset_t now;
        pthread_sigmask(SIG_BLOCK, 0, &now);
        if (changed || !sigismember(&now, SIGUSR1)) {
            fprintf(stderr, "kill_target: %d registers changed across a sleep; SIGUSR1 %s\n", changed,
                    sigismember(&now, SIGUSR1) ? "still blocked" : "unblocked");
            abort();
        }
    }
}
