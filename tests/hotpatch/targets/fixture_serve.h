/* The hotpatch fixture's protocol (hotpatch_fixture.h), for targets with one
 * command word: argv THREADS FIFO, "ready PID", then one "ok NAME VALUE" per
 * "NAME N" line read from the FIFO (VALUE = answer(NAME, N)), until "quit". */
#ifndef IPROBE_TEST_FIXTURE_SERVE_H
#define IPROBE_TEST_FIXTURE_SERVE_H

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int fixture_serve(int argc, char** argv, const char* program, long (*answer)(const char* name, long n)) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s THREADS FIFO\n", program);
        return 2;
    }
    setvbuf(stdout, 0, _IOLBF, 0);
    printf("ready %d\n", (int)getpid());
    char line[256];
    for (;;) {
        /* Read and write: the FIFO always has a writer (this), so it never
         * reads EOF; opened for reading only, a command written between the
         * last writer's EOF and the fclose was thrown away with the pipe
         * (an attach's stop landing there made a test wait for ever). */
        FILE* in = fopen(argv[2], "r+");
        if (!in) return 1;
        while (fgets(line, sizeof line, in)) {
            char name[64];
            long n = 0;
            if (sscanf(line, "%63s %ld", name, &n) < 1) continue;
            if (!strcmp(name, "quit")) {
                printf("ok quit 0\n");
                return 0;
            }
            printf("ok %s %ld\n", name, answer(name, n));
        }
        fclose(in);
    }
}

#endif
