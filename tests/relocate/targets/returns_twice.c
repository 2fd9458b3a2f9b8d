/* Calls into libc's functions that return twice or on another stack, each a
 * known number of times: setjmp and sigsetjmp returned to again by longjmp
 * and siglongjmp, vfork's child returning before its parent, swapcontext
 * into a coroutine and back, and posix_spawn (a clone on another stack, whose
 * return is an ordinary one) beside them.  Prints what it computed, which a
 * probed run must print the same. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

extern char** environ;

static jmp_buf jump;
static sigjmp_buf sigjump;
static ucontext_t main_context, coroutine_context;
static int coroutine_steps;

static void coroutine(void) {
    for (;;) {
        coroutine_steps++;
        swapcontext(&coroutine_context, &main_context);
    }
}

static __attribute__((noinline)) void jump_back(int i) {
    if (i % 2) longjmp(jump, i);
    siglongjmp(sigjump, i);
}

int main(void) {
    long jumped = 0;
    for (int i = 0; i < 1000; i++) {  /* setjmp: 1000 calls, 500 returning twice */
        const int r = setjmp(jump);
        if (r == 0 && i % 2) jump_back(i);
        jumped += r;
    }
    for (int i = 0; i < 1000; i++) {  /* sigsetjmp: 1000 calls, 500 returning twice */
        const int r = sigsetjmp(sigjump, 1);
        if (r == 0 && i % 2 == 0 && i > 0) jump_back(i);
        jumped += r;
    }
    int exited = 0;
    for (int i = 0; i < 20; i++) {  /* vfork: 20 calls, each returning in the child first */
        const pid_t child = vfork();
        if (child == 0) {
            execl("/bin/true", "true", (char*)0);
            _exit(127);
        }
        int status = 0;
        waitpid(child, &status, 0);
        exited += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    for (int i = 0; i < 20; i++) {  /* posix_spawn: 20 calls, ordinary returns */
        pid_t child;
        char* argv[] = {"true", 0};
        if (posix_spawn(&child, "/bin/true", 0, 0, argv, environ) != 0) continue;
        int status = 0;
        waitpid(child, &status, 0);
        exited += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    static char stack[65536];  /* getcontext once, swapcontext 2000 times */
    getcontext(&coroutine_context);
    coroutine_context.uc_stack.ss_sp = stack;
    coroutine_context.uc_stack.ss_size = sizeof stack;
    coroutine_context.uc_link = &main_context;
    makecontext(&coroutine_context, coroutine, 0);
    for (int i = 0; i < 1000; i++) swapcontext(&main_context, &coroutine_context);
    printf("jumped %ld, exited %d, coroutine steps %d\n", jumped, exited, coroutine_steps);
    return 0;
}
