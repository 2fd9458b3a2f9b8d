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

// What typing a values event's words takes: the live region and the
// modules' DWARF (ValuesReader), or what a trace file kept of them
// (trace_file.cpp), so both print the same.
class ValueTypes {
public:
    virtual ~ValueTypes() = default;
    virtual bool knows(std::uint32_t probe) = 0;
    // An exit probe's entry is `probe - entry_distance(probe)`.
    virtual std::uint32_t entry_distance(std::uint32_t exit_probe) = 0;
    virtual const elf::FunctionValues& function(std::uint32_t entry_probe) = 0;
    virtual std::uint64_t site(std::uint32_t probe) = 0;
    virtual Frame symbolize(std::uint64_t address) = 0;
};

// Fills e.values / e.retval / e.backtrace from the words after its
// record, written under `packed_spec` (iprobe_rt_record.values).
void decode_values(Event& e, std::uint32_t packed_spec, const std::vector<std::uint64_t>& words, ValueTypes& types);

class ValuesReader final : public ValueTypes {
public:
    ValuesReader(const Region& region, pid_t pid) : region_(region), pid_(pid) {}
    bool knows(std::uint32_t probe) override { return probe < region_.probe_count(); }
    std::uint32_t entry_distance(std::uint32_t exit_probe) override;
    const elf::FunctionValues& function(std::uint32_t entry_probe) override;
    std::uint64_t site(std::uint32_t probe) override;
    Frame symbolize(std::uint64_t address) override;

private:
    struct Module {
        std::shared_ptr<elf::ElfFile> elf, dwarf;
        std::unique_ptr<elf::SourceLines> lines;
        bool loaded = false;
    };
    Module& module(std::uint32_t index);

    const Region& region_;
    pid_t pid_;
    std::map<std::uint32_t, Module> modules_;
    std::map<std::uint32_t, elf::FunctionValues> functions_;
};

// A value's bytes (`available` of them, little-endian) as its type prints;
// what lies beyond them prints as "?".
Value format_value(const std::string& name, const elf::ValueType& type, const std::uint8_t* bytes, std::size_t available);

}  // namespace iprobe::hotpatch
