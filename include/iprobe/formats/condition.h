/*
 * A compiled `--when` condition: the bytecode `iprobe attach` writes per
 * function into the region (rt_layout.h: conditions table) and the runtime
 * evaluates inside the target (runtime/src/condition.c).
 *
 * Straight-line postfix code over a stack of 64-bit values: no jumps, so no
 * loop; at most IPROBE_COND_MAX_OPS operations and IPROBE_COND_MAX_STRINGS
 * bounded string compares, so one evaluation costs a bounded time whatever
 * the attacher (or the target, which can write its region) put there.  Every
 * field is checked by the evaluator before use: a malformed program is
 * "false", never a crash.
 *
 * Compiled by hotpatch/include/iprobe/hotpatch/condition.h.
 * This header is the single definition; C11 so the runtime can include it.
 */
#ifndef IPROBE_FORMATS_CONDITION_H
#define IPROBE_FORMATS_CONDITION_H

#ifdef __cplusplus
extern "C" {
#endif

#define IPROBE_COND_MAX_OPS 32
#define IPROBE_COND_MAX_STRINGS 4
#define IPROBE_COND_STRING_MAX 64 /* bytes compared at most (the literal's length) */
#define IPROBE_COND_ARGS 6        /* integer argument registers: rdi rsi rdx rcx r8 r9 */
/* Offsets the runtime's assembler reads (checked in runtime/src/rt.c). */
#define IPROBE_COND_PROGRAM_SIZE 864
#define IPROBE_COND_FAST 16
#define IPROBE_COND_FAST_ARG 17
#define IPROBE_COND_FAST_INVERT 18
#define IPROBE_COND_FAST_MASK 24
#define IPROBE_COND_FAST_SIGNBIT 32
#define IPROBE_COND_FAST_BIAS 40
#define IPROBE_COND_FAST_LOW 48
#define IPROBE_COND_FAST_SPAN 56

/* The rest is C (the runtime's assembler includes only the numbers above). */
#ifndef __ASSEMBLER__
#include <stdint.h>

enum iprobe_cond_opcode {
    IPROBE_COND_CONST = 1,     /* push operand */
    IPROBE_COND_ARG = 2,       /* push args[operand], `width` low bytes extended by `is_signed` */
    IPROBE_COND_RETVAL = 3,    /* push the return value (rax), the same extension */
    IPROBE_COND_DURATION = 4,  /* push the call's inclusive time in clock ticks */
    IPROBE_COND_COMPARE = 5,   /* pop b, pop a, push (a `compare` b), signed when is_signed */
    IPROBE_COND_STRING_EQ = 6, /* pop a pointer, push whether it points at strings[operand] (NUL-terminated) */
    IPROBE_COND_NOT = 7,
    IPROBE_COND_AND = 8,
    IPROBE_COND_OR = 9
};

enum iprobe_cond_compare {
    IPROBE_COND_EQ = 0,
    IPROBE_COND_NE = 1,
    IPROBE_COND_LT = 2,
    IPROBE_COND_LE = 3,
    IPROBE_COND_GT = 4,
    IPROBE_COND_GE = 5
};

/* What a program reads: decides when it can be evaluated. */
enum iprobe_cond_needs {
    IPROBE_COND_NEEDS_ARGS = 1u,
    IPROBE_COND_NEEDS_RETVAL = 2u,
    IPROBE_COND_NEEDS_DURATION = 4u,
    IPROBE_COND_AT_EXIT = IPROBE_COND_NEEDS_RETVAL | IPROBE_COND_NEEDS_DURATION
};

struct iprobe_cond_op {
    uint8_t opcode;   /* enum iprobe_cond_opcode */
    uint8_t compare;  /* enum iprobe_cond_compare (COMPARE) */
    uint8_t width;    /* ARG, RETVAL: 1, 2, 4 or 8 bytes */
    uint8_t is_signed;
    uint8_t is_duration; /* CONST: operand is in ns until the attacher converts it to ticks */
    uint8_t pad[3];
    int64_t operand;
};

struct iprobe_cond_string {
    uint32_t length;  /* <= IPROBE_COND_STRING_MAX */
    uint32_t pad;
    char bytes[IPROBE_COND_STRING_MAX];
};

struct iprobe_cond_program {
    uint32_t op_count;     /* <= IPROBE_COND_MAX_OPS; 0 = no condition (always true) */
    uint32_t needs;        /* enum iprobe_cond_needs, or-ed */
    uint32_t string_count; /* <= IPROBE_COND_MAX_STRINGS */
    uint32_t pad;
    /* The same program when it is `argN OP constant`, as one unsigned range
     * test the runtime's assembler entry makes before any C runs (a call it
     * does not hold for then costs what a count does):
     *   x = ((arg & fast_mask) ^ fast_signbit) - fast_signbit   (width, sign)
     *   holds = ((x ^ fast_bias) - fast_low <= fast_span) != fast_invert
     * fast 0: not that shape (the C evaluator decides). */
    uint8_t fast;
    uint8_t fast_arg;     /* 0..5 */
    uint8_t fast_invert;  /* 0 or 1 */
    uint8_t pad2[5];
    uint64_t fast_mask;
    uint64_t fast_signbit;
    uint64_t fast_bias;   /* 1 << 63 for a signed comparison: signed order as unsigned */
    uint64_t fast_low;
    uint64_t fast_span;
    struct iprobe_cond_op ops[IPROBE_COND_MAX_OPS];
    struct iprobe_cond_string strings[IPROBE_COND_MAX_STRINGS];
};

/* What a condition is evaluated against (what the handler holds). */
struct iprobe_cond_values {
    uint64_t args[IPROBE_COND_ARGS];
    uint64_t retval;
    uint64_t duration; /* clock ticks (rt_layout.h iprobe_rt_clock) */
};

#endif /* __ASSEMBLER__ */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* IPROBE_FORMATS_CONDITION_H */
