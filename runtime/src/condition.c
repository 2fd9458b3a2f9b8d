/*
 * Evaluates a compiled `--when` condition (iprobe/formats/condition.h) in
 * the target, on the handler's path: straight-line code, bounded by
 * IPROBE_COND_MAX_OPS operations and IPROBE_COND_MAX_STRINGS string reads of
 * at most IPROBE_COND_STRING_MAX + 1 bytes, so its cost has a ceiling.
 */
#include "condition.h"

#include <sys/syscall.h>
#include <sys/uio.h>

/* Raw syscalls: no libc on the handler's path (it may use vector registers
 * the runtime does not save, and errno is not ours to change). */
static inline long raw_syscall6(long n, long a, long b, long c, long d, long e, long f) {
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ __volatile__("syscall"
                         : "=a"(ret)
                         : "0"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                         : "rcx", "r11", "memory");
    return ret;
}

uint64_t iprobe_cond_read_memory(void* out, uint64_t address, uint64_t size) {
    if (address == 0 || size == 0) return 0;
    /* The pid is asked each time: a forked child reads its own memory. */
    const long pid = raw_syscall6(SYS_getpid, 0, 0, 0, 0, 0, 0);
    struct iovec local = {out, size};
    struct iovec remote = {(void*)(uintptr_t)address, size};
    const long got = raw_syscall6(SYS_process_vm_readv, pid, (long)&local, 1, (long)&remote, 1, 0);
    return got > 0 ? (uint64_t)got : 0;
}

static uint64_t extend(uint64_t value, uint8_t width, uint8_t is_signed) {
    switch (width) {
    case 1: return is_signed ? (uint64_t)(int64_t)(int8_t)value : (uint8_t)value;
    case 2: return is_signed ? (uint64_t)(int64_t)(int16_t)value : (uint16_t)value;
    case 4: return is_signed ? (uint64_t)(int64_t)(int32_t)value : (uint32_t)value;
    default: return value;
    }
}

static int compare(uint64_t a, uint64_t b, uint8_t how, uint8_t is_signed) {
    const int lt = is_signed ? (int64_t)a < (int64_t)b : a < b;
    switch (how) {
    case IPROBE_COND_EQ: return a == b;
    case IPROBE_COND_NE: return a != b;
    case IPROBE_COND_LT: return lt;
    case IPROBE_COND_LE: return lt || a == b;
    case IPROBE_COND_GT: return !lt && a != b;
    case IPROBE_COND_GE: return !lt;
    default: return -1;
    }
}

/* Whether the NUL-terminated string at `address` is `s`: reads the literal's
 * length plus its terminator, never more, never faulting. */
static int string_equals(uint64_t address, const struct iprobe_cond_string* s) {
    char seen[IPROBE_COND_STRING_MAX + 1];
    const uint64_t want = (uint64_t)s->length + 1;
    if (iprobe_cond_read_memory(seen, address, want) != want) return 0;
    for (uint32_t i = 0; i < s->length; i++)
        if (seen[i] != s->bytes[i]) return 0;
    return seen[s->length] == 0;
}

int iprobe_cond_evaluate(const struct iprobe_cond_program* program, const struct iprobe_cond_values* values) {
    const uint32_t count = *(const volatile uint32_t*)&program->op_count;
    if (count == 0) return 1;
    if (count > IPROBE_COND_MAX_OPS) return 0;
    uint64_t stack[IPROBE_COND_MAX_OPS];
    uint32_t depth = 0;
    for (uint32_t i = 0; i < count; i++) {
        const struct iprobe_cond_op* op = &program->ops[i];
        const uint8_t opcode = op->opcode;
        if (opcode <= IPROBE_COND_DURATION) { /* pushes one */
            uint64_t v;
            if (opcode == IPROBE_COND_CONST) v = (uint64_t)op->operand;
            else if (opcode == IPROBE_COND_ARG) {
                if (op->operand < 0 || op->operand >= IPROBE_COND_ARGS) return 0;
                v = extend(values->args[op->operand], op->width, op->is_signed);
            } else if (opcode == IPROBE_COND_RETVAL) v = extend(values->retval, op->width, op->is_signed);
            else if (opcode == IPROBE_COND_DURATION) v = values->duration;
            else return 0;
            stack[depth++] = v; /* depth <= i < IPROBE_COND_MAX_OPS */
            continue;
        }
        if (opcode == IPROBE_COND_NOT || opcode == IPROBE_COND_STRING_EQ) { /* pops one, pushes one */
            if (depth < 1) return 0;
            if (opcode == IPROBE_COND_NOT) stack[depth - 1] = !stack[depth - 1];
            else {
                if (op->operand < 0 || op->operand >= (int64_t)program->string_count ||
                    op->operand >= IPROBE_COND_MAX_STRINGS || program->strings[op->operand].length > IPROBE_COND_STRING_MAX)
                    return 0;
                stack[depth - 1] = (uint64_t)string_equals(stack[depth - 1], &program->strings[op->operand]);
            }
            continue;
        }
        if (depth < 2) return 0; /* pops two, pushes one */
        const uint64_t b = stack[--depth];
        const uint64_t a = stack[depth - 1];
        int r;
        if (opcode == IPROBE_COND_AND) r = a && b;
        else if (opcode == IPROBE_COND_OR) r = a || b;
        else if (opcode == IPROBE_COND_COMPARE) r = compare(a, b, op->compare, op->is_signed);
        else return 0;
        if (r < 0) return 0;
        stack[depth - 1] = (uint64_t)r;
    }
    return depth == 1 && stack[0] != 0;
}
