/* Functions with known arguments and return values for `iprobe attach
 * --args --retval --backtrace` (tests/hotpatch/values_test.cpp): built as C
 * and as C++ (which adds a member function and an exception), in every flow,
 * -O2 -g and without -g.  Driven like hp_target: "ready PID", then commands
 * on the FIFO, each answered "ok <command> <value>". */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef __cplusplus
#define EXTERN extern "C"
#else
#define EXTERN
#endif
/* Out of line, called as written: the probes see every call. */
#define PROBED EXTERN __attribute__((noinline, used))

enum color { RED = 0, GREEN = 5, BLUE = -3 };
struct point {
    int x;
    int y;
};
struct vec2 {
    double x, y;
};
struct mixed {
    long id;
    double weight;
};

static volatile long g_sink;

PROBED long v_ints(int a, unsigned short b, long c, signed char d) { return a + b + c + d; }
PROBED int v_enum(enum color c, bool flag) { return flag ? (int)c * 2 : (int)c; }
PROBED long v_string(const char* s, int read_it) {
    g_sink++;
    return read_it && s ? (long)strlen(s) : -1;
}
PROBED double v_double(double x, float y, int n) { return x * n + y; }
PROBED long v_point(struct point p) { return p.x * 100L + p.y; }
PROBED double v_vec(struct vec2 v) { return v.x + v.y; }
PROBED long v_mixed(struct mixed m, int k) { return m.id * k + (long)m.weight; }
PROBED long v_raw(long a, long b, long c, long d, long e, long f) { return a ^ b ^ c ^ d ^ e ^ f; }
PROBED void v_void(int n) { g_sink += n; }
PROBED long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

/* Inlined into its caller: in the -finstrument-functions flow its hooks stay
 * there, in the caller's code. */
static inline long twice(long v) { return 2 * v; }
PROBED long v_inlined(long v) { return twice(v) + 1; }

/* Inlined into in_loop (always): in the -finstrument-functions flow each
 * call's hooks are in in_loop's code, the parameters where in_loop keeps
 * them (n, it and name in registers; spare, never used, is n * 7 to gcc:
 * a computation, optimized out for iprobe). */
struct item {
    long id;
    struct item* next;
};
#define ITEMS 32
struct item g_items[ITEMS]; /* a list (linked by "loop"): `it` is not n's to compute */
static inline __attribute__((always_inline)) long in_visit(int n, struct item* it, const char* name, int spare) {
    g_sink += name[0];
    it->id = n + 1;
    return n * 2 + it->id;
}
PROBED long in_loop(long rounds, const char* name) {
    long sum = 0;
    int n = 0;
    for (struct item* it = g_items; it && n < rounds; it = it->next, n++) sum += in_visit(n, it, name, n * 7);
    return sum;
}
/* Recursive and inline: gcc inlines it into in_rec_top and into itself (a
 * few levels), so its own code holds copies of it. */
static inline long in_rec(int n) { return n <= 0 ? 0 : n + in_rec(n - 1); }
PROBED long in_rec_top(long n) { return in_rec((int)n); }

/* Links g_items into a list and prints where it starts. */
static void link_items(void) {
    for (int i = 0; i < ITEMS; i++) g_items[i].next = i + 1 < ITEMS ? &g_items[i + 1] : NULL;
    printf("items %p\n", (void*)g_items);
}

/* in_visit inlined into in_pair, itself inlined into in_nested: a copy in a copy. */
static inline __attribute__((always_inline)) long in_pair(int n, struct item* it, const char* name) {
    return in_visit(n, it, name, n * 7) + 1000;
}
PROBED long in_nested(long rounds, const char* name) {
    long sum = 0;
    int n = 0;
    for (struct item* it = g_items; it && n < rounds; it = it->next, n++) sum += in_pair(n, it, name);
    return sum;
}

PROBED long bt_inner(int x) {
    g_sink += x;
    return x + 1;
}
PROBED long bt_middle(int x) { return bt_inner(x + 1) * 2; }
PROBED long bt_outer(int x) { return bt_middle(x + 1) + 3; }

#ifdef __cplusplus
#include <stdexcept>
struct Counter {
    long total;
    __attribute__((noinline)) long add(long v);
};
long Counter::add(long v) {
    total += v;
    return total;
}
/* Defined in its class: inline, inlined into in_members (this, k from the
 * loop, v the constant 3). */
struct Accum {
    long total;
    long add_scaled(int k, long v) {
        total += v * 2 + k;
        return total;
    }
};
PROBED long in_members(Accum* a, long rounds) {
    long last = 0;
    for (int n = 0; n < rounds; n++) last = a->add_scaled(n, 3);
    return last;
}
PROBED long ex_thrower(int x) {
    if (x > 0) throw std::runtime_error("thrown");
    return x;
}
PROBED long ex_middle(int x) { return ex_thrower(x) + 1; }
PROBED long ex_catcher(int x) {
    try {
        return ex_middle(x);
    } catch (const std::exception&) {
        return -100;
    }
}
#endif

/* A call in flight while iprobe attaches again or detaches: "block N" starts
 * a thread calling v_wait(N), which waits inside until "release" writes a
 * byte (5) to its pipe; "release" answers what v_wait returned (N + 5). */
static int wait_pipe[2];
static volatile int wait_inside;
PROBED long v_wait(int n) {
    char c = 0;
    wait_inside = 1;
    while (read(wait_pipe[0], &c, 1) != 1) {
    }
    return n + c;
}
static pthread_t wait_thread;
static void* wait_run(void* n) { return (void*)v_wait((int)(long)n); }
static long wait_block(long n) {
    wait_inside = 0;
    if (pthread_create(&wait_thread, 0, wait_run, (void*)n) != 0) exit(1);
    while (!wait_inside) usleep(1000);
    return 1;
}
static long wait_release(void) {
    void* got = 0;
    if (write(wait_pipe[1], "\x05", 1) != 1) exit(1);
    pthread_join(wait_thread, &got);
    return (long)got;
}

/* A thread whose call is in flight at a detach and that calls more after
 * the next attach: "hold N" starts it inside v_wait(N); "unblock" lets that
 * call return (answers N + 5 once it has); "go" lets the thread call
 * v_spin N times and end (answers N). */
static int hold_pipe[2];
static volatile long hold_returned;
static pthread_t hold_thread;
PROBED long v_spin(long i);
static void* hold_run(void* n) {
    hold_returned = v_wait((int)(long)n);
    char c = 0;
    while (read(hold_pipe[0], &c, 1) != 1) {
    }
    long i = 0;
    for (long k = 0; k < (long)n; k++) i = v_spin(i);
    return (void*)i;
}
static long hold_start(long n) {
    wait_inside = 0;
    hold_returned = 0;
    if (pthread_create(&hold_thread, 0, hold_run, (void*)n) != 0) exit(1);
    while (!wait_inside) usleep(1000);
    return 1;
}
static long hold_unblock(void) {
    if (write(wait_pipe[1], "\x05", 1) != 1) exit(1);
    while (!hold_returned) usleep(1000);
    return hold_returned;
}
static long hold_go(void) {
    void* got = 0;
    if (write(hold_pipe[1], "g", 1) != 1) exit(1);
    pthread_join(hold_thread, &got);
    return (long)got;
}

/* Calls at a service's rate while iprobe attaches again and again: "spin N"
 * starts N threads calling v_spin until "stop", which answers how many
 * calls they made. */
#define SPIN_MAX 8
PROBED long v_spin(long i) { return i + 1; }
static volatile int spin_stop;
static pthread_t spin_threads[SPIN_MAX];
static long spin_count;
static void* spin_run(void* arg) {
    (void)arg;
    long i = 0;
    while (!spin_stop) i = v_spin(i);
    return (void*)i;
}
static long spin_start(long n) {
    spin_stop = 0;
    spin_count = n < 1 ? 1 : n > SPIN_MAX ? SPIN_MAX : n;
    for (long i = 0; i < spin_count; i++)
        if (pthread_create(&spin_threads[i], 0, spin_run, 0) != 0) exit(1);
    return spin_count;
}
static long spin_end(void) {
    spin_stop = 1;
    long calls = 0;
    for (long i = 0; i < spin_count; i++) {
        void* made = 0;
        pthread_join(spin_threads[i], &made);
        calls += (long)made;
    }
    return calls;
}

/* A pointer to freed memory that faults (an unmapped page), and a string
 * that ends exactly at the end of a page followed by an unmapped one. */
static char* dangling(void) {
    char* p = (char*)mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    strcpy(p, "gone");
    munmap(p, 4096);
    return p;
}
static char* at_page_end(void) {
    char* p = (char*)mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(p + 4096, 4096);
    strcpy(p + 4096 - 5, "edge");
    return p + 4096 - 5;
}

static long run_values(void) {
    long sum = 0;
    sum += v_ints(7, 8, -9, 10);
    sum += v_enum(GREEN, true);
    sum += v_enum(BLUE, false);
    sum += v_string("user:42", 1);
    sum += v_string(NULL, 1);
    sum += v_string(dangling(), 0);
    sum += v_string(at_page_end(), 1);
    sum += (long)v_double(1.5, 0.25f, 4);
    struct point p = {3, 4};
    sum += v_point(p);
    struct vec2 v = {1.25, 2.5};
    sum += (long)v_vec(v);
    struct mixed m = {11, 2.75};
    sum += v_mixed(m, 3);
    sum += v_raw(0x1111111111111111L, 0x2222, -3, 0x7fffffffffffffffL, 5, 0x600000000L);
    v_void(9);
#ifdef __cplusplus
    Counter c = {40};
    sum += c.add(2);
    sum += (long)(((unsigned long)(&c)) & 1); /* keeps c in memory: its address is `this` */
    printf("this %p\n", (void*)&c);
#endif
    return sum;
}

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: values_target THREADS FIFO\n");
        return 2;
    }
    setvbuf(stdout, 0, _IOLBF, 0);
    if (pipe(wait_pipe) != 0 || pipe(hold_pipe) != 0) return 1;
    printf("ready %d\n", (int)getpid());
    char line[256];
    for (;;) {
        /* Read and write: the FIFO always has a writer (this), so it never
         * reads EOF; opened for reading only, a command written between the
         * last writer's EOF and the fclose was thrown away with the pipe
         * (an attach's stop landing there made a test wait for ever). */
        FILE* in = fopen(argv[2], "r+");
        if (!in) return 1;
        while (fgets(line, sizeof line, in)) {
            long a = 0;
            char word[64];
            if (strncmp(line, "values", 6) == 0) {
                printf("ok values %ld\n", run_values());
            } else if (sscanf(line, "fib %ld", &a) == 1) {
                printf("ok fib %ld\n", fib((int)a));
            } else if (sscanf(line, "inlined %ld", &a) == 1) {
                printf("ok inlined %ld\n", v_inlined(a));
            } else if (sscanf(line, "block %ld", &a) == 1) {
                printf("ok block %ld\n", wait_block(a));
            } else if (strncmp(line, "release", 7) == 0) {
                printf("ok release %ld\n", wait_release());
            } else if (sscanf(line, "hold %ld", &a) == 1) {
                printf("ok hold %ld\n", hold_start(a));
            } else if (strncmp(line, "unblock", 7) == 0) {
                printf("ok unblock %ld\n", hold_unblock());
            } else if (strncmp(line, "go", 2) == 0) {
                printf("ok go %ld\n", hold_go());
            } else if (sscanf(line, "spin %ld", &a) == 1) {
                printf("ok spin %ld\n", spin_start(a));
            } else if (strncmp(line, "stop", 4) == 0) {
                printf("ok stop %ld\n", spin_end());
            } else if (sscanf(line, "loop %ld %63s", &a, word) == 2) {
                link_items();
                printf("ok loop %ld\n", in_loop(a, word));
            } else if (sscanf(line, "rec %ld", &a) == 1) {
                printf("ok rec %ld\n", in_rec_top(a));
            } else if (sscanf(line, "nested %ld %63s", &a, word) == 2) {
                link_items();
                printf("ok nested %ld\n", in_nested(a, word));
#ifdef __cplusplus
            } else if (sscanf(line, "members %ld", &a) == 1) {
                static Accum accum;
                accum.total = 0;
                printf("accum %p\n", (void*)&accum);
                printf("ok members %ld\n", in_members(&accum, a));
#endif
            } else if (sscanf(line, "bt %ld", &a) == 1) {
                printf("ok bt %ld\n", bt_outer((int)a));
#ifdef __cplusplus
            } else if (sscanf(line, "throw %ld", &a) == 1) {
                printf("ok throw %ld\n", ex_catcher((int)a));
#endif
            } else if (strncmp(line, "quit", 4) == 0) {
                printf("ok quit 0\n");
                return 0;
            }
        }
        fclose(in);
    }
}
