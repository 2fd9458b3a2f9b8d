/* A tiny TCP service CRIU cannot checkpoint: it holds a perf_event file
 * descriptor.  Answers every line with "pong\n" so a test can check it keeps
 * serving after a failed clone.  Usage: perf_fd_service PORT */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/perf_event.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static void serve(int conn) {
    char buf[256];
    ssize_t n;
    while ((n = read(conn, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < n; ++i)
            if (buf[i] == '\n' && write(conn, "pong\n", 5) != 5) return;
    }
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s PORT\n", argv[0]);
        return 2;
    }
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.type = PERF_TYPE_SOFTWARE;
    attr.config = PERF_COUNT_SW_TASK_CLOCK;
    if (syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0) < 0) {
        perror("perf_event_open");
        return 1;
    }
    int lsock = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lsock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[1]))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lsock, (struct sockaddr*)&addr, sizeof addr) < 0 || listen(lsock, 16) < 0) {
        perror("bind/listen");
        return 1;
    }
    for (;;) {
        int conn = accept(lsock, NULL, NULL);
        if (conn < 0) continue;
        serve(conn);
        close(conn);
    }
}
