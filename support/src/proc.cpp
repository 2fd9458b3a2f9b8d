#include "iprobe/support/proc.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "iprobe/support/error.h"

namespace iprobe::proc {

namespace {

std::string path_of(pid_t pid, std::string_view leaf) { return "/proc/" + std::to_string(pid) + "/" + std::string(leaf); }
// /proc/PID/LEAF, or the thread's /proc/PID/task/TID/LEAF when `tid` is given.
std::string task_path_of(pid_t pid, pid_t tid, std::string_view leaf) {
    return tid ? path_of(pid, "task/" + std::to_string(tid) + "/" + std::string(leaf)) : path_of(pid, leaf);
}

std::optional<Mapping> parse_mapping(const std::string& line) {
    Mapping m;
    std::istringstream fields(line);
    std::string range, dev, inode;
    if (!(fields >> range >> m.perms >> std::hex >> m.offset >> dev >> inode)) return std::nullopt;
    const auto dash = range.find('-');
    if (dash == std::string::npos) return std::nullopt;
    const char* const text = range.data();
    if (std::from_chars(text, text + dash, m.start, 16).ec != std::errc() ||
        std::from_chars(text + dash + 1, text + range.size(), m.end, 16).ec != std::errc())
        return std::nullopt;
    std::getline(fields, m.path);
    m.path.erase(0, m.path.find_first_not_of(' '));
    return m;
}

}  // namespace

std::vector<Mapping> read_maps(pid_t pid) {
    std::ifstream in(path_of(pid, "maps"));
    if (!in) throw Error("cannot read /proc/" + std::to_string(pid) + "/maps", ExitCode::not_found);
    std::vector<Mapping> maps;
    std::string line;
    while (std::getline(in, line))
        if (auto m = parse_mapping(line)) maps.push_back(std::move(*m));
    return maps;
}

std::vector<pid_t> threads(pid_t pid) {
    std::vector<pid_t> tids;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(path_of(pid, "task"), ec)) {
        const std::string name = entry.path().filename();
        pid_t tid = 0;
        if (std::from_chars(name.data(), name.data() + name.size(), tid).ec == std::errc()) tids.push_back(tid);
    }
    std::sort(tids.begin(), tids.end());
    return tids;
}

std::optional<std::string> status_field(pid_t pid, std::string_view key, pid_t tid) {
    std::ifstream in(task_path_of(pid, tid, "status"));
    std::string line;
    while (std::getline(in, line)) {
        if (line.size() <= key.size() || line.compare(0, key.size(), key) != 0 || line[key.size()] != ':') continue;
        const auto begin = line.find_first_not_of(" \t", key.size() + 1);
        if (begin == std::string::npos) return std::string();
        const auto end = line.find_last_not_of(" \t");
        return line.substr(begin, end - begin + 1);
    }
    return std::nullopt;
}

std::vector<long> status_numbers(pid_t pid, std::string_view key) {
    std::vector<long> out;
    const auto text = status_field(pid, key);
    if (!text) return out;
    std::istringstream fields(*text);
    long v = 0;
    while (fields >> v) out.push_back(v);
    return out;
}

std::optional<std::string> stat_field(pid_t pid, int number, pid_t tid) {
    std::ifstream in(task_path_of(pid, tid, "stat"));
    std::string stat;
    if (!std::getline(in, stat)) return std::nullopt;
    const auto close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) return std::nullopt;
    if (number == 1) return stat.substr(0, stat.find(' '));
    if (number == 2) return stat.substr(stat.find('(') + 1, close_paren - stat.find('(') - 1);
    std::istringstream fields(stat.substr(close_paren + 1));
    std::string field;
    for (int i = 3; fields >> field; ++i)
        if (i == number) return field;
    return std::nullopt;
}

char state(pid_t pid, pid_t tid) {
    const auto s = stat_field(pid, 3, tid);
    return s && !s->empty() ? (*s)[0] : 0;
}

std::vector<Listener> tcp_listeners(pid_t pid) {
    std::vector<std::string> inodes;
    std::error_code ec;
    for (const auto& fd : std::filesystem::directory_iterator(path_of(pid, "fd"), ec)) {
        const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
        if (!ec && target.rfind("socket:[", 0) == 0) inodes.push_back(target.substr(8, target.size() - 9));
    }
    std::vector<Listener> out;
    std::ifstream in(path_of(pid, "net/tcp"));
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
        // "  0: 0100007F:18EB 00000000:0000 0A ... uid timeout inode"
        std::istringstream f(line);
        std::string slot, local, remote, st, queues, timer, retrans, uid, timeout, inode;
        if (!(f >> slot >> local >> remote >> st >> queues >> timer >> retrans >> uid >> timeout >> inode)) continue;
        if (st != "0A" || std::find(inodes.begin(), inodes.end(), inode) == inodes.end()) continue;
        const auto colon = local.find(':');
        if (colon != 8) continue;
        const unsigned long ip = std::stoul(local.substr(0, 8), nullptr, 16);  // host order of the bytes as stored
        Listener l;
        l.address = std::to_string(ip & 0xff) + "." + std::to_string((ip >> 8) & 0xff) + "." +
                    std::to_string((ip >> 16) & 0xff) + "." + std::to_string((ip >> 24) & 0xff);
        l.port = static_cast<int>(std::stoul(local.substr(colon + 1), nullptr, 16));
        out.push_back(std::move(l));
    }
    return out;
}

bool kernel_thread(pid_t pid) {
    constexpr unsigned long kPfKthread = 0x00200000;
    const auto flags = stat_field(pid, 9);
    return flags && (std::strtoul(flags->c_str(), nullptr, 10) & kPfKthread) != 0;
}

}  // namespace iprobe::proc
