/* Loads libraries with dlopen and calls into each N times, for the tests
 * of `iprobe run --module` on a library loaded after the program started.
 *
 *   dlopen_target [--threads] [--fork] [--dlmopen] [--fds] [--wait FILE] N [LIB:SYMBOL...]
 *
 * Each LIB (a path) is dlopen'ed and its SYMBOL called N times, one after
 * the other, or with --threads one thread per LIB, all loading at once.
 * --dlmopen loads each into a new namespace (dlmopen(LM_ID_NEWLM)).
 * start_work (from libiprobe_dl_start.so, linked: loaded before main) is
 * called N times first.  --fork: a child does the loads and calls first
 * (it is not probed), then the parent, once the child is gone.  --wait FILE:
 * the loads wait until FILE exists.  Prints "done S" (S the sum of every
 * call's result in the parent); --fds also the descriptors open at the end,
 * LD_AUDIT as the program sees it and how many copies of libc's code are
 * mapped. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int start_work(int x);

static long g_n;
static pthread_barrier_t g_barrier;
static int g_threads;
static int g_dlmopen;

static void* load_and_call(void* arg) {
    char spec[4096];
    snprintf(spec, sizeof spec, "%s", (const char*)arg);
    char* colon = strrchr(spec, ':');
    if (!colon) {
        fprintf(stderr, "LIB:SYMBOL expected, not %s\n", spec);
        exit(2);
    }
    *colon = 0;
    if (g_threads) pthread_barrier_wait(&g_barrier);
    void* lib = g_dlmopen ? dlmopen(LM_ID_NEWLM, spec, RTLD_NOW) : dlopen(spec, RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        exit(1);
    }
    int (*work)(int) = (int (*)(int))dlsym(lib, colon + 1);
    if (!work) {
        fprintf(stderr, "%s\n", dlerror());
        exit(1);
    }
    long sum = 0;
    for (long i = 0; i < g_n; i++) sum += work((int)i);
    return (void*)sum;
}

static long load_all(char** specs, int count) {
    long sum = 0;
    if (!g_threads) {
        for (int i = 0; i < count; i++) sum += (long)load_and_call(specs[i]);
        return sum;
    }
    pthread_t threads[64];
    if (count > 64) count = 64;
    pthread_barrier_init(&g_barrier, 0, (unsigned)count);
    for (int i = 0; i < count; i++) pthread_create(&threads[i], 0, load_and_call, specs[i]);
    for (int i = 0; i < count; i++) {
        void* r;
        pthread_join(threads[i], &r);
        sum += (long)r;
    }
    return sum;
}

int main(int argc, char** argv) {
    int fork_first = 0, fds = 0, a = 1;
    const char* wait_for = 0;
    for (; a < argc && strncmp(argv[a], "--", 2) == 0; a++) {
        if (strcmp(argv[a], "--threads") == 0) g_threads = 1;
        else if (strcmp(argv[a], "--fork") == 0) fork_first = 1;
        else if (strcmp(argv[a], "--fds") == 0) fds = 1;
        else if (strcmp(argv[a], "--dlmopen") == 0) g_dlmopen = 1;
        else if (strcmp(argv[a], "--wait") == 0 && a + 1 < argc) wait_for = argv[++a];
    }
    if (a >= argc) {
        fprintf(stderr, "usage: dlopen_target [--threads] [--fork] [--dlmopen] [--fds] [--wait FILE] N [LIB:SYMBOL...]\n");
        return 2;
    }
    g_n = atol(argv[a++]);
    long sum = 0;
    for (long i = 0; i < g_n; i++) sum += start_work((int)i);
    struct stat st;
    while (wait_for && stat(wait_for, &st) != 0) usleep(10000);
    if (fork_first) {
        const pid_t child = fork();
        if (child == 0) {
            load_all(argv + a, argc - a);
            _exit(0);
        }
        int status = 0;
        waitpid(child, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 3;
    }
    sum += load_all(argv + a, argc - a);
    printf("done %ld\n", sum);
    if (fds) {
        int open_fds = -1; /* the directory's own descriptor not counted */
        DIR* dir = opendir("/proc/self/fd");
        for (struct dirent* e; dir && (e = readdir(dir));)
            if (e->d_name[0] != '.') open_fds++;
        if (dir) closedir(dir);
        const char* audit = getenv("LD_AUDIT");
        int libc_code = 0;
        FILE* maps = fopen("/proc/self/maps", "r");
        for (char line[4096]; maps && fgets(line, sizeof line, maps);)
            if (strstr(line, " r-xp ") && strstr(line, "/libc.so.6")) libc_code++;
        if (maps) fclose(maps);
        printf("fds %d audit %s libc %d\n", open_fds, audit ? audit : "(unset)", libc_code);
    }
    return 0;
}
