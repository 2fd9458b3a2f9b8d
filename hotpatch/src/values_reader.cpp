#include "values_reader.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "iprobe/elf/demangle.h"
#include "iprobe/support/error.h"
#include "iprobe/support/json.h"
#include "modules.h"
#include "process.h"

namespace iprobe::hotpatch {

namespace {

std::string hex(std::uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
    return buf;
}

std::string json_string(const std::string& s) {
    JsonWriter j;
    j.value(s);
    return j.str();
}

std::int64_t signed_of(const std::uint8_t* b, std::uint32_t size) {
    std::uint64_t v = 0;
    std::memcpy(&v, b, std::min<std::uint32_t>(size ? size : 8, 8));
    if (size > 0 && size < 8) {
        const unsigned shift = 64 - 8 * size;
        return static_cast<std::int64_t>(v << shift) >> shift;
    }
    return static_cast<std::int64_t>(v);
}

std::uint64_t unsigned_of(const std::uint8_t* b, std::uint32_t size) {
    std::uint64_t v = 0;
    std::memcpy(&v, b, std::min<std::uint32_t>(size ? size : 8, 8));
    return v;
}

std::string shortest(double v) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
}

// A C string's bytes as C would write them, quoted.
std::string quoted(const char* s, std::size_t n) {
    std::string out = "\"";
    for (std::size_t i = 0; i < n; i++) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c == '"' || c == '\\') out += std::string("\\") + static_cast<char>(c);
        else if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c < 0x20 || c >= 0x7f) {
            char esc[8];
            std::snprintf(esc, sizeof esc, "\\x%02x", c);
            out += esc;
        } else out += static_cast<char>(c);
    }
    return out + "\"";
}

}  // namespace

Value format_value(const std::string& name, const elf::ValueType& type, const std::uint8_t* bytes, std::size_t available) {
    Value v{name, type.name, "", ""};
    if (available < 8 && type.cls != elf::ValueClass::structure && (type.size == 0 || type.size > available)) {
        v.text = "?";  // a member the registers do not hold whole
        v.json = "null";
        return v;
    }
    switch (type.cls) {
    case elf::ValueClass::signed_int:
        v.text = v.json = std::to_string(signed_of(bytes, type.size));
        break;
    case elf::ValueClass::unsigned_int:
        v.text = v.json = std::to_string(unsigned_of(bytes, type.size));
        break;
    case elf::ValueClass::boolean:
        v.text = v.json = bytes[0] ? "true" : "false";
        break;
    case elf::ValueClass::enumeration: {
        const std::int64_t n = signed_of(bytes, type.size);
        v.text = v.json = std::to_string(n);
        for (const auto& [value, label] : type.enumerators)
            if (value == n) v.text = label, v.json = json_string(label);
        break;
    }
    case elf::ValueClass::pointer:
    case elf::ValueClass::string: {
        const std::uint64_t p = unsigned_of(bytes, 8);
        v.text = p ? hex(p) : "NULL";
        v.json = p ? json_string(hex(p)) : "null";
        break;
    }
    case elf::ValueClass::floating: {
        double d;
        if (type.size == 4) {
            float f;
            std::memcpy(&f, bytes, 4);
            d = f;
        } else {
            std::memcpy(&d, bytes, 8);
        }
        v.text = shortest(d);
        v.json = std::isfinite(d) ? v.text : json_string(v.text);
        break;
    }
    case elf::ValueClass::structure: {
        v.text = "{";
        v.json = "{";
        bool first = true;
        for (const auto& m : type.members) {
            if (m.offset >= available || m.type->size > available - m.offset) continue;
            const Value field = format_value(m.name, *m.type, bytes + m.offset, available - m.offset);
            v.text += (first ? "" : ", ") + m.name + " = " + field.text;
            v.json += (first ? "" : ",") + json_string(m.name) + ":" + field.json;
            first = false;
        }
        v.text += "}";
        v.json += "}";
        break;
    }
    case elf::ValueClass::other: {
        v.text = hex(unsigned_of(bytes, 8));
        v.json = json_string(v.text);
        break;
    }
    }
    return v;
}

ValuesReader::Module& ValuesReader::module(std::uint32_t index) {
    Module& m = modules_[index];
    if (m.loaded) return m;
    m.loaded = true;
    if (index >= region_.module_count()) return m;
    const iprobe_rt_module& rm = region_.modules()[index];
    const std::string path(rm.path, ::strnlen(rm.path, sizeof rm.path));
    // The region is the target's to write: a path naming a FIFO or a
    // device is not read.
    auto open = [&](const std::string& p) -> std::shared_ptr<elf::ElfFile> {
        try {
            return reading_target(pid_, [&]() -> std::shared_ptr<elf::ElfFile> {
                const std::string view = pid_ ? target_view(pid_, p) : p;
                std::error_code ec;
                if (!std::filesystem::is_regular_file(view, ec)) return nullptr;
                return std::make_shared<elf::ElfFile>(view);
            });
        } catch (const Error&) {
            return nullptr;
        }
    };
    m.elf = open(path);
    if (!m.elf) return m;
    const auto debug = elf::debug_file_for(*m.elf);
    m.dwarf = !debug ? nullptr : *debug == m.elf->path() ? m.elf : open(*debug);
    m.lines = std::make_unique<elf::SourceLines>(m.dwarf ? *m.dwarf : *m.elf);
    return m;
}

const elf::FunctionValues& ValuesReader::function(std::uint32_t entry_probe) {
    auto it = functions_.find(entry_probe);
    if (it != functions_.end()) return it->second;
    std::optional<elf::FunctionValues> typed;
    if (entry_probe < region_.probe_count()) {
        const iprobe_rt_probe& p = region_.probes()[entry_probe];
        Module& m = module(p.module);
        if (m.dwarf && m.elf && p.function) {
            const elf::ElfSymbol* symbol = m.elf->function_starting_at(p.function);
            // A -finstrument-functions entry: where the parameters are at its site.
            std::optional<elf::Site> site;
            const std::uint64_t bias = region_.modules()[p.module].load_bias;
            if (p.kind == IPROBE_KIND_ENTRY && (p.form == IPROBE_SITE_CALL_REL32 || p.form == IPROBE_SITE_CALL_RIPIND) &&
                p.site >= bias)
                site = elf::Site{p.site - bias, m.elf.get()};
            typed = elf::function_values(*m.dwarf, p.function, symbol ? symbol->name : "", site);
        }
    }
    return functions_.emplace(entry_probe, typed ? *typed : elf::raw_function_values()).first->second;
}

Frame ValuesReader::symbolize(std::uint64_t address) {
    Frame f;
    f.address = address;
    for (std::uint32_t i = 0; i < region_.module_count(); i++) {
        Module& m = module(i);
        const std::uint64_t bias = region_.modules()[i].load_bias;
        if (!m.elf || address < bias) continue;
        const std::uint64_t at = address - bias;
        const elf::ElfSection* section = m.elf->section_containing(at);
        if (!section || !section->executable()) continue;
        if (const elf::ElfSymbol* s = m.elf->function_at(at)) f.function = elf::demangle(s->name);
        if (m.lines)
            if (auto where = m.lines->at(at - 1)) f.file = where->file, f.line = where->line;  // the call, not what follows it
        break;
    }
    return f;
}

std::uint32_t ValuesReader::entry_distance(std::uint32_t exit_probe) {
    return std::max<std::uint32_t>(region_.probes()[exit_probe].values.distance, 1);
}

std::uint64_t ValuesReader::site(std::uint32_t probe) { return region_.probes()[probe].site; }

void decode_values(Event& e, std::uint32_t packed_spec, const std::vector<std::uint64_t>& words, ValueTypes& types) {
    if (!types.knows(e.probe)) return;
    iprobe_rt_values_spec spec{};
    spec.flags = static_cast<std::uint8_t>(packed_spec);
    spec.gprs = static_cast<std::uint8_t>(packed_spec >> 8 & 15);
    spec.xmms = static_cast<std::uint8_t>(packed_spec >> 12 & 15);
    spec.strings = static_cast<std::uint8_t>(packed_spec >> 16);
    spec.backtrace = static_cast<std::uint8_t>(packed_spec >> 24);
    std::size_t at = 0;
    auto next = [&]() { return at < words.size() ? words[at++] : 0; };
    if (e.kind == probelist::ProbeKind::exit) {
        // its entry: the probe before, or as far back as a -finstrument-functions
        // entry's hooked return recorded it (iprobe_rt_values_spec.distance)
        const std::uint32_t back = types.entry_distance(e.probe);
        if (!(spec.flags & IPROBE_RT_VALUES_RETVAL) || words.size() < 4 || e.probe < back) return;
        e.has_values = true;
        const elf::FunctionValues& f = types.function(e.probe - back);
        if (!f.ret) return;
        std::uint8_t bytes[16] = {};
        if (f.ret->parts.empty()) {  // returned in memory: rax points at it
            e.retval = Value{"", f.ret->type.name, "<in memory at " + hex(words[0]) + ">", json_string(hex(words[0]))};
            return;
        }
        for (std::size_t i = 0; i < f.ret->parts.size() && i < 2; i++) {
            const elf::ValuePart& part = f.ret->parts[i];
            const std::uint64_t v = part.vector ? words[2 + (part.reg & 1)] : words[part.reg & 1];
            std::memcpy(bytes + 8 * i, &v, 8);
        }
        e.retval = format_value("", f.ret->type, bytes, sizeof bytes);
        return;
    }
    if (e.kind != probelist::ProbeKind::entry) return;
    std::uint64_t gpr[IPROBE_RT_VALUES_GPRS] = {}, xmm[IPROBE_RT_VALUES_XMMS] = {};
    std::map<std::uint8_t, std::pair<std::uint64_t, std::string>> strings;  // gpr -> status, bytes
    if (spec.flags & IPROBE_RT_VALUES_ARGS) {
        const unsigned gprs = std::min<unsigned>(spec.gprs, IPROBE_RT_VALUES_GPRS);
        const unsigned xmms = std::min<unsigned>(spec.xmms, IPROBE_RT_VALUES_XMMS);
        for (unsigned i = 0; i < gprs; i++) gpr[i] = next();
        for (unsigned i = 0; i < xmms; i++) xmm[i] = next();
        for (unsigned i = 0; i < gprs; i++) {
            if (!(spec.strings & (1u << i))) continue;
            const std::uint64_t status = next();
            char bytes[IPROBE_RT_STRING_BYTES];
            for (unsigned k = 0; k < IPROBE_RT_STRING_BYTES / 8; k++) {
                const std::uint64_t w = next();
                std::memcpy(bytes + 8 * k, &w, 8);
            }
            strings[static_cast<std::uint8_t>(i)] = {status, std::string(bytes, sizeof bytes)};
        }
        e.has_values = true;
        const elf::FunctionValues& f = types.function(e.probe);
        for (const elf::ValueSlot& p : f.params) {
            if (p.constant) {
                e.values.push_back({p.name, p.type.name, std::to_string(*p.constant), std::to_string(*p.constant)});
                continue;
            }
            if (p.parts.empty()) {
                e.values.push_back({p.name, p.type.name, "<in memory>", "null"});
                continue;
            }
            if (f.at_site && p.at_site.empty()) {
                e.values.push_back({p.name, p.type.name, "<optimized out>", json_string("<optimized out>")});
                continue;
            }
            std::uint8_t bytes[16] = {};
            for (std::size_t i = 0; i < p.parts.size() && i < 2; i++) {
                const elf::ValuePart& part = p.parts[i];
                const std::uint64_t v = part.vector ? xmm[part.reg % IPROBE_RT_VALUES_XMMS] : gpr[part.reg % IPROBE_RT_VALUES_GPRS];
                std::memcpy(bytes + 8 * i, &v, 8);
            }
            Value v = format_value(p.name, p.type, bytes, sizeof bytes);
            const auto s = p.type.cls == elf::ValueClass::string ? strings.find(p.parts[0].reg) : strings.end();
            if (s != strings.end()) {
                const auto& [status, text] = s->second;
                const std::uint64_t pointer = gpr[p.parts[0].reg % IPROBE_RT_VALUES_GPRS];
                if (status == IPROBE_RT_STRING_NULL) {
                    v.text = "NULL", v.json = "null";
                } else if (status == IPROBE_RT_STRING_UNREADABLE || status > IPROBE_RT_STRING_BYTES) {
                    v.text = "<unreadable " + hex(pointer) + ">";
                    v.json = json_string(v.text);
                } else {
                    const std::size_t length = ::strnlen(text.data(), status);
                    const bool whole = length < status;  // its NUL was read
                    v.text = quoted(text.data(), length) + (whole ? "" : status < IPROBE_RT_STRING_BYTES ? "<unreadable after>" : "...");
                    v.json = json_string(text.substr(0, length));
                }
            }
            e.values.push_back(std::move(v));
        }
    }
    if (spec.flags & IPROBE_RT_VALUES_BACKTRACE) {
        // An inlined copy's chain starts at its host's return: the host, at
        // the copy's hook, is its first caller.
        if (types.function(e.probe).inlined) e.backtrace.push_back(types.symbolize(types.site(e.probe) + 1));
        const std::uint64_t n = std::min<std::uint64_t>(next(), IPROBE_RT_BACKTRACE_MAX);
        for (std::uint64_t i = 0; i < n && at < words.size(); i++) e.backtrace.push_back(types.symbolize(next()));
        if (e.backtrace.size() > spec.backtrace) e.backtrace.resize(spec.backtrace);
    }
}

}  // namespace iprobe::hotpatch
