/* iprobe-probe-cost: what `iprobe debug --adapt` measures the runtime's cost
 * per probed call on, so the cost it assigns a function (its calls times
 * this) is measured on this machine, with this runtime, not assumed.
 *
 * Built with iprobe-cc, so iprobe_cost_target has entry and exit probes.
 * Each line on stdin holds N; the answer is the fastest of five runs of N
 * calls, in ns per call, one line on stdout.  EOF ends it. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) void iprobe_cost_target(void) { __asm__ volatile("" ::: "memory"); }

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(void) {
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        const long n = strtol(line, NULL, 10);
        if (n <= 0) return 2;
        double best = 1e300;
        for (int run = 0; run < 5; run++) {
            const double start = now_ns();
            for (long i = 0; i < n; i++) iprobe_cost_target();
            const double per_call = (now_ns() - start) / (double)n;
            if (per_call < best) best = per_call;
        }
        printf("%.3f\n", best);
        fflush(stdout);
    }
    return 0;
}
