/* The program `iprobe run` starts in tests/hotpatch/run_test.cpp:
 *   run_target CALLS EXIT_CODE
 * calls leaf() once from a constructor and CALLS times from main, prints its
 * PID and what it sees of LD_PRELOAD, exits with EXIT_CODE. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static volatile int sink;

__attribute__((noinline)) void leaf(int x) { sink += x; }

__attribute__((constructor)) static void before_main(void) { leaf(1); }

int main(int argc, char** argv) {
    const int calls = argc > 1 ? atoi(argv[1]) : 0;
    for (int i = 0; i < calls; i++) leaf(i);
    const char* preload = getenv("LD_PRELOAD");
    printf("pid %d preload %s\n", (int)getpid(), preload ? preload : "(unset)");
    fflush(stdout);
    return argc > 2 ? atoi(argv[2]) : 0;
}
