// Probes on code as Debian ships it, not rebuilt: the redis-server package
// (stripped: its functions come from .dynsym, which redis exports for its
// modules), and zlib and libstdc++ called by a program built with plain g++.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "hotpatch_fixture.h"

namespace iprobe::test {
namespace {

using nlohmann::json;

constexpr const char* kPackagedRedis = "/usr/bin/redis-server";  // scripts/setup installs it

CommandResult redis_cli(int port, const std::vector<std::string>& args) {
    std::vector<std::string> argv{"redis-cli", "-p", std::to_string(port)};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv);
}

TEST(PackagedRedis, EveryProbeableFunctionCountedExactlyUnderLoadThenCodeAsInTheFile) {
    ASSERT_TRUE(std::filesystem::exists(kPackagedRedis)) << "scripts/setup installs the redis-server package";
    // redis-server is a symlink: the mapping names the file itself.
    const std::string file = std::filesystem::canonical(kPackagedRedis).string();
    const std::string suffix = "/" + std::filesystem::path(file).filename().string();
    const auto listed = iprobe({"list", kPackagedRedis, "--json", "--count"});
    ASSERT_EQ(listed.exit_code, 0) << listed.err;
    const json list = json::parse(listed.out);
    EXPECT_EQ(list["flow"], "unprepared");
    const auto functions = list["functions"].get<std::size_t>(), probeable = list["probeable"].get<std::size_t>();
    std::cout << "packaged redis-server: " << probeable << " of " << functions << " functions probe-able ("
              << list["refused_by_reason"].dump() << ")\n";
    EXPECT_GT(probeable * 100, functions * 90) << "fewer than 90% of redis's functions probe-able";

    TempDir tmp;
    RedisServer redis(kPackagedRedis, tmp);
    ASSERT_TRUE(redis.ready());
    const std::string pid = std::to_string(redis.pid());
    const auto file_bytes = file_text_of(redis.pid(), suffix);
    ASSERT_FALSE(file_bytes.empty());
    ASSERT_EQ(text_of(redis.pid(), suffix), file_bytes);

    auto r = iprobe({"attach", pid, "--handler", "count", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out)["enabled"].get<std::size_t>(), 2 * probeable) << r.out;
    EXPECT_EQ(redis_cli(redis.port(), {"SET", "probe", "relocated"}).out, "OK\n");
    EXPECT_EQ(redis_cli(redis.port(), {"GET", "probe"}).out, "relocated\n");
    r = run({"redis-benchmark", "-p", std::to_string(redis.port()), "-t", "set,get", "-n", "20000", "-c", "8", "-q"},
            {}, std::chrono::seconds(300));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(redis_cli(redis.port(), {"STRLEN", "key:__rand_int__"}).out, "3\n");  // the benchmark's value
    EXPECT_EQ(redis_cli(redis.port(), {"GET", "probe"}).out, "relocated\n");

    r = iprobe({"report", pid, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json_calls(r.out, "setCommand"), 20001);  // the benchmark's SETs and ours
    EXPECT_EQ(json_completed(r.out, "setCommand"), 20001);
    EXPECT_EQ(json_calls(r.out, "getCommand"), 20002);
    EXPECT_EQ(json_calls(r.out, "strlenCommand"), 1);
    EXPECT_EQ(json_number(r.out, "lost"), 0);
    const auto status = iprobe({"status", pid});
    EXPECT_NE(status.out.find("sites: relocated entries"), std::string::npos) << status.out;

    r = iprobe({"detach", pid});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(text_of(redis.pid(), suffix), file_bytes) << "detach must leave redis's code as in the file";
    EXPECT_EQ(redis_cli(redis.port(), {"PING"}).out, "PONG\n");
    EXPECT_EQ(redis_cli(redis.port(), {"GET", "probe"}).out, "relocated\n");
    EXPECT_TRUE(redis.running());
}

// The file name a library is mapped by (the link's target: libz.so.1.2.13).
std::string mapped_name(const std::string& link) {
    return "/" + std::filesystem::canonical(link).filename().string();
}

TEST(PackagedLibraries, ZlibAndLibstdcxxCalledByAProgramAreCountedExactly) {
    HpTarget t(1, std::string(RELOC_TARGETS) + "/lib_user");
    const std::string z = mapped_name("/lib/x86_64-linux-gnu/libz.so.1");
    const std::string cxx = mapped_name("/lib/x86_64-linux-gnu/libstdc++.so.6");
    const auto libz = file_text_of(t.pid(), z);
    const auto libstdcxx = file_text_of(t.pid(), cxx);
    ASSERT_FALSE(libz.empty());
    ASSERT_FALSE(libstdcxx.empty());
    ASSERT_EQ(text_of(t.pid(), z), libz);
    ASSERT_EQ(t.command("run 10"), 0);

    auto r = iprobe({"attach", std::to_string(t.pid()), "--module", "libz,libstdc++", "--handler", "count"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_EQ(t.command("run 2000"), 0) << "a relocated library function returned something else";
    r = iprobe({"report", std::to_string(t.pid()), "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char* name : {"compress2", "uncompress", "deflateInit_", "deflateInit2_", "deflateEnd", "inflateInit_",
                             "inflateEnd"}) {
        EXPECT_EQ(json_calls(r.out, name), 2000) << name;
        EXPECT_EQ(json_completed(r.out, name), 2000) << name;
    }
    EXPECT_EQ(json_calls(r.out, "crc32"), 4000);
    EXPECT_EQ(json_calls(r.out, "operator new\\(unsigned long\\)"), 2000);
    EXPECT_EQ(json_calls(r.out, "operator delete\\(void\\*, unsigned long\\)"), 2000);

    r = iprobe({"detach", std::to_string(t.pid())});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(text_of(t.pid(), z), libz);
    EXPECT_EQ(text_of(t.pid(), cxx), libstdcxx);
    EXPECT_EQ(t.command("run 10"), 0);
}

}  // namespace
}  // namespace iprobe::test
