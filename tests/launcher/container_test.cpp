// `iprobe clone --container`: a live clone of a podman container running a
// real redis-server, through podman's own checkpoint/restore.  The image is
// built here from the host's files (redis-server and the libraries it links),
// imported with `podman import`: no registry.  Needs root and podman.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "testutil.h"

namespace fs = std::filesystem;
using namespace iprobe::test;

namespace {

const char* const kImage = "localhost/iprobe-test-redis:host";

std::string trimmed(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

// A rootfs of `server` (as /usr/bin/redis-server) and what `ldd` says it
// loads, as an image.
std::string build_image(const TempDir& dir, const std::string& image = kImage,
                        const std::string& server = "/usr/bin/redis-server") {
    if (run({"podman", "image", "exists", image}).exit_code == 0) return {};
    const std::string root = dir / "rootfs";
    std::string files;
    const auto ldd = run({"ldd", server});
    const std::regex lib(R"((/[^ ]+) \(0x)");
    for (std::sregex_iterator it(ldd.out.begin(), ldd.out.end(), lib), end; it != end; ++it) files += " " + (*it)[1].str();
    const auto r = sh("set -e; rm -rf " + root + "; mkdir -p " + root + "/tmp " + root + "/data " + root +
                      "/usr/bin; cp " + server + " " + root + "/usr/bin/redis-server; for f in" + files +
                      "; do mkdir -p " + root + "$(dirname $f); cp -L $f " + root + "$f; done; tar -C " + root +
                      " -cf " + dir.path() + "/rootfs.tar . && podman import " + dir.path() + "/rootfs.tar " + image);
    return r.exit_code == 0 ? std::string() : "podman import failed: " + r.err;
}

// Limits no higher than this process's hard ones: podman's defaults for a
// rootful container are above them, and raising needs CAP_SYS_RESOURCE,
// which sandboxed machines (CI among them) do not give root.
std::vector<std::string> ulimits_within_ours() {
    rlimit files{}, procs{};
    ::getrlimit(RLIMIT_NOFILE, &files);
    ::getrlimit(RLIMIT_NPROC, &procs);
    const auto cap = [](rlim_t hard, rlim_t want) { return std::to_string(hard == RLIM_INFINITY ? want : std::min(hard, want)); };
    const std::string n = cap(files.rlim_max, 1048576), p = cap(procs.rlim_max, 32768);
    return {"--ulimit", "nofile=" + n + ":" + n, "--ulimit", "nproc=" + p + ":" + p};
}

std::string redis_at(const std::string& address, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"redis-cli", "-h", address};
    argv.insert(argv.end(), args.begin(), args.end());
    return trimmed(run(argv).out);
}

// What podman's checkpoint of `container` leaves in its own storage (CRIU's
// images, production's memory; tars of its /dev/shm and rootfs changes)
// and is there now.
std::vector<std::string> checkpoint_leftovers(const std::string& container) {
    const std::string dir = trimmed(run({"podman", "inspect", "--format", "{{.StaticDir}}", container}).out);
    std::vector<std::string> there;
    for (const char* f : {"checkpoint", "devshm-checkpoint.tar", "rootfs-diff.tar"})
        if (!dir.empty() && fs::exists(dir + "/" + f)) there.push_back(dir + "/" + f);
    return there;
}

class LauncherContainer : public ::testing::Test {
protected:
    void SetUp() override {
        IPROBE_SKIP_UNLESS_CLONING_WORKS();
        ASSERT_EQ(run({"podman", "--version"}).exit_code, 0) << "podman is not installed (scripts/setup installs it)";
        const std::string built = build_image(dir_, image_, server_);
        ASSERT_TRUE(built.empty()) << built;
        prod_ = "ipt-prod-" + std::to_string(getpid());
        clone_ = "ipt-clone-" + std::to_string(getpid());
        // runc: crun 1.8 refuses hosts with cgroups v1 and v2 mixed.
        std::vector<std::string> argv = {"podman", "--runtime", "runc", "run", "-d", "--name", prod_};
        for (const auto& u : ulimits_within_ours()) argv.push_back(u);
        argv.insert(argv.end(), run_options_.begin(), run_options_.end());
        argv.insert(argv.end(), {image_, "/usr/bin/redis-server", "--save", "", "--appendonly", "no",
                                 "--protected-mode", "no", "--dir", "/data"});
        const auto started = run(argv, {}, std::chrono::seconds(120));
        if (started.exit_code != 0) {
            // podman itself works (the image was imported): what fails is
            // the OCI runtime on this host's kernel or cgroup layout.
            GTEST_SKIP() << "podman cannot run a container on this host: " << trimmed(started.err);
        }
        address_ = trimmed(run({"podman", "inspect", "--format",
                                "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", prod_})
                               .out);
        for (int i = 0; i < 100 && redis_at(address_, {"PING"}) != "PONG"; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        ASSERT_EQ(redis_at(address_, {"PING"}), "PONG");
    }
    void TearDown() override {
        if (!clone_.empty()) run({bin("iprobe"), "clone", "--destroy", clone_});
        if (!prod_.empty()) run({"podman", "rm", "--force", "--time", "1", prod_}, {}, std::chrono::seconds(60));
    }

    TempDir dir_;
    std::string image_ = kImage, server_ = "/usr/bin/redis-server";
    std::string prod_, clone_, address_;
    std::vector<std::string> run_options_;  // `podman run` options production is started with
};

// Production started as people run it: a published port, a named volume for
// its data, a network other than podman's default.
class LauncherContainerAsRun : public LauncherContainer {
protected:
    void SetUp() override {
        IPROBE_SKIP_UNLESS_CLONING_WORKS();
        tag_ = std::to_string(getpid());
        published_ = free_port();
        ASSERT_EQ(run({"podman", "network", "create", "ipt-net-" + tag_}).exit_code, 0);
        ASSERT_EQ(run({"podman", "volume", "create", "ipt-vol-" + tag_}).exit_code, 0);
        run_options_ = {"-p", "127.0.0.1:" + std::to_string(published_) + ":6379", "-v", "ipt-vol-" + tag_ + ":/data",
                        "--network", "ipt-net-" + tag_};
        LauncherContainer::SetUp();
    }
    void TearDown() override {
        LauncherContainer::TearDown();
        run({"podman", "volume", "rm", "--force", "ipt-vol-" + tag_});
        run({"podman", "network", "rm", "--force", "ipt-net-" + tag_});
    }
    std::string production(const std::vector<std::string>& args) { return redis_at("127.0.0.1", args, published_); }
    static std::string redis_at(const std::string& host, const std::vector<std::string>& args, int port = 6379) {
        std::vector<std::string> argv = {"redis-cli", "-h", host, "-p", std::to_string(port)};
        argv.insert(argv.end(), args.begin(), args.end());
        return trimmed(run(argv).out);
    }
    std::string tag_;
    int published_ = 0;
};

// Production runs redis built with iprobe-cc: probes go into the clone.
class LauncherContainerProbed : public LauncherContainer {
protected:
    void SetUp() override {
        IPROBE_SKIP_UNLESS_CLONING_WORKS();
        server_ = build_redis("finstrument");
        ASSERT_FALSE(server_.empty()) << "scripts/build-redis --mode finstrument failed";
        // one image per build of that redis; those of earlier builds go
        // (an image in use by a container is kept: podman refuses)
        image_ = "localhost/iprobe-test-redis:finstrument-" +
                 std::to_string(fs::last_write_time(server_).time_since_epoch().count());
        std::istringstream images(
            run({"podman", "images", "--format", "{{.Repository}}:{{.Tag}}", "localhost/iprobe-test-redis"}).out);
        for (std::string image; std::getline(images, image);)
            if (image.starts_with("localhost/iprobe-test-redis:finstrument-") && image != image_)
                run({"podman", "rmi", image});
        LauncherContainer::SetUp();
    }
};

TEST_F(LauncherContainer, CloneIsANewContainerWithProductionsDataAndItsOwnAddress) {
    ASSERT_EQ(redis_at(address_, {"SET", "marker", "before-clone"}), "OK");
    ASSERT_EQ(redis_at(address_, {"RPUSH", "list", "a", "b", "c"}), "3");
    auto r = run({bin("iprobe"), "clone", "--container", prod_, "--netns", clone_, "--json"}, {},
                 std::chrono::seconds(180));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"re("address":"([0-9.]+)")re"))) << r.out;
    const std::string clone_address = m[1];
    EXPECT_NE(clone_address, address_);
    EXPECT_NE(r.out.find("\"freeze_us\":"), std::string::npos) << r.out;
    EXPECT_EQ(trimmed(run({"podman", "inspect", "--format", "{{.State.Running}}", clone_}).out), "true");
    // Alone on an isolated network of its own: production is out of its reach.
    const std::string network = "iprobe-" + clone_;
    EXPECT_NE(r.out.find("\"network\":\"" + network + "\""), std::string::npos) << r.out;
    EXPECT_EQ(trimmed(run({"podman", "inspect", "--format",
                           "{{range $name, $_ := .NetworkSettings.Networks}}{{$name}} {{end}}", clone_})
                          .out),
              network);
    const std::string clone_pid = trimmed(run({"podman", "inspect", "--format", "{{.State.Pid}}", clone_}).out);
    EXPECT_NE(run({"nsenter", "--net=/proc/" + clone_pid + "/ns/net", "redis-cli", "-h", address_, "-t", "2", "PING"}).out,
              "PONG\n")
        << "the clone reached production at " << address_;

    EXPECT_EQ(redis_at(clone_address, {"GET", "marker"}), "before-clone");
    EXPECT_EQ(redis_at(clone_address, {"LRANGE", "list", "0", "-1"}), "a\nb\nc");
    // Production's memory is in the clone, not left in podman's storage.
    EXPECT_EQ(checkpoint_leftovers(prod_), std::vector<std::string>{});
    // Two services from here on: writes stay where they were made.
    EXPECT_EQ(redis_at(clone_address, {"SET", "marker", "clone-wrote"}), "OK");
    EXPECT_EQ(redis_at(address_, {"SET", "only-in-production", "1"}), "OK");
    EXPECT_EQ(redis_at(address_, {"GET", "marker"}), "before-clone");
    EXPECT_EQ(redis_at(clone_address, {"EXISTS", "only-in-production"}), "0");

    auto d = run({bin("iprobe"), "clone", "--destroy", clone_});
    EXPECT_EQ(d.exit_code, 0) << d.err;
    EXPECT_NE(run({"podman", "container", "exists", clone_}).exit_code, 0) << "the clone container is gone";
    EXPECT_NE(run({"podman", "network", "exists", network}).exit_code, 0) << "the clone's network is gone";
    EXPECT_FALSE(fs::exists("/run/iprobe/container-clones/" + clone_));
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/run/iprobe/container-clones", ec))
        EXPECT_FALSE(e.path().filename().string().starts_with(".work-")) << "checkpoint archive left: " << e.path();
    EXPECT_EQ(redis_at(address_, {"GET", "marker"}), "before-clone");
    clone_.clear();
}

// `iprobe debug --container`: clients talk to production through the mirror,
// the clone container gets a copy of every request at its own address.
TEST_F(LauncherContainer, DebugFeedsTheCloneContainerAndRemovesItWhenStopped) {
    ASSERT_EQ(redis_at(address_, {"SET", "before", "debug"}), "OK");
    const int listen = free_port();
    const std::string out = dir_ / "debug.out";
    Child debug({bin("iprobe"), "debug", "--container", prod_, "--name", clone_, "--listen",
                 "127.0.0.1:" + std::to_string(listen), "--production", address_ + ":6379", "--json"},
                out);
    std::string text;
    for (int i = 0; i < 1200 && text.find(R"("event":"mirror")") == std::string::npos && debug.running(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        text = file_text(out);
    }
    ASSERT_NE(text.find(R"("event":"mirror")"), std::string::npos) << text;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(text, m, std::regex(R"re("debug_address":"([0-9.]+):6379")re"))) << text;
    const std::string clone_address = m[1];
    EXPECT_NE(text.find(R"("divergence":"resp")"), std::string::npos) << text;
    EXPECT_EQ(redis_at(clone_address, {"GET", "before"}), "debug");

    const auto via_mirror = [&](const std::vector<std::string>& args) {
        std::vector<std::string> argv = {"redis-cli", "-p", std::to_string(listen)};
        argv.insert(argv.end(), args.begin(), args.end());
        return trimmed(run(argv).out);
    };
    EXPECT_EQ(via_mirror({"SET", "k1", "v1"}), "OK");
    EXPECT_EQ(via_mirror({"INCRBY", "n", "5"}), "5");
    EXPECT_EQ(redis_at(address_, {"GET", "k1"}), "v1");
    std::string got;
    for (int i = 0; i < 100 && got != "5"; ++i) {
        got = redis_at(clone_address, {"GET", "n"});
        if (got != "5") std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(got, "5");
    EXPECT_EQ(redis_at(clone_address, {"GET", "k1"}), "v1");

    debug.kill(SIGTERM);
    EXPECT_EQ(debug.wait(std::chrono::seconds(60)), 0);
    EXPECT_NE(run({"podman", "container", "exists", clone_}).exit_code, 0) << "the clone container is gone";
    EXPECT_NE(run({"podman", "network", "exists", "iprobe-" + clone_}).exit_code, 0) << "the clone's network is gone";
    EXPECT_EQ(redis_at(address_, {"GET", "k1"}), "v1");
    clone_.clear();
}

TEST_F(LauncherContainerProbed, DebugTracesExactlyTheMirroredCommandsInTheCloneContainerOnly) {
    const int listen = free_port();
    const std::string out = dir_ / "debug.out";
    Child debug({bin("iprobe"), "debug", "--container", prod_, "--name", clone_, "--listen",
                 "127.0.0.1:" + std::to_string(listen), "--production", address_ + ":6379", "--probes",
                 server_ + ".probes", "--functions", "processCommand", "--json"},
                out);
    std::string text;
    for (int i = 0; i < 1200 && text.find(R"("event":"mirror")") == std::string::npos && debug.running(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        text = file_text(out);
    }
    ASSERT_NE(text.find(R"("event":"attached")"), std::string::npos) << text;
    for (const char* cmd : {"SET t1 a", "INCR t2", "GET t1"}) {
        std::vector<std::string> argv = {"redis-cli", "-p", std::to_string(listen)};
        std::istringstream words(cmd);
        for (std::string w; words >> w;) argv.push_back(w);
        EXPECT_EQ(run(argv).exit_code, 0);
    }
    const std::string entered = R"("kind":"entry","function":"processCommand")";
    size_t traced = 0;
    for (int i = 0; i < 100 && traced < 3; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        std::istringstream lines(file_text(out));
        traced = 0;
        for (std::string line; std::getline(lines, line);) traced += line.find(entered) != std::string::npos;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::istringstream lines(file_text(out));
    traced = 0;
    for (std::string line; std::getline(lines, line);) traced += line.find(entered) != std::string::npos;
    EXPECT_EQ(traced, 3u) << file_text(out);
    // production: never patched, no runtime loaded
    const std::string prod_pid = trimmed(run({"podman", "inspect", "--format", "{{.State.Pid}}", prod_}).out);
    EXPECT_EQ(file_text("/proc/" + prod_pid + "/maps").find("iprobe-rt"), std::string::npos);
    debug.kill(SIGTERM);
    EXPECT_EQ(debug.wait(std::chrono::seconds(60)), 0);
    EXPECT_NE(run({"podman", "container", "exists", clone_}).exit_code, 0);
    clone_.clear();
}

// The clone cannot have production's host port, volume or address: it
// publishes on a free loopback port, writes into a copy of the volume taken
// at the checkpoint, and runs alone on a network of its own; nothing of that
// fails after production was frozen (podman restored onto production's
// published port with `bind: address already in use`).
TEST_F(LauncherContainerAsRun, PublishedPortNamedVolumeAndOwnNetworkAreRemappedForTheClone) {
    ASSERT_EQ(production({"SET", "marker", "before-clone"}), "OK");
    ASSERT_EQ(production({"SAVE"}), "OK");
    const std::string volume = trimmed(run({"podman", "volume", "inspect", "--format", "{{.Mountpoint}}", "ipt-vol-" + tag_}).out);
    const std::string prod_rdb = file_text(volume + "/dump.rdb");
    ASSERT_FALSE(prod_rdb.empty());
    auto r = run({bin("iprobe"), "clone", "--container", prod_, "--netns", clone_, "--ping", "--json"}, {},
                 std::chrono::seconds(180));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"re("address":"([0-9.]+)")re"))) << r.out;
    const std::string clone_address = m[1];
    ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"re("ports":\{"6379/tcp":"127\.0\.0\.1:([0-9]+)"\})re")))
        << r.out;
    const int clone_port = std::stoi(m[1]);
    EXPECT_TRUE(std::regex_search(r.out, std::regex(R"re("client_seen_us":[1-9][0-9]*)re")))
        << "production's freeze as a client felt it: " << r.out;
    EXPECT_NE(clone_port, published_);
    const std::string clone_volume = "iprobe-" + clone_ + "-ipt-vol-" + tag_;
    EXPECT_NE(r.out.find("\"volumes\":{\"ipt-vol-" + tag_ + "\":\"" + clone_volume + "\"}"), std::string::npos) << r.out;

    EXPECT_EQ(redis_at(clone_address, {"GET", "marker"}), "before-clone");
    EXPECT_EQ(redis_at("127.0.0.1", {"GET", "marker"}, clone_port), "before-clone");
    // Production keeps its port; the clone's SAVE goes to its own volume.
    EXPECT_EQ(redis_at(clone_address, {"SET", "only-in-clone", "1"}), "OK");
    EXPECT_EQ(redis_at(clone_address, {"SAVE"}), "OK");
    EXPECT_EQ(file_text(volume + "/dump.rdb"), prod_rdb) << "the clone wrote into production's volume";
    const std::string copy = trimmed(run({"podman", "volume", "inspect", "--format", "{{.Mountpoint}}", clone_volume}).out);
    EXPECT_NE(file_text(copy + "/dump.rdb"), prod_rdb);
    EXPECT_EQ(production({"EXISTS", "only-in-clone"}), "0");
    EXPECT_EQ(production({"GET", "marker"}), "before-clone");

    // In the one list of clones, as a container clone, with the freeze
    // clients saw (podman's stopping phase included).
    const auto list = run({bin("iprobe"), "clone", "--list", "--json"});
    ASSERT_TRUE(std::regex_search(list.out, m, std::regex(R"re(\{"name":")re" + clone_ +
                                                          R"re(","kind":"container"[^}]*"running":true,"unavailable_us":([0-9]+),"freezing_us":([0-9]+),"freeze_us":([0-9]+))re")))
        << list.out;
    EXPECT_EQ(std::stoll(m[1]), std::stoll(m[2]) + std::stoll(m[3]));
    EXPECT_GT(std::stoll(m[2]), 0) << "podman's freezing phase is part of what clients wait through";
    auto d = run({bin("iprobe"), "clone", "--destroy", clone_, "--json"});
    EXPECT_EQ(d.exit_code, 0) << d.err;
    EXPECT_NE(d.out.find(R"({"kind":"volume","what":")" + clone_volume + "\"}"), std::string::npos) << d.out;
    EXPECT_NE(run({"podman", "container", "exists", clone_}).exit_code, 0);
    EXPECT_NE(run({"podman", "volume", "exists", clone_volume}).exit_code, 0);
    EXPECT_NE(run({"podman", "network", "exists", "iprobe-" + clone_}).exit_code, 0);
    EXPECT_EQ(production({"PING"}), "PONG");
    clone_.clear();
}

// A host directory bound read-write would be shared by the clone (podman's
// checkpoint does not copy it): refused before anything is frozen.
TEST_F(LauncherContainer, WritableBindMountIsRefusedBeforeTheFreeze) {
    run({"podman", "rm", "--force", "--time", "1", prod_}, {}, std::chrono::seconds(60));
    fs::create_directories(dir_ / "data");
    run_options_ = {"-v", dir_ / "data" + ":/data"};
    LauncherContainer::SetUp();
    auto r = run({bin("iprobe"), "clone", "--container", prod_, "--netns", clone_}, {}, std::chrono::seconds(120));
    EXPECT_EQ(r.exit_code, 7) << r.err;
    EXPECT_NE(r.err.find("read-write"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("checkpointing"), std::string::npos) << "production was checkpointed: " << r.err;
    EXPECT_NE(run({"podman", "container", "exists", clone_}).exit_code, 0);
    EXPECT_EQ(redis_at(address_, {"PING"}), "PONG");
    clone_.clear();
}

TEST_F(LauncherContainer, UnknownContainerAndNameInUseAreRefusedUntouched) {
    auto missing = run({bin("iprobe"), "clone", "--container", "ipt-no-such-container"});
    EXPECT_EQ(missing.exit_code, 5) << missing.err;
    auto taken = run({bin("iprobe"), "clone", "--container", prod_, "--netns", prod_});
    EXPECT_EQ(taken.exit_code, 6) << taken.err;
    EXPECT_EQ(run({bin("iprobe"), "clone", "--container", prod_, "1"}).exit_code, 2);
    EXPECT_EQ(redis_at(address_, {"PING"}), "PONG");
    clone_.clear();
}

// ---- killed or interrupted at each step: nothing of the clone outlives it

// The state letter of /proc/PID/stat (T: stopped), 0 when gone or a zombie.
char state_of(long long pid) {
    const std::string stat = file_text("/proc/" + std::to_string(pid) + "/stat");
    const auto paren = stat.rfind(')');
    const char state = paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : 0;
    return state == 'Z' ? 0 : state;
}

std::vector<long long> children_of(long long pid) {
    std::vector<long long> out;
    std::error_code ec;
    for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
        std::istringstream in(file_text(task.path() / "children"));
        for (long long c; in >> c;) out.push_back(c);
    }
    return out;
}

std::string cmdline_of(long long pid) {
    std::string s = file_text("/proc/" + std::to_string(pid) + "/cmdline");
    std::replace(s.begin(), s.end(), '\0', ' ');
    return s;
}

// The launcher's child whose command line has `words`, or -1.
long long child_with(long long launcher, const std::string& words) {
    for (long long c : children_of(launcher))
        if (cmdline_of(c).find(words) != std::string::npos) return c;
    return -1;
}

// The launcher's iprobe-guardian (clone_guardian.h), or -1.
long long guardian_of(long long launcher) {
    for (long long c : children_of(launcher))
        if (file_text("/proc/" + std::to_string(c) + "/comm") == "iprobe-guardian\n") return c;
    return -1;
}

// The clone container's address on its own network, "" when none.
std::string clone_address_of(const std::string& clone) {
    return trimmed(run({"podman", "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                        clone})
                       .out);
}

// `iprobe clone --container` killed outright (SIGKILL) or interrupted
// (SIGINT to its process group, as a terminal's Ctrl-C) at STEP: stopped
// there by the test-only IPROBE_TEST_PAUSE=STEP (launcher/src/process.h):
// `workspace` (the clone's volume copy and the archive's directory made,
// nothing checkpointed), `exported` (the checkpoint archive written),
// `restored` (the clone container runs, still on production's network),
// `record` (the clone recorded, not yet reported); or caught while it runs
// `podman container checkpoint` (`checkpointing`) or `podman container
// restore` (`restoring`), which run on in groups of their own.  Production
// runs as people run it (a published port, a named volume, a network of its
// own).  Each time nothing is left once the launcher's processes ended: no
// container of the clone's name, no network or volume of its own, no
// checkpoint archive, no record; `--destroy` finds nothing (exit 5);
// production runs and answers with its own data; and the name can be
// cloned again.
class LauncherContainerKilledAt : public LauncherContainerAsRun,
                                  public ::testing::WithParamInterface<std::string> {
protected:
    void SetUp() override {
        LauncherContainerAsRun::SetUp();
        if (IsSkipped() || HasFatalFailure()) return;
        ASSERT_EQ(production({"SET", "marker", "before-clone"}), "OK");
        std::vector<std::string> mset = {"MSET"};
        for (int i = 0; i < 500; ++i) mset.insert(mset.end(), {"key:" + std::to_string(i), std::to_string(i * i)});
        ASSERT_EQ(production(mset), "OK");
        for (const auto& e : fs::directory_iterator("/run/iprobe/container-clones", ec_)) before_.insert(e.path());
    }
    std::string clone_volume() const { return "iprobe-" + clone_ + "-ipt-vol-" + tag_; }

    // Everything of the clone on the host, one line each.
    std::vector<std::string> remains() {
        std::vector<std::string> left;
        if (run({"podman", "container", "exists", clone_}).exit_code == 0) left.push_back("container " + clone_);
        if (run({"podman", "network", "exists", "iprobe-" + clone_}).exit_code == 0)
            left.push_back("network iprobe-" + clone_);
        if (run({"podman", "volume", "exists", clone_volume()}).exit_code == 0) left.push_back("volume " + clone_volume());
        for (const auto& e : fs::directory_iterator("/run/iprobe/container-clones", ec_))
            if (!before_.count(e.path())) left.push_back("file " + e.path().string());
        for (const auto& f : checkpoint_leftovers(prod_)) left.push_back("production's storage " + f);
        if (fs::exists("/run/iprobe/claims/" + clone_)) left.push_back("claim /run/iprobe/claims/" + clone_);
        return left;
    }

    // Starts the clone; returns once it is at `step`, with its guardian
    // (none before the fix) and the podman it was caught running (if any).
    struct AtStep {
        long long guardian = -1, podman = -1;
    };
    AtStep start_until(const std::string& step) {
        Child& cli = cli_;
        const fs::path& out = out_;
        const bool caught = step == "checkpointing" || step == "restoring";
        cli = Child({bin("iprobe"), "clone", "--container", prod_, "--netns", clone_}, out,
                    caught ? std::vector<std::string>{} : std::vector<std::string>{"IPROBE_TEST_PAUSE=" + step},
                    Session::own);
        AtStep at;
        const std::string podman = step == "checkpointing" ? "container checkpoint" : "container restore";
        for (int i = 0; i < 120000 && cli.running(); ++i) {
            if (caught ? (at.podman = child_with(cli.pid(), podman)) > 0 : state_of(cli.pid()) == 'T') break;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        if (caught) {
            EXPECT_GT(at.podman, 0) << "`podman " << podman << "` was not seen running: " << file_text(out);
        } else {
            EXPECT_NE(file_text(out).find("iprobe: test pause at " + step + " (PID " + std::to_string(cli.pid()) + ")"),
                      std::string::npos)
                << file_text(out);
        }
        at.guardian = guardian_of(cli.pid());
        return at;
    }

    // Once every process the launcher left has ended (podman finishing its
    // checkpoint or restore, the guardian after its removals).
    static void wait_ended(const AtStep& at) {
        for (long long p : {at.podman, at.guardian})
            for (int i = 0; i < 12000 && p > 0 && state_of(p); ++i)
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
        for (long long p : {at.podman, at.guardian}) {
            if (p > 0) {
                EXPECT_EQ(state_of(p), 0) << "left running: " << p << " [" << cmdline_of(p) << "]";
            }
        }
    }

    // The clone a command made, whole once it ended (its container, record,
    // network and volume copy, answering with production's data, which
    // production keeps); then `--destroy` leaves nothing.
    void expect_clone_whole_then_destroy_it() {
        std::vector<std::string> kept = remains();
        std::sort(kept.begin(), kept.end());
        EXPECT_EQ(kept, (std::vector<std::string>{"container " + clone_, "file /run/iprobe/container-clones/" + clone_,
                                                  "network iprobe-" + clone_, "volume " + clone_volume()}));
        const std::string address = clone_address_of(clone_);
        EXPECT_EQ(redis_at(address, {"GET", "marker"}), "before-clone");
        EXPECT_EQ(redis_at(address, {"DBSIZE"}), "501");
        EXPECT_EQ(production({"GET", "marker"}), "before-clone");
        EXPECT_EQ(production({"DBSIZE"}), "501");
        const auto d = run({bin("iprobe"), "clone", "--destroy", clone_});
        EXPECT_EQ(d.exit_code, 0) << d.err;
        EXPECT_EQ(remains(), std::vector<std::string>{});
    }

    void expect_nothing_left_and_name_free() {
        EXPECT_EQ(remains(), std::vector<std::string>{});
        const auto destroyed = run({bin("iprobe"), "clone", "--destroy", clone_});
        EXPECT_EQ(destroyed.exit_code, 5) << destroyed.out << destroyed.err;
        EXPECT_EQ(trimmed(run({"podman", "inspect", "--format", "{{.State.Running}}", prod_}).out), "true");
        EXPECT_EQ(production({"GET", "marker"}), "before-clone");
        EXPECT_EQ(production({"DBSIZE"}), "501");
        auto again = run({bin("iprobe"), "clone", "--container", prod_, "--netns", clone_, "--json"}, {},
                         std::chrono::seconds(180));
        ASSERT_EQ(again.exit_code, 0) << again.err;
        std::smatch m;
        ASSERT_TRUE(std::regex_search(again.out, m, std::regex(R"re("address":"([0-9.]+)")re"))) << again.out;
        EXPECT_EQ(redis_at(m[1].str(), {"GET", "marker"}), "before-clone");
        EXPECT_EQ(redis_at(m[1].str(), {"DBSIZE"}), "501");
        EXPECT_EQ(checkpoint_leftovers(prod_), std::vector<std::string>{});
    }

    std::set<fs::path> before_;
    std::error_code ec_;
    Child cli_;  // the launcher
    fs::path out_ = dir_ / "clone.out";
};

TEST_P(LauncherContainerKilledAt, LeavesNothingAndProductionRunning) {
    const std::string step = GetParam();
    const AtStep at = start_until(step);
    ASSERT_FALSE(HasFailure());
    EXPECT_GT(at.guardian, 0) << "no iprobe-guardian among the launcher's children";
    // What the launcher has made by then.
    const std::vector<std::string> made = remains();
    const bool restored = step == "restored" || step == "record";
    // Mid-restore, podman may have made the container already or not yet.
    if (step != "restoring") {
        EXPECT_EQ(std::count(made.begin(), made.end(), "container " + clone_), restored ? 1 : 0)
            << ::testing::PrintToString(made);
    }
    EXPECT_EQ(std::count(made.begin(), made.end(), "volume " + clone_volume()), 1) << ::testing::PrintToString(made);
    EXPECT_EQ(std::count(made.begin(), made.end(), "file /run/iprobe/container-clones/" + clone_), step == "record")
        << ::testing::PrintToString(made);
    // Once exported, production's memory is no longer in podman's storage.
    if (step != "workspace" && step != "checkpointing") {
        EXPECT_EQ(checkpoint_leftovers(prod_), std::vector<std::string>{});
    }
    cli_.kill(SIGKILL);
    cli_.wait();
    wait_ended(at);
    expect_nothing_left_and_name_free();
}

INSTANTIATE_TEST_SUITE_P(Steps, LauncherContainerKilledAt,
                         ::testing::Values("workspace", "checkpointing", "exported", "restoring", "restored", "record"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// `iprobe debug --container` killed outright (SIGKILL) while its session
// runs: a container clone has no keeper to end it, so the session's
// guardian, armed before the clone was made and held until the session
// removes it, removes the clone container, its network, volume copy and
// record.
TEST_F(LauncherContainerKilledAt, DebugSessionKilledOutrightLeavesNothing) {
    const fs::path out = dir_ / "debug.out";
    Child debug({bin("iprobe"), "debug", "--container", prod_, "--name", clone_, "--listen",
                 "127.0.0.1:" + std::to_string(free_port()), "--production", address_ + ":6379", "--json"},
                out, {}, Session::own);
    std::string text;
    for (int i = 0; i < 1200 && text.find(R"("event":"mirror")") == std::string::npos && debug.running(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        text = file_text(out);
    }
    ASSERT_NE(text.find(R"("event":"mirror")"), std::string::npos) << text;
    const std::vector<std::string> made = remains();
    EXPECT_EQ(std::count(made.begin(), made.end(), "container " + clone_), 1) << ::testing::PrintToString(made);
    EXPECT_EQ(std::count(made.begin(), made.end(), "network iprobe-" + clone_), 1) << ::testing::PrintToString(made);
    EXPECT_EQ(std::count(made.begin(), made.end(), "file /run/iprobe/container-clones/" + clone_), 1)
        << ::testing::PrintToString(made);
    AtStep at;
    at.guardian = guardian_of(debug.pid());
    EXPECT_GT(at.guardian, 0) << "no iprobe-guardian among the session's children";
    debug.kill(SIGKILL);
    wait_ended(at);
    expect_nothing_left_and_name_free();
}

// ---- one name, one maker (docs/debug-container.md, "One name, one maker")

// `iprobe clone --list --json`'s entry named `name`, "" when none.
std::string listed_as(const std::string& name) {
    std::smatch m;
    const std::string out = run({bin("iprobe"), "clone", "--list", "--json"}).out;
    return std::regex_search(out, m, std::regex(R"re(\{"name":")re" + name + R"re("[^}]*\})re")) ? m.str() : "";
}

// A second `iprobe clone --container … --netns X` arriving while the first
// is held with its clone container restored (on production's network,
// not yet recorded): it stops at once with exit 6 and what holds the name,
// before any podman object of its own; `--destroy X` is refused too; then
// the first ends with its clone whole: its container, network, volume copy
// and record, answering with production's data.  Before the name was
// claimed, the second checkpointed production, failed to restore onto the
// taken name, and its undo removed the first's clone container by name.
TEST_F(LauncherContainerKilledAt, SecondCloneOfANameBeingMadeIsRefusedAndTheFirstEndsWhole) {
    const AtStep at = start_until("restored");
    ASSERT_FALSE(HasFailure());
    const std::vector<std::string> made = remains();
    EXPECT_EQ(std::count(made.begin(), made.end(), "container " + clone_), 1) << ::testing::PrintToString(made);
    EXPECT_EQ(std::count(made.begin(), made.end(), "claim /run/iprobe/claims/" + clone_), 1)
        << ::testing::PrintToString(made);
    const std::string listed = listed_as(clone_);
    EXPECT_NE(listed.find(R"("kind":"container")"), std::string::npos) << listed;
    EXPECT_NE(listed.find(R"("being_made":true)"), std::string::npos) << listed;
    EXPECT_NE(listed.find(R"("running":false)"), std::string::npos) << listed;

    const auto second = run({bin("iprobe"), "clone", "--container", prod_, "--netns", clone_}, {},
                            std::chrono::seconds(120));
    EXPECT_EQ(second.exit_code, 6) << second.err;
    EXPECT_NE(second.err.find("clone name '" + clone_ + "' is taken: a container clone of that name is being made "
                              "by iprobe PID " + std::to_string(cli_.pid())),
              std::string::npos)
        << second.err;
    EXPECT_EQ(second.err.find("checkpointing"), std::string::npos) << "the second checkpointed: " << second.err;
    const auto destroyed = run({bin("iprobe"), "clone", "--destroy", clone_});
    EXPECT_EQ(destroyed.exit_code, 6) << destroyed.err;
    EXPECT_NE(destroyed.err.find("is being made by iprobe PID " + std::to_string(cli_.pid()) + "; wait for it"),
              std::string::npos)
        << destroyed.err;
    EXPECT_EQ(remains(), made) << "the refused commands changed what the first made";

    cli_.kill(SIGCONT);
    ASSERT_EQ(cli_.wait(std::chrono::seconds(120)), 0) << file_text(out_);
    wait_ended(at);
    EXPECT_NE(listed_as(clone_).find(R"("being_made":false)"), std::string::npos) << listed_as(clone_);
    EXPECT_NE(listed_as(clone_).find(R"("running":true)"), std::string::npos) << listed_as(clone_);
    expect_clone_whole_then_destroy_it();
    EXPECT_EQ(listed_as(clone_), "");
    clone_.clear();
}

// Two `iprobe clone --container … --netns X` started at once, twice: one
// makes the clone, the other exits 6 (the name being made, or made), and
// the winner's clone is whole and answers; `--destroy` then leaves nothing.
TEST_F(LauncherContainerKilledAt, TwoClonesOfOneNameStartedAtOnceMakeOneClone) {
    for (int round = 0; round < 2; ++round) {
        SCOPED_TRACE("round " + std::to_string(round));
        const fs::path out_a = dir_ / "a.out", out_b = dir_ / "b.out";
        const std::vector<std::string> argv = {bin("iprobe"), "clone", "--container", prod_, "--netns", clone_};
        Child a(argv, out_a), b(argv, out_b);
        const int exit_a = a.wait(std::chrono::seconds(180)), exit_b = b.wait(std::chrono::seconds(180));
        ASSERT_EQ(std::min(exit_a, exit_b), 0) << file_text(out_a) << file_text(out_b);
        ASSERT_EQ(std::max(exit_a, exit_b), 6) << file_text(out_a) << file_text(out_b);
        const std::string loser = file_text(exit_a == 0 ? out_b : out_a);
        const bool while_made = loser.find("is being made by iprobe PID " + std::to_string((exit_a == 0 ? a : b).pid())) !=
                                std::string::npos;
        EXPECT_TRUE(while_made || loser.find("a container named '" + clone_ + "' exists") != std::string::npos) << loser;
        EXPECT_EQ(loser.find("checkpointing"), std::string::npos) << "the loser checkpointed: " << loser;
        expect_clone_whole_then_destroy_it();
        if (HasFailure()) break;
    }
    clone_.clear();
}

// Ctrl-C (SIGINT to the launcher's process group) while podman checkpoints
// production and while it restores the clone: podman, in a group of its
// own, is not cut off; the launcher then removes what it made and exits 130.
class LauncherContainerCtrlC : public LauncherContainerKilledAt {};

TEST_P(LauncherContainerCtrlC, UndoesTheCloneAndExits130) {
    const std::string step = GetParam();
    const AtStep at = start_until(step);
    ASSERT_FALSE(HasFailure());
    cli_.kill(SIGINT);
    EXPECT_EQ(cli_.wait(std::chrono::seconds(120)), 130) << file_text(out_);
    EXPECT_NE(file_text(out_).find("interrupted"), std::string::npos) << file_text(out_);
    wait_ended(at);
    expect_nothing_left_and_name_free();
}

INSTANTIATE_TEST_SUITE_P(Steps, LauncherContainerCtrlC, ::testing::Values("checkpointing", "restoring"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
