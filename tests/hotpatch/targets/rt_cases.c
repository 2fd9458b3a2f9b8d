/*
 * The hard cases of exits through return trampolines, as one program built
 * twice with iprobe-cc's entry flow: as C (rt_cases_c) and as C++
 * (rt_cases_cxx, which adds exceptions).  Every function marked PROBED has a
 * function-entry site; the tests attach to its entry and exit and check the
 * exact counts `iprobe report` gives against what the program did.
 *
 * Usage: rt_cases THREADS FIFO (THREADS is ignored).  Commands arrive one
 * per line on the FIFO and are answered on stdout as "ok <command> <value>":
 *   values N        return values of every ABI class, N times: a checksum
 *   longjmp N       lj_outer -> lj_middle -> lj_inner, which longjmps back
 *   siglongjmp N    sj_outer -> sj_wait raises SIGUSR1; sj_handler siglongjmps
 *   abandon N       ab_catch, which does not return meanwhile, jumps back N
 *                   times (longjmp; in C++ a throw too) from ab_down 30 deep,
 *                   then calls ab_leaf 1000 times: prints the jumps
 *   setcontext N    sc_outer -> sc_inner, which setcontexts back
 *   swapcontext N   a coroutine: co_body calls co_step N times, each swapping
 *                   back to main, which resumes it with co_resume
 *   signals N       sg_leaf N times while SIGUSR2 arrives; sg_handler (on
 *   altsignals N    an alternate stack for altsignals) recurses sg_nested 8
 *                   deep: prints how many handlers ran
 *   firstcall N     a new thread calls sg_leaf N times, SIGUSR2 raised in it
 *                   from inside the runtime's claims at its first traced call
 *                   (this program's pthread_setspecific): prints 100 x the
 *                   handlers that ran + the signals raised
 *   threads N       N threads each of: te_start (pthread_exit in te_exit),
 *                   tc_start (cancelled in tc_wait), tn_start (returns):
 *                   prints how many cancellation cleanups ran
 *   fork N          fk_fork N times; each child returns through it, calls
 *                   sg_leaf 100 times and exits 42: prints failed children
 *   tailcalls N     tc_a (tail-calls tc_b) N times: a checksum
 *   mutual N        tc_even(N): N+1 tail calls that chain on one slot
 *   recurse N       rec(N): N+1 frames deep
 *   backtrace N     bt_a -> bt_b -> bt_c, which takes backtrace(): 1 when the
 *                   real callers are there in order
 *   block           a thread enters bk_a -> bk_b -> bk_c and waits there
 *   release         lets it return: prints what it returned
 *   exceptions N    (C++) ex_outer catches what ex_inner throws through ex_middle
 *   rethrow N       (C++) ex_rethrow_mid catches and rethrows
 *   nested N        (C++) a catch that calls hooked functions, exception_ptr
 *   quit
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include "fixture_serve.h"

#ifdef __cplusplus
#include <exception>
#include <stdexcept>
#define EXTERN_C extern "C"
#else
#define EXTERN_C
#endif

/* Out of line, not cloned (a clone would be another symbol), not inlined. */
#define PROBED EXTERN_C __attribute__((noinline, noclone))

static volatile long sink;

/* ---- return values of every class survive the trampoline ---- */
struct two_doubles { double a, b; };   /* xmm0, xmm1 */
struct two_longs { long a, b; };       /* rax, rdx */
struct big { long v[6]; };             /* memory; rax holds its address */

PROBED long rv_long(long x) { return x * 3 + 1; }
PROBED double rv_double(long x) { return (double)x * 1.5; }
PROBED long double rv_long_double(long x) { return (long double)x * 2.25L + 0.125L; } /* st0 */
PROBED __complex__ long double rv_complex_ld(long x) { /* st0, st1 */
    __complex__ long double z;
    __real__ z = (long double)x / 3;
    __imag__ z = -(long double)x / 7;
    return z;
}
PROBED struct two_doubles rv_two_doubles(long x) {
    struct two_doubles r = {(double)x / 4, -(double)x * 8};
    return r;
}
PROBED struct two_longs rv_two_longs(long x) {
    struct two_longs r = {x * 11, ~x};
    return r;
}
PROBED __int128 rv_int128(long x) { return ((__int128)x << 64) | (unsigned long)(x * 5 + 3); }
PROBED struct big rv_big(long x) {
    struct big r;
    for (int i = 0; i < 6; i++) r.v[i] = x + i;
    return r;
}

static uint64_t mix(uint64_t h, const void* p, size_t n) {
    const unsigned char* b = (const unsigned char*)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static long values(long n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (long i = 0; i < n; i++) {
        const long l = rv_long(i);
        const double d = rv_double(i);
        const long double ld = rv_long_double(i);
        const __complex__ long double z = rv_complex_ld(i);
        const long double zr = __real__ z, zi = __imag__ z;
        const struct two_doubles td = rv_two_doubles(i);
        const struct two_longs tl = rv_two_longs(i);
        const __int128 w = rv_int128(i);
        const struct big b = rv_big(i);
        h = mix(h, &l, sizeof l);
        h = mix(h, &d, sizeof d);
        h = mix(h, &ld, 10); /* the x87 format's 80 bits, not the padding */
        h = mix(h, &zr, 10);
        h = mix(h, &zi, 10);
        h = mix(h, &td, sizeof td);
        h = mix(h, &tl, sizeof tl);
        h = mix(h, &w, sizeof w);
        h = mix(h, &b, sizeof b);
    }
    return (long)(h & 0x7fffffffffffffffull);
}

/* ---- longjmp ---- */
static jmp_buf lj_env;
PROBED void lj_inner(long i) {
    if (i >= 0) longjmp(lj_env, 1);
    sink++;
}
PROBED void lj_middle(long i) {
    lj_inner(i);
    sink++;
}
PROBED long lj_outer(long i) {
    if (setjmp(lj_env) == 0) {
        lj_middle(i);
        return 0;
    }
    return 1;
}

/* ---- frames abandoned under a function that goes on (postgres's
 * PG_TRY in a loop, a server catching each request's exception) ---- */
static jmp_buf ab_env;
PROBED void ab_leaf(long i) { sink += i; }
PROBED void ab_down(long depth, long i) {
    if (depth == 0) {
#ifdef __cplusplus
        if (i % 2) throw std::runtime_error("from ab_down");
#endif
        longjmp(ab_env, 1);
    }
    ab_down(depth - 1, i);
    sink++;
}
PROBED long ab_catch(long n) {
    volatile long jumps = 0;
    for (volatile long i = 0; i < n; i++) {
#ifdef __cplusplus
        try {
#endif
            if (setjmp(ab_env) == 0) ab_down(30, i);
            else jumps = jumps + 1;
#ifdef __cplusplus
        } catch (const std::runtime_error&) {
            jumps = jumps + 1;
        }
#endif
    }
    for (long i = 0; i < 1000; i++) ab_leaf(i);
    return jumps;
}

/* ---- siglongjmp out of a signal handler ---- */
static sigjmp_buf sj_env;
PROBED void sj_handler(int sig) {
    (void)sig;
    siglongjmp(sj_env, 1);
}
PROBED void sj_wait(void) {
    raise(SIGUSR1);
    sink++;
}
PROBED long sj_outer(void) {
    if (sigsetjmp(sj_env, 1) == 0) {
        sj_wait();
        return 0;
    }
    return 1;
}

/* ---- setcontext back into a hooked frame ---- */
static ucontext_t sc_ctx;
static volatile int sc_back;
PROBED void sc_inner(void) { setcontext(&sc_ctx); }
PROBED long sc_outer(void) {
    sc_back = 0;
    getcontext(&sc_ctx);
    if (!sc_back) {
        sc_back = 1;
        sc_inner();
    }
    return 1;
}

/* ---- a coroutine: hooked frames live on two stacks at once ---- */
static ucontext_t co_main_ctx, co_ctx;
static long co_steps;
PROBED void co_step(long i) {
    sink += i;
    swapcontext(&co_ctx, &co_main_ctx);
}
PROBED void co_body(void) {
    for (long i = 0; i < co_steps; i++) co_step(i);
}
PROBED void co_resume(void) { swapcontext(&co_main_ctx, &co_ctx); }

static long coroutine(long n) {
    static char stack[256 * 1024];
    co_steps = n;
    getcontext(&co_ctx);
    co_ctx.uc_stack.ss_sp = stack;
    co_ctx.uc_stack.ss_size = sizeof stack;
    co_ctx.uc_link = &co_main_ctx;
    makecontext(&co_ctx, co_body, 0);
    for (long i = 0; i <= n; i++) co_resume();
    return n;
}

/* ---- signals arriving anywhere, also on an alternate stack ---- */
static volatile long sg_handled;
static volatile int sg_done, sg_sending;
PROBED long sg_leaf(long i) { return i ^ 5; }
PROBED long sg_nested(long depth) {
    const long r = depth ? sg_nested(depth - 1) + 1 : 0;
    __asm__ __volatile__("" ::: "memory"); /* not a tail call, not a loop */
    return r;
}
PROBED void sg_handler(int sig) {
    (void)sig;
    sink += sg_nested(8);
    sg_handled++;
}

static void* sg_sender(void* arg) {
    const pthread_t target = *(pthread_t*)arg;
    while (!sg_done) {
        pthread_kill(target, SIGUSR2);
        sg_sending = 1;
        usleep(20);
    }
    return 0;
}

static long signals(long n, int alternate) {
    static char altstack[256 * 1024];
    stack_t ss;
    memset(&ss, 0, sizeof ss);
    ss.ss_sp = altstack;
    ss.ss_size = sizeof altstack;
    if (alternate) sigaltstack(&ss, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = sg_handler;
    sa.sa_flags = SA_RESTART | (alternate ? SA_ONSTACK : 0);
    sigaction(SIGUSR2, &sa, 0);
    sg_handled = 0;
    sg_done = 0;
    sg_sending = 0;
    pthread_t self = pthread_self(), sender;
    pthread_create(&sender, 0, sg_sender, &self);
    while (!sg_sending) sched_yield(); /* on a loaded machine the loop could end before it starts */
    long sum = 0;
    for (long i = 0; i < n; i++) sum += sg_leaf(i);
    sg_done = 1;
    pthread_join(sender, 0);
    /* let no signal still in flight land after the count is printed */
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &block, 0);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGUSR2, &sa, 0);
    pthread_sigmask(SIG_UNBLOCK, &block, 0);
    if (alternate) {
        ss.ss_flags = SS_DISABLE;
        sigaltstack(&ss, 0);
    }
    sink += sum;
    return sg_handled;
}

/* ---- a signal inside a thread's first traced call ----
 * The runtime claims a thread's sums, ring and return stack at its first
 * traced event and registers the thread (pthread_setspecific) while it
 * does: the runtime's calls come to this definition (-rdynamic), which
 * raises SIGUSR2 in a thread that armed it, so sg_handler is due from
 * inside the claim every time, not one run in twenty. */
static __thread volatile int fc_armed; /* sg_leaf never reads it: kept */
static volatile long fc_raised;
typedef int (*setspecific_fn)(pthread_key_t, const void*);
static setspecific_fn fc_real_setspecific;
EXTERN_C int pthread_setspecific(pthread_key_t key, const void* value)
#ifdef __cplusplus
    noexcept
#endif
{
    if (!fc_real_setspecific) fc_real_setspecific = (setspecific_fn)dlsym(RTLD_NEXT, "pthread_setspecific");
    if (fc_armed) {
        fc_raised++;
        raise(SIGUSR2);
    }
    return fc_real_setspecific(key, value);
}

static void* fc_thread(void* arg) {
    long sum = 0;
    fc_armed = 1;
    for (long i = 0; i < (long)arg; i++) sum += sg_leaf(i);
    fc_armed = 0;
    return (void*)sum;
}

static long firstcall(long n) {
    if (!fc_real_setspecific) fc_real_setspecific = (setspecific_fn)dlsym(RTLD_NEXT, "pthread_setspecific");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = sg_handler;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR2, &sa, 0);
    sg_handled = 0;
    fc_raised = 0;
    pthread_t thread;
    void* sum = 0;
    pthread_create(&thread, 0, fc_thread, (void*)n);
    pthread_join(thread, &sum);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGUSR2, &sa, 0);
    sink += (long)sum;
    return 100 * sg_handled + fc_raised;
}

/* ---- threads that end inside hooked frames ---- */
static volatile long tc_cleanups;
PROBED void te_exit(long i) { pthread_exit((void*)i); }
PROBED void* te_start(void* arg) {
    te_exit((long)arg);
    return 0;
}
PROBED void tc_wait(void) {
    for (;;) {
        pthread_testcancel();
        usleep(50);
    }
}
static void tc_cleanup(void* arg) {
    (void)arg;
    __atomic_fetch_add(&tc_cleanups, 1, __ATOMIC_SEQ_CST);
}
PROBED void* tc_start(void* arg) {
    pthread_cleanup_push(tc_cleanup, arg);
    tc_wait();
    pthread_cleanup_pop(0);
    return 0;
}
PROBED void* tn_start(void* arg) { return (void*)(sg_leaf((long)arg) ^ 5); }

static long threads(long n) {
    tc_cleanups = 0;
    long wrong = 0;
    for (long i = 0; i < n; i++) {
        pthread_t t;
        void* got = 0;
        pthread_create(&t, 0, te_start, (void*)i);
        pthread_join(t, &got);
        wrong += got != (void*)i;
        pthread_create(&t, 0, tc_start, 0);
        pthread_cancel(t);
        pthread_join(t, &got);
        wrong += got != PTHREAD_CANCELED;
        pthread_create(&t, 0, tn_start, (void*)i);
        pthread_join(t, &got);
        wrong += got != (void*)i;
    }
    return wrong ? -wrong : tc_cleanups;
}

/* ---- fork: the child returns through frames hooked in its parent ---- */
PROBED long fk_fork(long i) {
    const pid_t child = fork();
    if (child == 0) return -1;
    int status = 0;
    waitpid(child, &status, 0);
    (void)i;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

static long forks(long n) {
    long failed = 0;
    for (long i = 0; i < n; i++) {
        const long r = fk_fork(i);
        if (r < 0) { /* in the child */
            long sum = 0;
            for (long k = 0; k < 100; k++) sum += sg_leaf(k) ^ 5;
            _exit(sum == 4950 ? 42 : 1);
        }
        failed += r != 42;
    }
    return failed;
}

/* ---- tail calls: the slot already holds a trampoline ---- */
PROBED long tc_b(long x) { return x * 7 + sink; }
PROBED long tc_a(long x) { return tc_b(x + 1); }
PROBED long tc_odd(long n);
PROBED long tc_even(long n) { return n == 0 ? 1 : tc_odd(n - 1); }
PROBED long tc_odd(long n) { return n == 0 ? 0 : tc_even(n - 1); }

/* ---- recursion deeper than the return stack ---- */
PROBED long rec(long depth) {
    const long r = depth ? rec(depth - 1) + 1 : 0;
    __asm__ __volatile__("" ::: "memory");
    return r;
}

/* ---- backtrace() from inside hooked frames ---- */
static const char* frame_name(void* address) {
    Dl_info info;
    if (!dladdr(address, &info) || !info.dli_sname) return "?";
    return info.dli_sname;
}

/* 1 when bt_c, bt_b and bt_a come in this order with nothing but return
 * trampolines between them. */
PROBED int bt_c(void) {
    void* frames[64];
    const int n = backtrace(frames, 64);
    const char* want[] = {"bt_c", "bt_b", "bt_a"};
    int next = 0;
    char seen[512] = "";
    for (int i = 0; i < n && next < 3; i++) {
        const char* name = frame_name(frames[i]);
        if (strlen(seen) + strlen(name) + 2 < sizeof seen) strcat(strcat(seen, name), ",");
        if (!strcmp(name, want[next])) next++;
        else if (next > 0 && strcmp(name, "iprobe_rt_return_trampolines") != 0) break;
    }
    fprintf(stderr, "backtrace: %s\n", seen);
    return next == 3;
}
PROBED int bt_b(void) { return bt_c() * 2; }
PROBED int bt_a(void) { return bt_b() / 2; }

/* ---- a thread waits inside hooked frames (gdb, detach while live) ---- */
static int bk_pipe[2];
static volatile int bk_inside;
PROBED long bk_c(void) {
    char c = 0;
    bk_inside = 1;
    while (read(bk_pipe[0], &c, 1) != 1) {
    }
    return c;
}
PROBED long bk_b(void) { return bk_c() + 1; }
PROBED long bk_a(void) { return bk_b() * 2; }
static void* bk_thread(void* arg) {
    (void)arg;
    return (void*)bk_a();
}
static pthread_t bk_blocked;
static long bk_block(void) {
    bk_inside = 0;
    pthread_create(&bk_blocked, 0, bk_thread, 0);
    while (!bk_inside) usleep(1000);
    return 1;
}
static long bk_release(void) {
    void* got = 0;
    if (write(bk_pipe[1], "\x05", 1) != 1) exit(1);
    pthread_join(bk_blocked, &got);
    return (long)got;
}

#ifdef __cplusplus
/* ---- C++ exceptions through hooked frames ---- */
static long destroyed, rethrown;
struct Tracker {
    ~Tracker() { destroyed++; }
};
PROBED void ex_inner(long i) {
    Tracker t;
    if (i >= 0) throw std::runtime_error("from ex_inner");
    sink++;
}
PROBED void ex_middle(long i) {
    Tracker t;
    ex_inner(i);
    sink++;
}
PROBED long ex_outer(long i) {
    try {
        ex_middle(i);
        return 0;
    } catch (const std::exception&) {
        return 1;
    }
}
PROBED void ex_rethrow_mid(long i) {
    try {
        ex_inner(i);
    } catch (...) {
        rethrown++;
        throw;
    }
}
PROBED long ex_rethrow_outer(long i) {
    try {
        ex_rethrow_mid(i);
    } catch (const std::runtime_error&) {
        return 1;
    }
    return 0;
}
PROBED std::exception_ptr ex_capture(long i) {
    try {
        ex_inner(i);
    } catch (...) {
        return std::current_exception();
    }
    return nullptr;
}
/* A catch that calls hooked functions, one that throws again from the
 * handler, and an exception carried out and rethrown elsewhere. */
PROBED long ex_nested(long i) {
    long r = 0;
    try {
        try {
            ex_inner(i);
        } catch (const std::logic_error&) {
            return -1; /* not this type: passed through */
        }
    } catch (const std::runtime_error&) {
        r = ex_outer(i) + ex_rethrow_outer(i);
    }
    try {
        std::rethrow_exception(ex_capture(i));
    } catch (const std::runtime_error&) {
        r++;
    }
    return r;
}
#endif

static long command(const char* name, long n) {
    long r = 0;
    if (!strcmp(name, "values")) return values(n);
    if (!strcmp(name, "longjmp")) {
        for (long i = 0; i < n; i++) r += lj_outer(i);
        return r;
    }
    if (!strcmp(name, "abandon")) return ab_catch(n);
    if (!strcmp(name, "siglongjmp")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = sj_handler;
        sigaction(SIGUSR1, &sa, 0);
        for (long i = 0; i < n; i++) r += sj_outer();
        return r;
    }
    if (!strcmp(name, "setcontext")) {
        for (long i = 0; i < n; i++) r += sc_outer();
        return r;
    }
    if (!strcmp(name, "swapcontext")) return coroutine(n);
    if (!strcmp(name, "signals")) return signals(n, 0);
    if (!strcmp(name, "altsignals")) return signals(n, 1);
    if (!strcmp(name, "firstcall")) return firstcall(n);
    if (!strcmp(name, "threads")) return threads(n);
    if (!strcmp(name, "fork")) return forks(n);
    if (!strcmp(name, "tailcalls")) {
        for (long i = 0; i < n; i++) r += tc_a(i);
        return r;
    }
    if (!strcmp(name, "mutual")) return tc_even(n);
    if (!strcmp(name, "recurse")) return rec(n);
    if (!strcmp(name, "backtrace")) {
        for (long i = 0; i < n; i++) r += bt_a();
        return r;
    }
    if (!strcmp(name, "block")) return bk_block();
    if (!strcmp(name, "release")) return bk_release();
#ifdef __cplusplus
    if (!strcmp(name, "exceptions")) {
        destroyed = 0;
        for (long i = 0; i < n; i++) r += ex_outer(i);
        return r == n && destroyed == 2 * n ? n : -1;
    }
    if (!strcmp(name, "rethrow")) {
        rethrown = 0;
        for (long i = 0; i < n; i++) r += ex_rethrow_outer(i);
        return r == n && rethrown == n ? n : -1;
    }
    if (!strcmp(name, "nested")) {
        for (long i = 0; i < n; i++) r += ex_nested(i);
        return r;
    }
#endif
    return -1000000;
}

int main(int argc, char** argv) {
    if (pipe(bk_pipe) != 0) return 1;
    return fixture_serve(argc, argv, "rt_cases", command);
}
