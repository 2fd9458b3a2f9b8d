// `iprobe clone --to` onto a second host.  Two network namespaces joined by
// a veth pair stand in for production's host (A) and the debug host (B),
// each with its own state; `iprobe clone-agent` runs in B, the clone tool
// and the mirror in A, and a real redis-server is the service.  Needs root.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <regex>
#include <fstream>
#include <memory>
#include <thread>

#include "redis_fixture.h"

namespace fs = std::filesystem;
using namespace iprobe::test;

namespace {

std::string iprobe_bin() { return bin("iprobe"); }

bool same_netns(long long pid, const std::string& netns_path) {
    struct stat a {}, b {};
    return ::stat(("/proc/" + std::to_string(pid) + "/ns/net").c_str(), &a) == 0 &&
           ::stat(netns_path.c_str(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

bool gone(long long pid, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
        std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
        std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        const auto paren = stat.rfind(')');
        if (stat.empty() || (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z'))
            return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
}

class LauncherRemote : public ::testing::Test {
protected:
    void SetUp() override {
        IPROBE_SKIP_UNLESS_CLONING_WORKS();
        const std::string id = std::to_string(::getpid());
        host_a_ = std::make_unique<Netns>("ipt-ha-" + id);
        host_b_ = std::make_unique<Netns>("ipt-hb-" + id);
        const std::string subnet = "10.231." + std::to_string(::getpid() % 250) + ".";
        address_a_ = subnet + "1";
        address_b_ = subnet + "2";
        const std::string va = "iva" + id, vb = "ivb" + id;
        for (const std::vector<std::string>& step : std::vector<std::vector<std::string>>{
                 {"ip", "link", "add", va, "type", "veth", "peer", "name", vb},
                 {"ip", "link", "set", va, "netns", host_a_->name()},
                 {"ip", "link", "set", vb, "netns", host_b_->name()},
                 {"ip", "-n", host_a_->name(), "addr", "add", address_a_ + "/24", "dev", va},
                 {"ip", "-n", host_b_->name(), "addr", "add", address_b_ + "/24", "dev", vb},
                 {"ip", "-n", host_a_->name(), "link", "set", va, "up"},
                 {"ip", "-n", host_b_->name(), "link", "set", vb, "up"}}) {
            auto r = run(step);
            ASSERT_EQ(r.exit_code, 0) << step[0] << " " << step[1] << " " << step[2] << ": " << r.err;
        }
        port_ = free_port();
        // Reachable from the other host: not only loopback.
        redis_ = std::make_unique<Redis>(host_a_->path(), port_, service_dir_.path(), "/usr/bin/redis-server",
                                         std::vector<std::string>{"--protected-mode", "no"});
        ASSERT_TRUE(redis_->ready()) << "redis-server did not start";
        ASSERT_EQ(redis_->cli({"DEBUG", "POPULATE", "5000", "key", "100"}), "OK");
        ASSERT_EQ(redis_->cli({"SET", "marker", "before-clone"}), "OK");

        agent_address_ = address_b_ + ":" + std::to_string(free_port());
        agent_ = std::make_unique<Child>(std::vector<std::string>{"nsenter", "--net=" + host_b_->path(), iprobe_bin(),
                                                                  "clone-agent", "--listen", agent_address_,
                                                                  "--state-dir", agent_dir_.path()},
                                         logs_ / "agent.log", std::vector<std::string>{},
                                         Session::own);
        // Listening once `clone --destroy` of an unknown name is refused by the agent (exit 5), not unreachable (7).
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (in_a({iprobe_bin(), "clone", "--destroy", "none", "--to", agent_address_}).exit_code != 5) {
            ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the clone agent never listened";
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }

    void TearDown() override {
        if (agent_) {
            agent_->kill(SIGTERM);
            agent_->wait(std::chrono::seconds(20));
        }
        // The note a clone --to keeps here, once its agent is gone.
        run({iprobe_bin(), "clone", "--destroy", name_});
        redis_.reset();
        host_a_.reset();
        host_b_.reset();
    }

    // A command run on host A.
    CommandResult in_a(std::vector<std::string> argv, std::chrono::seconds timeout = std::chrono::seconds(120)) {
        argv.insert(argv.begin(), {"nsenter", "--net=" + host_a_->path()});
        return run(argv, {}, timeout);
    }

    CommandResult clone_to_b(const std::vector<std::string>& extra = {}) {
        std::vector<std::string> argv = {iprobe_bin(), "clone", std::to_string(redis_->pid()), "--to", agent_address_,
                                         "--netns", name_, "--json"};
        argv.insert(argv.end(), extra.begin(), extra.end());
        return in_a(argv);
    }

    std::string clone_cli(const std::vector<std::string>& args) { return redis_cli(host_b_->path(), port_, args); }

    TempDir service_dir_, agent_dir_, logs_;
    std::unique_ptr<Netns> host_a_, host_b_;
    std::string address_a_, address_b_, agent_address_;
    std::string name_ = "ipt-remote-" + std::to_string(::getpid());
    int port_ = 0;
    std::unique_ptr<Redis> redis_;
    std::unique_ptr<Child> agent_;
};

TEST_F(LauncherRemote, CloneRunsOnTheSecondHostAndServesMirroredTraffic) {
    auto r = clone_to_b({"--ping"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const long long clone_pid = json_number(r.out, "clone_pid");
    ASSERT_GT(clone_pid, 1) << r.out;
    EXPECT_TRUE(same_netns(clone_pid, host_b_->path())) << "the clone must run in the second host's network";
    EXPECT_EQ(json_number(r.out, "clone_pid_in_ns"), redis_->pid());
    EXPECT_GE(json_number(r.out, "freeze_us"), 0);
    EXPECT_GT(json_number(r.out, "client_seen_us"), 0) << "production's freeze as a client felt it: " << r.out;
    EXPECT_GT(json_number(r.out, "pages_written"), 0);
    EXPECT_TRUE(fs::exists(agent_dir_ / (name_ + "/images"))) << "the agent keeps the clone's state in its own directory";

    // Production's dataset on host B; production on host A unchanged.
    EXPECT_EQ(clone_cli({"DBSIZE"}), "5001");
    EXPECT_EQ(clone_cli({"GET", "marker"}), "before-clone");
    EXPECT_EQ(clone_cli({"GET", "key:4321"}), redis_->cli({"GET", "key:4321"}));
    EXPECT_EQ(redis_->cli({"DBSIZE"}), "5001");

    // The mirror on host A feeds the clone on host B across the link.
    const int mirror_port = free_port();
    Child mirror({"nsenter", "--net=" + host_a_->path(), iprobe_bin(), "mirror", "--listen",
                  "127.0.0.1:" + std::to_string(mirror_port), "--production", "127.0.0.1:" + std::to_string(port_),
                  "--debug", address_b_ + ":" + std::to_string(port_)});
    ASSERT_TRUE(redis_answers(host_a_->path(), mirror_port)) << "the mirror did not start";
    for (int i = 0; i < 100; i++)
        ASSERT_EQ(redis_cli(host_a_->path(), mirror_port, {"SET", "mirrored:" + std::to_string(i), "v"}), "OK");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (clone_cli({"DBSIZE"}) != "5101" && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(clone_cli({"DBSIZE"}), "5101") << "every mirrored write reached the clone";
    EXPECT_EQ(clone_cli({"GET", "mirrored:99"}), "v");
    EXPECT_EQ(redis_->cli({"DBSIZE"}), "5101");
    mirror.kill(SIGTERM);

    // The clone's own writes stay on host B.
    EXPECT_EQ(clone_cli({"SET", "only-in-clone", "1"}), "OK");
    EXPECT_EQ(redis_->cli({"EXISTS", "only-in-clone"}), "0");

    auto d = in_a({iprobe_bin(), "clone", "--destroy", name_, "--to", agent_address_});
    EXPECT_EQ(d.exit_code, 0) << d.err;
    EXPECT_TRUE(gone(clone_pid)) << "the clone outlived --destroy";
    EXPECT_FALSE(fs::exists(agent_dir_ / name_)) << "the agent kept the destroyed clone's state";
    EXPECT_EQ(redis_->cli({"GET", "marker"}), "before-clone");
}

// One inventory: the clone made here with --to is listed here (kind
// "remote"), the one the agent holds is listed on its host ("agent"; both
// hosts are this machine in the test), with consistent timings, and
// --destroy without --to finds the agent from the list.
TEST_F(LauncherRemote, ListShowsTheRemoteCloneAndDestroyNeedsOnlyItsName) {
    auto r = clone_to_b();
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const long long clone_pid = json_number(r.out, "clone_pid");
    auto list = in_a({iprobe_bin(), "clone", "--list", "--json"});
    ASSERT_EQ(list.exit_code, 0) << list.err;
    const std::regex remote(R"re(\{"name":")re" + name_ + R"re(","kind":"remote"[^}]*"checkpoint_us":([0-9]+),"restore_us":([0-9]+),"total_us":([0-9]+),"being_made":false\})re");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(list.out, m, remote)) << list.out;
    EXPECT_GE(std::stoll(m[3]), std::stoll(m[1]) + std::stoll(m[2])) << "total below checkpoint + restore: " << m[0];
    EXPECT_EQ(std::stoll(m[3]), json_number(r.out, "total_us")) << "not what the clone command printed: " << m[0];
    EXPECT_NE(list.out.find(R"({"name":")" + name_ + R"(","kind":"agent")"), std::string::npos) << list.out;
    auto d = in_a({iprobe_bin(), "clone", "--destroy", name_, "--json"});
    EXPECT_EQ(d.exit_code, 0) << d.err;
    EXPECT_NE(d.out.find(R"("kind":"remote")"), std::string::npos) << d.out;
    EXPECT_TRUE(gone(clone_pid)) << "the clone outlived --destroy";
    EXPECT_FALSE(fs::exists(agent_dir_ / name_));
    EXPECT_EQ(in_a({iprobe_bin(), "clone", "--list", "--json"}).out.find("\"" + name_ + "\""), std::string::npos);
    EXPECT_EQ(in_a({iprobe_bin(), "clone", "--destroy", name_}).exit_code, 5);
}

TEST_F(LauncherRemote, StoppingTheAgentTakesItsClonesAlong) {
    auto r = clone_to_b();
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const long long clone_pid = json_number(r.out, "clone_pid");
    ASSERT_GT(clone_pid, 1) << r.out;
    agent_->kill(SIGTERM);
    EXPECT_EQ(agent_->wait(std::chrono::seconds(20)), 0);
    agent_.reset();
    EXPECT_TRUE(gone(clone_pid)) << "a clone outlived its agent";
    EXPECT_FALSE(fs::exists(agent_dir_ / name_));
    EXPECT_EQ(redis_->cli({"DBSIZE"}), "5001");
}

TEST_F(LauncherRemote, UnreachableAgentFailsBeforeProductionIsTouched) {
    auto r = in_a({iprobe_bin(), "clone", std::to_string(redis_->pid()), "--to", address_b_ + ":1"});
    EXPECT_EQ(r.exit_code, 7) << r.err;
    EXPECT_NE(r.err.find("iprobe clone-agent --listen"), std::string::npos) << r.err;
    EXPECT_EQ(redis_->cli({"GET", "marker"}), "before-clone");
    // A name the agent does not hold is refused by the agent, and says so.
    auto d = in_a({iprobe_bin(), "clone", "--destroy", "no-such-clone", "--to", agent_address_});
    EXPECT_EQ(d.exit_code, 5) << d.err;
    EXPECT_NE(d.err.find("no clone named 'no-such-clone'"), std::string::npos) << d.err;
}

}  // namespace

namespace {

// The state letter of /proc/PID/stat (T: stopped), 0 when gone.
char state_of(long long pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto paren = stat.rfind(')');
    return paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : 0;
}

// Until `left()` is false or 60 s passed; its last answer.
bool still_after_60s(const std::function<bool()>& left) {
    for (int i = 0; i < 6000 && left(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return left();
}

// `iprobe clone --to` killed outright (SIGKILL) at STEP, where the test-only
// IPROBE_TEST_PAUSE=STEP (launcher/src/process.h) stopped it: once the
// agent's page server listens, while CRIU dumps production to it, before
// the images are sent, once the agent restored the clone (nothing recorded
// yet), and once the clone is recorded here but not yet kept by the agent.
// Each time nothing is left on either host: no scratch images in /dev/shm,
// no record in /run/iprobe/remote-clones, nothing in the agent's state
// directory, no clone process; production runs (never left stopped) and
// answers with its own data; the name is free again.
class LauncherRemoteKilledAt : public LauncherRemote, public ::testing::WithParamInterface<std::string> {
protected:
    void signal_at_and_expect_nothing_left(const std::string& step, int signal);
};

TEST_P(LauncherRemoteKilledAt, LeavesNothingOnEitherHostAndProductionRunning) {
    signal_at_and_expect_nothing_left(GetParam(), SIGKILL);
}

// Ctrl-C at a terminal once the clone runs on B, before the command kept it.
TEST_F(LauncherRemoteKilledAt, CtrlCOnceRestoredLeavesNothingOnEitherHost) {
    signal_at_and_expect_nothing_left("restored", SIGINT);
}

void LauncherRemoteKilledAt::signal_at_and_expect_nothing_left(const std::string& step, int signal) {
    const fs::path out = logs_ / "clone.out";
    Child cli({"nsenter", "--net=" + host_a_->path(), iprobe_bin(), "clone", std::to_string(redis_->pid()), "--to",
               agent_address_, "--netns", name_},
              out, {"IPROBE_TEST_PAUSE=" + step}, Session::own);
    for (int i = 0; i < 120000 && cli.running() && state_of(cli.pid()) != 'T'; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::ifstream said(out);
    const std::string text((std::istreambuf_iterator<char>(said)), std::istreambuf_iterator<char>());
    ASSERT_NE(text.find("iprobe: test pause at " + step + " "), std::string::npos) << text;
    const std::string scratch = "/dev/shm/iprobe-remote-" + name_, record = "/run/iprobe/remote-clones/" + name_;
    const fs::path held = agent_dir_ / name_;
    EXPECT_TRUE(fs::exists(held)) << "the agent holds nothing of the clone at " << step;
    long long clone_pid = -1;
    if (step == "restored" || step == "record") {
        std::ifstream in(held / "clone.json");
        const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        clone_pid = json_number(doc, "clone_pid");
        ASSERT_GT(clone_pid, 1) << doc;
        EXPECT_EQ(clone_cli({"GET", "marker"}), "before-clone");
    }
    if (step == "images" || step == "restored" || step == "record") {
        EXPECT_TRUE(fs::exists(scratch));
    }
    EXPECT_EQ(fs::exists(record), step == "record");

    cli.kill(signal);
    cli.kill(SIGCONT);  // a stopped process takes SIGINT once it runs again
    cli.wait();
    EXPECT_FALSE(still_after_60s([&] { return fs::exists(scratch); })) << scratch << " left";
    EXPECT_FALSE(still_after_60s([&] { return fs::exists(record); })) << record << " left";
    EXPECT_FALSE(still_after_60s([&] { return fs::exists("/run/iprobe/claims/" + name_); })) << "the name's claim left";
    EXPECT_FALSE(still_after_60s([&] { return fs::exists(held); })) << held << " left on the agent";
    if (clone_pid > 0) {
        EXPECT_TRUE(gone(clone_pid, std::chrono::seconds(60))) << "the clone outlived its session";
    }
    const char production = state_of(redis_->pid());
    EXPECT_TRUE(production == 'S' || production == 'R') << "production is in state " << production;
    EXPECT_EQ(redis_->cli({"PING"}), "PONG");
    EXPECT_EQ(redis_->cli({"GET", "marker"}), "before-clone");
    EXPECT_EQ(redis_->cli({"DBSIZE"}), "5001");
    EXPECT_EQ(in_a({iprobe_bin(), "clone", "--destroy", name_, "--to", agent_address_}).exit_code, 5);
    const auto list = in_a({iprobe_bin(), "clone", "--list", "--json"});
    EXPECT_EQ(list.out.find("\"" + name_ + "\""), std::string::npos) << list.out;
    // The name is free again on both hosts.
    const auto again = clone_to_b();
    EXPECT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(clone_cli({"GET", "marker"}), "before-clone");
    EXPECT_EQ(in_a({iprobe_bin(), "clone", "--destroy", name_}).exit_code, 0);
}

// A second `iprobe clone --to … --netns X` while the first is held with
// production's memory on the agent and its images in /dev/shm: refused at
// once (exit 6), before it speaks to any agent, and `--destroy X` too; the
// first then ends with its clone running on B and recorded here.  (Before
// the name was claimed, the second's scratch images and record were the
// first's, by name.)
TEST_F(LauncherRemoteKilledAt, SecondCloneOfANameBeingMadeIsRefusedAndTheFirstEndsWhole) {
    const fs::path out = logs_ / "clone.out";
    Child cli({"nsenter", "--net=" + host_a_->path(), iprobe_bin(), "clone", std::to_string(redis_->pid()), "--to",
               agent_address_, "--netns", name_, "--json"},
              out, {"IPROBE_TEST_PAUSE=images"}, Session::own);
    for (int i = 0; i < 120000 && cli.running() && state_of(cli.pid()) != 'T'; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(state_of(cli.pid()), 'T') << "never paused at images";
    const std::string scratch = "/dev/shm/iprobe-remote-" + name_, record = "/run/iprobe/remote-clones/" + name_;
    ASSERT_TRUE(fs::exists(scratch));
    const auto list = in_a({iprobe_bin(), "clone", "--list", "--json"});
    EXPECT_TRUE(std::regex_search(list.out, std::regex(R"re(\{"name":")re" + name_ +
                                                       R"re(","kind":"remote"[^}]*"running":false[^}]*"being_made":true)re")))
        << list.out;

    const auto second = clone_to_b();
    EXPECT_EQ(second.exit_code, 6) << second.err;
    EXPECT_NE(second.err.find("clone name '" + name_ + "' is taken: a remote clone of that name is being made by "
                              "iprobe PID " + std::to_string(cli.pid())),
              std::string::npos)
        << second.err;
    const auto destroyed = in_a({iprobe_bin(), "clone", "--destroy", name_});
    EXPECT_EQ(destroyed.exit_code, 6) << destroyed.err;
    EXPECT_TRUE(fs::exists(scratch)) << "the refused commands removed the first's images";
    EXPECT_FALSE(fs::exists(record));

    cli.kill(SIGCONT);
    ASSERT_EQ(cli.wait(std::chrono::seconds(120)), 0) << file_text(out);
    const long long clone_pid = json_number(file_text(out), "clone_pid");
    ASSERT_GT(clone_pid, 1) << file_text(out);
    EXPECT_EQ(clone_cli({"GET", "marker"}), "before-clone");
    EXPECT_EQ(clone_cli({"DBSIZE"}), "5001");
    EXPECT_EQ(redis_->cli({"DBSIZE"}), "5001");
    EXPECT_TRUE(fs::exists(record));
    EXPECT_FALSE(fs::exists(scratch));
    EXPECT_FALSE(fs::exists("/run/iprobe/claims/" + name_));
    EXPECT_EQ(in_a({iprobe_bin(), "clone", "--destroy", name_}).exit_code, 0);
    EXPECT_TRUE(gone(clone_pid)) << "the clone outlived --destroy";
    EXPECT_FALSE(fs::exists(record));
    EXPECT_FALSE(fs::exists(agent_dir_ / name_));
}

INSTANTIATE_TEST_SUITE_P(Steps, LauncherRemoteKilledAt,
                         ::testing::Values("page-server", "dump", "images", "restored", "record"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                             std::string name = info.param;
                             std::replace(name.begin(), name.end(), '-', '_');
                             return name;
                         });

}  // namespace
