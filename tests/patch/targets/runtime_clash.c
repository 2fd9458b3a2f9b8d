/* A program that defines a function the iprobe runtime calls (close, which
   the whole process, the runtime included, then calls through this
   definition): `iprobe patch` must refuse to replace it. */
#include <time.h>

long syscall(long number, ...);

__attribute__((noinline)) int close(int fd) { return (int)syscall(3 /* SYS_close */, fd); }

int main(void) {
    for (;;) {
        struct timespec t = {0, 50 * 1000 * 1000};
        nanosleep(&t, 0);
        close(-1);
    }
}
