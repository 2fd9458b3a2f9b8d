// `iprobe debug` end to end: a real redis-server as production in its own
// network namespace, clients through the mirror, a CRIU clone receiving the
// copy, probes on in the clone only.  Needs root.
#include <fcntl.h>
#include <poll.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "redis_fixture.h"

namespace fs = std::filesystem;
using namespace iprobe::test;

namespace {

// Bytes of every executable mapping of the process' main binary.
std::string text_bytes(pid_t pid) {
    std::string proc = "/proc/" + std::to_string(pid);
    std::string exe = fs::read_symlink(proc + "/exe").string();
    std::ifstream maps(proc + "/maps");
    std::string line, out;
    int mem = ::open((proc + "/mem").c_str(), O_RDONLY | O_CLOEXEC);
    while (std::getline(maps, line)) {
        std::istringstream f(line);
        std::string range, perms, offset, dev, inode, path;
        f >> range >> perms >> offset >> dev >> inode >> path;
        if (perms.find('x') == std::string::npos || path != exe) continue;
        unsigned long start = std::stoul(range.substr(0, range.find('-')), nullptr, 16);
        unsigned long end = std::stoul(range.substr(range.find('-') + 1), nullptr, 16);
        std::string chunk(end - start, '\0');
        ssize_t n = ::pread(mem, chunk.data(), chunk.size(), static_cast<off_t>(start));
        if (n > 0) out.append(chunk.data(), static_cast<size_t>(n));
    }
    ::close(mem);
    return out;
}

class LauncherDebug : public ::testing::Test {
protected:
    void SetUp() override {
        IPROBE_SKIP_UNLESS_CLONING_WORKS();
        if (!fs::exists(build_dir() + "/libexec/iprobe/iprobe-mirror"))
            FAIL() << "iprobe-mirror is not built (target iprobe-mirror)";
        prod_ns_ = std::make_unique<Netns>("ipt-dprod-" + std::to_string(getpid()));
        port_ = free_port();
        listen_port_ = free_port();
        while (listen_port_ == port_) listen_port_ = free_port();
    }
    void TearDown() override {
        if (debug_) {
            debug_->kill(SIGTERM);
            debug_->wait(std::chrono::seconds(30));
        }
        debug_.reset();
        // A test that failed half-way may leave its own clone behind.
        run({bin("iprobe"), "clone", "--destroy", "ipt-probed-" + std::to_string(getpid())});
        redis_.reset();
        prod_ns_.reset();
    }
    void start_redis(const std::string& binary = "/usr/bin/redis-server") {
        redis_ = std::make_unique<Redis>(prod_ns_->path(), port_, dir_.path(), binary);
        ASSERT_TRUE(redis_->ready()) << "redis-server did not start";
        ASSERT_EQ(redis_->cli({"SET", "before", "debug"}), "OK");
    }
    void start_debug(const std::vector<std::string>& extra = {}, Session session = Session::inherit) {
        std::vector<std::string> argv = {"nsenter", "--net=" + prod_ns_->path(), bin("iprobe"), "debug",
                                         std::to_string(redis_->pid()), "--listen",
                                         "127.0.0.1:" + std::to_string(listen_port_), "--production",
                                         "127.0.0.1:" + std::to_string(port_), "--json"};
        argv.insert(argv.end(), extra.begin(), extra.end());
        debug_ = std::make_unique<Child>(argv, out_path(), std::vector<std::string>{}, session);
        ASSERT_TRUE(wait_for_event(out_path(), "mirror", 1, *debug_)) << file_text(out_path());
        auto clone = events(out_path(), "clone");
        ASSERT_FALSE(clone.empty());
        clone_netns_ = json_string(clone.back(), "netns");
        clone_pid_ = json_number(clone.back(), "clone_pid");
        ASSERT_FALSE(clone_netns_.empty());
        ASSERT_GT(clone_pid_, 1) << clone.back();
    }
    // The iprobe-cc redis as production, a session probing processCommand
    // in its clone (no trace), once the probes are attached.
    void start_probed_debug() {
        const std::string server = finstrument_redis();
        ASSERT_FALSE(server.empty()) << "scripts/build-redis --mode finstrument failed";
        ASSERT_NO_FATAL_FAILURE(start_redis(server));
        ASSERT_NO_FATAL_FAILURE(start_debug({"--probes", server + ".probes", "--functions", "processCommand", "--no-trace"}));
        ASSERT_TRUE(wait_for_event(out_path(), "attached", 1, *debug_)) << file_text(out_path());
    }
    std::string out_path() const { return dir_ / out_name_; }
    std::string via_mirror(const std::vector<std::string>& args) {
        return redis_cli(prod_ns_->path(), listen_port_, args);
    }
    std::string clone_cli(const std::vector<std::string>& args) { return redis_cli(clone_netns_, port_, args); }
    // The mirror's copy reaches the clone asynchronously.
    std::string clone_eventually(const std::vector<std::string>& args, const std::string& want) {
        std::string got;
        for (int i = 0; i < 100; ++i) {
            got = clone_cli(args);
            if (got == want) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return got;
    }
    void stop_debug_and_check_clean() {
        std::string netns_name = fs::path(clone_netns_).filename().string();
        debug_->kill(SIGTERM);
        EXPECT_EQ(debug_->wait(std::chrono::seconds(30)), 0);
        debug_.reset();
        EXPECT_FALSE(netns_exists(netns_name));
        EXPECT_EQ(::kill(static_cast<pid_t>(clone_pid_), 0) == 0 && fs::exists("/proc/" + std::to_string(clone_pid_)) &&
                      file_text("/proc/" + std::to_string(clone_pid_) + "/stat").find(") Z") == std::string::npos,
                  false);
        // The mirror is gone: nothing listens on --listen any more.
        EXPECT_LT(connect_in_netns(prod_ns_->path(), listen_port_), 0);
        EXPECT_EQ(redis_->cli({"PING"}), "PONG");
    }

    TempDir dir_;
    std::string out_name_ = "debug.out";  // the session's stdout, under dir_
    std::unique_ptr<Netns> prod_ns_;
    int port_ = 0, listen_port_ = 0;
    std::unique_ptr<Redis> redis_;
    std::unique_ptr<Child> debug_;
    std::string clone_netns_;
    long long clone_pid_ = -1;
};

TEST_F(LauncherDebug, ClientsReachProductionThroughListenAndTheCloneTracksIt) {
    ASSERT_NO_FATAL_FAILURE(start_redis());
    std::string text_before = text_bytes(redis_->pid());
    ASSERT_FALSE(text_before.empty());
    ASSERT_NO_FATAL_FAILURE(start_debug());
    EXPECT_EQ(clone_cli({"GET", "before"}), "debug");  // cloned state

    EXPECT_EQ(via_mirror({"SET", "k1", "v1"}), "OK");
    EXPECT_EQ(via_mirror({"INCRBY", "n", "5"}), "5");
    EXPECT_EQ(via_mirror({"RPUSH", "list", "a", "b", "c"}), "3");
    // Production got them (directly visible on its own port) ...
    EXPECT_EQ(redis_->cli({"GET", "k1"}), "v1");
    EXPECT_EQ(redis_->cli({"LLEN", "list"}), "3");
    // ... and so did the clone.
    EXPECT_EQ(clone_eventually({"GET", "k1"}, "v1"), "v1");
    EXPECT_EQ(clone_eventually({"LRANGE", "list", "0", "-1"}, "a\nb\nc"), "a\nb\nc");
    EXPECT_EQ(clone_eventually({"GET", "n"}, "5"), "5");
    EXPECT_EQ(clone_cli({"DBSIZE"}), redis_->cli({"DBSIZE"}));
    // Writes made to the clone directly stay there.
    EXPECT_EQ(clone_cli({"SET", "clone-only", "1"}), "OK");
    EXPECT_EQ(redis_->cli({"EXISTS", "clone-only"}), "0");

    EXPECT_EQ(text_bytes(redis_->pid()), text_before);
    stop_debug_and_check_clean();
    EXPECT_EQ(redis_->cli({"GET", "k1"}), "v1");
    EXPECT_EQ(text_bytes(redis_->pid()), text_before);
}

TEST_F(LauncherDebug, ProbeTraceComesFromTheCloneAndProductionIsNotPatched) {
    if (!fs::exists(build_dir() + "/libexec/iprobe/iprobe-hotpatch"))
        FAIL() << "iprobe-hotpatch is not built (target iprobe-hotpatch)";
    std::string server = finstrument_redis();
    ASSERT_FALSE(server.empty()) << "scripts/build-redis --mode finstrument failed";
    ASSERT_NO_FATAL_FAILURE(start_redis(server));
    const std::string text_before = text_bytes(redis_->pid());
    ASSERT_FALSE(text_before.empty());
    ASSERT_NO_FATAL_FAILURE(start_debug({"--probes", server + ".probes", "--functions", "processCommand"}));
    ASSERT_TRUE(wait_for_event(out_path(), "attached", 1, *debug_)) << file_text(out_path());

    // Five commands on one client connection through --listen.
    int fd = connect_in_netns(prod_ns_->path(), listen_port_);
    ASSERT_GE(fd, 0);
    const std::string cmds = "SET t1 a\r\nSET t2 b\r\nINCR t3\r\nGET t1\r\nPING\r\n";
    ASSERT_EQ(::write(fd, cmds.data(), cmds.size()), static_cast<ssize_t>(cmds.size()));
    std::string replies;
    while (replies != "+OK\r\n+OK\r\n:1\r\n$1\r\na\r\n+PONG\r\n") {
        pollfd p{fd, POLLIN, 0};
        ASSERT_EQ(::poll(&p, 1, 5000), 1) << "replies so far: " << replies;
        char buf[256];
        ssize_t n = ::read(fd, buf, sizeof buf);
        ASSERT_GT(n, 0);
        replies.append(buf, static_cast<size_t>(n));
        ASSERT_LE(replies.size(), 40u) << replies;
    }
    ::close(fd);

    // The clone ran exactly those five commands, each one traced, as JSON
    // events of the session (--json: stdout is JSON lines only).
    const std::string entry = R"("event":"trace","time_ns":)", entered = R"("kind":"entry","function":"processCommand")";
    size_t entries = 0;
    for (int i = 0; i < 100 && entries < 5; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        entries = count_lines_with(file_text(out_path()), entered);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::string out = file_text(out_path());
    EXPECT_EQ(count_lines_with(out, entered), 5u) << out;
    EXPECT_EQ(count_lines_with(out, R"("kind":"exit","function":"processCommand")"), 5u) << out;
    EXPECT_EQ(count_lines_with(out, entry), 10u) << out;
    EXPECT_EQ(clone_cli({"MGET", "t1", "t2", "t3"}), "a\nb\n1");

    // Production: served the commands, never patched, no runtime loaded.
    EXPECT_EQ(redis_->cli({"MGET", "t1", "t2", "t3"}), "a\nb\n1");
    EXPECT_EQ(text_bytes(redis_->pid()), text_before);
    EXPECT_EQ(file_text("/proc/" + std::to_string(redis_->pid()) + "/maps").find("iprobe-rt"), std::string::npos);
    stop_debug_and_check_clean();
    EXPECT_EQ(text_bytes(redis_->pid()), text_before);
    // stdout is JSON events only (the file also holds stderr, where the
    // tools' diagnostics go, each prefixed with its tool's name); the last
    // event is "stopping", with the mirror's final stats.
    out = file_text(out_path());
    std::istringstream lines(out);
    std::string line, last;
    while (std::getline(lines, line)) {
        if (line.starts_with("iprobe ")) continue;
        EXPECT_TRUE(line.starts_with("{\"event\":\"") && line.ends_with("}")) << line;
        last = line;
    }
    EXPECT_TRUE(last.starts_with(R"({"event":"stopping","stats":{)")) << last;
    EXPECT_NE(last.find(R"("mode":"resp")"), std::string::npos) << "redis: divergence by RESP message by default: " << last;
}

// `iprobe debug --lossless`: every function of the clone probed, a
// pipelined burst through the mirror; the clone's agent reads losslessly,
// so each of the 500 commands is one processCommand entry and one exit in
// the session's trace, and nothing was dropped (AgentTest has the rings
// overflowing and the threads waiting; this is the flag end to end).
TEST_F(LauncherDebug, LosslessTraceInTheCloneKeepsEveryCommand) {
    if (!fs::exists(build_dir() + "/libexec/iprobe/iprobe-hotpatch"))
        FAIL() << "iprobe-hotpatch is not built (target iprobe-hotpatch)";
    std::string server = finstrument_redis();
    ASSERT_FALSE(server.empty()) << "scripts/build-redis --mode finstrument failed";
    ASSERT_NO_FATAL_FAILURE(start_redis(server));
    ASSERT_NO_FATAL_FAILURE(start_debug({"--probes", server + ".probes", "--lossless"}));
    ASSERT_TRUE(wait_for_event(out_path(), "attached", 1, *debug_)) << file_text(out_path());
    constexpr int kCommands = 500;
    int fd = connect_in_netns(prod_ns_->path(), listen_port_);
    ASSERT_GE(fd, 0);
    std::string cmds;
    for (int i = 0; i < kCommands; ++i) cmds += "INCR lossless\r\n";
    ASSERT_EQ(::write(fd, cmds.data(), cmds.size()), static_cast<ssize_t>(cmds.size()));
    std::string replies;
    while (replies.find(":" + std::to_string(kCommands) + "\r\n") == std::string::npos) {
        pollfd p{fd, POLLIN, 0};
        ASSERT_EQ(::poll(&p, 1, 10000), 1) << "replies so far: " << replies.size() << " bytes";
        char buf[4096];
        ssize_t n = ::read(fd, buf, sizeof buf);
        ASSERT_GT(n, 0);
        replies.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    EXPECT_EQ(clone_eventually({"GET", "lossless"}, std::to_string(kCommands)), std::to_string(kCommands));
    const std::string entered = R"("kind":"entry","function":"processCommand")",
                      exited = R"("kind":"exit","function":"processCommand")";
    std::size_t exits = 0;
    // the burst's, plus the GET above
    for (int i = 0; i < 200 && exits < kCommands + 1; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        exits = count_lines_with(file_text(out_path()), exited);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const std::string out = file_text(out_path());
    EXPECT_EQ(count_lines_with(out, entered), kCommands + 1u) << out.substr(0, 2000);
    EXPECT_EQ(count_lines_with(out, exited), kCommands + 1u);
    stop_debug_and_check_clean();
    // a generation's end says what its clones' rings dropped: nothing
    EXPECT_EQ(file_text(out_path()).find("trace-dropped"), std::string::npos) << "nothing dropped while lossless";
}

// Values in the clone: `iprobe debug --args --retval` on a redis built with
// the entry flow (-O2 -g, Debian's source).  setCommand(client *c) gets its
// key inside the client; the key itself is a string argument of sdsdup(),
// which dbAdd calls with it for a new key: each SET shows its key, nested in
// its setCommand call, with sdsdup's copy as the return value.
TEST_F(LauncherDebug, ArgsInTheCloneShowTheKeyOfEachSetCommand) {
    if (!fs::exists(build_dir() + "/libexec/iprobe/iprobe-hotpatch"))
        FAIL() << "iprobe-hotpatch is not built (target iprobe-hotpatch)";
    const std::string server = build_redis("entry");
    ASSERT_FALSE(server.empty());
    ASSERT_NO_FATAL_FAILURE(start_redis(server));
    ASSERT_NO_FATAL_FAILURE(start_debug({"--probes", server + ".probes", "--functions", "setCommand,sdsdup", "--args",
                                         "--retval"}));
    ASSERT_TRUE(wait_for_event(out_path(), "attached", 1, *debug_)) << file_text(out_path());
    for (const char* key : {"user:1", "user:22", "user:333"}) EXPECT_EQ(via_mirror({"SET", key, "v"}), "OK");
    const std::string set_entry = R"("kind":"entry","function":"setCommand","depth":0,"args":[{"name":"c","type":"struct client*","value":"0x)";
    std::string out;
    for (int i = 0; i < 100 && count_lines_with(out, R"("kind":"exit","function":"setCommand")") < 3; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        out = file_text(out_path());
    }
    EXPECT_EQ(count_lines_with(out, set_entry), 3u) << out;
    // the retval of a void function: none
    EXPECT_EQ(count_lines_with(out, R"("kind":"exit","function":"setCommand","depth":0})"), 3u) << out;
    for (const char* key : {"user:1", "user:22", "user:333"}) {
        const std::string dup = std::string(R"("kind":"entry","function":"sdsdup","depth":1,"args":[{"name":"s","type":"const char*","value":")") + key + R"("}])";
        EXPECT_EQ(count_lines_with(out, dup), 1u) << key << "\n" << out;
    }
    EXPECT_EQ(count_lines_with(out, R"("kind":"exit","function":"sdsdup","depth":1,"retval":{"type":"char*","value":")"), 3u)
        << out;
    EXPECT_EQ(clone_eventually({"GET", "user:333"}, "v"), "v");
    stop_debug_and_check_clean();
}

// --when goes to the clone's agent with the attach: only the calls it holds
// for are traced (in the clone, by the runtime), the others counted only.
TEST_F(LauncherDebug, WhenInTheCloneTracesOnlyTheCallsItHoldsFor) {
    if (!fs::exists(build_dir() + "/libexec/iprobe/iprobe-hotpatch"))
        FAIL() << "iprobe-hotpatch is not built (target iprobe-hotpatch)";
    const std::string server = build_redis("entry");
    ASSERT_FALSE(server.empty());
    ASSERT_NO_FATAL_FAILURE(start_redis(server));
    ASSERT_NO_FATAL_FAILURE(start_debug({"--probes", server + ".probes", "--functions", "sdsdup", "--args", "--when",
                                         "s == \"user:22\""}));
    ASSERT_TRUE(wait_for_event(out_path(), "attached", 1, *debug_)) << file_text(out_path());
    for (const char* key : {"user:1", "user:22", "user:333"}) EXPECT_EQ(via_mirror({"SET", key, "v"}), "OK");
    const std::string matched = R"("kind":"entry","function":"sdsdup")";
    const std::string user22 = R"("args":[{"name":"s","type":"const char*","value":"user:22"}])";
    std::string out;
    for (int i = 0; i < 100 && count_lines_with(out, user22) < 1; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        out = file_text(out_path());
    }
    EXPECT_EQ(clone_eventually({"GET", "user:333"}, "v"), "v");  // every SET reached the clone
    out = file_text(out_path());
    EXPECT_GE(count_lines_with(out, user22), 1u) << out;
    EXPECT_EQ(count_lines_with(out, matched), count_lines_with(out, user22)) << out;
    EXPECT_EQ(count_lines_with(out, R"("value":"user:1")"), 0u) << out;
    EXPECT_EQ(count_lines_with(out, R"("value":"user:333")"), 0u) << out;
    stop_debug_and_check_clean();
}

// Without --json, a person reads: the clone by its own PID, the freeze once,
// where the mirror's stats are, and how replies are compared.
TEST_F(LauncherDebug, HumanOutputNamesTheCloneItsStatsAddressAndTheFreezeOnce) {
    ASSERT_NO_FATAL_FAILURE(start_redis());
    const std::string log = dir_ / "human.out";
    Child debug({"sh", "-c",
                 "exec nsenter --net=" + prod_ns_->path() + " " + bin("iprobe") + " debug " +
                     std::to_string(redis_->pid()) + " --listen 127.0.0.1:" + std::to_string(listen_port_) +
                     " --production 127.0.0.1:" + std::to_string(port_) + " 2>&1"},
                log);
    std::string text;
    for (int i = 0; i < 600 && text.find("stats at http://127.0.0.1:") == std::string::npos; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        text = file_text(log);
    }
    debug.kill(SIGTERM);
    EXPECT_EQ(debug.wait(std::chrono::seconds(30)), 0);
    text = file_text(log);
    EXPECT_EQ(count_lines_with(text, "frozen"), 1u) << text;
    EXPECT_EQ(count_lines_with(text, "clone iprobe-debug-" + std::to_string(redis_->pid()) + " running as PID "), 1u)
        << text;
    EXPECT_EQ(count_lines_with(text, "running as PID " + std::to_string(redis_->pid()) + " "), 0u)
        << "the clone is named by its own PID, not production's: " << text;
    EXPECT_EQ(count_lines_with(text, "divergence checking by resp; stats at http://127.0.0.1:"), 1u) << text;
    EXPECT_EQ(redis_->cli({"PING"}), "PONG");
}

// Production already probed: the clone inherits the runtime and its shared
// memory mapping, and must log into a private copy, never into production's.
TEST_F(LauncherDebug, CloneOfAProbedProductionLogsIntoItsOwnRegion) {
    const std::string hotpatch = build_dir() + "/libexec/iprobe/iprobe-hotpatch";
    if (!fs::exists(hotpatch)) FAIL() << "iprobe-hotpatch is not built (target iprobe-hotpatch)";
    std::string server = finstrument_redis();
    ASSERT_FALSE(server.empty()) << "scripts/build-redis --mode finstrument failed";
    ASSERT_NO_FATAL_FAILURE(start_redis(server));
    const std::string pid = std::to_string(redis_->pid());
    auto a = run({hotpatch, "attach", pid, "--probes", server + ".probes", "--functions", "processCommand"});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    const std::string name = "ipt-probed-" + std::to_string(getpid());
    auto c = run({bin("iprobe"), "clone", pid, "--netns", name, "--json"});
    ASSERT_EQ(c.exit_code, 0) << c.err;
    // The runtime region is a memfd: CRIU restores the clone its own copy.
    const std::string keeper = std::to_string(json_number(c.out, "keeper_pid"));

    Child prod_trace({hotpatch, "trace", pid, "--duration", "4"}, dir_ / "prod.trace");
    Child clone_trace({"nsenter", "--target", keeper, "--pid", "--mount", "--", hotpatch, "trace", pid, "--duration", "4"},
                      dir_ / "clone.trace");
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    for (int i = 0; i < 3; ++i) EXPECT_EQ(redis_cli("/run/netns/" + name, port_, {"PING"}), "PONG");
    EXPECT_EQ(redis_->cli({"PING"}), "PONG");
    EXPECT_EQ(prod_trace.wait(std::chrono::seconds(20)), 0);
    EXPECT_EQ(clone_trace.wait(std::chrono::seconds(20)), 0);
    std::string prod_events = file_text(dir_ / "prod.trace"), clone_events = file_text(dir_ / "clone.trace");
    EXPECT_EQ(count_lines_with(prod_events, "-> processCommand"), 1u) << prod_events;
    EXPECT_EQ(count_lines_with(clone_events, "-> processCommand"), 3u) << clone_events;
    EXPECT_EQ(run({bin("iprobe"), "clone", "--destroy", name}).exit_code, 0);
    EXPECT_EQ(run({hotpatch, "detach", pid}).exit_code, 0);
}

TEST_F(LauncherDebug, PeriodicRecloningPicksUpProductionsCurrentState) {
    ASSERT_NO_FATAL_FAILURE(start_redis());
    ASSERT_NO_FATAL_FAILURE(start_debug({"--recloning", "periodic:2"}));
    // Written straight to production: the first clone never sees it.
    EXPECT_EQ(redis_->cli({"SET", "direct", "after-first-clone"}), "OK");
    EXPECT_EQ(clone_cli({"EXISTS", "direct"}), "0");
    ASSERT_TRUE(wait_for_event(out_path(), "clone", 2, *debug_, std::chrono::seconds(30))) << file_text(out_path());
    auto clones = events(out_path(), "clone");
    EXPECT_EQ(json_number(clones[1], "generation"), 2);
    clone_netns_ = json_string(clones[1], "netns");
    clone_pid_ = json_number(clones[1], "clone_pid");
    EXPECT_EQ(clone_cli({"GET", "direct"}), "after-first-clone");
    // The mirror goes on feeding the new clone.
    EXPECT_EQ(via_mirror({"SET", "k2", "v2"}), "OK");
    EXPECT_EQ(clone_eventually({"GET", "k2"}, "v2"), "v2");
    stop_debug_and_check_clean();
}

TEST_F(LauncherDebug, OverflowRecloningReplacesADivergedClone) {
    ASSERT_NO_FATAL_FAILURE(start_redis());
    ASSERT_NO_FATAL_FAILURE(start_debug({"--buffer", "64K", "--recloning", "on-overflow"}));
    // A clone that stops reading: its copy of the stream backs up.
    // (kill(-1) or kill(0) would stop the test runner itself)
    ASSERT_GT(clone_pid_, 1);
    ASSERT_EQ(::kill(static_cast<pid_t>(clone_pid_), SIGSTOP), 0);
    const std::string big(512 * 1024, 'x');
    for (int i = 0; i < 8; ++i) EXPECT_EQ(redis_cli_x(prod_ns_->path(), listen_port_, {"SET", "big" + std::to_string(i)}, big), "OK");
    // Production answered every one without waiting for the stopped clone.
    EXPECT_EQ(redis_->cli({"STRLEN", "big7"}), std::to_string(big.size()));
    ASSERT_TRUE(wait_for_event(out_path(), "reclone", 1, *debug_, std::chrono::seconds(30))) << file_text(out_path());
    ASSERT_TRUE(wait_for_event(out_path(), "clone", 2, *debug_, std::chrono::seconds(30))) << file_text(out_path());
    auto clones = events(out_path(), "clone");
    clone_netns_ = json_string(clones.back(), "netns");
    clone_pid_ = json_number(clones.back(), "clone_pid");
    // The new clone starts from production's current state.
    EXPECT_EQ(clone_cli({"STRLEN", "big7"}), std::to_string(big.size()));
    stop_debug_and_check_clean();
}

TEST_F(LauncherDebug, DivergenceRecloningReplacesACloneThatAnswersDifferently) {
    ASSERT_NO_FATAL_FAILURE(start_redis());
    ASSERT_NO_FATAL_FAILURE(start_debug({"--divergence", "resp", "--recloning", "on-divergence"}));
    // Make the clone's state differ, then ask both the same question.
    EXPECT_EQ(clone_cli({"SET", "x", "clone-only"}), "OK");
    EXPECT_EQ(redis_->cli({"SET", "x", "production"}), "OK");
    EXPECT_EQ(via_mirror({"GET", "x"}), "production");
    ASSERT_TRUE(wait_for_event(out_path(), "reclone", 1, *debug_, std::chrono::seconds(30))) << file_text(out_path());
    ASSERT_TRUE(wait_for_event(out_path(), "clone", 2, *debug_, std::chrono::seconds(30))) << file_text(out_path());
    auto clones = events(out_path(), "clone");
    clone_netns_ = json_string(clones.back(), "netns");
    clone_pid_ = json_number(clones.back(), "clone_pid");
    EXPECT_EQ(clone_cli({"GET", "x"}), "production");
    // Identical replies do not re-clone.
    EXPECT_EQ(via_mirror({"GET", "x"}), "production");
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    EXPECT_EQ(events(out_path(), "reclone").size(), 1u) << file_text(out_path());
    stop_debug_and_check_clean();
}

// The clone's probes are one agent process inside its PID namespace; when
// it dies the session says so and ends, taking the clone along.
TEST_F(LauncherDebug, AProbeAgentThatDiesEndsTheSessionSayingSoAndTheCloneGoes) {
    ASSERT_NO_FATAL_FAILURE(start_probed_debug());
    // The agents of this clone: processes in its PID namespace running `iprobe-hotpatch agent`.
    const auto ns_of = [](long long pid) {
        std::error_code ec;
        return fs::read_symlink("/proc/" + std::to_string(pid) + "/ns/pid", ec).string();
    };
    std::vector<pid_t> agents;
    for (const auto& entry : fs::directory_iterator("/proc")) {
        const std::string name = entry.path().filename();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        const std::string cmdline = file_text(entry.path() / "cmdline");
        if (cmdline.find(std::string("iprobe-hotpatch\0agent\0", 22)) != std::string::npos &&
            ns_of(std::stoll(name)) == ns_of(clone_pid_))
            agents.push_back(std::stoi(name));
    }
    ASSERT_EQ(agents.size(), 1u) << "one probe agent per clone";
    ASSERT_EQ(::kill(agents.front(), SIGKILL), 0);
    EXPECT_EQ(debug_->wait(std::chrono::seconds(60)), 1) << file_text(out_path());
    const auto errors = events(out_path(), "error");
    ASSERT_FALSE(errors.empty()) << file_text(out_path());
    EXPECT_NE(errors.back().find("the probe agent of clone"), std::string::npos) << errors.back();
    debug_.reset();
    EXPECT_FALSE(netns_exists(fs::path(clone_netns_).filename().string()));
    EXPECT_FALSE(fs::exists("/proc/" + std::to_string(clone_pid_)) &&
                 file_text("/proc/" + std::to_string(clone_pid_) + "/stat").find(") Z") == std::string::npos);
    EXPECT_EQ(redis_->cli({"PING"}), "PONG");
}

// The clone's process ending is not its agent dying: the agent says so, the
// session tells its user and goes on (divergence or the user ends it).
TEST_F(LauncherDebug, ACloneWhoseProcessExitsIsSaidAndTheSessionGoesOn) {
    ASSERT_NO_FATAL_FAILURE(start_probed_debug());
    ASSERT_EQ(::kill(static_cast<pid_t>(clone_pid_), SIGKILL), 0);
    EXPECT_TRUE(wait_for_event(out_path(), "clone-exited", 1, *debug_)) << file_text(out_path());
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    EXPECT_TRUE(debug_->running()) << file_text(out_path());
    EXPECT_TRUE(events(out_path(), "error").empty()) << file_text(out_path());
    EXPECT_EQ(via_mirror({"SET", "still", "served"}), "OK");
    stop_debug_and_check_clean();
}

// A session killed outright (SIGKILL: no teardown runs) takes its clone
// along, its namespace and state with it, and the next session with the
// same clone name starts clean.
TEST_F(LauncherDebug, KilledSessionTakesItsCloneAlongAndTheNextStartsClean) {
    ASSERT_NO_FATAL_FAILURE(start_redis());
    ASSERT_NO_FATAL_FAILURE(start_debug());
    const auto clone_alive = [](long long pid) {
        const std::string stat = "/proc/" + std::to_string(pid) + "/stat";
        return fs::exists(stat) && file_text(stat).find(") Z") == std::string::npos;
    };
    ASSERT_TRUE(clone_alive(clone_pid_));
    debug_->kill(SIGKILL);
    bool gone = false;
    for (int i = 0; i < 100 && !(gone = !clone_alive(clone_pid_)); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(gone) << "clone PID " << clone_pid_ << " outlived its session";
    // Its keeper removed the clone's pins on the host as it left: nothing
    // of the session is left in /run for --list to show as remains.
    const std::string name = fs::path(clone_netns_).filename().string();
    for (int i = 0; i < 100 && (fs::exists(clone_netns_) || fs::exists("/run/iprobe/clones/" + name)); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(fs::exists(clone_netns_));
    EXPECT_FALSE(fs::exists("/run/iprobe/clones/" + name));
    EXPECT_FALSE(fs::exists("/dev/shm/iprobe-checkpoint-" + name));
    EXPECT_EQ(redis_->cli({"PING"}), "PONG");
    // The killed session's mirror follows it (parent-death signal): wait
    // until --listen is free again.
    for (int i = 0; i < 100 && connect_in_netns(prod_ns_->path(), listen_port_) >= 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    out_name_ = "second-session.out";
    ASSERT_NO_FATAL_FAILURE(start_debug());
    EXPECT_EQ(clone_cli({"GET", "before"}), "debug");
    EXPECT_EQ(via_mirror({"SET", "k", "v"}), "OK");
    EXPECT_EQ(clone_eventually({"GET", "k"}, "v"), "v");
    stop_debug_and_check_clean();
}

// Ctrl-C at a terminal (SIGINT to the whole foreground process group),
// SIGTERM from a supervisor, SIGHUP when the terminal goes: each ends the
// session as its user asked, not as a failure.  The mirror, the traces and
// the clones run in process groups of their own, so the signal reaches the
// launcher alone, which reports, takes the mirror's final stats and removes
// everything.
class LauncherDebugStop : public LauncherDebug, public ::testing::WithParamInterface<std::pair<int, int>> {};

TEST_P(LauncherDebugStop, SignalToTheSessionsGroupEndsItCleanlyWithStatsAndTheReport) {
    const auto [sig, clones] = GetParam();
    std::string server = finstrument_redis();
    ASSERT_FALSE(server.empty()) << "scripts/build-redis --mode finstrument failed";
    ASSERT_NO_FATAL_FAILURE(start_redis(server));
    ASSERT_NO_FATAL_FAILURE(start_debug({"--probes", server + ".probes", "--functions", "setCommand", "--clones",
                                         std::to_string(clones), "--no-trace"},
                                        Session::own));
    ASSERT_TRUE(wait_for_event(out_path(), "attached", static_cast<size_t>(clones), *debug_)) << file_text(out_path());
    for (int i = 0; i < 3; ++i) EXPECT_EQ(via_mirror({"SET", "s" + std::to_string(i), "v"}), "OK");
    std::vector<std::string> netns;
    for (const auto& c : events(out_path(), "clone")) netns.push_back(fs::path(json_string(c, "netns")).filename().string());
    ASSERT_EQ(netns.size(), static_cast<size_t>(clones));
    for (const auto& n : netns) {
        std::string got;
        for (int i = 0; i < 100 && (got = redis_cli("/run/netns/" + n, port_, {"DBSIZE"})) != "4"; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        EXPECT_EQ(got, "4") << n;
    }
    debug_->kill(sig);  // the whole process group, as a terminal does
    EXPECT_EQ(debug_->wait(std::chrono::seconds(60)), 0) << file_text(out_path());
    debug_.reset();
    const std::string out = file_text(out_path());
    EXPECT_TRUE(events(out_path(), "error").empty()) << out;
    // The per-function report: the three SETs, counted in the clone that probed setCommand.
    const auto reports = events(out_path(), "report");
    ASSERT_EQ(reports.size(), 1u) << out;
    EXPECT_NE(reports[0].find(R"("name":"setCommand","calls":3,)"), std::string::npos) << reports[0];
    // The last event is "stopping" with the mirror's final stats and the signal.
    std::istringstream lines(out);
    std::string line, last;
    while (std::getline(lines, line))
        if (line.starts_with("{\"event\":")) last = line;
    EXPECT_TRUE(last.starts_with(R"({"event":"stopping","stats":{)")) << last;
    EXPECT_NE(last.find(std::string(R"("signal":"SIG)") + sigabbrev_np(sig) + "\""), std::string::npos) << last;
    EXPECT_NE(last.find(R"("client_to_production":)"), std::string::npos) << last;
    // Production as its clients felt it: a PING every 10 ms through the
    // session, and the longest wait around the checkpoint in the clone event.
    EXPECT_GT(json_number(last, "samples"), 0) << last;
    EXPECT_GT(json_number(last, "p99_us"), 0) << last;
    const auto clone_events = events(out_path(), "clone");
    ASSERT_FALSE(clone_events.empty());
    EXPECT_GT(json_number(clone_events[0], "client_seen_us"), 0) << clone_events[0];
    EXPECT_EQ(json_number(clone_events[0], "unavailable_us") >= json_number(clone_events[0], "freeze_us"), true)
        << clone_events[0];
    // Nothing left: clones, namespaces, state, the mirror.
    for (const auto& n : netns) {
        EXPECT_FALSE(netns_exists(n)) << n;
        EXPECT_FALSE(fs::exists("/run/iprobe/clones/" + n)) << n;
    }
    EXPECT_LT(connect_in_netns(prod_ns_->path(), listen_port_), 0);
    EXPECT_EQ(redis_->cli({"DBSIZE"}), "4");
}

INSTANTIATE_TEST_SUITE_P(Signals, LauncherDebugStop,
                         ::testing::Values(std::pair{SIGINT, 2}, std::pair{SIGINT, 1}, std::pair{SIGTERM, 2},
                                           std::pair{SIGHUP, 1}),
                         [](const auto& info) {
                             return std::string(sigabbrev_np(info.param.first)) + "_" +
                                    std::to_string(info.param.second) + "clones";
                         });

TEST_F(LauncherDebug, MissingCriuFailsCleanlyAndProductionServes) {
    ASSERT_NO_FATAL_FAILURE(start_redis());
    std::vector<std::string> argv = {"nsenter", "--net=" + prod_ns_->path(), bin("iprobe"), "debug",
                                     std::to_string(redis_->pid()), "--listen",
                                     "127.0.0.1:" + std::to_string(listen_port_), "--production",
                                     "127.0.0.1:" + std::to_string(port_)};
    auto r = run(argv, {}, std::chrono::seconds(60), {"IPROBE_CRIU=/nonexistent/criu"});
    EXPECT_EQ(r.exit_code, 7) << r.err;
    EXPECT_NE(r.err.find("scripts/setup"), std::string::npos) << r.err;
    EXPECT_FALSE(netns_exists("iprobe-debug-" + std::to_string(redis_->pid())));
    EXPECT_LT(connect_in_netns(prod_ns_->path(), listen_port_), 0);
    EXPECT_EQ(redis_->cli({"GET", "before"}), "debug");
}

TEST_F(LauncherDebug, NotRootIsRefusedAndNothingStarts) {
    ASSERT_NO_FATAL_FAILURE(start_redis());
    const ToolsForAnotherUser tools;
    auto r = run(ToolsForAnotherUser::as_nobody({tools.iprobe(), "debug", std::to_string(redis_->pid()), "--listen",
                                                 "127.0.0.1:" + std::to_string(listen_port_), "--production",
                                                 "127.0.0.1:" + std::to_string(port_)}));
    EXPECT_EQ(r.exit_code, 4) << r.err;
    EXPECT_NE(r.err.find("root"), std::string::npos) << r.err;
    EXPECT_FALSE(netns_exists("iprobe-debug-" + std::to_string(redis_->pid())));
    EXPECT_EQ(redis_->cli({"GET", "before"}), "debug");
}

TEST_F(LauncherDebug, BadArgumentsAreUsageErrors) {
    auto r = run({bin("iprobe"), "debug", "1", "--listen", "127.0.0.1:1"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    auto p = run({bin("iprobe"), "debug", "1", "--listen", "x", "--production", "127.0.0.1:1", "--recloning", "sometimes"});
    EXPECT_EQ(p.exit_code, 2) << p.err;
    auto d = run({bin("iprobe"), "debug", "1", "--listen", "127.0.0.1:1", "--production", "127.0.0.1:2",
                  "--divergence", "off", "--recloning", "on-divergence"});
    EXPECT_EQ(d.exit_code, 2) << d.err;
    EXPECT_EQ(run({bin("iprobe"), "debug", "1", "--listen", "127.0.0.1:1", "--production", "127.0.0.1:2",
                   "--divergence", "sometimes"}).exit_code,
              2);
    // --lossless is about the clones' event stream, which --no-trace turns off
    auto l = run({bin("iprobe"), "debug", "1", "--listen", "127.0.0.1:1", "--production", "127.0.0.1:2", "--no-trace",
                  "--lossless"});
    EXPECT_EQ(l.exit_code, 2) << l.err;
    EXPECT_NE(l.err.find("--lossless is about the event stream"), std::string::npos) << l.err;
}

}  // namespace
