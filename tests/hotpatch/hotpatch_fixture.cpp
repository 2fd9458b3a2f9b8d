#include "hotpatch_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace iprobe::test {

std::string targets_dir() { return HP_TARGETS; }
std::string iprobe_bin() { return bin("iprobe"); }

CommandResult iprobe(const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
    std::vector<std::string> argv{iprobe_bin()};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv, {}, timeout);
}

HpTarget::HpTarget(int threads, const std::string& binary) {
    fifo_ = dir_ / "commands";
    out_ = dir_ / "out";
    if (::mkfifo(fifo_.c_str(), 0600) != 0) throw std::runtime_error("mkfifo");
    child_ = Child({binary, std::to_string(threads), fifo_}, out_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (output().find("ready") == std::string::npos) {
        if (std::chrono::steady_clock::now() > deadline || !child_.running())
            throw std::runtime_error("hp_target did not start");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

HpTarget::~HpTarget() {
    child_.kill(SIGKILL);
    child_.wait(std::chrono::seconds(10));
}

std::string HpTarget::output() const { return file_text(out_); }

long HpTarget::command(const std::string& line, std::chrono::milliseconds timeout) {
    {
        const int fd = ::open(fifo_.c_str(), O_WRONLY);
        if (fd < 0) throw std::runtime_error("open fifo");
        const std::string text = line + "\n";
        if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) throw std::runtime_error("write fifo");
        ::close(fd);
    }
    answers_++;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        const std::string out = output();
        std::istringstream lines(out);
        std::string l;
        std::size_t seen = 0;
        long value = 0;
        while (std::getline(lines, l))
            if (l.rfind("ok ", 0) == 0) {
                seen++;
                value = std::stol(l.substr(l.rfind(' ') + 1));
            }
        if (seen >= answers_) return value;
        if (std::chrono::steady_clock::now() > deadline || !child_.running())
            throw std::runtime_error("no answer to '" + line + "'");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

namespace {

struct CodeMapping {
    std::uint64_t low = 0, high = 0, offset = 0;
    std::string path;
};

// The executable file mappings of `pid` whose path ends in `path_suffix`.
std::vector<CodeMapping> code_mappings(pid_t pid, const std::string& path_suffix) {
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    std::string line;
    std::vector<CodeMapping> out;
    while (std::getline(maps, line)) {
        std::istringstream f(line);
        std::string range, perms, off, dev, inode, path;
        f >> range >> perms >> off >> dev >> inode >> path;
        if (perms.size() < 3 || perms[2] != 'x' || path.size() < path_suffix.size() ||
            path.compare(path.size() - path_suffix.size(), path_suffix.size(), path_suffix) != 0)
            continue;
        const auto dash = range.find('-');
        out.push_back({std::stoull(range.substr(0, dash), nullptr, 16), std::stoull(range.substr(dash + 1), nullptr, 16),
                       std::stoull(off, nullptr, 16), path});
    }
    return out;
}

}  // namespace

std::vector<std::uint8_t> text_of(pid_t pid, const std::string& path_suffix) {
    std::vector<std::uint8_t> bytes;
    const int mem = ::open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDONLY);
    for (const CodeMapping& m : code_mappings(pid, path_suffix)) {
        std::vector<std::uint8_t> chunk(m.high - m.low);
        if (::pread(mem, chunk.data(), chunk.size(), static_cast<off_t>(m.low)) != static_cast<ssize_t>(chunk.size()))
            chunk.clear();
        bytes.insert(bytes.end(), chunk.begin(), chunk.end());
    }
    ::close(mem);
    return bytes;
}

std::vector<std::uint64_t> changed_code(pid_t pid, const std::string& path_suffix, const std::vector<std::uint8_t>& before) {
    const std::vector<std::uint8_t> now = text_of(pid, path_suffix);
    std::vector<std::uint64_t> out;
    std::size_t at = 0;
    for (const CodeMapping& m : code_mappings(pid, path_suffix))
        for (std::uint64_t a = m.low; a < m.high; a++, at++)
            if (at < now.size() && at < before.size() && now[at] != before[at]) out.push_back(a);
    return out;
}

std::vector<std::uint8_t> memory_of(pid_t pid, std::uint64_t address, std::size_t size) {
    std::vector<std::uint8_t> bytes(size);
    const int mem = ::open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDONLY);
    if (mem < 0 || ::pread(mem, bytes.data(), size, static_cast<off_t>(address)) != static_cast<ssize_t>(size)) bytes.clear();
    if (mem >= 0) ::close(mem);
    return bytes;
}

std::vector<std::uint8_t> file_text_of(pid_t pid, const std::string& path_suffix) {
    std::vector<std::uint8_t> bytes;
    for (const CodeMapping& m : code_mappings(pid, path_suffix)) {
        std::vector<std::uint8_t> chunk(m.high - m.low, 0);  // past the file's end: zeros, as mapped
        const int fd = ::open(m.path.c_str(), O_RDONLY);
        if (fd < 0 || ::pread(fd, chunk.data(), chunk.size(), static_cast<off_t>(m.offset)) <= 0) chunk.clear();
        if (fd >= 0) ::close(fd);
        bytes.insert(bytes.end(), chunk.begin(), chunk.end());
    }
    return bytes;
}

long long json_calls(const std::string& json, const std::string& function) {
    const std::regex re("\"name\":\"" + function + "\",\"calls\":([0-9]+)");
    std::smatch m;
    return std::regex_search(json, m, re) ? std::stoll(m[1]) : -1;
}

long long json_completed(const std::string& json, const std::string& function) {
    const std::regex re("\"name\":\"" + function + "\",\"calls\":[0-9]+,\"completed\":([0-9]+)");
    std::smatch m;
    return std::regex_search(json, m, re) ? std::stoll(m[1]) : -1;
}

long long json_number(const std::string& json, const std::string& key) {
    const std::regex re("\"" + key + "\":([0-9]+)");
    std::smatch m;
    return std::regex_search(json, m, re) ? std::stoll(m[1]) : -1;
}

std::vector<std::string> lines_with(const std::string& out, const std::vector<std::string>& fragments) {
    std::vector<std::string> hits;
    std::size_t start = 0;
    while (start < out.size()) {
        std::size_t end = out.find('\n', start);
        if (end == std::string::npos) end = out.size();
        const std::string line = out.substr(start, end - start);
        std::size_t at = 0;
        bool all = true;
        for (const auto& f : fragments) {
            at = line.find(f, at);
            if (at == std::string::npos) {
                all = false;
                break;
            }
            at += f.size();
        }
        if (all) hits.push_back(line);
        start = end + 1;
    }
    return hits;
}

}  // namespace iprobe::test
