/*
 * Return trampolines, the C side (return_stack.h says how they work): the
 * pool and its chunks, hooking a return from C, the slow paths of the
 * assembler's fast ones, and the collection of entries whose frames are gone.
 *
 * Hot-path rules as for the rest of the runtime: no lock, no malloc, no
 * syscall except on a slow path (reading a possibly unmapped stack slot),
 * async-signal-safe.  Only the owning thread moves its `next`/`limit`; a
 * slow path hides the chunk (limit = 0) while it rearranges it, so a signal
 * handler arriving meanwhile takes the slow path too, finds the thread busy
 * and does not hook.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "iprobe/formats/rt_layout.h"
#include "raw_syscall.h"
#include "return_stack_internal.h"

#define BARRIER() __asm__ __volatile__("" ::: "memory")
#define CHUNKS (IPROBE_RT_RETURN_ENTRIES / IPROBE_RT_RETURN_CHUNK)
#define CHUNK_FREE 0u
#define CHUNK_RETIRED 0xffffffffu /* its thread exited leaving entries that may still return */
/* what readers are told the pool serves (rt_layout.h) */
_Static_assert(CHUNKS == IPROBE_RT_RETURN_POOL_THREADS, "IPROBE_RT_RETURN_POOL_THREADS");
_Static_assert(IPROBE_RT_RETURN_CHUNK * IPROBE_RT_RETURN_MAX_CHUNKS == IPROBE_RT_RETURN_STACK_FRAMES,
               "IPROBE_RT_RETURN_STACK_FRAMES");

__attribute__((aligned(64))) struct iprobe_rt_return iprobe_rt_return_pool[IPROBE_RT_RETURN_ENTRIES];
__thread struct iprobe_rt_thread_state iprobe_rt_thread __attribute__((tls_model("initial-exec"), visibility("hidden")));

static uint32_t g_chunk_owner[CHUNKS];
static uint32_t g_next_token;
static uint32_t g_claim_hint;
static iprobe_rt_return_callback g_callbacks[IPROBE_RT_RETURN_CALLBACKS];


static inline struct iprobe_rt_return* chunk_start(uint16_t chunk) {
    return &iprobe_rt_return_pool[(uint32_t)chunk * IPROBE_RT_RETURN_CHUNK];
}

/* What a hooked function's return slot holds. */
static inline uint64_t trampoline_of(const struct iprobe_rt_return* e) {
    return iprobe_rt_return_unit(e) + IPROBE_RT_RETURN_UNIT_TRAMPOLINE;
}

/* The entry whose trampoline `address` is, or 0. */
static inline struct iprobe_rt_return* entry_of_unit(uint64_t address) {
    const uint64_t sled = (uint64_t)(uintptr_t)iprobe_rt_return_sled;
    if (address < sled || (address - sled) % IPROBE_RT_RETURN_UNIT_SIZE != IPROBE_RT_RETURN_UNIT_TRAMPOLINE) return 0;
    const uint64_t index = (address - sled) / IPROBE_RT_RETURN_UNIT_SIZE;
    return index < IPROBE_RT_RETURN_ENTRIES ? &iprobe_rt_return_pool[index] : 0;
}

__attribute__((visibility("default"))) int iprobe_rt_is_return_trampoline(uint64_t address) { return entry_of_unit(address) != 0; }

__attribute__((visibility("default"))) uint64_t iprobe_rt_real_return_address(uint64_t address) {
    /* a chain (tail calls) ends at a real address */
    for (int hops = 0; hops < IPROBE_RT_RETURN_ENTRIES; hops++) {
        const struct iprobe_rt_return* e = entry_of_unit(address);
        if (!e) return address;
        const uint64_t ret = __atomic_load_n(&e->ret, __ATOMIC_RELAXED);
        if (!ret) return address;
        address = ret;
    }
    return address;
}

/* Reads the words at `addresses` (slots that may not be mapped any more: a
 * freed coroutine stack) in one system call per batch; an unreadable one
 * reads as 0.  Slow path only. */
#define READ_BATCH 64
static void read_words(const uint64_t* addresses, uint64_t* out, unsigned n) {
    struct iovec local[READ_BATCH], remote[READ_BATCH];
    for (unsigned i = 0; i < n; i++) out[i] = 0;
    for (unsigned done = 0; done < n;) {
        const unsigned batch = n - done < READ_BATCH ? n - done : READ_BATCH;
        for (unsigned i = 0; i < batch; i++) {
            local[i].iov_base = &out[done + i];
            local[i].iov_len = sizeof *out;
            remote[i].iov_base = (void*)(uintptr_t)addresses[done + i];
            remote[i].iov_len = sizeof *out;
        }
        /* not libc's: it may be probed, and this runs inside a handler */
        const long got = iprobe_rt_raw_syscall6(SYS_process_vm_readv, iprobe_rt_raw_syscall6(SYS_getpid, 0, 0, 0, 0, 0, 0),
                                                (long)local, (long)batch, (long)remote, (long)batch, 0);
        /* the kernel stops at the first element it cannot read: skip it */
        const unsigned whole = got > 0 ? (unsigned)(got / (long)sizeof *out) : 0;
        done += whole < batch ? whole + 1 : batch;
    }
}

static uint32_t own_token(struct iprobe_rt_thread_state* t) {
    if (!t->token) {
        uint32_t token;
        do token = __atomic_add_fetch(&g_next_token, 1, __ATOMIC_RELAXED);
        while (token == CHUNK_FREE || token == CHUNK_RETIRED);
        t->token = token;
    }
    return t->token;
}

static int chunk_all_free(uint32_t chunk) {
    const struct iprobe_rt_return* e = chunk_start((uint16_t)chunk);
    for (int i = 0; i < IPROBE_RT_RETURN_CHUNK; i++)
        if (__atomic_load_n(&e[i].ret, __ATOMIC_RELAXED)) return 0;
    return 1;
}

/* A free chunk, or a retired one whose last entries have returned. */
static int claim_chunk(struct iprobe_rt_thread_state* t) {
    const uint32_t token = own_token(t);
    const uint32_t start = __atomic_load_n(&g_claim_hint, __ATOMIC_RELAXED) % CHUNKS;
    for (uint32_t n = 0; n < CHUNKS; n++) {
        const uint32_t c = (start + n) % CHUNKS;
        uint32_t owner = __atomic_load_n(&g_chunk_owner[c], __ATOMIC_RELAXED);
        if (owner == CHUNK_RETIRED && !chunk_all_free(c)) continue;
        if (owner != CHUNK_FREE && owner != CHUNK_RETIRED) continue;
        if (!__atomic_compare_exchange_n(&g_chunk_owner[c], &owner, token, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            continue;
        __atomic_store_n(&g_claim_hint, c + 1, __ATOMIC_RELAXED);
        if (t->count == 0) iprobe_rt_watch_thread();
        t->chunks[t->count++] = (uint16_t)c;
        return 1;
    }
    return 0;
}

/* The longest run of free entries in the thread's chunks. */
struct run {
    struct iprobe_rt_return *start, *end;
};

static struct run longest_free_run(const struct iprobe_rt_thread_state* t) {
    struct run best = {0, 0};
    for (int k = t->count - 1; k >= 0; k--) {
        struct iprobe_rt_return* e = chunk_start(t->chunks[k]);
        for (int i = 0; i < IPROBE_RT_RETURN_CHUNK;) {
            if (__atomic_load_n(&e[i].ret, __ATOMIC_RELAXED)) {
                i++;
                continue;
            }
            int j = i;
            while (j < IPROBE_RT_RETURN_CHUNK && !__atomic_load_n(&e[j].ret, __ATOMIC_RELAXED)) j++;
            if (j - i > best.end - best.start) best = (struct run){&e[i], &e[j]};
            i = j;
        }
    }
    return best;
}

/* Entries of this thread whose frame can no longer return through them:
 * their slot holds something else and no other entry returns into them (a
 * tail call chains entries on one slot).  Freed; the rest is kept, however
 * old: an entry on another stack (swapcontext) may still return, and one
 * whose slot still holds the address it saved may be on its way to its unit
 * (prepared, the unit's call not made yet: a signal handler can land there). */
static int collect(struct iprobe_rt_thread_state* t) {
    enum { HELD = IPROBE_RT_RETURN_MAX_CHUNKS * IPROBE_RT_RETURN_CHUNK };
    uint8_t suspect[HELD / 8] = {0};
    int suspects = 0;
    for (uint32_t k = 0; k < t->count; k++) {
        struct iprobe_rt_return* e = chunk_start(t->chunks[k]);
        uint64_t slots[IPROBE_RT_RETURN_CHUNK], held[IPROBE_RT_RETURN_CHUNK];
        unsigned index[IPROBE_RT_RETURN_CHUNK], n = 0;
        for (unsigned i = 0; i < IPROBE_RT_RETURN_CHUNK; i++)
            if (__atomic_load_n(&e[i].ret, __ATOMIC_RELAXED)) slots[n] = e[i].slot, index[n++] = i;
        read_words(slots, held, n);
        for (unsigned m = 0; m < n; m++) {
            if (held[m] == trampoline_of(&e[index[m]]) || held[m] == e[index[m]].ret) continue;
            const uint32_t bit = k * IPROBE_RT_RETURN_CHUNK + index[m];
            suspect[bit / 8] |= (uint8_t)(1u << (bit % 8));
            suspects++;
        }
    }
    if (!suspects) return 0;
    int freed = 0;
    for (uint32_t index = 0; index < IPROBE_RT_RETURN_ENTRIES; index++) {
        const struct iprobe_rt_return* target = entry_of_unit(__atomic_load_n(&iprobe_rt_return_pool[index].ret, __ATOMIC_RELAXED));
        if (!target) continue;
        for (uint32_t k = 0; k < t->count; k++) {
            const struct iprobe_rt_return* start = chunk_start(t->chunks[k]);
            if (target < start || target >= start + IPROBE_RT_RETURN_CHUNK) continue;
            const uint32_t bit = k * IPROBE_RT_RETURN_CHUNK + (uint32_t)(target - start);
            suspect[bit / 8] &= (uint8_t)~(1u << (bit % 8));
        }
    }
    for (uint32_t k = 0; k < t->count; k++) {
        struct iprobe_rt_return* e = chunk_start(t->chunks[k]);
        for (int i = 0; i < IPROBE_RT_RETURN_CHUNK; i++) {
            const uint32_t bit = k * IPROBE_RT_RETURN_CHUNK + (uint32_t)i;
            if (suspect[bit / 8] & (1u << (bit % 8))) {
                __atomic_store_n(&e[i].ret, 0, __ATOMIC_RELAXED);
                freed++;
            }
        }
    }
    return freed;
}

/* Whether this slow path collects (see collect_backoff): always, until a
 * collection frees nothing; then every 2nd, 4th, ... 1024th time, back to
 * always once one frees an entry.  Entries LIFO returns give back are found
 * by the free-run scan meanwhile; only abandoned ones wait. */
static int collect_now(struct iprobe_rt_thread_state* t) {
    if (t->collect_skip) {
        t->collect_skip--;
        return 0;
    }
    if (collect(t)) {
        t->collect_backoff = 0;
        return 1;
    }
    t->collect_backoff = t->collect_backoff ? (uint16_t)(t->collect_backoff < 512 ? 2 * t->collect_backoff : 1024) : 1;
    t->collect_skip = t->collect_backoff;
    return 0;
}

/* A new run of free entries for the fast path, [next, limit): returns are
 * LIFO as a rule, so a long run serves many calls before the next slow path.
 * Holes that non-LIFO returns (a coroutine, a hook under a longjmp'ed frame)
 * leave are reused through the runs found here; abandoned entries through
 * collect().  Then a new chunk; a short run only when none is left.  0 when
 * the thread has no room at all (counted by the caller). */
#define GOOD_RUN (IPROBE_RT_RETURN_CHUNK / 4)
static int grow(struct iprobe_rt_thread_state* t) {
    t->pool_empty = 0;
    if (t->busy || t->retired) return 0;
    t->busy = 1;
    __atomic_store_n(&t->limit, (struct iprobe_rt_return*)0, __ATOMIC_RELAXED);
    BARRIER();
    struct run run = longest_free_run(t);
    if (run.end - run.start < GOOD_RUN && t->count && collect_now(t)) run = longest_free_run(t);
    if (run.end - run.start < GOOD_RUN && t->count < IPROBE_RT_RETURN_MAX_CHUNKS) {
        if (claim_chunk(t)) {
            run.start = chunk_start(t->chunks[t->count - 1]);
            run.end = run.start + IPROBE_RT_RETURN_CHUNK;
        }
        t->pool_empty = run.start == run.end;
    }
    t->next = run.start;
    BARRIER();
    __atomic_store_n(&t->limit, run.end, __ATOMIC_RELAXED);
    BARRIER();
    t->busy = 0;
    return run.start != run.end;
}

int iprobe_rt_return_grow(void) { return grow(&iprobe_rt_thread); }

int iprobe_rt_return_register(iprobe_rt_return_callback callback) {
    for (int k = 0; k < IPROBE_RT_RETURN_CALLBACKS; k++) {
        iprobe_rt_return_callback seen = __atomic_load_n(&g_callbacks[k], __ATOMIC_ACQUIRE);
        if (seen == callback) return k;
        if (!seen && __atomic_compare_exchange_n(&g_callbacks[k], &seen, callback, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return k;
        if (seen == callback) return k;
    }
    return -1;
}

__attribute__((visibility("hidden"))) uint64_t iprobe_rt_vector_safe_call(uint64_t (*fn)(void*, void*), void* a,
                                                                          void* b);

static uint64_t run_callback(void* callback, void* entry) {
    const struct iprobe_rt_return* e = entry;
    ((iprobe_rt_return_callback)callback)(e->cookie, (uintptr_t)e->slot);
    return 0;
}

/* Another library's code (fperf's, which calls PAPI) may use any vector
 * register, and the hooked function's caller may keep values in them (gcc's
 * IPA-RA): xmm0-15 are kept around it. */
void iprobe_rt_return_callback_run(const struct iprobe_rt_return* e) {
    const uint32_t k = e->handler - IPROBE_RT_RETURN_CALLBACK;
    if (k >= IPROBE_RT_RETURN_CALLBACKS) return;
    const iprobe_rt_return_callback callback = __atomic_load_n(&g_callbacks[k], __ATOMIC_ACQUIRE);
    if (callback) iprobe_rt_vector_safe_call(run_callback, (void*)callback, (void*)e);
}

/* At thread exit (its frames are gone): entries whose slot lies on the
 * thread's own stack are dead; one elsewhere whose slot still holds its
 * trampoline (a coroutine's stack) may return later, so its chunk is
 * retired rather than freed, and reclaimed once its entries have returned. */
void iprobe_rt_return_retire(void) {
    struct iprobe_rt_thread_state* t = &iprobe_rt_thread;
    t->retired = 1;
    __atomic_store_n(&t->limit, (struct iprobe_rt_return*)0, __ATOMIC_RELAXED);
    BARRIER();
    uint64_t low = 0, high = 0;
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        void* base = 0;
        size_t size = 0;
        if (pthread_attr_getstack(&attr, &base, &size) == 0) {
            low = (uint64_t)(uintptr_t)base;
            high = low + size;
        }
        pthread_attr_destroy(&attr);
    }
    collect(t);
    for (uint32_t k = 0; k < t->count; k++) {
        struct iprobe_rt_return* e = chunk_start(t->chunks[k]);
        int live = 0;
        for (int i = 0; i < IPROBE_RT_RETURN_CHUNK; i++) {
            if (!e[i].ret) continue;
            if (e[i].slot >= low && e[i].slot < high)
                __atomic_store_n(&e[i].ret, 0, __ATOMIC_RELAXED);
            else
                live = 1;
        }
        __atomic_store_n(&g_chunk_owner[t->chunks[k]], live ? CHUNK_RETIRED : CHUNK_FREE, __ATOMIC_RELEASE);
    }
    t->count = 0;
    t->next = 0;
}

/* In a forked child only the forking thread lives on: the entries of every
 * other thread belong to frames that do not exist here. */
void iprobe_rt_return_after_fork(void) {
    const uint32_t token = iprobe_rt_thread.token;
    for (uint32_t c = 0; c < CHUNKS; c++) {
        const uint32_t owner = g_chunk_owner[c];
        if (owner == CHUNK_FREE || owner == CHUNK_RETIRED || (token && owner == token)) continue;
        struct iprobe_rt_return* e = chunk_start((uint16_t)c);
        for (int i = 0; i < IPROBE_RT_RETURN_CHUNK; i++) e[i].ret = 0;
        g_chunk_owner[c] = CHUNK_FREE;
    }
}

_Static_assert(IPROBE_RT_RETURN_CHUNK * IPROBE_RT_RETURN_MAX_CHUNKS == IPROBE_RT_RETURN_STACK_FRAMES,
               "the return stack's depth is what rt_layout.h tells readers");
