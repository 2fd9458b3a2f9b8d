/*
 * iprobe-criu-hook: CRIU's action script for `iprobe debug --capture`.
 *
 * At "post-dump" production is still frozen: tell the mirror (its
 * --hook-socket, named in the environment) to read how far production has
 * read each connection, and wait for its answer, at most
 * IPROBE_CHECKPOINT_HOOK_TIMEOUT_MS.  Every other action is ignored.  Always
 * exits 0: CRIU fails a dump whose post-dump script fails, and a mirror
 * that does not answer must not cost production its checkpoint (the
 * session then reports the clone's start as unknown).  C and tiny: it runs
 * while production is frozen.
 */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "iprobe/formats/checkpoint_hook.h"

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int main(void) {
    const char* action = getenv("CRTOOLS_SCRIPT_ACTION");
    const char* path = getenv(IPROBE_CHECKPOINT_HOOK_SOCKET_ENV);
    if (!action || strcmp(action, "post-dump") != 0 || !path) return 0;
    struct sockaddr_un at;
    memset(&at, 0, sizeof at);
    at.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof at.sun_path) return 0;
    strcpy(at.sun_path, path);
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr*)&at, sizeof at) != 0) return 0;
    const char* command = IPROBE_CHECKPOINT_HOOK_COMMAND;
    if (send(fd, command, strlen(command), MSG_NOSIGNAL) != (ssize_t)strlen(command)) return 0;
    const long long deadline = now_ms() + IPROBE_CHECKPOINT_HOOK_TIMEOUT_MS;
    char reply[4096];
    for (;;) {
        const long long left = deadline - now_ms();
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, (int)left) != 1) return 0;
        const ssize_t n = read(fd, reply, sizeof reply);
        if (n <= 0 || memchr(reply, '\n', (size_t)n)) return 0;
    }
}
