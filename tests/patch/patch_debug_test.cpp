// Active debugging end to end: the buggy service (targets/quote.c) as
// production in its own network namespace, `iprobe debug --patch` with the
// fix in the clone only: exactly the requests the bug affects are reported
// as changed, production's replies and code bytes stay as they were; then
// `iprobe investigate --patch` on the recorded window finds the same set.
// Needs root, CRIU.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "quote_client.h"
#include "redis_fixture.h"
#include "targets/quote.h"

namespace fs = std::filesystem;
using namespace iprobe::test;
using nlohmann::json;

namespace {

std::string target(const std::string& name) { return std::string(PATCH_TARGETS) + "/" + name; }

// Every executable mapping of `path` in `pid` compared with the file's bytes
// at the same offsets: "" when identical, else where they differ.
std::string code_differs_from_file(pid_t pid, const std::string& path) {
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    std::ifstream file(path, std::ios::binary);
    const int mem = ::open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDONLY | O_CLOEXEC);
    std::string line;
    int compared = 0;
    while (std::getline(maps, line)) {
        std::istringstream f(line);
        std::string range, perms, offset, dev, inode, mapped;
        f >> range >> perms >> offset >> dev >> inode >> mapped;
        if (perms.find('x') == std::string::npos || mapped != path) continue;
        const unsigned long start = std::stoul(range.substr(0, range.find('-')), nullptr, 16);
        const unsigned long end = std::stoul(range.substr(range.find('-') + 1), nullptr, 16);
        std::string live(end - start, '\0'), disk(end - start, '\0');
        const ssize_t n = ::pread(mem, live.data(), live.size(), static_cast<off_t>(start));
        file.clear();
        file.seekg(static_cast<std::streamoff>(std::stoul(offset, nullptr, 16)));
        file.read(disk.data(), static_cast<std::streamsize>(disk.size()));
        const auto got = static_cast<std::size_t>(file.gcount());
        if (n <= 0) return "cannot read " + range;
        live.resize(std::min<std::size_t>(static_cast<std::size_t>(n), got));
        disk.resize(live.size());
        if (live != disk) {
            std::size_t at = 0;
            while (live[at] == disk[at]) at++;
            ::close(mem);
            return "differs at offset " + std::to_string(at) + " of " + range;
        }
        compared++;
    }
    ::close(mem);
    return compared ? "" : "no executable mapping of " + path;
}

std::set<std::string> changed_requests(const std::vector<std::string>& lines) {
    std::set<std::string> out;
    for (const auto& l : lines) out.insert(json::parse(l).value("request", ""));
    return out;
}

class PatchDebug : public ::testing::Test {
protected:
    void SetUp() override {
        IPROBE_SKIP_UNLESS_CLONING_WORKS();
        prod_ns_ = std::make_unique<Netns>("ipt-patchp-" + std::to_string(getpid()));
        port_ = free_port();
        listen_port_ = free_port();
        while (listen_port_ == port_) listen_port_ = free_port();
        service_ = Child({"nsenter", "--net=" + prod_ns_->path(), target("patch_service"), std::to_string(port_)},
                         "/dev/null", {}, Session::own);
        for (int i = 0; i < 100 && (fd_ = connect_in_netns(prod_ns_->path(), port_)) < 0; i++)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        ASSERT_GE(fd_, 0) << "patch_service did not start";
        ::close(fd_);
        // nsenter execs the service: same PID.
        pid_ = service_.pid();
    }
    void TearDown() override {
        if (debug_) {
            debug_->kill(SIGTERM);
            debug_->wait(std::chrono::seconds(30));
        }
        run({bin("iprobe"), "clone", "--destroy", name()});
        service_.kill();
        prod_ns_.reset();
    }
    std::string name() const { return "ipt-patchc-" + std::to_string(getpid()); }
    // `items` asked on one connection at `port` in production's namespace.
    std::vector<long> ask(int port, const std::vector<long>& items) {
        const int fd = connect_in_netns(prod_ns_->path(), port);
        if (fd < 0) return {};
        auto out = ask_quotes(fd, items);
        ::close(fd);
        return out;
    }

    // `iprobe investigate RECORD --patch quote=libquote_fix.so EXTRA... --json`
    // in production's namespace: its patch-effect event (null when none).
    json investigate_patch_effect(const std::string& record, const std::vector<std::string>& extra = {}) {
        std::vector<std::string> argv = {"nsenter", "--net=" + prod_ns_->path(), bin("iprobe"), "investigate", record,
                                         "--patch", "quote=" + target("libquote_fix.so"), "--json"};
        argv.insert(argv.end(), extra.begin(), extra.end());
        const auto inv = run(argv, {}, std::chrono::seconds(300));
        EXPECT_EQ(inv.exit_code, 0) << inv.out << inv.err;
        json effect;
        std::istringstream lines(inv.out);
        for (std::string l; std::getline(lines, l);)
            if (l.find("\"event\":\"patch-effect\"") != std::string::npos) effect = json::parse(l);
        EXPECT_TRUE(effect.is_object()) << inv.out << inv.err;
        return effect;
    }

    TempDir dir_;
    std::unique_ptr<Netns> prod_ns_;
    int port_ = 0, listen_port_ = 0, fd_ = -1;
    pid_t pid_ = 0;
    Child service_;
    std::unique_ptr<Child> debug_;
};

TEST_F(PatchDebug, TheFixChangesExactlyTheBugsRepliesInTheCloneAndInvestigateFindsTheSame) {
    const std::string exe = target("patch_service");
    ASSERT_EQ(code_differs_from_file(pid_, exe), "");
    const std::string out = dir_ / "debug.out", record = dir_ / "record";
    debug_ = std::make_unique<Child>(
        std::vector<std::string>{"nsenter", "--net=" + prod_ns_->path(), bin("iprobe"), "debug", std::to_string(pid_),
                                 "--listen", "127.0.0.1:" + std::to_string(listen_port_), "--production",
                                 "127.0.0.1:" + std::to_string(port_), "--divergence", "resp", "--patch",
                                 "quote=" + target("libquote_fix.so"), "--record", record, "--name", name(), "--json"},
        out);
    ASSERT_TRUE(wait_for_event(out, "mirror", 1, *debug_)) << file_text(out);
    const auto patched = events(out, "patched");
    ASSERT_EQ(patched.size(), 1u) << file_text(out);
    EXPECT_EQ(json::parse(patched[0])["patch"]["patched"][0]["function"], "quote");
    EXPECT_NE(json::parse(patched[0]).value("clone_pid", 0), pid_);

    // Production's clients, through the mirror: 3 connections, 200 items each.
    std::set<std::string> bug_subset;
    std::size_t sent = 0;
    for (long c = 0; c < 3; c++) {
        std::vector<long> items;
        for (long i = 0; i < 200; i++) items.push_back(c * 1000 + i * 3);
        const auto replies = ask(listen_port_, items);
        ASSERT_EQ(replies.size(), items.size());
        for (std::size_t i = 0; i < items.size(); i++) {
            EXPECT_EQ(replies[i], QUOTE_BUGGY(items[i])) << "production's reply changed for item " << items[i];
            if (QUOTE_BUGGY(items[i]) != QUOTE_FIXED(items[i])) bug_subset.insert("QUOTE " + std::to_string(items[i]));
        }
        sent += items.size();
    }
    ASSERT_EQ(bug_subset.size(), 60u);
    // Every reply compared, then the session ends.
    for (int i = 0; i < 100 && events(out, "changed").size() < bug_subset.size(); i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    debug_->kill(SIGTERM);
    EXPECT_EQ(debug_->wait(std::chrono::seconds(60)), 0) << file_text(out);
    debug_.reset();

    const auto changed = events(out, "changed");
    EXPECT_EQ(changed.size(), bug_subset.size()) << file_text(out);
    EXPECT_EQ(changed_requests(changed), bug_subset);
    for (const auto& l : changed) {
        const json e = json::parse(l);
        const long item = std::stol(e.value("request", "QUOTE 0").substr(6));
        EXPECT_EQ(e["production"], ":" + std::to_string(QUOTE_BUGGY(item)) + "\r\n");
        EXPECT_EQ(e["patched"], ":" + std::to_string(QUOTE_FIXED(item)) + "\r\n");
    }
    const auto effect = events(out, "patch-effect");
    ASSERT_EQ(effect.size(), 1u) << file_text(out);
    EXPECT_EQ(json::parse(effect[0])["mode"], "resp");
    EXPECT_EQ(json::parse(effect[0])["changed"], bug_subset.size());
    EXPECT_EQ(json::parse(effect[0])["compared"], sent);

    // Production: its code as its file, its replies as before.
    EXPECT_EQ(code_differs_from_file(pid_, exe), "");
    EXPECT_EQ(file_text("/proc/" + std::to_string(pid_) + "/maps").find("libquote_fix"), std::string::npos);
    const auto after = ask(port_, {7, 8, 17});
    EXPECT_EQ(after, (std::vector<long>{QUOTE_BUGGY(7), QUOTE_BUGGY(8), QUOTE_BUGGY(17)}));

    // The recorded window, replayed into a patched clone: the same changes.
    const json replayed = investigate_patch_effect(record);
    ASSERT_TRUE(replayed.is_object());
    EXPECT_EQ(replayed["changed"], bug_subset.size());
    EXPECT_EQ(replayed["compared"], sent);
    std::set<std::string> replayed_requests;
    for (const auto& c : replayed["changes"]) replayed_requests.insert(c.value("request", ""));
    EXPECT_EQ(replayed_requests, bug_subset) << replayed;

    // Byte for byte: each connection changed once, at its first changed
    // reply, and the bytes before that difference counted as equal.
    const json streamed = investigate_patch_effect(record, {"--compare", "stream"});
    ASSERT_TRUE(streamed.is_object());
    std::uint64_t equal_bytes = 0;
    for (long c = 0; c < 3; c++)
        for (long i = 0; i < 200; i++) {
            const long item = c * 1000 + i * 3;
            const std::string prod = ":" + std::to_string(QUOTE_BUGGY(item)) + "\r\n";
            const std::string fixed = ":" + std::to_string(QUOTE_FIXED(item)) + "\r\n";
            const auto differ = std::mismatch(prod.begin(), prod.end(), fixed.begin(), fixed.end());
            equal_bytes += static_cast<std::uint64_t>(differ.first - prod.begin());
            if (differ.first != prod.end()) break;
        }
    EXPECT_EQ(streamed["mode"], "stream") << streamed;
    EXPECT_EQ(streamed["changed"], 3) << streamed;
    EXPECT_EQ(streamed["changed_connections"], 3) << streamed;
    EXPECT_EQ(streamed["compared"], equal_bytes) << streamed;
}

TEST_F(PatchDebug, ABadPatchSpecOrALibraryThatIsNotThereStartsNothing) {
    auto r = run({bin("iprobe"), "debug", std::to_string(pid_), "--listen", "127.0.0.1:" + std::to_string(listen_port_),
                  "--production", "127.0.0.1:" + std::to_string(port_), "--divergence", "resp", "--patch", "quote"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    r = run({bin("iprobe"), "debug", std::to_string(pid_), "--listen", "127.0.0.1:" + std::to_string(listen_port_),
             "--production", "127.0.0.1:" + std::to_string(port_), "--divergence", "resp", "--patch",
             "quote=/nonexistent/fix.so"});
    EXPECT_EQ(r.exit_code, 5) << r.err;
    // Re-cloning at each divergence would re-clone at each change the patch makes.
    r = run({bin("iprobe"), "debug", std::to_string(pid_), "--listen", "127.0.0.1:" + std::to_string(listen_port_),
             "--production", "127.0.0.1:" + std::to_string(port_), "--divergence", "resp", "--recloning",
             "on-divergence", "--patch", "quote=" + target("libquote_fix.so")});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    // An unknown protocol and no --divergence: the changes could not be found.
    r = run({bin("iprobe"), "debug", std::to_string(pid_), "--listen", "127.0.0.1:" + std::to_string(listen_port_),
             "--production", "127.0.0.1:" + std::to_string(port_), "--patch", "quote=" + target("libquote_fix.so")});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--divergence"), std::string::npos) << r.err;
    EXPECT_FALSE(netns_exists(name()));
    EXPECT_EQ(code_differs_from_file(pid_, target("patch_service")), "");
}

}  // namespace
