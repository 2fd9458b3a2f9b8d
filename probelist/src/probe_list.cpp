#include "iprobe/probelist/probe_list.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "iprobe/support/error.h"
#include "iprobe/support/file.h"
#include "iprobe/support/glob.h"

namespace iprobe::probelist {

std::string_view to_string(ProbeKind kind) {
    switch (kind) {
        case ProbeKind::entry: return "entry";
        case ProbeKind::exit: return "exit";
        case ProbeKind::point: return "point";
    }
    return "unknown";
}

std::string_view to_string(SiteForm form) {
    switch (form) {
        case SiteForm::call_rel32: return "call_rel32";
        case SiteForm::call_rip_indirect: return "call_rip_indirect";
        case SiteForm::nop: return "nop";
        case SiteForm::ret: return "return";
    }
    return "unknown";
}

bool serves_returns(const std::vector<Probe>& probes, std::size_t index) {
    return index + 1 < probes.size() && probes[index].kind == ProbeKind::entry &&
           probes[index].form == SiteForm::nop && probes[index + 1].form == SiteForm::ret &&
           probes[index + 1].site == probes[index].site;
}

std::string_view flow_name(std::uint32_t flow) {
    switch (flow) {
        case IPROBE_FLOW_FINSTRUMENT: return "finstrument";
        case IPROBE_FLOW_LLVM: return "llvm";
        case IPROBE_FLOW_PATCHABLE_ENTRY: return "entry";
        case IPROBE_FLOW_UNPREPARED: return "unprepared";
    }
    return "unknown";
}

ProbeKind parse_probe_kind(std::string_view text) {
    if (text == "entry") return ProbeKind::entry;
    if (text == "exit") return ProbeKind::exit;
    if (text == "point") return ProbeKind::point;
    throw Error("unknown probe kind '" + std::string(text) + "' (expected entry, exit or point)",
                ExitCode::usage);
}

std::string hex(std::span<const std::uint8_t> bytes) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(bytes.size() * 2);
    for (const auto b : bytes) {
        out += digits[b >> 4];
        out += digits[b & 15];
    }
    return out;
}

std::string ProbeList::build_id_hex() const { return hex(build_id); }

bool ProbeList::has_relocated() const {
    return std::any_of(probes.begin(), probes.end(), [](const Probe& p) { return p.relocated; });
}

void ProbeList::normalize() {
    std::stable_sort(probes.begin(), probes.end(),
                     [](const Probe& a, const Probe& b) { return a.site < b.site; });
    for (std::size_t i = 0; i < probes.size(); ++i) probes[i].id = static_cast<std::uint32_t>(i);
}

namespace {

class StringTable {
public:
    StringTable() { data_.push_back('\0'); }
    std::uint32_t add(const std::string& s) {
        if (s.empty()) return 0;
        auto [it, inserted] = offsets_.try_emplace(s, static_cast<std::uint32_t>(data_.size()));
        if (inserted) data_.insert(data_.end(), s.c_str(), s.c_str() + s.size() + 1);
        return it->second;
    }
    const std::vector<char>& data() const { return data_; }

private:
    std::vector<char> data_;
    std::unordered_map<std::string, std::uint32_t> offsets_;
};

// `field` names the string for the error: "module_name", "record 7: source_file".
std::string string_at(std::span<const std::uint8_t> strings, std::uint32_t offset, const std::string& origin,
                      const std::string& field) {
    if (offset >= strings.size())
        throw Error(origin + ": not a valid probe list (" + field + " " + std::to_string(offset) +
                        " is past the string table's " + std::to_string(strings.size()) + " bytes)",
                    ExitCode::bad_input);
    const auto* begin = reinterpret_cast<const char*>(strings.data()) + offset;
    const auto* nul = static_cast<const char*>(std::memchr(begin, '\0', strings.size() - offset));
    if (!nul)
        throw Error(origin + ": not a valid probe list (" + field + ": unterminated string)", ExitCode::bad_input);
    return std::string(begin, nul);
}

}  // namespace

std::vector<std::uint8_t> ProbeList::serialize() const {
    StringTable strings;
    iprobe_pl_header header{};
    std::memcpy(header.magic, IPROBE_PL_MAGIC, IPROBE_PL_MAGIC_SIZE);
    header.version = IPROBE_PL_VERSION;
    header.header_size = sizeof(iprobe_pl_header);
    header.record_size = sizeof(iprobe_pl_record);
    header.flags = flags;
    header.flow = flow;
    header.probe_count = static_cast<std::uint32_t>(probes.size());
    if (build_id.size() > IPROBE_PL_BUILD_ID_MAX)
        throw Error("build-id longer than " + std::to_string(IPROBE_PL_BUILD_ID_MAX) + " bytes");
    header.build_id_size = static_cast<std::uint32_t>(build_id.size());
    std::copy(build_id.begin(), build_id.end(), header.build_id);
    header.module_name = strings.add(module);
    header.enter_target = enter_target;
    header.exit_target = exit_target;
    header.enter_got_slot = enter_got_slot;
    header.exit_got_slot = exit_got_slot;

    std::vector<iprobe_pl_record> records(probes.size());
    for (std::size_t i = 0; i < probes.size(); ++i) {
        const Probe& p = probes[i];
        iprobe_pl_record& r = records[i];
        r.id = p.id;
        r.kind = static_cast<std::uint8_t>(p.kind);
        r.site_form = static_cast<std::uint8_t>(p.form);
        r.site_size = p.size;
        r.flags = static_cast<std::uint8_t>((p.shared_site ? IPROBE_PL_RECORD_SHARED_SITE : 0) |
                                            (p.relocated ? IPROBE_PL_RECORD_RELOCATED : 0));
        r.site_address = p.site;
        r.function_address = p.function_address;
        r.function_name = strings.add(p.function);
        r.function_demangled = strings.add(p.demangled);
        r.source_file = strings.add(p.file);
        r.source_line = p.line;
        std::copy(p.original.begin(), p.original.end(), r.original_bytes);
        std::copy(p.placeholder.begin(), p.placeholder.end(), r.placeholder_bytes);
    }

    header.records_offset = sizeof header;
    header.strings_offset = header.records_offset + records.size() * sizeof(iprobe_pl_record);
    header.strings_size = strings.data().size();

    std::vector<std::uint8_t> out(header.strings_offset + header.strings_size);
    std::memcpy(out.data(), &header, sizeof header);
    if (!records.empty())
        std::memcpy(out.data() + header.records_offset, records.data(),
                    records.size() * sizeof(iprobe_pl_record));
    std::memcpy(out.data() + header.strings_offset, strings.data().data(), header.strings_size);
    return out;
}

ProbeList ProbeList::deserialize(std::span<const std::uint8_t> bytes, const std::string& origin) {
    // Every count, offset and size is checked against the file's size before
    // anything is allocated from it; every record is checked before the list
    // is handed to anyone, so no reader ever acts on part of a bad list.
    auto corrupt = [&](const std::string& why) {
        return Error(origin + ": not a valid probe list (" + why + "); re-run coldpatch or rebuild with iprobe-cc",
                     ExitCode::bad_input);
    };
    iprobe_pl_header header;
    if (bytes.size() < sizeof header)
        throw corrupt("too short: " + std::to_string(bytes.size()) + " bytes, the header alone is " +
                      std::to_string(sizeof header));
    std::memcpy(&header, bytes.data(), sizeof header);
    if (std::memcmp(header.magic, IPROBE_PL_MAGIC, IPROBE_PL_MAGIC_SIZE) != 0) throw corrupt("bad magic");
    if (header.version != IPROBE_PL_VERSION)
        throw Error(origin + ": probe list version " + std::to_string(header.version) +
                        " is not supported (this iprobe reads version " +
                        std::to_string(IPROBE_PL_VERSION) + "); re-run coldpatch",
                    ExitCode::bad_input);
    if (header.header_size < sizeof header || header.header_size > bytes.size())
        throw corrupt("header_size " + std::to_string(header.header_size));
    if (header.record_size < sizeof(iprobe_pl_record) || header.record_size > bytes.size())
        throw corrupt("record_size " + std::to_string(header.record_size));
    if (header.build_id_size > IPROBE_PL_BUILD_ID_MAX) throw corrupt("build_id_size " + std::to_string(header.build_id_size));
    const std::uint64_t size = bytes.size();
    // probe_count * record_size < 2^64: both are 32-bit.
    const std::uint64_t records_size = std::uint64_t{header.probe_count} * header.record_size;
    if (header.records_offset < header.header_size || header.records_offset > size ||
        records_size > size - header.records_offset)
        throw corrupt("records: " + std::to_string(header.probe_count) + " of " + std::to_string(header.record_size) +
                      " bytes at offset " + std::to_string(header.records_offset) + " do not fit in the file's " +
                      std::to_string(size) + " bytes");
    if (header.strings_offset > size || header.strings_size > size - header.strings_offset)
        throw corrupt("strings: " + std::to_string(header.strings_size) + " bytes at offset " +
                      std::to_string(header.strings_offset) + " do not fit in the file's " + std::to_string(size) +
                      " bytes");
    const auto strings = bytes.subspan(header.strings_offset, header.strings_size);

    ProbeList list;
    list.flags = header.flags;
    list.flow = header.flow;
    list.module = string_at(strings, header.module_name, origin, "module_name");
    list.build_id.assign(header.build_id, header.build_id + header.build_id_size);
    list.enter_target = header.enter_target;
    list.exit_target = header.exit_target;
    list.enter_got_slot = header.enter_got_slot;
    list.exit_got_slot = header.exit_got_slot;
    list.probes.resize(header.probe_count);
    for (std::uint32_t i = 0; i < header.probe_count; ++i) {
        iprobe_pl_record r;
        std::memcpy(&r, bytes.data() + header.records_offset + std::uint64_t(i) * header.record_size, sizeof r);
        auto bad = [&](const char* field, const std::string& why) {
            return corrupt("record " + std::to_string(i) + ": " + field + " " + why);
        };
        if (r.id != i) throw bad("id", std::to_string(r.id) + " is not its index " + std::to_string(i));
        if (r.kind < IPROBE_KIND_ENTRY || r.kind > IPROBE_KIND_POINT) throw bad("kind", std::to_string(r.kind) + " is unknown");
        if (r.site_form < IPROBE_SITE_CALL_REL32 || r.site_form > IPROBE_SITE_RETURN)
            throw bad("site_form", std::to_string(r.site_form) + " is unknown");
        if (r.site_size != 5 && r.site_size != 6) throw bad("site_size", std::to_string(r.site_size) + " is not 5 or 6");
        if (r.site_address > UINT64_MAX - r.site_size) throw bad("site_address", "wraps around");
        if (r.site_form == IPROBE_SITE_RETURN) {
            // No site of its own: it shares its entry's, the record before it.
            const Probe* entry = i > 0 ? &list.probes[i - 1] : nullptr;
            if (r.kind != IPROBE_KIND_EXIT || !entry || entry->kind != ProbeKind::entry ||
                entry->form != SiteForm::nop || entry->site != r.site_address || entry->size != r.site_size ||
                entry->function_address != r.function_address)
                throw bad("site_form", "return is not the exit of the NOP-form entry record before it");
            if (!std::equal(std::begin(r.original_bytes), std::end(r.original_bytes), entry->original.begin()) ||
                !std::equal(std::begin(r.placeholder_bytes), std::end(r.placeholder_bytes), entry->placeholder.begin()))
                throw corrupt("record " + std::to_string(i) + ": site bytes differ from those of its entry, record " +
                              std::to_string(i - 1));
        } else if (i > 0) {
            const Probe& previous = list.probes[i - 1];
            if (r.site_address < previous.site + previous.size)
                throw bad("site_address", "overlaps record " + std::to_string(i - 1) +
                                              " (records are sorted by site and sites are distinct)");
        }
        if ((r.flags & IPROBE_PL_RECORD_RELOCATED) && (r.kind != IPROBE_KIND_ENTRY || r.site_form != IPROBE_SITE_NOP))
            throw bad("flags", "relocated is only for NOP-form entry records");
        Probe& p = list.probes[i];
        p.id = r.id;
        p.kind = static_cast<ProbeKind>(r.kind);
        p.form = static_cast<SiteForm>(r.site_form);
        p.size = r.site_size;
        p.shared_site = (r.flags & IPROBE_PL_RECORD_SHARED_SITE) != 0;
        p.relocated = (r.flags & IPROBE_PL_RECORD_RELOCATED) != 0;
        p.site = r.site_address;
        p.function_address = r.function_address;
        const std::string record = "record " + std::to_string(i) + ": ";
        p.function = string_at(strings, r.function_name, origin, record + "function_name");
        p.demangled = string_at(strings, r.function_demangled, origin, record + "function_demangled");
        p.file = string_at(strings, r.source_file, origin, record + "source_file");
        p.line = r.source_line;
        std::copy(std::begin(r.original_bytes), std::end(r.original_bytes), p.original.begin());
        std::copy(std::begin(r.placeholder_bytes), std::end(r.placeholder_bytes), p.placeholder.begin());
    }
    return list;
}

void ProbeList::save(const std::string& path) const {
    const auto bytes = serialize();
    write_file_atomic(path, bytes.data(), bytes.size());
}

ProbeList ProbeList::load(const std::string& path) {
    const auto bytes = read_file(path);
    return deserialize(bytes, path);
}

ProbeMatcher::ProbeMatcher(const ProbeSelector& selector) : selector_(selector) {
    for (const std::string& g : selector.function_globs) {
        if (g.find_first_of("*?[\\") == std::string::npos) names_.insert(g);
        else patterns_.push_back(g);
    }
}

bool ProbeMatcher::matches(const Probe& probe) const {
    const auto& kinds = selector_.kinds;
    if (!kinds.empty() && std::find(kinds.begin(), kinds.end(), probe.kind) == kinds.end()) return false;
    if (!selector_.function_globs.empty() && !names_.count(probe.demangled) && !names_.count(probe.function) &&
        std::none_of(patterns_.begin(), patterns_.end(), [&](std::string_view g) {
            return glob_match(g, probe.demangled) || glob_match(g, probe.function);
        }))
        return false;
    if (!selector_.file_globs.empty()) {
        const auto slash = probe.file.rfind('/');
        const std::string_view base =
            slash == std::string::npos ? std::string_view(probe.file)
                                       : std::string_view(probe.file).substr(slash + 1);
        if (std::none_of(selector_.file_globs.begin(), selector_.file_globs.end(), [&](const std::string& g) {
                return glob_match(g, probe.file) || glob_match(g, base);
            }))
            return false;
    }
    return true;
}

bool ProbeSelector::matches(const Probe& probe) const { return ProbeMatcher(*this).matches(probe); }

std::vector<const Probe*> ProbeSelector::select(const ProbeList& list) const {
    const ProbeMatcher matcher(*this);
    std::vector<const Probe*> out;
    for (const auto& p : list.probes)
        if (matcher.matches(p)) out.push_back(&p);
    return out;
}

}  // namespace iprobe::probelist
