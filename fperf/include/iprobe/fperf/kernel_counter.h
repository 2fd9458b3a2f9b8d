/*
 * The kernel backend's counters, opened the same way by the handler (in the
 * target, per thread) and by the fperf process (to check an event can be
 * counted here, and to estimate what a sample costs).  Header-only C so both
 * halves share one definition.
 */
#ifndef FPERF_KERNEL_COUNTER_H
#define FPERF_KERNEL_COUNTER_H

#include <errno.h>
#include <linux/perf_event.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "iprobe/formats/fperf_region.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opens `source` on the calling thread, in the group led by `group_fd` (-1
 * starts a group: one read() of its leader returns every member).  Counts
 * kernel-side too where allowed, since a context switch or a page fault is
 * the kernel's work; user-side only where perf_event_paranoid says so.
 * Returns the fd, or -errno. */
static inline int fperf_open_kernel_counter(const struct fperf_event_source* source, int group_fd)
{
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.type = source->perf_type;
    attr.config = source->perf_config;
    attr.read_format = PERF_FORMAT_GROUP;
    attr.exclude_hv = 1;
    int err = 0;
    for (int user_only = 0; user_only <= 1; user_only++) {
        attr.exclude_kernel = (uint64_t)user_only;
        long fd = syscall(SYS_perf_event_open, &attr, 0, -1, group_fd, PERF_FLAG_FD_CLOEXEC);
        if (fd >= 0) return (int)fd;
        err = errno;
        if (err != EACCES && err != EPERM) break;
    }
    return -err;
}

/* The group's `count` values, in the order its members were opened.
 * 0 on success, -1 when the read fell short. */
static inline int fperf_read_kernel_group(int leader, uint64_t* values, uint32_t count)
{
    uint64_t buffer[1 + FPERF_MAX_EVENTS];
    if (count > FPERF_MAX_EVENTS) return -1;
    ssize_t got = read(leader, buffer, sizeof(uint64_t) * (1 + count));
    if (got != (ssize_t)(sizeof(uint64_t) * (1 + count)) || buffer[0] != count) return -1;
    memcpy(values, buffer + 1, sizeof(uint64_t) * count);
    return 0;
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FPERF_KERNEL_COUNTER_H */
