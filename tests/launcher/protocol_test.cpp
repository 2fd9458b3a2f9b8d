// The launcher's typed crossings: the clone agent's JSON lines
// (agent_protocol.h), CRIU's RPC requests and answers (criu_rpc.h, CRIU's own
// rpc.proto) and its statistics image.  Each message round-trips byte for
// byte, hostile strings included; a real CRIU answers a dump it cannot do
// with a typed failure, and one it can with its statistics.  Podman's JSON,
// which iprobe only reads, is read into typed fields from podman's own
// documents, and refused as bad input when it is not that.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "iprobe/launcher/agent_protocol.h"
#include "iprobe/launcher/clone.h"
#include "iprobe/launcher/criu_rpc.h"
#include "iprobe/launcher/podman_json.h"
#include "iprobe/support/error.h"
#include "rpc.pb.h"
#include "testutil.h"

namespace fs = std::filesystem;
using namespace iprobe;
using namespace iprobe::launcher;
namespace protocol = iprobe::launcher::agent_protocol;

namespace {

// Every kind of string that broke or could break a line protocol.
const std::vector<std::string>& hostile_strings() {
    static const std::vector<std::string> strings = {
        "",
        "plain-name_1.0",
        "two\nlines\r\nand a tab\t",
        "\"quoted\" and \\backslashed\\ and {\"json\":1}",
        std::string("nul\0inside", 10),
        std::string("\0", 1),
        "\xff\xfe not UTF-8 \x80",
        "\xc0\xaf overlong slash",
        "\xed\xa0\x80 a surrogate",
        "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 valid UTF-8",
        std::string(70000, 'x'),
    };
    return strings;
}

void expect_round_trip(const protocol::Message& m) {
    const std::string line = protocol::encode(m);
    ASSERT_FALSE(line.empty());
    EXPECT_EQ(line.back(), '\n');
    EXPECT_EQ(line.find('\n'), line.size() - 1) << "one message, one line: " << line.substr(0, 200);
    EXPECT_EQ(line.find('\0'), std::string::npos);
    const protocol::Message back = protocol::decode(line.substr(0, line.size() - 1));
    EXPECT_EQ(back, m) << line.substr(0, 200);
}

TEST(AgentProtocol, EveryMessageRoundTripsWithHostileStrings) {
    for (const auto& s : hostile_strings()) {
        SCOPED_TRACE(testing::PrintToString(s.substr(0, 40)));
        expect_round_trip(protocol::Clone{s, true, 4194304});
        expect_round_trip(protocol::File{s, 18446744073709551615ull});
        expect_round_trip(protocol::Snapshot{7, s, 0});
        expect_round_trip(protocol::Destroy{s});
        expect_round_trip(protocol::Failure{6, s});
    }
    expect_round_trip(protocol::Clone{"c", false, 1});
    expect_round_trip(protocol::PageServerReady{65535});
    expect_round_trip(protocol::Restore{});
    expect_round_trip(protocol::Restored{123, 45, 6789012});
    expect_round_trip(protocol::Abort{});
    expect_round_trip(protocol::Destroyed{});
    expect_round_trip(protocol::Keep{});
    expect_round_trip(protocol::Kept{});
}

TEST(AgentProtocol, ValidUtf8TravelsAsTextAndTheRestAsBase64) {
    // The type first, then the fields in the message's order (JsonWriter).
    EXPECT_EQ(protocol::encode(protocol::Destroy{"caf\xc3\xa9"}), "{\"type\":\"destroy\",\"name\":\"caf\xc3\xa9\"}\n");
    EXPECT_EQ(protocol::encode(protocol::Destroy{"\xff"}), "{\"type\":\"destroy\",\"name\":{\"base64\":\"/w==\"}}\n");
    EXPECT_EQ(protocol::encode(protocol::Restored{42, 41, 1500}),
              "{\"type\":\"restored\",\"clone_pid\":42,\"keeper_pid\":41,\"restore_us\":1500}\n");
}

void expect_bad_input(const std::string& line, const std::string& said) {
    try {
        protocol::decode(line);
        ADD_FAILURE() << "accepted: " << line;
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::bad_input) << line;
        EXPECT_NE(std::string(e.what()).find(said), std::string::npos) << e.what();
    }
}

TEST(AgentProtocol, MalformedLinesAreBadInputSayingWhy) {
    expect_bad_input("CLONE name 0 1", "not JSON");
    expect_bad_input("[1,2]", "no \"type\"");
    expect_bad_input("{\"type\":\"launch\"}", "unknown message type 'launch'");
    expect_bad_input("{\"type\":\"clone\",\"name\":\"a\",\"shell_job\":false}", "lacks a field");
    expect_bad_input("{\"type\":\"file\",\"name\":\"a\",\"size\":-1}", "'size' is not a count");
    expect_bad_input("{\"type\":\"restored\",\"clone_pid\":1e3,\"keeper_pid\":1,\"restore_us\":1}", "'clone_pid'");
    expect_bad_input("{\"type\":\"clone\",\"name\":\"a\",\"shell_job\":1,\"source_pid\":1}", "'shell_job'");
    expect_bad_input("{\"type\":\"destroy\",\"name\":{\"base64\":\"/w=\"}}", "bad base64");
    expect_bad_input("{\"type\":\"destroy\",\"name\":{\"base64\":\"*w==\"}}", "bad base64");
    expect_bad_input("{\"type\":\"page_server\",\"port\":4294967296}", "'port'");
}

// ---- CRIU's RPC

TEST(CriuRpc, RestoreRequestCarriesEveryOptionOfTheCommandLineItReplaces) {
    criu_req req;
    ASSERT_TRUE(req.ParseFromString(restore_request(5, 6, "restore.log", true)));
    EXPECT_EQ(req.type(), RESTORE);
    const criu_opts& o = req.opts();
    EXPECT_EQ(o.images_dir_fd(), 5);
    EXPECT_EQ(o.work_dir_fd(), 6);
    EXPECT_EQ(o.log_file(), "restore.log");
    EXPECT_EQ(o.log_level(), 2);
    EXPECT_TRUE(o.tcp_close());
    EXPECT_TRUE(o.ext_unix_sk());
    EXPECT_TRUE(o.file_locks());
    EXPECT_TRUE(o.shell_job());
    EXPECT_FALSE(o.has_leave_running());
    ASSERT_TRUE(req.ParseFromString(restore_request(5, 6, "restore.log", false)));
    EXPECT_FALSE(req.opts().shell_job());
}

TEST(CriuRpc, RestoreAnswersRoundTripIntoTypedReplies) {
    for (const auto& message : hostile_strings()) {
        criu_resp resp;
        resp.set_type(RESTORE);
        resp.set_success(false);
        resp.set_cr_errno(EADDRINUSE);
        resp.set_cr_errmsg(message);
        resp.mutable_restore()->set_pid(-1);
        const RestoreReply r = parse_restore_reply(resp.SerializeAsString(), 0);
        EXPECT_FALSE(r.reply.success);
        EXPECT_EQ(r.reply.cr_errno, EADDRINUSE);
        EXPECT_EQ(r.reply.cr_errmsg, message);
        EXPECT_FALSE(r.reply.died_status);
        EXPECT_NE(r.reply.describe().find("errno 98: Address already in use"), std::string::npos) << r.reply.describe();
    }
    criu_resp ok;
    ok.set_type(RESTORE);
    ok.set_success(true);
    ok.mutable_restore()->set_pid(4242);
    const RestoreReply r = parse_restore_reply(ok.SerializeAsString(), 0);
    EXPECT_TRUE(r.reply.success);
    EXPECT_EQ(r.restored_pid, 4242);
    // criu ended without a word: how it ended is the reply.
    const RestoreReply died = parse_restore_reply("", 9);  // killed by SIGKILL
    EXPECT_FALSE(died.reply.success);
    ASSERT_TRUE(died.reply.died_status);
    EXPECT_NE(died.reply.describe().find("killed by signal"), std::string::npos) << died.reply.describe();
    // Not CRIU's answer to a restore: refused, not misread.
    criu_resp dump;
    dump.set_type(DUMP);
    dump.set_success(true);
    EXPECT_THROW(parse_restore_reply(dump.SerializeAsString(), 0), Error);
    EXPECT_THROW(parse_restore_reply(std::string("\xff\xff\xff", 3), 0), Error);
}

TEST(CriuRpc, StatsImageThatIsNotCriusIsRefused) {
    test::TempDir dir;
    EXPECT_THROW(read_dump_stats(dir.path()), Error);  // absent
    std::ofstream(dir.path() + "/stats-dump") << "not an image at all";
    try {
        read_dump_stats(dir.path());
        ADD_FAILURE() << "a text file was read as CRIU's statistics";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("not CRIU's statistics image"), std::string::npos) << e.what();
    }
}

// A process of its own session with nothing open but /dev/null: what CRIU
// can always dump.
pid_t start_sleeper() {
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::setsid();
        execlp("sleep", "sleep", "600", static_cast<char*>(nullptr));
        _exit(127);
    }
    return pid;
}

void stop(pid_t pid) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
}

// A dump of `pid` into DIR/images, CRIU's log and statistics in DIR.
DumpRequest dump_into(const test::TempDir& dir, pid_t pid) {
    fs::create_directories(dir.path() + "/images");
    DumpRequest request;
    request.pid = pid;
    request.images_dir = dir.path() + "/images";
    request.log_path = dir.path() + "/dump.log";
    return request;
}

TEST(CriuRpc, VersionComesFromTheVersionRequest) {
    IPROBE_SKIP_UNLESS_CLONING_WORKS();
    const Criu criu = find_criu();
    const auto version = query_criu_version(criu.path);
    ASSERT_TRUE(version);
    EXPECT_TRUE(version->at_least(4, 2)) << version->text();
    EXPECT_EQ(version->text(), criu.version);
    EXPECT_FALSE(query_criu_version("/nonexistent/criu"));
    EXPECT_FALSE(query_criu_version("/bin/true")) << "a program that is not criu answered a VERSION request";
}

TEST(CriuRpc, DumpOfAProcessThatIsNotThereIsATypedFailureWithCriusMessage) {
    IPROBE_SKIP_UNLESS_CLONING_WORKS();
    const Criu criu = find_criu();
    test::TempDir dir;
    // A PID that was there a moment ago and is gone now.
    const pid_t gone = start_sleeper();
    stop(gone);
    const DumpRequest request = dump_into(dir, gone);
    const DumpOutcome outcome = criu_dump(criu.path, request);
    EXPECT_FALSE(outcome.reply.success);
    EXPECT_FALSE(outcome.reply.died_status) << "criu answered nothing: " << outcome.reply.describe();
    EXPECT_FALSE(outcome.reply.cr_errmsg.empty()) << "no message from CRIU";
    EXPECT_NE(outcome.reply.describe().find(outcome.reply.cr_errmsg.substr(0, 20)), std::string::npos);
    EXPECT_TRUE(fs::exists(request.log_path)) << "CRIU's log is kept for the user";
}

TEST(CriuRpc, DumpAnswersSuccessAndItsStatisticsAndTheProcessRunsOn) {
    IPROBE_SKIP_UNLESS_CLONING_WORKS();
    const Criu criu = find_criu();
    test::TempDir dir;
    const pid_t sleeper = start_sleeper();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // exec'd
    DumpRequest request = dump_into(dir, sleeper);
    int post_dump_calls = 0;
    request.post_dump = [&] {
        ++post_dump_calls;
        // CRIU holds the process frozen while it waits for this answer.
        std::ifstream status("/proc/" + std::to_string(sleeper) + "/status");
        std::string line;
        bool traced = false;
        while (std::getline(status, line))
            if (line.rfind("TracerPid:", 0) == 0) traced = line.find_first_not_of("\t 0", 10) != std::string::npos;
        EXPECT_TRUE(traced) << "post-dump came after CRIU let go of the process";
    };
    const DumpOutcome outcome = criu_dump(criu.path, request);
    ASSERT_TRUE(outcome.reply.success) << outcome.reply.describe();
    EXPECT_EQ(post_dump_calls, 1);
    EXPECT_GT(outcome.stats.frozen_us, 0u);
    EXPECT_GT(outcome.stats.pages_scanned, 0u);
    EXPECT_GT(outcome.stats.pages_written, 0u);
    EXPECT_LE(outcome.stats.pages_written, outcome.stats.pages_scanned);
    EXPECT_TRUE(fs::exists(request.images_dir + "/inventory.img"));
    EXPECT_EQ(::kill(sleeper, 0), 0) << "leave_running: the process runs on";
    int status = 0;
    EXPECT_EQ(::waitpid(sleeper, &status, WNOHANG), 0) << "it did not exit";
    stop(sleeper);
}

}  // namespace

// ---- podman's JSON (podman_json.h): read, never written, by iprobe.  The
// documents are podman 4.3's (Debian 12) as it prints them, cut to the
// fields around the ones read.

namespace {

const char* const kInspect = R"([
     {
          "Id": "5d6f3a1c0a8e4b1f9e2d7c6b5a4938271605f4e3d2c1b0a99887766554433221",
          "Created": "2026-11-26T12:00:00.000000000Z",
          "Path": "redis-server",
          "State": {
               "OciVersion": "1.0.2-dev",
               "Status": "running",
               "Running": true,
               "Paused": false,
               "Pid": 43210,
               "ConmonPid": 43200,
               "ExitCode": 0,
               "CheckpointPath": "/var/lib/containers/storage/overlay-containers/5d6f/userdata/checkpoint"
          },
          "StaticDir": "/var/lib/containers/storage/overlay-containers/5d6f/userdata",
          "Mounts": [
               {
                    "Type": "volume",
                    "Name": "redis-data",
                    "Source": "/var/lib/containers/storage/volumes/redis-data/_data",
                    "Destination": "/data",
                    "Driver": "local",
                    "Mode": "",
                    "Options": ["nosuid", "nodev", "rbind"],
                    "RW": true,
                    "Propagation": "rprivate"
               },
               {
                    "Type": "bind",
                    "Source": "/etc/redis",
                    "Destination": "/etc/redis",
                    "RW": false
               }
          ],
          "NetworkSettings": {
               "Ports": {
                    "6379/tcp": [ { "HostIp": "127.0.0.1", "HostPort": "16379" } ],
                    "9121/tcp": null
               },
               "Networks": {
                    "podman": { "IPAddress": "10.88.0.5", "Gateway": "10.88.0.1", "IPPrefixLen": 16 }
               }
          },
          "HostConfig": {
               "PortBindings": { "6379/tcp": [ { "HostIp": "127.0.0.1", "HostPort": "16379" } ] }
          }
     }
]
)";

}  // namespace

TEST(PodmanJson, InspectIsReadIntoTypedFields) {
    const auto c = podman::parse_inspect(kInspect);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->id, "5d6f3a1c0a8e4b1f9e2d7c6b5a4938271605f4e3d2c1b0a99887766554433221");
    EXPECT_TRUE(c->running);
    EXPECT_EQ(c->pid, 43210);
    ASSERT_EQ(c->mounts.size(), 2u);
    EXPECT_EQ(c->mounts[0], (podman::Mount{"volume", "redis-data", "/var/lib/containers/storage/volumes/redis-data/_data",
                                           "/data", true}));
    EXPECT_EQ(c->mounts[1], (podman::Mount{"bind", "", "/etc/redis", "/etc/redis", false}));
    ASSERT_EQ(c->networks.size(), 1u);
    EXPECT_EQ(c->networks.at("podman").ip_address, "10.88.0.5");
    ASSERT_EQ(c->ports.size(), 2u);
    EXPECT_EQ(c->ports.at("6379/tcp"), (std::vector<podman::PortBinding>{{"127.0.0.1", "16379"}}));
    EXPECT_TRUE(c->ports.at("9121/tcp").empty());  // exposed, not published: null
    ASSERT_EQ(c->port_bindings.size(), 1u);
    EXPECT_EQ(c->port_bindings.at("6379/tcp"), (std::vector<podman::PortBinding>{{"127.0.0.1", "16379"}}));
    EXPECT_EQ(c->static_dir, "/var/lib/containers/storage/overlay-containers/5d6f/userdata");
    EXPECT_EQ(c->checkpoint_path, "/var/lib/containers/storage/overlay-containers/5d6f/userdata/checkpoint");
}

TEST(PodmanJson, WhatPodmanLeavesOutIsDefaultedAndWhatIsNotThereIsNone) {
    // A stopped container with nothing published, mounted or attached.
    const auto c = podman::parse_inspect(R"([{"Id":"abc","State":{"Running":false}}])");
    ASSERT_TRUE(c);
    EXPECT_EQ(c->id, "abc");
    EXPECT_FALSE(c->running);
    EXPECT_EQ(c->pid, 0);
    EXPECT_TRUE(c->mounts.empty() && c->networks.empty() && c->ports.empty() && c->port_bindings.empty());
    EXPECT_TRUE(c->static_dir.empty() && c->checkpoint_path.empty());
    EXPECT_FALSE(podman::parse_inspect("[]"));
    EXPECT_FALSE(podman::parse_inspect("{}"));
    for (const char* bad : {"", "Error: no such container x", R"([{"State":{}}])", R"([{"Id":"abc"}])",
                            R"([{"Id":7,"State":{}}])"}) {
        try {
            podman::parse_inspect(bad);
            ADD_FAILURE() << "taken: " << bad;
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ExitCode::bad_input) << bad;
        }
    }
}

TEST(PodmanJson, CheckpointStatisticsAreTheLastContainersCriuStatistics) {
    const auto st = podman::parse_checkpoint_stats(R"({
        "podman_checkpoint_duration": 290126,
        "container_statistics": [
            {"id": "first", "runtime_checkpoint_duration": 100,
             "criu_statistics": {"freezing_time": 11, "frozen_time": 22, "memdump_time": 3, "pages_written": 44}},
            {"id": "5d6f3a1c", "runtime_checkpoint_duration": 202030,
             "criu_statistics": {"freezing_time": 1033, "frozen_time": 75872, "memdump_time": 1402,
                                 "memwrite_time": 1788, "pages_scanned": 5361, "pages_written": 2048}}
        ]
    })");
    EXPECT_EQ(st.freezing_us, 1033);
    EXPECT_EQ(st.frozen_us, 75872);
    EXPECT_EQ(st.pages_written, 2048);
    EXPECT_EQ(podman::parse_checkpoint_stats(R"({"container_statistics":[{"id":"x"}]})").frozen_us, 0);
    EXPECT_THROW(podman::parse_checkpoint_stats(R"({"podman_checkpoint_duration":1})"), Error);
    EXPECT_THROW(podman::parse_checkpoint_stats("not json"), Error);
}
