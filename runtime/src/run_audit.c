/* libiprobe-run-audit.so: tells `iprobe run` about each library the program
 * loads after its start, once the library is mapped and relocated and
 * before its constructors run (rtld-audit(7): la_activity's
 * LA_ACT_CONSISTENT comes before the loader calls them), and waits for the
 * prober's go-ahead.  The protocol: include/iprobe/runtime/run_loads.h.
 *
 * An audit module, not an interposed dlopen: the loader calls it for
 * dlopen, dlmopen and every dependency they bring in, from the caller's
 * own dlopen (whose RUNPATH, $ORIGIN and namespace an interposer calling the
 * real one would replace by its own), and before the library's constructors.
 *
 * It lives in the audit namespace with a libc of its own: it keeps to a few
 * system calls.  Outside a watch (nothing pending, iprobe gone, the
 * descriptor closed by the program) each load costs a flag test; in a
 * fork()ed child, a getpid(). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "iprobe/runtime/run_loads.h"

#define EXPORT __attribute__((visibility("default")))

static int g_fd = -1;          /* our copy of the channel, close-on-exec */
static dev_t g_dev;            /* ... and its identity: a program that */
static ino_t g_ino;            /* closes it may reuse the number */
static pid_t g_owner;          /* a fork()ed child says nothing */
static int g_started;          /* the start-up set is consistent */
static int g_watching;

/* The objects added since the last consistent state, as sent. */
static unsigned char g_batch[64 * 1024];
static size_t g_batch_len;
static int g_batch_overflow;

static void stop_watching(int ours) {
    if (ours && g_fd >= 0) close(g_fd);
    g_fd = -1;
    g_watching = 0;
}

/* A descriptor far above the ones the program counts on being next. */
static int high_copy(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, iprobe_run_audit_fd_floor()); }

EXPORT unsigned int la_version(unsigned int version) {
    const char* fd_text = getenv(IPROBE_RUN_FD_VARIABLE);
    if (fd_text && *fd_text) {
        const int fd = high_copy(atoi(fd_text));
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0) {
            g_fd = fd;
            g_dev = st.st_dev;
            g_ino = st.st_ino;
            g_owner = getpid();
            g_watching = 1;
        } else if (fd >= 0) {
            close(fd);
        }
    }
    return version < LAV_CURRENT ? version : LAV_CURRENT;
}

static void add_to_batch(const char* name) {
    const size_t length = strlen(name);
    if (length == 0) return;
    uint16_t n = (uint16_t)length;
    if (length > IPROBE_RUN_LOADS_MAX_NAME || g_batch_len + sizeof n + length + 8 > sizeof g_batch /* room for "*" and the end */) {
        g_batch_overflow = 1;
        return;
    }
    memcpy(g_batch + g_batch_len, &n, sizeof n);
    memcpy(g_batch + g_batch_len + sizeof n, name, length);
    g_batch_len += sizeof n + length;
}

EXPORT unsigned int la_objopen(struct link_map* map, Lmid_t lmid, uintptr_t* cookie) {
    (void)lmid;
    (void)cookie;
    if (g_watching && g_started && map->l_name) add_to_batch(map->l_name);
    return 0; /* no symbol bindings audited: lazy binding stays as it is */
}

static int send_all(const unsigned char* data, size_t size) {
    while (size > 0) {
        const ssize_t n = send(g_fd, data, size, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return 0;
        data += n;
        size -= (size_t)n;
    }
    return 1;
}

/* Sends the batch and waits for the go-ahead; any failure ends the watch. */
static void tell_prober(void) {
    if (getpid() != g_owner) return; /* a child of fork (or vfork: the state is the parent's) */
    struct stat st;
    if (fstat(g_fd, &st) != 0 || st.st_dev != g_dev || st.st_ino != g_ino) {
        stop_watching(0); /* no longer ours: the program closed it */
        return;
    }
    if (g_batch_overflow) {
        /* names left out: "*" says "look at the maps" */
        static const char any[] = "*";
        const uint16_t n = 1;
        memcpy(g_batch + g_batch_len, &n, sizeof n);
        memcpy(g_batch + g_batch_len + sizeof n, any, 1);
        g_batch_len += sizeof n + 1;
    }
    const uint16_t end = 0;
    memcpy(g_batch + g_batch_len, &end, sizeof end);
    g_batch_len += sizeof end;
    unsigned char reply = 1;
    ssize_t n = 0;
    if (send_all(g_batch, g_batch_len)) {
        do n = recv(g_fd, &reply, 1, 0);
        while (n < 0 && errno == EINTR);
    }
    if (n != 1 || reply != IPROBE_RUN_LOADS_WATCH) stop_watching(1); /* iprobe gone, or nothing pending */
}

EXPORT void la_activity(uintptr_t* cookie, unsigned int flag) {
    (void)cookie;
    if (flag != LA_ACT_CONSISTENT || !g_watching) return;
    if (!g_started) {
        g_started = 1; /* the program's own start-up set: the start hold's */
    } else if (g_batch_len > 0 || g_batch_overflow) {
        tell_prober();
    }
    g_batch_len = 0;
    g_batch_overflow = 0;
}
