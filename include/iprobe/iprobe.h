/*
 * iprobe developer probe points.  Include this header in application code
 * (C or C++, gcc or clang, either build flow) to mark places worth tracing:
 *
 *   IPROBE_POINT(cache_miss);
 *   IPROBE_POINT_ARGS(request_done, fd, bytes, status);   // 1..4 integer/pointer args
 *
 * The name is a bare token sequence (like a USDT probe name), not a string
 * literal.  Each use compiles to
 *
 *   lea -128(%rsp),%rsp ; nopl 0(%rax,%rax,1) ; lea 128(%rsp),%rsp
 *
 * plus a record in the IPROBE_PL_SECTION section (see probe_list.h, "site
 * section"), so `iprobe list BINARY` shows it as kind "point" and
 * `iprobe attach PID --functions NAME` enables it.  Disabled, the cost is the
 * 5-byte NOP and two `lea` (no flags, no memory access); the arguments are
 * only moved into rdi, rsi, rdx, rcx where the compiler did not already have
 * them.  Enabled, the NOP becomes `call` to iprobe's register-preserving
 * trampoline, which records the name and the four argument registers.
 *
 * Why the two `lea`: a point may sit in the middle of a leaf function whose
 * locals live in the 128-byte red zone below %rsp; the `call` an enabled
 * probe performs pushes its return address there.  Stepping %rsp down first
 * keeps the red zone intact.
 *
 * IPROBE_ALWAYS / IPROBE_NEVER mark functions for the LLVM pass flow
 * (iprobe-cc --mode=llvm): always instrumented whatever the filters say, or
 * never instrumented.  Under gcc, IPROBE_NEVER also keeps
 * -finstrument-functions away from the function.
 *
 * On targets other than x86-64 the macros expand to nothing.
 */
#ifndef IPROBE_IPROBE_H
#define IPROBE_IPROBE_H

#if defined(__clang__)
#define IPROBE_ALWAYS __attribute__((annotate("iprobe")))
#define IPROBE_NEVER __attribute__((annotate("iprobe_never")))
#elif defined(__GNUC__)
#define IPROBE_ALWAYS
#define IPROBE_NEVER __attribute__((no_instrument_function))
#else
#define IPROBE_ALWAYS
#define IPROBE_NEVER
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

/* Keep in sync with struct iprobe_site_entry in probe_list.h. */
#define IPROBE__SITE_ASM(name, nargs)                                          \
    "lea -128(%%rsp),%%rsp\n"                                                  \
    "990: .byte 0x0f,0x1f,0x44,0x00,0x00\n"                                    \
    "lea 128(%%rsp),%%rsp\n"                                                   \
    ".pushsection iprobe_sites,\"a?R\",@progbits\n"                            \
    ".balign 8\n"                                                              \
    "991: .short 992f-991b\n"                                                  \
    ".byte 1,3\n"                                                              \
    ".long 990b-.\n"                                                           \
    ".long 0\n"                                                                \
    ".byte 5," #nargs ",1,0\n"                                                 \
    ".asciz \"" #name "\"\n"                                                   \
    ".balign 8\n"                                                              \
    "992:\n"                                                                   \
    ".popsection\n"

#define IPROBE__ARG(value) ((__UINTPTR_TYPE__)(value))

#define IPROBE_POINT(name) __asm__ __volatile__(IPROBE__SITE_ASM(name, 0) : :)

#define IPROBE__POINT1(name, a) \
    __asm__ __volatile__(IPROBE__SITE_ASM(name, 1) : : "D"(IPROBE__ARG(a)))
#define IPROBE__POINT2(name, a, b) \
    __asm__ __volatile__(IPROBE__SITE_ASM(name, 2) : : "D"(IPROBE__ARG(a)), "S"(IPROBE__ARG(b)))
#define IPROBE__POINT3(name, a, b, c)                                                           \
    __asm__ __volatile__(IPROBE__SITE_ASM(name, 3) : : "D"(IPROBE__ARG(a)), "S"(IPROBE__ARG(b)), \
                         "d"(IPROBE__ARG(c)))
#define IPROBE__POINT4(name, a, b, c, d)                                                        \
    __asm__ __volatile__(IPROBE__SITE_ASM(name, 4) : : "D"(IPROBE__ARG(a)), "S"(IPROBE__ARG(b)), \
                         "d"(IPROBE__ARG(c)), "c"(IPROBE__ARG(d)))

#else /* not x86-64 */

#define IPROBE_POINT(name) ((void)0)
#define IPROBE__POINT1(name, a) ((void)(a))
#define IPROBE__POINT2(name, a, b) ((void)(a), (void)(b))
#define IPROBE__POINT3(name, a, b, c) ((void)(a), (void)(b), (void)(c))
#define IPROBE__POINT4(name, a, b, c, d) ((void)(a), (void)(b), (void)(c), (void)(d))

#endif

/* More than four arguments selects IPROBE__POINT_TOO_MANY_ARGS: a compile error. */
#define IPROBE__COUNT(...) IPROBE__COUNT_(__VA_ARGS__, _TOO_MANY_ARGS, 4, 3, 2, 1, 0)
#define IPROBE__COUNT_(a, b, c, d, e, n, ...) n
#define IPROBE__CAT(a, b) IPROBE__CAT_(a, b)
#define IPROBE__CAT_(a, b) a##b
#define IPROBE_POINT_ARGS(name, ...) \
    IPROBE__CAT(IPROBE__POINT, IPROBE__COUNT(__VA_ARGS__))(name, __VA_ARGS__)

#endif /* IPROBE_IPROBE_H */
