/* A paced redis client: COUNT copies of one command on one connection at
 * RATE per second (an open loop: commands go out on schedule whether or not
 * replies came back), replies counted as whole RESP values.  Used by the
 * debug-window tests and bench/debug-window/run.sh to load production at a
 * chosen share of its capacity.
 *
 *   launcher_paced_client [-n PER_CONNECTION] HOST:PORT RATE COUNT ARG...
 *
 * With -n, each connection carries PER_CONNECTION commands, then waits for
 * their replies and closes, and the next one opens (clients that come and
 * go, as a re-cloned debug session's mirror needs them to).
 * Prints {"sent":N,"replies":N,"seconds":S,"rate":R,"connections":C} and
 * exits 0 once every reply came, 1 when a connection failed or closed early. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Bytes of the RESP value at p (at most n), 0 when incomplete. */
static size_t value_size(const char* p, size_t n) {
    const char* nl = memchr(p, '\n', n);
    if (!nl || nl == p) return 0;
    size_t head = (size_t)(nl - p) + 1;
    long v = strtol(p + 1, NULL, 10);
    switch (p[0]) {
    case '+': case '-': case ':': return head;
    case '$': return v < 0 ? head : (head + (size_t)v + 2 <= n ? head + (size_t)v + 2 : 0);
    case '*': {
        size_t at = head;
        for (long i = 0; i < v; i++) {
            size_t one = at < n ? value_size(p + at, n - at) : 0;
            if (!one) return 0;
            at += one;
        }
        return at;
    }
    default:
        fprintf(stderr, "paced_client: not RESP: %.20s\n", p);
        exit(1);
    }
}

struct reader {
    int fd;
    long want, replies;
};

static void* read_replies(void* arg) {
    struct reader* r = arg;
    size_t cap = 1 << 22, len = 0;
    char* buf = malloc(cap);
    while (r->replies < r->want) {
        if (len == cap) buf = realloc(buf, cap *= 2);
        ssize_t got = recv(r->fd, buf + len, cap - len, 0);
        if (got <= 0) break;
        len += (size_t)got;
        size_t at = 0, one;
        while (at < len && (one = value_size(buf + at, len - at)) != 0) {
            at += one;
            r->replies++;
        }
        memmove(buf, buf + at, len - at);
        len -= at;
    }
    free(buf);
    return NULL;
}

static int connect_to(const struct sockaddr_in* to) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (const struct sockaddr*)to, sizeof *to) != 0) {
        perror("paced_client: connect");
        exit(1);
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int main(int argc, char** argv) {
    long per_connection = 0;
    if (argc > 2 && strcmp(argv[1], "-n") == 0) {
        per_connection = atol(argv[2]);
        argv += 2;
        argc -= 2;
    }
    if (argc < 5) {
        fprintf(stderr, "usage: %s [-n PER_CONNECTION] HOST:PORT RATE COUNT ARG...\n", argv[0]);
        return 2;
    }
    char host[64];
    const char* colon = strrchr(argv[1], ':');
    if (!colon || (size_t)(colon - argv[1]) >= sizeof host) return 2;
    memcpy(host, argv[1], (size_t)(colon - argv[1]));
    host[colon - argv[1]] = 0;
    const double rate = atof(argv[2]);
    const long count = atol(argv[3]);
    /* The command, once, in RESP. */
    size_t cmd_len = 0;
    char* cmd = malloc(1 << 16);
    cmd_len += (size_t)sprintf(cmd, "*%d\r\n", argc - 4);
    for (int i = 4; i < argc; i++) cmd_len += (size_t)sprintf(cmd + cmd_len, "$%zu\r\n%s\r\n", strlen(argv[i]), argv[i]);

    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &to.sin_addr) != 1) return 2;
    if (per_connection <= 0) per_connection = count;
    const double start = now_s();
    long sent = 0, replies = 0, connections = 0;
    char* batch = malloc(cmd_len * 1024);
    while (sent < count) {
        const long until = sent + per_connection < count ? sent + per_connection : count;
        const int fd = connect_to(&to);
        connections++;
        struct reader r = {fd, until - sent, 0};
        pthread_t t;
        pthread_create(&t, NULL, read_replies, &r);
        while (sent < until) {
            long due = (long)((now_s() - start) * rate) + 1;
            if (due > until) due = until;
            long n = due - sent;
            if (n > 1024) n = 1024;
            for (long i = 0; i < n; i++) memcpy(batch + (size_t)i * cmd_len, cmd, cmd_len);
            size_t left = (size_t)n * cmd_len, off = 0;
            while (left) {
                ssize_t w = send(fd, batch + off, left, MSG_NOSIGNAL);
                if (w <= 0) {
                    perror("paced_client: send");
                    return 1;
                }
                off += (size_t)w;
                left -= (size_t)w;
            }
            sent += n;
            struct timespec tick = {0, 1000000};
            nanosleep(&tick, NULL);
        }
        pthread_join(t, NULL);
        close(fd);
        replies += r.replies;
        if (r.replies != r.want) break;
    }
    const double seconds = now_s() - start;
    printf("{\"sent\":%ld,\"replies\":%ld,\"seconds\":%.3f,\"rate\":%.1f,\"connections\":%ld}\n", sent, replies,
           seconds, seconds > 0 ? (double)sent / seconds : 0.0, connections);
    return replies == count ? 0 : 1;
}
