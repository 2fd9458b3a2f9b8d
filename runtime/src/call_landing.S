/* Where the attacher's function calls inside this process return
 * (hotpatch/src/process.cpp, StoppedProcess::call).  The attacher leaves a
 * signal frame holding the borrowed thread's own context above the return
 * address; the landing keeps the call's result in that frame's uc_link (the
 * attacher reads it there) and returns to the context with rt_sigreturn.  The
 * thread needs nobody to get back: an attacher killed during the call leaves
 * it running exactly where it was. */
    .text
    .globl iprobe_rt_call_landing
    .type iprobe_rt_call_landing, @function
iprobe_rt_call_landing:
    mov %rax, 8(%rsp)       /* rsp: the ucontext; +8: uc_link */
    mov $15, %eax           /* rt_sigreturn */
    syscall
    ud2
    .size iprobe_rt_call_landing, . - iprobe_rt_call_landing

    .section .note.GNU-stack, "", @progbits
