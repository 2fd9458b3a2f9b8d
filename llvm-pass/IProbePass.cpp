// IProbePass: an LLVM 14 new-pass-manager plugin that gives every selected
// function a 5-byte NOP at its very first instruction (the backend's
// patchable function entry, listed in __patchable_function_entries) and
// records the function in the iprobe_sites section (struct
// iprobe_site_entry, include/iprobe/formats/probe_list.h).  At run time
// `iprobe attach` turns the NOP into a call; the function's exit is served by
// a return trampoline that the enabled entry sets up, so there is nothing
// before its returns and nothing rewrites the binary after the link.  Design
// and trade-offs: docs/llvm-pass.md.
//
// Runs at the optimizer's last extension point, after inlining, so that
// probes describe the functions that exist in the binary.
//
// Settings (a command-line option wins over the environment variable):
//   -mllvm -iprobe-filter=REGEX    IPROBE_FILTER     instrument only matching names
//   -mllvm -iprobe-exclude=REGEX   IPROBE_EXCLUDE    never instrument matching names
//   -mllvm -iprobe-min-size=N      IPROBE_MIN_SIZE   skip functions with < N IR instructions
//   -mllvm -iprobe-only-annotated  IPROBE_ONLY_ANNOTATED=1
// Regexes are POSIX extended, unanchored, matched against the raw and the
// demangled name.  `__attribute__((annotate("iprobe")))` (IPROBE_ALWAYS)
// forces a function in; annotate("iprobe_never") (IPROBE_NEVER) keeps it out.

#include <cstdlib>
#include <optional>
#include <string>

#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Demangle/Demangle.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Function.h"
#include "llvm/IR/GlobalVariable.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/PassManager.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Passes/PassPlugin.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Regex.h"

#include "iprobe/formats/probe_list.h"

using namespace llvm;

namespace {

cl::opt<std::string> filter_option("iprobe-filter",
                                   cl::desc("iprobe: instrument only functions matching this regex"),
                                   cl::value_desc("regex"));
cl::opt<std::string> exclude_option("iprobe-exclude",
                                    cl::desc("iprobe: never instrument functions matching this regex"),
                                    cl::value_desc("regex"));
cl::opt<unsigned> min_size_option(
    "iprobe-min-size", cl::desc("iprobe: skip functions with fewer IR instructions than this"),
    cl::value_desc("count"));
cl::opt<bool> only_annotated_option(
    "iprobe-only-annotated",
    cl::desc("iprobe: instrument only functions marked IPROBE_ALWAYS / annotate(\"iprobe\")"));

constexpr const char* kAlwaysAnnotation = "iprobe";
constexpr const char* kNeverAnnotation = "iprobe_never";

std::string setting(const cl::opt<std::string>& option, const char* env) {
    if (option.getNumOccurrences() > 0) return option;
    const char* value = std::getenv(env);
    return value ? value : "";
}

struct Selection {
    std::optional<Regex> include;
    std::optional<Regex> exclude;
    unsigned min_size = 0;
    bool only_annotated = false;
    SmallPtrSet<const Function*, 16> always;
    SmallPtrSet<const Function*, 16> never;
};

// An invalid regex is a build error the user must see, not a silent
// "instrument everything": report it through the compiler's diagnostics.
bool compile_regex(Module& M, const std::string& text, const char* what, std::optional<Regex>& out) {
    if (text.empty()) return true;
    Regex regex(text);
    std::string why;
    if (!regex.isValid(why)) {
        M.getContext().emitError(Twine("iprobe: invalid ") + what + " regex '" + text + "': " + why);
        return false;
    }
    out.emplace(std::move(regex));
    return true;
}

bool read_selection(Module& M, Selection& selection) {
    bool ok = compile_regex(M, setting(filter_option, "IPROBE_FILTER"), "filter (-iprobe-filter / IPROBE_FILTER)",
                            selection.include);
    ok &= compile_regex(M, setting(exclude_option, "IPROBE_EXCLUDE"),
                        "exclude (-iprobe-exclude / IPROBE_EXCLUDE)", selection.exclude);
    if (min_size_option.getNumOccurrences() > 0) {
        selection.min_size = min_size_option;
    } else if (const char* text = std::getenv("IPROBE_MIN_SIZE"); text && *text) {
        char* end = nullptr;
        const unsigned long value = std::strtoul(text, &end, 10);
        if (*end != '\0' || text[0] < '0' || text[0] > '9') {
            M.getContext().emitError(Twine("iprobe: IPROBE_MIN_SIZE='") + text +
                                     "' is not a non-negative integer");
            ok = false;
        }
        selection.min_size = static_cast<unsigned>(value);
    }
    if (only_annotated_option.getNumOccurrences() > 0) {
        selection.only_annotated = only_annotated_option;
    } else if (const char* text = std::getenv("IPROBE_ONLY_ANNOTATED")) {
        selection.only_annotated = StringRef(text) == "1" || StringRef(text) == "yes";
    }
    return ok;
}

// llvm.global.annotations: { ptr function, ptr string, ptr file, i32 line, ptr args }.
void read_annotations(Module& M, Selection& selection) {
    const GlobalVariable* annotations = M.getNamedGlobal("llvm.global.annotations");
    if (!annotations || !annotations->hasInitializer()) return;
    const auto* array = dyn_cast<ConstantArray>(annotations->getInitializer());
    if (!array) return;
    for (const Use& element : array->operands()) {
        const auto* entry = dyn_cast<ConstantStruct>(element.get());
        if (!entry || entry->getNumOperands() < 2) continue;
        const auto* function = dyn_cast<Function>(entry->getOperand(0)->stripPointerCasts());
        const auto* text = dyn_cast<GlobalVariable>(entry->getOperand(1)->stripPointerCasts());
        if (!function || !text || !text->hasInitializer()) continue;
        const auto* data = dyn_cast<ConstantDataSequential>(text->getInitializer());
        if (!data || !data->isString()) continue;
        const StringRef annotation = data->getAsString().rtrim('\0');
        if (annotation == kAlwaysAnnotation) selection.always.insert(function);
        if (annotation == kNeverAnnotation) selection.never.insert(function);
    }
}

StringRef raw_name(const Function& F) {
    StringRef name = F.getName();
    if (name.startswith("\1")) name = name.drop_front();  // asm("label"): no mangling prefix
    return name;
}

bool is_ours(StringRef name) {
    return name.startswith("__iprobe") || name.startswith("__cyg_profile_func_");
}

bool can_instrument(const Function& F) {
    return !F.isDeclaration() && !F.hasAvailableExternallyLinkage() &&
           !F.hasFnAttribute(Attribute::Naked) && !is_ours(raw_name(F));
}

bool matches(const Regex& regex, StringRef raw, const std::string& demangled) {
    return regex.match(raw) || regex.match(demangled);
}

bool selected(const Function& F, const Selection& selection) {
    if (selection.never.contains(&F)) return false;
    if (selection.always.contains(&F)) return true;
    if (selection.only_annotated) return false;
    if (F.getInstructionCount() < selection.min_size) return false;
    if (!selection.include && !selection.exclude) return true;
    const StringRef raw = raw_name(F);
    const std::string demangled = demangle(raw.str());
    if (selection.include && !matches(*selection.include, raw, demangled)) return false;
    return !(selection.exclude && matches(*selection.exclude, raw, demangled));
}

// The name as an .asciz operand of module-level assembly.
std::string asm_string_literal(StringRef text) {
    std::string out;
    for (const unsigned char c : text) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
        } else if (c < 0x20 || c >= 0x7f) {
            static constexpr char digits[] = "01234567";
            out += '\\';
            out += digits[(c >> 6) & 7];
            out += digits[(c >> 3) & 7];
            out += digits[c & 7];
        } else {
            out += static_cast<char>(c);
        }
    }
    return out;
}

// The function's own address is only written when a PC-relative reference to
// it resolves at static link time; a preemptible symbol in a shared library
// would need a dynamic relocation, so there the reader uses the symbol table.
bool can_reference_directly(const Function& F) { return F.hasLocalLinkage() || F.isDSOLocal(); }

// A symbol module-level assembly can name as it is.
bool plain_symbol(StringRef name) {
    if (name.empty() || name.startswith(".L")) return false;
    for (const char c : name)
        if (!isAlnum(c) && c != '_' && c != '.' && c != '$') return false;
    return true;
}

// The record of one instrumented function, as module-level assembly: the
// function's own text goes untouched.  It joins the function's COMDAT group
// so that the record goes when the linker drops a duplicate of it.
std::string function_record(const Function& F) {
    const StringRef raw = raw_name(F);
    const bool direct = can_reference_directly(F) && !F.hasPrivateLinkage() && plain_symbol(raw);
    std::string text = ".pushsection " IPROBE_PL_SECTION;
    if (const Comdat* group = F.getComdat(); group && plain_symbol(group->getName()))
        text += ",\"aGR\",@progbits," + group->getName().str() + ",comdat\n";
    else
        text += ",\"aR\",@progbits\n";
    text += ".balign 8\n";
    text += "991: .short 992f-991b\n";
    text += ".byte " + std::to_string(IPROBE_SITE_ENTRY_VERSION) + "," + std::to_string(IPROBE_KIND_ENTRY) + "\n";
    text += ".long 0\n";
    text += direct ? ".long " + raw.str() + "-.\n" : ".long 0\n";
    text += ".byte 5,0," + std::to_string(IPROBE_SITE_FLAG_FUNCTION_ENTRY) + ",0\n";
    text += ".asciz \"" + asm_string_literal(raw) + "\"\n";
    text += ".balign 8\n";
    text += "992:\n";
    text += ".popsection\n";
    return text;
}

// The backend puts the NOP before anything else, after an endbr64 under
// -fcf-protection: the function's return address is then on top of the
// stack, which is what lets an enabled entry hook the return.  No red zone
// is needed: nothing of the function is below the stack pointer yet.
void instrument(Function& F, std::string& records) {
    F.addFnAttr("patchable-function-entry", "5");
    records += function_record(F);
}

struct IProbePass : PassInfoMixin<IProbePass> {
    PreservedAnalyses run(Module& M, ModuleAnalysisManager&) {
        Selection selection;
        if (!read_selection(M, selection)) return PreservedAnalyses::all();
        read_annotations(M, selection);
        std::string records;
        for (Function& F : M) {
            if (!can_instrument(F) || !selected(F, selection)) continue;
            instrument(F, records);
        }
        if (records.empty()) return PreservedAnalyses::all();
        M.appendModuleInlineAsm(records);
        return PreservedAnalyses::none();
    }
    static bool isRequired() { return true; }
};

}  // namespace

extern "C" LLVM_ATTRIBUTE_WEAK PassPluginLibraryInfo llvmGetPassPluginInfo() {
    return {LLVM_PLUGIN_API_VERSION, "IProbePass", "0.1", [](PassBuilder& builder) {
                builder.registerOptimizerLastEPCallback(
                    [](ModulePassManager& passes, OptimizationLevel) { passes.addPass(IProbePass()); });
                builder.registerPipelineParsingCallback(
                    [](StringRef name, ModulePassManager& passes, ArrayRef<PassBuilder::PipelineElement>) {
                        if (name != "iprobe") return false;
                        passes.addPass(IProbePass());
                        return true;
                    });
            }};
}
