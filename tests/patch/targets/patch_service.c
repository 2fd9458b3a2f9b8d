/* A small TCP service for the `iprobe patch` and `iprobe debug --patch`
   tests: one thread per connection, requests are inline commands
   "QUOTE <item>\r\n", replies RESP integers ":<price>\r\n" (so the mirror's
   divergence checker frames them), "PING\r\n" gets "+PONG\r\n".  The price
   comes from quote() (quote.h), which has a deliberate bug for items ending
   in 7.  Usage: patch_service PORT */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "quote.h"

#ifdef __cplusplus
static const Pricing pricing(QUOTE_RATE);
static long price_of(long item) { return pricing.quote(item); }
#else
static long price_of(long item) { return quote(item); }
#endif

static int write_all(int fd, const char* data, size_t size) {
    while (size > 0) {
        ssize_t n = write(fd, data, size);
        if (n <= 0) return -1;
        data += n;
        size -= (size_t)n;
    }
    return 0;
}

/* Answers every complete line in `buf`; returns the bytes consumed. */
static size_t answer(int fd, char* buf, size_t used, char* out, size_t* out_used) {
    size_t start = 0;
    for (size_t i = 0; i < used; i++) {
        if (buf[i] != '\n') continue;
        buf[i] = 0;
        const char* line = buf + start;
        long item = 0;
        int n;
        if (sscanf(line, "QUOTE %ld", &item) == 1)
            n = snprintf(out + *out_used, 64, ":%ld\r\n", price_of(item));
        else if (strncmp(line, "PING", 4) == 0)
            n = snprintf(out + *out_used, 64, "+PONG\r\n");
        else
            n = snprintf(out + *out_used, 64, "-ERR unknown command\r\n");
        *out_used += (size_t)n;
        if (*out_used > 60000) {
            if (write_all(fd, out, *out_used) != 0) return (size_t)-1;
            *out_used = 0;
        }
        start = i + 1;
    }
    return start;
}

static void* serve(void* arg) {
    int fd = (int)(long)arg;
    static __thread char buf[65536], out[65536 + 64];
    size_t used = 0;
    for (;;) {
        ssize_t n = read(fd, buf + used, sizeof buf - 1 - used);
        if (n <= 0) break;
        used += (size_t)n;
        size_t out_used = 0;
        size_t done = answer(fd, buf, used, out, &out_used);
        if (done == (size_t)-1 || (out_used && write_all(fd, out, out_used) != 0)) break;
        memmove(buf, buf + done, used - done);
        used -= done;
        if (used == sizeof buf - 1) break; /* a line longer than the buffer */
    }
    close(fd);
    return NULL;
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: patch_service PORT\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((unsigned short)atoi(argv[1]));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, (struct sockaddr*)&addr, sizeof addr) != 0 || listen(listener, 128) != 0) {
        perror("patch_service: bind/listen");
        return 1;
    }
    for (;;) {
        int fd = accept(listener, NULL, NULL);
        if (fd < 0) continue;
        pthread_t t;
        if (pthread_create(&t, NULL, serve, (void*)(long)fd) != 0) {
            close(fd);
            continue;
        }
        pthread_detach(t);
    }
}
