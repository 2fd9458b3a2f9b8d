/*
 * echo-service: a small multi-threaded TCP line service, the sample
 * production service of iprobe's examples and tests.
 *
 *   echo-service [--port N] [--threads N]     (port 0 = any free port)
 *
 * Each worker thread accepts connections on the shared listening socket and
 * serves one connection at a time.  A request is one line; the reply is one
 * line:
 *   ECHO text      -> text
 *   UPPER text     -> TEXT
 *   REV text       -> txet
 *   SUM 1 2 3      -> 6
 *   STATS          -> connections=N requests=M
 *   QUIT           -> bye (connection closed)
 *   SHUTDOWN       -> bye (server stops: workers joined, totals printed)
 *   anything else  -> ERR unknown command
 * SIGINT/SIGTERM also shut it down cleanly.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_LINE 4096
#define MAX_THREADS 64

static int listen_fd = -1;
static atomic_int stopping;
static atomic_long connections_served;
static atomic_long requests_served;

struct connection {
    int fd;
    char buf[MAX_LINE];
    size_t used;
};

static void request_shutdown(void) {
    if (atomic_exchange(&stopping, 1)) return;
    /* Wakes every thread blocked in accept(). */
    shutdown(listen_fd, SHUT_RDWR);
}

static void on_signal(int sig) {
    (void)sig;
    atomic_store(&stopping, 1);
    shutdown(listen_fd, SHUT_RDWR);
}

static int send_all(int fd, const char *data, size_t len) {
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

static void to_upper(char *text) {
    for (; *text; ++text) *text = (char)toupper((unsigned char)*text);
}

static void reverse(char *text) {
    size_t n = strlen(text);
    for (size_t i = 0; i < n / 2; ++i) {
        char c = text[i];
        text[i] = text[n - 1 - i];
        text[n - 1 - i] = c;
    }
}

static long sum_numbers(const char *text) {
    long total = 0;
    char *end;
    for (;;) {
        long v = strtol(text, &end, 10);
        if (end == text) break;
        total += v;
        text = end;
    }
    return total;
}

enum verdict { KEEP_OPEN, CLOSE, STOP };

/* Builds the reply to one request line (without its newline) in `reply`. */
static enum verdict handle_request(char *line, char *reply, size_t reply_size) {
    char *arg = strchr(line, ' ');
    if (arg) *arg++ = '\0';
    else arg = line + strlen(line);
    atomic_fetch_add(&requests_served, 1);
    if (strcmp(line, "ECHO") == 0) {
        snprintf(reply, reply_size, "%s\n", arg);
    } else if (strcmp(line, "UPPER") == 0) {
        to_upper(arg);
        snprintf(reply, reply_size, "%s\n", arg);
    } else if (strcmp(line, "REV") == 0) {
        reverse(arg);
        snprintf(reply, reply_size, "%s\n", arg);
    } else if (strcmp(line, "SUM") == 0) {
        snprintf(reply, reply_size, "%ld\n", sum_numbers(arg));
    } else if (strcmp(line, "STATS") == 0) {
        snprintf(reply, reply_size, "connections=%ld requests=%ld\n", atomic_load(&connections_served),
                 atomic_load(&requests_served));
    } else if (strcmp(line, "QUIT") == 0) {
        snprintf(reply, reply_size, "bye\n");
        return CLOSE;
    } else if (strcmp(line, "SHUTDOWN") == 0) {
        snprintf(reply, reply_size, "bye\n");
        return STOP;
    } else {
        snprintf(reply, reply_size, "ERR unknown command\n");
    }
    return KEEP_OPEN;
}

static void serve_connection(struct connection *c) {
    char reply[MAX_LINE + 64];
    for (;;) {
        char *nl;
        while ((nl = memchr(c->buf, '\n', c->used)) != NULL) {
            *nl = '\0';
            if (nl > c->buf && nl[-1] == '\r') nl[-1] = '\0';
            enum verdict v = handle_request(c->buf, reply, sizeof reply);
            if (send_all(c->fd, reply, strlen(reply)) != 0) return;
            size_t consumed = (size_t)(nl + 1 - c->buf);
            memmove(c->buf, nl + 1, c->used - consumed);
            c->used -= consumed;
            if (v == STOP) request_shutdown();
            if (v != KEEP_OPEN) return;
        }
        if (c->used == sizeof c->buf) {
            send_all(c->fd, "ERR line too long\n", 18);
            return;
        }
        ssize_t n = recv(c->fd, c->buf + c->used, sizeof c->buf - c->used, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        c->used += (size_t)n;
    }
}

static void *worker(void *unused) {
    (void)unused;
    while (!atomic_load(&stopping)) {
        int fd = accept(listen_fd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            break; /* the listening socket was shut down */
        }
        atomic_fetch_add(&connections_served, 1);
        struct connection *c = calloc(1, sizeof *c);
        if (c) {
            c->fd = fd;
            serve_connection(c);
            free(c);
        }
        close(fd);
    }
    return NULL;
}

static int open_listener(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 128) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int bound_port(int fd) {
    struct sockaddr_in addr;
    socklen_t len = sizeof addr;
    if (getsockname(fd, (struct sockaddr *)&addr, &len) != 0) return -1;
    return ntohs(addr.sin_port);
}

static void usage(void) {
    fprintf(stderr, "usage: echo-service [--port N] [--threads N]\n");
}

int main(int argc, char **argv) {
    int port = 7000, threads = 4;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--port") == 0 && i + 1 < argc) port = atoi(argv[++i]);
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--help") == 0) { usage(); return 0; }
        else { usage(); return 2; }
    }
    if (threads < 1 || threads > MAX_THREADS || port < 0 || port > 65535) { usage(); return 2; }

    listen_fd = open_listener(port);
    if (listen_fd < 0) {
        fprintf(stderr, "echo-service: cannot listen on 127.0.0.1:%d: %s\n", port, strerror(errno));
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    printf("echo-service listening on 127.0.0.1:%d with %d threads\n", bound_port(listen_fd), threads);
    fflush(stdout);

    pthread_t tids[MAX_THREADS];
    for (int i = 0; i < threads; ++i) pthread_create(&tids[i], NULL, worker, NULL);
    for (int i = 0; i < threads; ++i) pthread_join(tids[i], NULL);
    close(listen_fd);
    printf("echo-service stopped: %ld connections, %ld requests\n", atomic_load(&connections_served),
           atomic_load(&requests_served));
    return 0;
}
