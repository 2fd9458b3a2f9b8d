/*
 * What a timestamp costs on this machine, for the runtime's choice of clock:
 * rdtsc, rdtscp, lfence;rdtsc and clock_gettime(CLOCK_MONOTONIC) (vDSO), each
 * read 10^7 times back to back, ns per read (CPU time, fastest of 5 rounds).
 * Also prints whether the TSC is invariant (constant_tsc and nonstop_tsc in
 * /proc/cpuinfo), without which a TSC is not a clock.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>

#define READS 10000000L

static double cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static volatile uint64_t sink;

static double per_read(int which) {
    double best = 1e30;
    for (int round = 0; round < 5; round++) {
        uint64_t acc = 0;
        unsigned aux;
        struct timespec ts;
        const double t0 = cpu_ns();
        for (long i = 0; i < READS; i++) {
            switch (which) {
            case 0: acc += __rdtsc(); break;
            case 1: acc += __rdtscp(&aux); break;
            case 2: _mm_lfence(); acc += __rdtsc(); break;
            default: clock_gettime(CLOCK_MONOTONIC, &ts); acc += (uint64_t)ts.tv_nsec; break;
            }
        }
        const double ns = (cpu_ns() - t0) / READS;
        sink = acc;
        if (ns < best) best = ns;
    }
    return best;
}

static int cpu_flag(const char* flag) {
    FILE* f = fopen("/proc/cpuinfo", "r");
    if (!f) return 0;
    char line[8192];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        if (strncmp(line, "flags", 5) == 0) {
            char want[64];
            snprintf(want, sizeof want, " %s", flag);
            const char* at = strstr(line, want);
            found = at && (at[strlen(want)] == ' ' || at[strlen(want)] == '\n');
        }
    fclose(f);
    return found;
}

int main(void) {
    printf("| clock | ns per read |\n|---|---|\n");
    static const char* names[] = {"rdtsc", "rdtscp", "lfence; rdtsc", "clock_gettime(CLOCK_MONOTONIC)"};
    for (int i = 0; i < 4; i++) printf("| %s | %.2f |\n", names[i], per_read(i));
    printf("constant_tsc: %s, nonstop_tsc: %s\n", cpu_flag("constant_tsc") ? "yes" : "no",
           cpu_flag("nonstop_tsc") ? "yes" : "no");
    return 0;
}
