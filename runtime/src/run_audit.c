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
 * Freestanding (no libc, system calls of its own, linked -nostdlib): an
 * audit module's dependencies load again in its audit namespace, and a
 * second libc mapped in the program would be one more module named
 * libc.so.6 (attach --module libc.so.6) and one more thing the program did
 * not have.  Outside a watch (nothing pending, iprobe gone, the descriptor
 * closed by the program) each load costs a flag test; in a fork()ed child, a
 * getpid(). */
#define _GNU_SOURCE
#include <errno.h> /* the E... numbers only */
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "iprobe/runtime/run_loads.h"
#include "raw_syscall.h"

#define EXPORT __attribute__((visibility("default")))

static long sys3(long n, long a, long b, long c) { return iprobe_rt_raw_syscall6(n, a, b, c, 0, 0, 0); }

static int g_fd = -1;          /* our copy of the channel, close-on-exec */
static unsigned long g_dev;    /* ... and its identity: a program that */
static unsigned long g_ino;    /* closes it may reuse the number */
static long g_owner;           /* a fork()ed child says nothing */
static int g_started;          /* the start-up set is consistent */
static int g_watching;

/* The objects added since the last consistent state, as sent. */
static unsigned char g_batch[64 * 1024];
static unsigned long g_batch_len;
static int g_batch_overflow;

static void stop_watching(int ours) {
    if (ours && g_fd >= 0) sys3(SYS_close, g_fd, 0, 0);
    g_fd = -1;
    g_watching = 0;
}

static void copy_bytes(unsigned char* to, const void* from, unsigned long n) {
    const unsigned char* f = from;
    for (unsigned long i = 0; i < n; i++) to[i] = f[i];
}

/* IPROBE_RUN_FD from the environment the program started with
 * (/proc/self/environ: without libc there is no environ); -1 if absent. */
static int channel_from_environment(void) {
    static const char key[] = IPROBE_RUN_FD_VARIABLE "=";
    const long fd = sys3(SYS_openat, AT_FDCWD, (long)"/proc/self/environ", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char buf[4096];
    unsigned long matched = 0; /* of key, at the start of an entry; ~0: not this entry */
    long value = -1;
    int done = 0;
    for (long n; !done && (n = sys3(SYS_read, fd, (long)buf, sizeof buf)) != 0;) {
        if (n == -EINTR) continue;
        if (n < 0) break;
        for (long i = 0; i < n && !done; i++) {
            const char c = buf[i];
            if (matched == sizeof key - 1) { /* in the value */
                if (c >= '0' && c <= '9' && value < (1l << 30)) value = (value < 0 ? 0 : value * 10) + (c - '0');
                else done = 1;
            } else if (c == 0) {
                matched = 0;
                value = -1;
            } else if (matched != ~0ul) {
                matched = c == key[matched] ? matched + 1 : ~0ul;
            }
        }
    }
    sys3(SYS_close, fd, 0, 0);
    return (int)value;
}

EXPORT unsigned int la_version(unsigned int version) {
    const int channel = channel_from_environment();
    if (channel >= 0) {
        struct rlimit open_files;
        const unsigned long long limit =
            iprobe_rt_raw_syscall6(SYS_prlimit64, 0, RLIMIT_NOFILE, 0, (long)&open_files, 0, 0) == 0 ? open_files.rlim_cur
                                                                                                  : 1024;
        /* far above the descriptors the program counts on being next */
        const long fd = sys3(SYS_fcntl, channel, F_DUPFD_CLOEXEC, iprobe_run_audit_fd_floor(limit));
        struct stat st;
        if (fd >= 0 && sys3(SYS_fstat, fd, (long)&st, 0) == 0) {
            g_fd = (int)fd;
            g_dev = st.st_dev;
            g_ino = st.st_ino;
            g_owner = sys3(SYS_getpid, 0, 0, 0);
            g_watching = 1;
        } else if (fd >= 0) {
            sys3(SYS_close, fd, 0, 0);
        }
    }
    return version < LAV_CURRENT ? version : LAV_CURRENT;
}

static void add_to_batch(const char* name) {
    unsigned long length = 0;
    while (name[length]) length++;
    if (length == 0) return;
    const uint16_t n = (uint16_t)length;
    if (length > IPROBE_RUN_LOADS_MAX_NAME ||
        g_batch_len + sizeof n + length + 8 > sizeof g_batch /* room for "*" and the end */) {
        g_batch_overflow = 1;
        return;
    }
    copy_bytes(g_batch + g_batch_len, &n, sizeof n);
    copy_bytes(g_batch + g_batch_len + sizeof n, name, length);
    g_batch_len += sizeof n + length;
}

EXPORT unsigned int la_objopen(struct link_map* map, Lmid_t lmid, uintptr_t* cookie) {
    (void)lmid;
    (void)cookie;
    if (g_watching && g_started && map->l_name) add_to_batch(map->l_name);
    return 0; /* no symbol bindings audited: lazy binding stays as it is */
}

static int send_all(const unsigned char* data, unsigned long size) {
    while (size > 0) {
        const long n = iprobe_rt_raw_syscall6(SYS_sendto, g_fd, (long)data, (long)size, MSG_NOSIGNAL, 0, 0);
        if (n == -EINTR) continue;
        if (n <= 0) return 0;
        data += n;
        size -= (unsigned long)n;
    }
    return 1;
}

/* Sends the batch and waits for the go-ahead; iprobe gone or nothing left
 * pending ends the watch. */
static void tell_prober(void) {
    if (sys3(SYS_getpid, 0, 0, 0) != g_owner) return; /* a child of fork (or vfork: the state is the parent's) */
    struct stat st;
    if (sys3(SYS_fstat, g_fd, (long)&st, 0) != 0 || st.st_dev != g_dev || st.st_ino != g_ino) {
        stop_watching(0); /* no longer ours: the program closed it */
        return;
    }
    if (g_batch_overflow) { /* names left out: "*" says "look at the maps" */
        const uint16_t n = 1;
        copy_bytes(g_batch + g_batch_len, &n, sizeof n);
        g_batch[g_batch_len + sizeof n] = '*';
        g_batch_len += sizeof n + 1;
    }
    const uint16_t end = 0;
    copy_bytes(g_batch + g_batch_len, &end, sizeof end);
    g_batch_len += sizeof end;
    unsigned char reply = IPROBE_RUN_LOADS_GO;
    long n = 0;
    if (send_all(g_batch, g_batch_len)) {
        do n = iprobe_rt_raw_syscall6(SYS_recvfrom, g_fd, (long)&reply, 1, 0, 0, 0);
        while (n == -EINTR);
    }
    if (n != 1 || reply != IPROBE_RUN_LOADS_WATCH) stop_watching(1);
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
