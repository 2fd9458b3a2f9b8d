/*
 * Target of the hostile-region test (tests/hotpatch/hostile_test.cpp): once
 * attached, it corrupts its own iprobe region, which root's tools then read.
 * Two threads call probed functions until then; the main thread finds the
 * region in /proc/self/maps (memfd:iprobe) and, by MODE:
 *   add      forever: adds random values below 2^40 to about a quarter of
 *            the 64-bit words below word 100000 of the region's first MiB
 *   small    once: the same to a quarter of the words of the first MiB whose
 *            value is below 100000 (offsets, capacities, counts)
 *   control  forever: random bytes over the control block
 *   counts   forever: random live counts (modules, probes, stats, hash)
 *   tables   once: random bytes over the module, probe and site tables
 *   rings    forever: random heads, tails, states and tids in every ring
 *   threads  forever: random thread slots (states, depths, sums)
 *   bytes    once: SEED-chosen bytes at random offsets of the first 64 MiB
 * Prints "corrupting" once it has started.  `hostile_target MODE SEED`.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "iprobe/formats/rt_layout.h"

static volatile long sink;
__attribute__((noinline)) void hostile_leaf(long i) { sink += i; }
__attribute__((noinline)) void hostile_work(long i) { hostile_leaf(i); sink ^= i; }

/* Set once the region is being corrupted: the probed functions are no longer
 * called (their handlers read the region too, and the target would only be
 * corrupting itself). */
static volatile int corrupting;

static void* worker(void* arg) {
    (void)arg;
    for (long i = 0; !corrupting; i++) {
        hostile_work(i);
        if (i % 1024 == 0) usleep(100);
    }
    for (;;) pause();
    return 0;
}

static uint64_t state;
static uint64_t next_random(void) {  /* xorshift64* */
    state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
    return state * 2685821657736338717ull;
}

/* The region's mapping, once an attach made it: base and size. */
static uint8_t* find_region(size_t* size) {
    FILE* maps = fopen("/proc/self/maps", "r");
    char line[512];
    uint8_t* found = 0;
    while (maps && fgets(line, sizeof line, maps)) {
        unsigned long start, end;
        if (strstr(line, "memfd:iprobe") && sscanf(line, "%lx-%lx", &start, &end) == 2) {
            found = (uint8_t*)start;
            *size = end - start;
            break;
        }
    }
    if (maps) fclose(maps);
    return found;
}

static void scribble(uint8_t* at, size_t n) {
    for (size_t i = 0; i < n; i++) at[i] = (uint8_t)next_random();
}

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: hostile_target MODE SEED\n");
        return 2;
    }
    const char* mode = argv[1];
    state = strtoull(argv[2], 0, 10) * 0x9E3779B97F4A7C15ull + 1;
    pthread_t t;
    for (int i = 0; i < 2; i++) pthread_create(&t, 0, worker, 0);
    printf("ready\n");
    fflush(stdout);
    size_t size = 0;
    uint8_t* region = 0;
    while (!(region = find_region(&size))) usleep(2000);
    /* The region is mapped by an attach's first stop; the attach is over
     * once its second has written the sites: hostile_work's placeholder NOP
     * (0f 1f 44 00 00) is a jump then.  Corrupting between the two stops
     * failed the attach itself, which is not what this target tests. */
    while (*(const volatile uint8_t*)(uintptr_t)&hostile_work == 0x0f) usleep(2000);
    struct iprobe_rt_control layout;
    memcpy(&layout, region, sizeof layout);  /* as the attacher wrote it */
    corrupting = 1;
    usleep(20000);  /* the workers are out of the probed functions */
    printf("corrupting\n");
    fflush(stdout);
    const size_t mib = size < (1u << 20) ? size : (1u << 20);
    int once_done = 0;
    for (;;) {
        struct iprobe_rt_control* cb = (struct iprobe_rt_control*)region;
        if (!strcmp(mode, "add")) {
            uint64_t* words = (uint64_t*)region;
            const size_t n = mib / 8 < 100000 ? mib / 8 : 100000;
            for (size_t i = 0; i < n; i++)
                if (next_random() % 4 == 0) words[i] += next_random() % (1ull << 40);
        } else if (!strcmp(mode, "small") && !once_done) {
            uint64_t* words = (uint64_t*)region;
            for (size_t i = 0; i < mib / 8; i++)
                if (words[i] < 100000 && next_random() % 4 == 0) words[i] += next_random() % (1ull << 40);
        } else if (!strcmp(mode, "control")) {
            scribble(region, sizeof(struct iprobe_rt_control));
        } else if (!strcmp(mode, "counts")) {
            cb->module_count = (uint32_t)next_random();
            cb->probe_count = (uint32_t)next_random();
            cb->stat_count = (uint32_t)next_random();
            cb->hash_used = (uint32_t)next_random();
            cb->generation = (uint32_t)next_random();
        } else if (!strcmp(mode, "tables") && !once_done) {
            if (layout.hash_offset <= size && layout.modules_offset < layout.hash_offset)
                scribble(region + layout.modules_offset, layout.hash_offset - layout.modules_offset);
        } else if (!strcmp(mode, "rings")) {
            for (uint32_t i = 0; i < layout.ring_count; i++) {
                const uint64_t off = layout.rings_offset + layout.ring_stride * i;
                if (off + sizeof(struct iprobe_rt_ring) > size) break;
                struct iprobe_rt_ring* r = (struct iprobe_rt_ring*)(region + off);
                if (i > 4 && r->state == IPROBE_RT_RING_FREE && next_random() % 8) continue;
                r->state = (uint32_t)(next_random() % 4);
                r->tid = (uint32_t)next_random();
                r->head = next_random() >> (next_random() % 64);
                r->tail = next_random() >> (next_random() % 64);
                r->dropped = next_random();
                scribble((uint8_t*)(r + 1), 256);  /* the first records */
            }
        } else if (!strcmp(mode, "threads")) {
            for (uint32_t i = 0; i < layout.thread_count && i < 8; i++) {
                const uint64_t off = layout.threads_offset + layout.thread_stride * i;
                if (off + layout.thread_header_size + 4096 > size) break;
                struct iprobe_rt_thread* th = (struct iprobe_rt_thread*)(region + off);
                th->state = (uint32_t)(next_random() % 4);
                th->depth = (uint32_t)next_random();
                th->unmatched_exits = next_random();
                scribble(region + off + layout.thread_header_size, 4096);
            }
        } else if (!strcmp(mode, "bytes") && !once_done) {
            const size_t span = size < (64u << 20) ? size : (64u << 20);
            for (int i = 0; i < 4096; i++) region[next_random() % span] = (uint8_t)next_random();
        }
        once_done = 1;
        usleep(1000);
    }
}
