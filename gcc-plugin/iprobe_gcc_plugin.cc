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
#include "gcc-plugin.h"
#include "plugin-version.h"

#include "tree.h"
#include "stringpool.h"
#include "attribs.h"
#include "cgraph.h"
#include "diagnostic-core.h"

int plugin_is_GPL_compatible;

namespace {

constexpr const char kAttribute[] = "patchable_function_entry";

tree pad_arguments() {
    return tree_cons(NULL_TREE, build_int_cst(integer_type_node, 5),
                     tree_cons(NULL_TREE, build_int_cst(integer_type_node, 0), NULL_TREE));
}

void pad_every_function(void*, void*) {
    cgraph_node* node;
    FOR_EACH_FUNCTION_WITH_GIMPLE_BODY(node) {
        tree decl = node->decl;
        if (lookup_attribute(kAttribute, DECL_ATTRIBUTES(decl))) continue;
        DECL_ATTRIBUTES(decl) = tree_cons(get_identifier(kAttribute), pad_arguments(), DECL_ATTRIBUTES(decl));
    }
}

plugin_info kInfo = {"0.1", "iprobe: patchable_function_entry(5,0) on every function, IPA-RA kept"};

}  // namespace

int plugin_init(plugin_name_args* args, plugin_gcc_version* version) {
    if (!plugin_default_version_check(version, &gcc_version)) {
        error("the iprobe gcc plugin was built for gcc %s; rebuild iprobe for this gcc, or set %<IPROBE_GCC_PLUGIN=0%>",
              gcc_version.basever);
        return 1;
    }
    register_callback(args->base_name, PLUGIN_INFO, nullptr, &kInfo);
    register_callback(args->base_name, PLUGIN_ALL_IPA_PASSES_START, pad_every_function, nullptr);
    return 0;
}
