// Types the values records of the event stream (rt_layout.h, "values") into
// named, printable values: from the probed function's DWARF (the module or
// its debug file), else arg0..arg5 raw; backtraces symbolized.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <vector>

#include "iprobe/elf/function_values.h"
#include "iprobe/elf/source_lines.h"
#include "iprobe/hotpatch/trace_reader.h"
#include "region.h"

namespace iprobe::hotpatch {

class ValuesReader {
public:
    ValuesReader(const Region& region, pid_t pid) : region_(region), pid_(pid) {}
    // Fills e.values / e.retval / e.backtrace from the words after its
    // record, written under `packed_spec` (iprobe_rt_record.values).
    void decode(Event& e, std::uint32_t packed_spec, const std::vector<std::uint64_t>& words);

private:
    struct Module {
        std::shared_ptr<elf::ElfFile> elf, dwarf;
        std::unique_ptr<elf::SourceLines> lines;
        bool loaded = false;
    };
    Module& module(std::uint32_t index);
    const elf::FunctionValues& function(std::uint32_t entry_probe);
    Frame symbolize(std::uint64_t address);

    const Region& region_;
    pid_t pid_;
    std::map<std::uint32_t, Module> modules_;
    std::map<std::uint32_t, elf::FunctionValues> functions_;
};

// A value's bytes (`available` of them, little-endian) as its type prints;
// what lies beyond them prints as "?".
Value format_value(const std::string& name, const elf::ValueType& type, const std::uint8_t* bytes, std::size_t available);

}  // namespace iprobe::hotpatch
