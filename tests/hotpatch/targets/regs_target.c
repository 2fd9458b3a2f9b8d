/* The register-preservation target (regs_leaf.S): "check N" makes N calls of
 * the probed leaf and answers how many changed a register they should not
 * have.  Protocol of the hotpatch fixture: argv THREADS FIFO, "ready PID",
 * then one "ok NAME VALUE" per command line read from the FIFO. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

long rg_check(long calls);

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: regs_target THREADS FIFO\n");
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
            printf("ok %s %ld\n", name, !strcmp(name, "check") ? rg_check(n) : -1L);
        }
        fclose(in);
    }
}
