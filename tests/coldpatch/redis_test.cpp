// Redis 7.0 from Debian 12's source, built with `make CC=iprobe-cc`
// (scripts/build-redis), against the same source built with gcc: same
// replies, redis-benchmark runs, no hook call left, one probe per
// placeholder the compiler emitted.  Builds are cached in the build tree.
#include <gtest/gtest.h>

#include "binary_checks.h"
#include "iprobe/probelist/probe_list.h"
#include "testutil.h"

namespace iprobe::test {
namespace {

// The directory with redis-server, -cli and -benchmark.
std::string redis_dir(const std::string& mode) {
    const std::string server = build_redis(mode);
    return server.substr(0, server.rfind('/'));
}

// The replies to a fixed command set, one redis-cli call per command.
std::string replies(const std::string& cli, int port) {
    static const std::vector<std::vector<std::string>> commands = {
        {"PING"},
        {"SET", "greeting", "hello"},
        {"GET", "greeting"},
        {"APPEND", "greeting", " world"},
        {"STRLEN", "greeting"},
        {"INCR", "counter"},
        {"INCRBY", "counter", "41"},
        {"DECR", "counter"},
        {"MSET", "a", "1", "b", "2", "c", "3"},
        {"MGET", "a", "b", "c", "missing"},
        {"LPUSH", "list", "x", "y", "z"},
        {"RPUSH", "list", "tail"},
        {"LRANGE", "list", "0", "-1"},
        {"LPOP", "list"},
        {"HSET", "user:1", "name", "ada", "lang", "c"},
        {"HGETALL", "user:1"},
        {"SADD", "set", "m1", "m2", "m3", "m2"},
        {"SCARD", "set"},
        {"SISMEMBER", "set", "m2"},
        {"ZADD", "board", "10", "alice", "20", "bob", "15", "carol"},
        {"ZRANGE", "board", "0", "-1", "WITHSCORES"},
        {"ZRANK", "board", "carol"},
        {"EXPIRE", "greeting", "100"},
        {"TYPE", "board"},
        {"EXISTS", "a", "b", "nope"},
        {"DEL", "a", "b"},
        {"KEYS", "cou*"},
        {"DBSIZE"},
        {"EVAL", "return redis.call('INCR', KEYS[1]) * 2", "1", "counter"},
        {"XADD", "stream", "1-1", "field", "value"},
        {"XLEN", "stream"},
        {"SETRANGE", "greeting", "0", "J"},
        {"GETRANGE", "greeting", "0", "4"},
        {"OBJECT", "ENCODING", "list"},
        {"NOSUCHCOMMAND"},
        {"GET"},
        {"PERSIST", "greeting"},
        {"TTL", "greeting"},
        {"ECHO", "last"},
    };
    std::string out;
    for (const auto& c : commands) {
        std::vector<std::string> argv{cli, "-p", std::to_string(port)};
        argv.insert(argv.end(), c.begin(), c.end());
        const auto r = run(argv);
        out += "> " + c[0] + "\n" + r.out + r.err;
    }
    return out;
}

TEST(Redis, BuiltWithIprobeCcBehavesLikeTheNativeBuild) {
    const std::string native = redis_dir("native");
    const std::string probed = redis_dir("finstrument");
    const std::string unpatched = redis_dir("finstrument-unpatched");
    ASSERT_FALSE(native.empty());
    ASSERT_FALSE(probed.empty());
    ASSERT_FALSE(unpatched.empty());

    for (const char* tool : {"redis-server", "redis-cli", "redis-benchmark"}) {
        SCOPED_TRACE(tool);
        const probelist::ProbeList list = probelist::ProbeList::load(probed + "/" + tool + ".probes");
        const HookCalls emitted = count_hook_calls(unpatched + "/" + tool);
        const HookCalls left = count_hook_calls(probed + "/" + tool);
        std::size_t entries = 0;
        for (const auto& p : list.probes) entries += p.kind == probelist::ProbeKind::entry;
        EXPECT_GT(emitted.total(), 1000);
        EXPECT_EQ(list.probes.size(), static_cast<std::size_t>(emitted.total()));
        EXPECT_EQ(entries, static_cast<std::size_t>(emitted.enter));
        EXPECT_EQ(left.total(), 0);
        EXPECT_EQ(left.tail_jumps, 0);
        EXPECT_EQ(emitted.tail_jumps, 0);
    }
    const probelist::ProbeList server = probelist::ProbeList::load(probed + "/redis-server.probes");
    EXPECT_NE(server.flags & IPROBE_PL_FLAG_DWARF, 0u);
    // Each probe is named by the function it instruments, inlined or not.
    const auto misnamed = probes_misnamed(probed + "/redis-server", server);
    EXPECT_LE(misnamed.size(), server.probes.size() / 1000)
        << "e.g. " << (misnamed.empty() ? "" : misnamed.front());
    const auto lookup = run({bin("iprobe"), "list", probed + "/redis-server", "--count", "--functions", "processCommand",
                             "--kind", "entry"});
    EXPECT_GE(std::stoi(lookup.out), 1) << "its own entry, plus copies inlined elsewhere";

    TempDir tmp;
    RedisServer native_server(native + "/redis-server", tmp, "native");
    RedisServer probed_server(probed + "/redis-server", tmp, "probed");
    ASSERT_TRUE(native_server.ready());
    ASSERT_TRUE(probed_server.ready());
    // The same client (the native redis-cli) against both servers, then the
    // iprobe-built redis-cli against the iprobe-built server.
    const std::string expected = replies(native + "/redis-cli", native_server.port());
    EXPECT_NE(expected.find("> MGET\n1\n2\n3\n\n"), std::string::npos) << expected;
    EXPECT_NE(expected.find("> EVAL\n84\n"), std::string::npos) << expected;
    EXPECT_EQ(replies(native + "/redis-cli", probed_server.port()), expected);
    ASSERT_EQ(run({native + "/redis-cli", "-p", std::to_string(probed_server.port()), "FLUSHALL"}).out, "OK\n");
    EXPECT_EQ(replies(probed + "/redis-cli", probed_server.port()), expected);

    // Ground truth for the names: the unpatched build, run with a recorder of
    // what its hooks receive, against the probe list of the same bytes.
    const std::string copy = tmp / "redis-server-patched";
    ASSERT_EQ(run({bin("iprobe"), "coldpatch", "-q", unpatched + "/redis-server", "-o", copy}).exit_code, 0);
    const probelist::ProbeList same_layout = probelist::ProbeList::load(copy + ".probes");
    {
        const int port = free_port();
        const std::string log = tmp / "hooks.log";
        Child recorded({unpatched + "/redis-server", "--port", std::to_string(port), "--bind", "127.0.0.1", "--save",
                        "", "--appendonly", "no", "--dir", tmp.path(), "--daemonize", "no"},
                       "/dev/null", recorder_env(log));
        ASSERT_TRUE(wait_for_port(port, std::chrono::seconds(20)));
        EXPECT_EQ(replies(native + "/redis-cli", port), expected);
        run({native + "/redis-cli", "-p", std::to_string(port), "SHUTDOWN", "NOSAVE"});
        recorded.wait(std::chrono::seconds(20));
        const RecordedCheck check = check_recorded(log, same_layout);
        EXPECT_GT(check.sites, 1000u);
        EXPECT_TRUE(check.problems.empty()) << check.problems.size() << " of " << check.sites << ", e.g. "
                                            << (check.problems.empty() ? "" : check.problems.front());
        // A few sites serve several functions: gcc merges identical exit-hook
        // tails of different inlined functions (cross-jumping), each path
        // with its own this_fn; those are named by the enclosing function.
        EXPECT_LE(check.misnamed.size(), check.sites / 100)
            << "e.g. " << (check.misnamed.empty() ? "" : check.misnamed.front());
        // ... and every one of those is flagged as such (IPROBE_PL_RECORD_SHARED_SITE).
        EXPECT_TRUE(check.misnamed_unflagged.empty())
            << check.misnamed_unflagged.size() << ", e.g. " << (check.misnamed_unflagged.empty() ? "" : check.misnamed_unflagged.front());
    }

    const auto bench = run({probed + "/redis-benchmark", "-p", std::to_string(probed_server.port()), "-n", "2000", "-q"},
                           {}, std::chrono::minutes(5));
    EXPECT_EQ(bench.exit_code, 0) << bench.err;
    EXPECT_NE(bench.out.find("SET: "), std::string::npos) << bench.out;
    EXPECT_NE(bench.out.find("requests per second"), std::string::npos);
    EXPECT_EQ(run({native + "/redis-cli", "-p", std::to_string(probed_server.port()), "PING"}).out, "PONG\n");
}

}  // namespace
}  // namespace iprobe::test
