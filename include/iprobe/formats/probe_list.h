/*
 * The probe list: the contract between build time (coldpatch, the LLVM pass)
 * and run time (hotpatch, trace, report, fperf).  This header is the single
 * definition of the on-disk format; every writer and reader includes it.
 *
 * Layout of a FILE.probes (little-endian, offsets from the start of the file):
 *
 *   struct iprobe_pl_header
 *   struct iprobe_pl_record   [probe_count]   sorted by site_address, id == index
 *   char                      strings[strings_size]   NUL-terminated, offset 0 == ""
 *
 * Fixed-size records so that 100k probes load with one read and no parsing.
 * Addresses are link-time virtual addresses of the module; at run time a
 * probe lives at load_bias + site_address, where load_bias is the module's
 * mapping start minus its first PT_LOAD vaddr (0 for non-PIE executables).
 */
#ifndef IPROBE_PROBE_LIST_H
#define IPROBE_PROBE_LIST_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IPROBE_PL_MAGIC "IPROBEPL"
#define IPROBE_PL_MAGIC_SIZE 8
#define IPROBE_PL_VERSION 1u
#define IPROBE_PL_BUILD_ID_MAX 64
#define IPROBE_PL_SITE_MAX 8
#define IPROBE_PL_SUFFIX ".probes"

/* Name of the ELF section a binary carries probe records in (LLVM flow). */
#define IPROBE_PL_SECTION "iprobe_sites"

enum iprobe_probe_kind {
    IPROBE_KIND_ENTRY = 1, /* function entry */
    IPROBE_KIND_EXIT = 2,  /* function exit (each return / tail call site, or its return trampoline) */
    IPROBE_KIND_POINT = 3  /* developer-marked IPROBE_POINT */
};

/* How the original placeholder was encoded; decides how it is re-enabled. */
enum iprobe_site_form {
    IPROBE_SITE_CALL_REL32 = 1,   /* e8 rel32: direct or via PLT            */
    IPROBE_SITE_CALL_RIPIND = 2,  /* ff 15 rel32: call *GOT(%rip), -fno-plt */
    IPROBE_SITE_NOP = 3,          /* compiler-emitted NOP, no original call */
    /* An exit with no site of its own: the function's entry site (the record
     * right before, a NOP-form entry at the same site_address, at the very
     * start of the function) hooks the return through a return trampoline
     * when this probe is enabled.  site_size and the bytes are the entry's. */
    IPROBE_SITE_RETURN = 4
};

/* Which compiler flow produced the module's placeholders. */
enum iprobe_flow {
    IPROBE_FLOW_FINSTRUMENT = 1, /* -finstrument-functions + coldpatch */
    IPROBE_FLOW_LLVM = 2,        /* our LLVM pass */
    /* gcc -fpatchable-function-entry=5,0 + coldpatch: one 5-byte NOP entry
     * site per out-of-line function (original_bytes: the five 1-byte NOPs
     * gcc emitted), listed by __patchable_function_entries, each followed by
     * the function's exit probe of form IPROBE_SITE_RETURN; function symbols
     * without a pad are entries of IPROBE_PL_RECORD_RELOCATED */
    IPROBE_FLOW_PATCHABLE_ENTRY = 3,
    /* No compiler flow at all: a binary nobody prepared.  The list is derived
     * at run time from the ELF symbol table (never written to disk); each
     * entry site is the function's first instruction (after endbr64), whose
     * first bytes move to a trampoline when enabled (relocate/).  The records
     * are those of IPROBE_FLOW_PATCHABLE_ENTRY with the function's own first
     * bytes as original_bytes and placeholder_bytes. */
    IPROBE_FLOW_UNPREPARED = 4
};

enum iprobe_pl_flags {
    IPROBE_PL_FLAG_PIE = 1u << 0,     /* module is position independent (ET_DYN) */
    IPROBE_PL_FLAG_SHARED = 1u << 1,  /* module is a shared library */
    IPROBE_PL_FLAG_DWARF = 1u << 2    /* source locations came from DWARF */
};

struct iprobe_pl_header {
    char magic[IPROBE_PL_MAGIC_SIZE];
    uint32_t version;
    uint32_t header_size;   /* sizeof(struct iprobe_pl_header) of the writer */
    uint32_t record_size;   /* sizeof(struct iprobe_pl_record) of the writer */
    uint32_t flags;         /* enum iprobe_pl_flags */
    uint32_t flow;          /* enum iprobe_flow */
    uint32_t probe_count;
    uint32_t build_id_size; /* 0 when the module has no GNU build-id */
    uint32_t module_name;   /* string offset: path or soname as linked */
    uint8_t build_id[IPROBE_PL_BUILD_ID_MAX];
    /*
     * Where the placeholders originally called (link-time addresses), so a
     * hotpatcher can route enabled probes without re-reading the ELF:
     * the PLT entry or function for call rel32, the GOT slot that PLT or
     * call *GOT(%rip) goes through. 0 when absent.
     */
    uint64_t enter_target;
    uint64_t exit_target;
    uint64_t enter_got_slot;
    uint64_t exit_got_slot;
    uint64_t records_offset;
    uint64_t strings_offset;
    uint64_t strings_size;
    uint64_t reserved[4];
};

enum iprobe_pl_record_flags {
    /* The hook call's this_fn is not one constant: gcc merged the hook calls
     * of several functions inlined into one caller into this single call.
     * The probe is named after the enclosing function, but fires for the
     * inlined ones too. */
    IPROBE_PL_RECORD_SHARED_SITE = 1u << 0,
    /* An entry with no pad (IPROBE_FLOW_PATCHABLE_ENTRY: a small function the gcc
     * plugin left unpadded, marked by IPROBE_UNPADDED_MARKER): relocated
     * when enabled, as in IPROBE_FLOW_UNPREPARED; original_bytes ==
     * placeholder_bytes == the function's own first bytes at the site, and
     * the moved instructions are read from the binary (relocate/). */
    IPROBE_PL_RECORD_RELOCATED = 1u << 1
};

/* The gcc plugin's mark on a function it left without a pad: a local
 * symbol without a type, NAME IPROBE_UNPADDED_MARKER, at the function's
 * first instruction (after any endbr64). */
#define IPROBE_UNPADDED_MARKER ".iprobe_nopad"

struct iprobe_pl_record {
    uint32_t id;             /* stable within a build: index in site order */
    uint8_t kind;            /* enum iprobe_probe_kind */
    uint8_t site_form;       /* enum iprobe_site_form */
    uint8_t site_size;       /* bytes at the site: 5 or 6 */
    uint8_t flags;           /* enum iprobe_pl_record_flags */
    uint64_t site_address;   /* link-time vaddr of the placeholder */
    uint64_t function_address; /* link-time vaddr of the enclosing function */
    uint32_t function_name;  /* string offset: raw (mangled) symbol */
    uint32_t function_demangled; /* string offset: demangled, == raw for C */
    uint32_t source_file;    /* string offset, 0 when unknown */
    uint32_t source_line;    /* 0 when unknown */
    uint8_t original_bytes[IPROBE_PL_SITE_MAX];    /* the call the compiler emitted */
    uint8_t placeholder_bytes[IPROBE_PL_SITE_MAX]; /* the NOP now in the binary */
};

/*
 * Addendum: the site section.  Not a probe-list file: the compile-time form
 * the LLVM pass and the IPROBE_POINT macros (iprobe.h) emit into the binary's
 * IPROBE_PL_SECTION section; read_site_section() turns it into a probe list.
 *
 * The section is a sequence of variable-size entries, each 8-byte aligned
 * and a multiple of 8 bytes long: struct iprobe_site_entry, then the name
 * (NUL-terminated), then zero padding up to `size`.  Zero bytes between
 * entries (linker padding between input sections) read as size == 0: skip 8.
 *
 * Addresses are self-relative 32-bit offsets resolved by the static linker
 * (R_X86_64_PC32), so the section needs no dynamic relocation in a PIE or a
 * shared library and its bytes on disk are final.  The section is marked
 * SHF_GNU_RETAIN ("R") so --gc-sections keeps it, and joins the COMDAT group
 * of the code it describes ("?") so a discarded inline function takes its
 * records with it.
 *
 * name: entry/exit: the function's raw (mangled) symbol; point: the point name.
 * (The LLVM pass writes one entry record per function with
 * IPROBE_SITE_FLAG_FUNCTION_ENTRY; older builds wrote entry and exit records
 * for NOPs after the prologue and before each return.)
 */
#define IPROBE_SITE_ENTRY_VERSION 1u
#define IPROBE_SITE_ENTRY_ALIGN 8u

enum iprobe_site_entry_flags {
    IPROBE_SITE_FLAG_REDZONE_STEP = 1u << 0, /* site is wrapped in lea -128/+128(%rsp) */
    /* An entry record naming a function whose site is its patchable entry:
     * the 5-byte NOP the compiler put at its very start (after an endbr64)
     * and listed in __patchable_function_entries.  `site` is unused; the
     * function's exit is served by that site's return trampoline. */
    IPROBE_SITE_FLAG_FUNCTION_ENTRY = 1u << 1
};

struct iprobe_site_entry {
    uint16_t size;       /* bytes of this entry incl. name and padding; 0 = padding */
    uint8_t version;     /* IPROBE_SITE_ENTRY_VERSION */
    uint8_t kind;        /* enum iprobe_probe_kind */
    int32_t site;        /* placeholder vaddr minus the vaddr of this field */
    int32_t function;    /* enclosing function's vaddr minus the vaddr of this field;
                            0 = not recorded (points, preemptible symbols): the
                            reader takes the symbol containing the site */
    uint8_t site_size;   /* bytes of the placeholder: 5 (0f 1f 44 00 00) */
    uint8_t arg_count;   /* IPROBE_POINT_ARGS: arguments in rdi, rsi, rdx, rcx */
    uint8_t flags;       /* enum iprobe_site_entry_flags */
    uint8_t reserved;
    /* char name[]; */
};

#ifdef __cplusplus
} /* extern "C" */
static_assert(sizeof(struct iprobe_site_entry) == 16, "site-section entry layout is ABI");
static_assert(sizeof(struct iprobe_pl_header) == 192, "probe-list header layout is ABI");
static_assert(sizeof(struct iprobe_pl_record) == 56, "probe-list record layout is ABI");
#else
_Static_assert(sizeof(struct iprobe_site_entry) == 16, "site-section entry layout is ABI");
_Static_assert(sizeof(struct iprobe_pl_header) == 192, "probe-list header layout is ABI");
_Static_assert(sizeof(struct iprobe_pl_record) == 56, "probe-list record layout is ABI");
#endif

#endif /* IPROBE_PROBE_LIST_H */
