#include "criu.h"

#include <unistd.h>

#include <cstdlib>
#include <sstream>

#include "iprobe/launcher/clone.h"
#include "iprobe/support/error.h"
#include "iprobe/support/file.h"
#include "iprobe/support/install_layout.h"
#include "process.h"

namespace iprobe::launcher {
namespace {

constexpr int kMinMajor = 4, kMinMinor = 2;

// "Version: 4.2.1" -> "4.2.1"; empty when criu does not run.
std::string criu_version(const std::string& path) {
    RunResult r;
    try {
        r = run({path, "--version"});
    } catch (const Error&) {
        return {};
    }
    if (!r.ok()) return {};
    std::istringstream lines(r.out);
    std::string line;
    while (std::getline(lines, line)) {
        const std::string tag = "Version:";
        if (line.rfind(tag, 0) == 0) {
            auto v = line.substr(tag.size());
            v.erase(0, v.find_first_not_of(" \t"));
            return v;
        }
    }
    return {};
}

bool recent_enough(const std::string& version) {
    int major = 0, minor = 0;
    if (std::sscanf(version.c_str(), "%d.%d", &major, &minor) != 2) return false;
    return major > kMinMajor || (major == kMinMajor && minor >= kMinMinor);
}

std::uint64_t read_varint(const std::vector<std::uint8_t>& buf, std::size_t& pos) {
    std::uint64_t value = 0;
    for (int shift = 0; pos < buf.size() && shift < 64; shift += 7) {
        std::uint8_t b = buf[pos++];
        value |= static_cast<std::uint64_t>(b & 0x7f) << shift;
        if (!(b & 0x80)) return value;
    }
    throw Error("CRIU stats image is malformed (truncated varint)");
}

// Visits the fields of one protobuf message: fn(field, wire_type, varint, sub_begin, sub_end).
template <typename Fn>
void for_each_field(const std::vector<std::uint8_t>& buf, std::size_t begin, std::size_t end, Fn fn) {
    std::size_t pos = begin;
    while (pos < end) {
        std::uint64_t tag = read_varint(buf, pos);
        unsigned field = static_cast<unsigned>(tag >> 3), wire = static_cast<unsigned>(tag & 7);
        switch (wire) {
            case 0: fn(field, wire, read_varint(buf, pos), pos, pos); break;
            case 1: pos += 8; break;
            case 5: pos += 4; break;
            case 2: {
                std::uint64_t len = read_varint(buf, pos);
                if (len > end - pos) throw Error("CRIU stats image is malformed (bad length)");
                fn(field, wire, 0, pos, pos + len);
                pos += len;
                break;
            }
            default: throw Error("CRIU stats image is malformed (wire type)");
        }
    }
}

Criu locate_criu() {
    std::vector<std::string> tried;
    if (const char* env = getenv("IPROBE_CRIU"); env && *env) {
        std::string version = criu_version(env);
        if (version.empty())
            throw Error(std::string("IPROBE_CRIU=") + env + " does not run as criu (`" + env +
                            " --version` failed); unset it to use the CRIU scripts/setup installs",
                        ExitCode::unavailable);
        if (!recent_enough(version))
            throw Error(std::string("IPROBE_CRIU=") + env + " is CRIU " + version +
                            "; iprobe needs CRIU >= 4.2 on this kernel (run scripts/setup)",
                        ExitCode::unavailable);
        return {env, version};
    }
    // scripts/setup installs CRIU into a private prefix; the build links it
    // into libexec/iprobe (launcher/CMakeLists.txt).
    const std::string private_criu = (InstallLayout::current().libexec() / "criu").string();
    if (access(private_criu.c_str(), X_OK) == 0) {
        std::string version = criu_version(private_criu);
        if (recent_enough(version)) return {private_criu, version};
        tried.push_back(private_criu + (version.empty() ? " (does not run)" : " (" + version + ")"));
    }
    if (std::string system_criu = find_program("criu"); !system_criu.empty()) {
        std::string version = criu_version(system_criu);
        if (recent_enough(version)) return {system_criu, version};
        tried.push_back(system_criu + (version.empty() ? " (does not run)" : " (" + version + ")"));
    }
    std::string msg = "CRIU >= 4.2 not found";
    if (!tried.empty()) {
        msg += "; found only";
        for (const auto& t : tried) msg += " " + t;
    }
    msg += ". Run scripts/setup (it installs CRIU from Debian sid into third_party/cache/criu), "
           "or point IPROBE_CRIU at a criu >= 4.2";
    throw Error(msg, ExitCode::unavailable);
}

}  // namespace

Criu find_criu() {
    // Each step of a clone asks (take_checkpoint, restore_clone, and the
    // command before them), and each asking ran `criu --version`; what a
    // process finds cannot change while it runs.  A failure is not kept.
    static const Criu found = locate_criu();
    return found;
}

DumpStats read_dump_stats(const std::string& images_dir) {
    std::vector<std::uint8_t> buf;
    try {
        buf = read_file(images_dir + "/stats-dump");
    } catch (const Error&) {
        throw Error("CRIU wrote no statistics (" + images_dir + "/stats-dump)");
    }
    // Two magic words, then one length-prefixed StatsEntry.
    if (buf.size() < 12) throw Error("CRIU stats image is truncated");
    std::uint32_t len = static_cast<std::uint32_t>(buf[8]) | static_cast<std::uint32_t>(buf[9]) << 8 |
                        static_cast<std::uint32_t>(buf[10]) << 16 | static_cast<std::uint32_t>(buf[11]) << 24;
    if (len > buf.size() - 12) throw Error("CRIU stats image is truncated");
    DumpStats stats;
    bool found = false;
    for_each_field(buf, 12, 12 + len, [&](unsigned field, unsigned wire, std::uint64_t, std::size_t b, std::size_t e) {
        if (field != 1 || wire != 2) return;
        found = true;
        for_each_field(buf, b, e, [&](unsigned f, unsigned w, std::uint64_t v, std::size_t, std::size_t) {
            if (w != 0) return;
            switch (f) {
                case 1: stats.freezing_us = v; break;
                case 2: stats.frozen_us = v; break;
                case 3: stats.memdump_us = v; break;
                case 4: stats.memwrite_us = v; break;
                case 5: stats.pages_scanned = v; break;
                case 7: stats.pages_written = v; break;
                default: break;
            }
        });
    });
    if (!found) throw Error("CRIU stats image has no dump statistics");
    return stats;
}

std::string criu_log_errors(const std::string& log_path, std::size_t max_lines) {
    std::string text;
    try {
        auto bytes = read_file(log_path);
        text.assign(bytes.begin(), bytes.end());
    } catch (const Error&) {
        return {};
    }
    std::vector<std::string> errors;
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
        if (line.find("Error (") == std::string::npos) continue;
        // Harmless in containers that cap RLIMIT_NOFILE; CRIU goes on.
        if (line.find("RLIMIT_NOFILE") != std::string::npos) continue;
        errors.push_back(line);
    }
    if (errors.size() > max_lines) errors.erase(errors.begin(), errors.end() - static_cast<long>(max_lines));
    std::string out;
    for (const auto& e : errors) out += "\n  " + e;
    return out;
}

}  // namespace iprobe::launcher
