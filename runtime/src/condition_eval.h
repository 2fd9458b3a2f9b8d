/* The evaluator's body (iprobe/formats/condition.h), inline so that the
 * runtime's handler evaluates without a call; condition.c exports it as
 * iprobe_cond_evaluate for others (the unit tests).  Included by condition.c
 * and rt.c only. */
#ifndef IPROBE_RT_CONDITION_EVAL_H
#define IPROBE_RT_CONDITION_EVAL_H

#include "condition.h"

static inline uint64_t iprobe_cond_extend(uint64_t value, uint8_t width, uint8_t is_signed) {
    switch (width) {
    case 1: return is_signed ? (uint64_t)(int64_t)(int8_t)value : (uint8_t)value;
    case 2: return is_signed ? (uint64_t)(int64_t)(int16_t)value : (uint16_t)value;
    case 4: return is_signed ? (uint64_t)(int64_t)(int32_t)value : (uint32_t)value;
    default: return value;
    }
}

static inline int iprobe_cond_compare_values(uint64_t a, uint64_t b, uint8_t how, uint8_t is_signed) {
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
static inline int iprobe_cond_string_equals(uint64_t address, const struct iprobe_cond_string* s) {
    char seen[IPROBE_COND_STRING_MAX + 1];
    const uint64_t want = (uint64_t)s->length + 1;
    if (iprobe_cond_read_memory(seen, address, want) != want) return 0;
    for (uint32_t i = 0; i < s->length; i++)
        if (seen[i] != s->bytes[i]) return 0;
    return seen[s->length] == 0;
}

static inline __attribute__((always_inline)) int iprobe_cond_holds(const struct iprobe_cond_program* program,
                                                                   const struct iprobe_cond_values* values) {
    const uint32_t count = *(const volatile uint32_t*)&program->op_count;
    if (count == 0) return 1;
    if (count > IPROBE_COND_MAX_OPS) return 0;
    /* The common shape, `argN OP constant`, without the stack machine. */
    if (count == 3 && program->ops[0].opcode == IPROBE_COND_ARG && program->ops[1].opcode == IPROBE_COND_CONST &&
        program->ops[2].opcode == IPROBE_COND_COMPARE && (uint64_t)program->ops[0].operand < IPROBE_COND_ARGS) {
        const struct iprobe_cond_op* op = program->ops;
        const int r = iprobe_cond_compare_values(iprobe_cond_extend(values->args[op[0].operand], op[0].width, op[0].is_signed),
                                                 (uint64_t)op[1].operand, op[2].compare, op[2].is_signed);
        return r > 0;
    }
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
                v = iprobe_cond_extend(values->args[op->operand], op->width, op->is_signed);
            } else if (opcode == IPROBE_COND_RETVAL) v = iprobe_cond_extend(values->retval, op->width, op->is_signed);
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
                stack[depth - 1] = (uint64_t)iprobe_cond_string_equals(stack[depth - 1], &program->strings[op->operand]);
            }
            continue;
        }
        if (depth < 2) return 0; /* pops two, pushes one */
        const uint64_t b = stack[--depth];
        const uint64_t a = stack[depth - 1];
        int r;
        if (opcode == IPROBE_COND_AND) r = a && b;
        else if (opcode == IPROBE_COND_OR) r = a || b;
        else if (opcode == IPROBE_COND_COMPARE) r = iprobe_cond_compare_values(a, b, op->compare, op->is_signed);
        else return 0;
        if (r < 0) return 0;
        stack[depth - 1] = (uint64_t)r;
    }
    return depth == 1 && stack[0] != 0;
}

#endif
