// The entry flow's gcc plugin: every function gcc compiles gets the
// attribute patchable_function_entry(5, 0) (five 1-byte NOPs at its first
// instruction, after endbr64), as -fpatchable-function-entry=5,0 would give
// it, but without that option.  The option turns interprocedural register
// allocation off for the whole translation unit (gcc 12's process_options:
// `if (profile_flag || patch_area_size ...) flag_ipa_ra = 0`), so callers
// save registers around calls that clobber nothing: probes off cost more
// than the NOP.  The attribute leaves IPA-RA on.  An enabled probe must
// then preserve every register the function itself does not clobber (the
// runtime's entry stubs and return trampolines do: docs/hotpatch.md).
//
// The attribute goes on when the IPA passes start, on every function with a
// body, so it is streamed with -flto and reaches the link-time compilation.
// A function's own patchable_function_entry attribute wins.
//
// Small functions lose the pad again just before the pad is emitted (the
// pass before i386's endbr_and_patchable_area, when the code is final; the
// pad's size is in crtl since expansion): a function of fewer than
// pad-threshold machine instructions (-fplugin-arg-iprobe_pad-pad-threshold=N,
// default kDefaultThreshold; 0 pads everything), as XRay's
// -fxray-instruction-threshold.  For such a function the NOP is a large
// share of each call, and its probe is not lost: coldpatch lists it as a
// relocated entry (its first instructions move to a trampoline when
// enabled, relocate/).  One whose first instructions a branch of its own
// may target, that is too short to hold the 5-byte jump, that has a jump
// table, a computed jump or an indirect tail call keeps its pad, since
// relocation would refuse it, and so does one with a call among its first
// instructions (the callee would return into the trampoline).
#include "gcc-plugin.h"
#include "plugin-version.h"

#include "tree.h"
#include "stringpool.h"
#include "attribs.h"
#include "cgraph.h"
#include "diagnostic-core.h"
#include "rtl.h"
#include "tree-pass.h"
#include "context.h"
#include "function.h"
#include "memmodel.h"
#include "emit-rtl.h"
#include "insn-attr.h"

#include "iprobe/formats/probe_list.h"

#include <cstdlib>
#include <cstring>
#include <string>

int plugin_is_GPL_compatible;

namespace {

constexpr const char kAttribute[] = "patchable_function_entry";
// Marks a pad this plugin gave (the space keeps it out of source code).
constexpr const char kOurs[] = "iprobe pad";
constexpr const char kMarkerSuffix[] = IPROBE_UNPADDED_MARKER;
constexpr int kDefaultThreshold = 64;
constexpr int kPadBytes = 5;

int pad_threshold = kDefaultThreshold;

tree pad_arguments() {
    return tree_cons(NULL_TREE, build_int_cst(integer_type_node, kPadBytes),
                     tree_cons(NULL_TREE, build_int_cst(integer_type_node, 0), NULL_TREE));
}

void pad_every_function(void*, void*) {
    cgraph_node* node;
    FOR_EACH_FUNCTION_WITH_GIMPLE_BODY(node) {
        tree decl = node->decl;
        if (lookup_attribute(kAttribute, DECL_ATTRIBUTES(decl))) continue;
        DECL_ATTRIBUTES(decl) = tree_cons(get_identifier(kAttribute), pad_arguments(), DECL_ATTRIBUTES(decl));
        DECL_ATTRIBUTES(decl) = tree_cons(get_identifier(kOurs), NULL_TREE, DECL_ATTRIBUTES(decl));
    }
}

// An instruction that becomes machine code (not a USE or CLOBBER marker).
bool emits_code(rtx_insn* insn) {
    if (!NONDEBUG_INSN_P(insn)) return false;
    const rtx_code code = GET_CODE(PATTERN(insn));
    return code != USE && code != CLOBBER;
}

// `jmp *%rax` to another function: relocate/ cannot tell it from a jump
// inside this one, so it would refuse the entry.
bool indirect_tail_call(rtx_insn* insn) {
    if (!CALL_P(insn) || !SIBLING_CALL_P(insn)) return false;
    const rtx call = get_call_rtx_from(insn);
    return !call || !MEM_P(XEXP(call, 0)) || GET_CODE(XEXP(XEXP(call, 0), 0)) != SYMBOL_REF;
}

// Should the function being compiled keep its pad?  Yes unless it has
// fewer than pad_threshold instructions and an entry relocate/ can move: at
// least kPadBytes bytes (by gcc's upper bound of each length) before the
// first label, so that no branch of its own lands in them.
bool keeps_pad() {
    int instructions = 0, entry_bytes = 0;
    bool label_seen = false;
    for (rtx_insn* insn = get_insns(); insn; insn = NEXT_INSN(insn)) {
        if (JUMP_TABLE_DATA_P(insn) || (JUMP_P(insn) && computed_jump_p(insn)) || indirect_tail_call(insn))
            return true;
        if (LABEL_P(insn) && instructions > 0) label_seen = true;
        // A call among the moved instructions would return into the
        // trampoline, where no unwinder, backtrace() or gdb finds a frame
        // (a margin over gcc's length estimates).
        if (CALL_P(insn) && !label_seen && entry_bytes < 2 * kPadBytes) return true;
        if (!emits_code(insn)) continue;
        if (++instructions >= pad_threshold) return true;
        if (!label_seen) entry_bytes += get_attr_length(insn);
    }
    return entry_bytes < kPadBytes;
}

// Labels the function's first instruction NAME.iprobe_nopad (a local
// symbol without a type): coldpatch makes relocated entries of the
// functions so marked, and of no other function without a pad (the
// program's startup code, a static libc).  A discarded COMDAT copy takes its
// label with it.
void mark_unpadded(tree decl) {
    const char* name = IDENTIFIER_POINTER(DECL_ASSEMBLER_NAME(decl));
    if (*name == '*') name++;
    const std::string label = std::string(name) + kMarkerSuffix + ":";
    rtx_insn* first = get_insns();
    while (first && !NONDEBUG_INSN_P(first)) first = NEXT_INSN(first);
    if (!first) return;
    emit_insn_before(gen_rtx_ASM_INPUT_loc(VOIDmode, ggc_strdup(label.c_str()), DECL_SOURCE_LOCATION(decl)), first);
}

// Drops the pad from small functions (see the top of the file).
const pass_data kUnpadData = {RTL_PASS, "iprobe_unpad", OPTGROUP_NONE, TV_NONE, PROP_rtl, 0, 0, 0, 0};

class UnpadSmallLeaves : public rtl_opt_pass {
public:
    explicit UnpadSmallLeaves(gcc::context* context) : rtl_opt_pass(kUnpadData, context) {}
    bool gate(function*) override { return pad_threshold > 0; }
    unsigned int execute(function* fun) override {
        tree decl = fun->decl;
        if (!lookup_attribute(kOurs, DECL_ATTRIBUTES(decl)) || keeps_pad()) return 0;
        // Expansion read the attribute into crtl; the pad is emitted from there.
        crtl->patch_area_size = 0;
        crtl->patch_area_entry = 0;
        mark_unpadded(decl);
        return 0;
    }
};

bool parse_arguments(const plugin_name_args* args) {
    for (int i = 0; i < args->argc; i++) {
        const plugin_argument& a = args->argv[i];
        if (std::strcmp(a.key, "pad-threshold") != 0) {
            error("iprobe gcc plugin: unknown argument %qs (known: pad-threshold=N)", a.key);
            return false;
        }
        char* end = nullptr;
        const long n = a.value ? std::strtol(a.value, &end, 10) : -1;
        if (!a.value || *end || n < 0 || n > 1000000) {
            error("iprobe gcc plugin: pad-threshold wants a count of instructions (0 pads every function)");
            return false;
        }
        pad_threshold = static_cast<int>(n);
    }
    return true;
}

plugin_info kInfo = {"0.2",
                     "iprobe: patchable_function_entry(5,0) on every function but small ones, IPA-RA kept; "
                     "pad-threshold=N (default 64, 0: every function)"};

}  // namespace

int plugin_init(plugin_name_args* args, plugin_gcc_version* version) {
    if (!plugin_default_version_check(version, &gcc_version)) {
        error("the iprobe gcc plugin was built for gcc %s; rebuild iprobe for this gcc, or set %<IPROBE_GCC_PLUGIN=0%>",
              gcc_version.basever);
        return 1;
    }
    if (!parse_arguments(args)) return 1;
    register_callback(args->base_name, PLUGIN_INFO, nullptr, &kInfo);
    register_callback(args->base_name, PLUGIN_ALL_IPA_PASSES_START, pad_every_function, nullptr);
    register_pass_info unpad = {new UnpadSmallLeaves(g), "endbr_and_patchable_area", 1, PASS_POS_INSERT_BEFORE};
    register_callback(args->base_name, PLUGIN_PASS_MANAGER_SETUP, nullptr, &unpad);
    return 0;
}
