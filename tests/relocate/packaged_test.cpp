// Probes on code as Debian ships it, not rebuilt: the redis-server package
// (stripped: its functions come from .dynsym, which redis exports for its
// modules), PowerDNS's pdns_server (C++, its functions exported for its
// backends), node and a JVM (V8 and HotSpot read their frames' return
// addresses), a cgo
// program built by Debian's Go, zlib and libstdc++ called by a program
// built with plain g++, and libc's functions that return twice.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <iterator>
#include <thread>

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
    EXPECT_GT(probeable * 100, functions * 75) << "fewer than 75% of redis's functions probe-able";

    TempDir tmp;
    RedisServer redis(kPackagedRedis, tmp);
    ASSERT_TRUE(redis.ready());
    const std::string pid = std::to_string(redis.pid());
    const auto file_bytes = file_text_of(redis.pid(), suffix);
    ASSERT_FALSE(file_bytes.empty());
    ASSERT_EQ(text_of(redis.pid(), suffix), file_bytes);

    auto r = iprobe({"attach", pid, "--handler", "count", "--completed", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out)["enabled"].get<std::size_t>(), 2 * probeable) << r.out;
    EXPECT_TRUE(json::parse(r.out)["planned_while_running"].get<bool>()) << "a first attach of many sites: " << r.out;
    EXPECT_EQ(redis_cli(redis.port(), {"SET", "probe", "relocated"}).out, "OK\n");
    EXPECT_EQ(redis_cli(redis.port(), {"GET", "probe"}).out, "relocated\n");
    // Every test redis-benchmark has (strings, lists, sets, hashes, sorted sets, MSET, LRANGE), 5000 requests each.
    r = run({"redis-benchmark", "-p", std::to_string(redis.port()), "-n", "5000", "-c", "8", "-q"}, {},
            std::chrono::seconds(600));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(redis_cli(redis.port(), {"STRLEN", "key:__rand_int__"}).out, "3\n");  // the benchmark's value
    EXPECT_EQ(redis_cli(redis.port(), {"GET", "probe"}).out, "relocated\n");

    r = iprobe({"report", pid, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json_calls(r.out, "setCommand"), 5001);  // the benchmark's SETs and ours
    EXPECT_EQ(json_completed(r.out, "setCommand"), 5001);
    EXPECT_EQ(json_calls(r.out, "getCommand"), 5002);
    EXPECT_EQ(json_calls(r.out, "incrCommand"), 5000);
    EXPECT_EQ(json_calls(r.out, "msetCommand"), 5000);
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

    auto r = iprobe({"attach", std::to_string(t.pid()), "--module", "libz,libstdc++", "--handler", "count", "--completed"});
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

// Every function of Debian's libc probed, every return hooked, in a program
// calling those that return twice or on another stack: setjmp and
// sigsetjmp (returned to again by longjmp), vfork (its child returns through
// the parent's frame first), swapcontext (a coroutine and back).  Their
// hooked returns were taken again after their return entry was used: the
// program died (SIGSEGV at the first longjmp) or vfork's parent ran the
// child's branch (exit 127).  Their exits are left off, said, and their
// calls still counted; posix_spawn's ordinary return is hooked.
TEST(PackagedLibc, SetjmpVforkAndSwapcontextRunAsWithoutAndEveryOtherReturnIsHooked) {
    const std::string program = std::string(RELOC_TARGETS) + "/returns_twice";
    const auto plain = run({program});
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    ASSERT_EQ(plain.out, "jumped 499500, exited 40, coroutine steps 1000\n");

    for (const std::vector<std::string>& handler : {std::vector<std::string>{"count", "--completed"}, {"trace"}}) {
        SCOPED_TRACE(handler.front());
        std::vector<std::string> args{"run", "--json", "--module", "libc.so.6", "--handler"};
        args.insert(args.end(), handler.begin(), handler.end());
        args.insert(args.end(), {"--", program});
        const auto r = iprobe(args, std::chrono::seconds(120));
        ASSERT_EQ(r.exit_code, 0) << r.err.substr(0, 2000);
        EXPECT_EQ(r.out, plain.out);
        const json report = json::parse(r.err.substr(r.err.rfind("\n{\"pid\"") + 1));
        // _setjmp: the program's 1000 and libc's own start's (the buffer
        // __libc_start_call_main keeps for thread cancellation).
        const std::map<std::string, long long> left_off{
            {"_setjmp", 1001}, {"vfork", 20}, {"getcontext", 1}, {"swapcontext", 2000}};
        std::size_t completed_functions = 0;
        for (const auto& f : report["functions"]) {
            const std::string name = f["name"];
            if (auto it = left_off.find(name); it != left_off.end()) {
                EXPECT_EQ(f["calls"], it->second) << name;
                EXPECT_EQ(f["fields"], json::array({"calls"})) << name << ": its exit must be left off";
            } else if (name == "__sigsetjmp") {
                EXPECT_EQ(f["fields"], json::array({"calls"})) << name;
            } else if (f.contains("completed") && f["completed"].get<long long>() > 0) {
                ++completed_functions;
            }
        }
        EXPECT_EQ(json_calls(r.err, "posix_spawn"), 20);
        EXPECT_EQ(json_completed(r.err, "posix_spawn"), 20);
        EXPECT_GT(completed_functions, 10u) << "every other function's exits are on";
    }
}

// Asks for www.example.test A over UDP `count` times; returns the answers
// that were not 192.0.2.7 (or none came within a second).
int wrong_dns_answers(int port, int count) {
    const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    timeval timeout{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<std::uint16_t>(port));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int wrong = 0;
    for (int i = 0; i < count; i++) {
        std::vector<std::uint8_t> q = {static_cast<std::uint8_t>(i >> 8), static_cast<std::uint8_t>(i), 1, 0, 0, 1, 0, 0,
                                       0, 0, 0, 0, 3, 'w', 'w', 'w', 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 4, 't', 'e', 's',
                                       't', 0, 0, 1, 0, 1};
        ::sendto(fd, q.data(), q.size(), 0, reinterpret_cast<const sockaddr*>(&to), sizeof to);
        std::uint8_t r[512];
        const ssize_t n = ::recv(fd, r, sizeof r, 0);
        const std::uint8_t address[4] = {192, 0, 2, 7};
        wrong += n < 16 || r[0] != q[0] || r[1] != q[1] || (r[3] & 15) != 0 || std::memcmp(r + n - 4, address, 4) != 0;
    }
    ::close(fd);
    return wrong;
}

// A packaged C++ program: PowerDNS's authoritative server, not rebuilt,
// serving one zone from the bind backend, every probe-able function on.
TEST(PackagedCxxProgram, PowerDnsServesEveryQueryCountedExactlyThenCodeAsInTheFile) {
    const std::string server = "/usr/sbin/pdns_server";  // scripts/setup installs pdns-server, pdns-backend-bind
    ASSERT_TRUE(std::filesystem::exists(server)) << "scripts/setup installs pdns-server";
    const auto listed = iprobe({"list", server, "--json", "--count"});
    ASSERT_EQ(listed.exit_code, 0) << listed.err;
    const json list = json::parse(listed.out);
    const auto functions = list["functions"].get<std::size_t>(), probeable = list["probeable"].get<std::size_t>();
    std::cout << "packaged pdns_server: " << probeable << " of " << functions << " functions probe-able ("
              << list["refused_by_reason"].dump() << ")\n";
    EXPECT_GT(probeable * 100, functions * 75);

    TempDir dir;
    std::ofstream(dir / "pdns.conf") << "";
    std::ofstream(dir / "named.conf") << "zone \"example.test\" { type master; file \"" << dir / "example.test.zone"
                                      << "\"; };\n";
    std::ofstream(dir / "example.test.zone") << "$TTL 60\n@ IN SOA ns.example.test. admin.example.test. 1 3600 600 86400 60\n"
                                                "@ IN NS ns.example.test.\nns IN A 127.0.0.1\nwww IN A 192.0.2.7\n";
    const int port = free_port();
    Child pdns({server, "--config-dir=" + dir.path(), "--socket-dir=" + dir.path(), "--guardian=no", "--daemon=no",
                "--disable-syslog", "--write-pid=no", "--local-address=127.0.0.1", "--local-port=" + std::to_string(port),
                "--launch=bind", "--bind-config=" + dir / "named.conf", "--cache-ttl=0", "--query-cache-ttl=0",
                "--negquery-cache-ttl=0"},
               dir / "pdns.log");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (wrong_dns_answers(port, 1) != 0) {
        ASSERT_TRUE(pdns.running()) << file_text(dir / "pdns.log");
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "pdns_server never answered: " << file_text(dir / "pdns.log");
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const std::string pid = std::to_string(pdns.pid());
    const auto code = file_text_of(pdns.pid(), "/pdns_server");
    ASSERT_FALSE(code.empty());
    ASSERT_EQ(text_of(pdns.pid(), "/pdns_server"), code);

    auto r = iprobe({"attach", pid, "--handler", "count", "--completed", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out)["enabled"].get<std::size_t>(), 2 * probeable) << r.out;
    EXPECT_TRUE(json::parse(r.out)["planned_while_running"].get<bool>()) << "a first attach of many sites: " << r.out;
    EXPECT_EQ(wrong_dns_answers(port, 2000), 0);
    r = iprobe({"report", pid, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // One answer record per query, answered by one of its threads.
    EXPECT_EQ(json_calls(r.out, "DNSPacket::addRecord\\(DNSZoneRecord&&\\)"), 2000) << r.out.substr(0, 2000);
    EXPECT_EQ(json_completed(r.out, "DNSPacket::addRecord\\(DNSZoneRecord&&\\)"), 2000);
    EXPECT_EQ(json_calls(r.out, "DNSPacket::getServiceRecords\\(\\)"), 2000);
    EXPECT_EQ(json_calls(r.out, "DNSPacket::DNSPacket\\(bool\\)"), 2000);
    EXPECT_EQ(json_number(r.out, "lost"), 0);

    r = iprobe({"detach", pid});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(text_of(pdns.pid(), "/pdns_server"), code) << "detach must leave pdns_server's code as in the file";
    EXPECT_EQ(wrong_dns_answers(port, 10), 0);
    pdns.kill(SIGTERM);
}

constexpr const char* kNode = "/usr/bin/node";  // scripts/setup installs the nodejs package

// Where V8 is: in the executable (a static build) or in libnode (Debian's).
std::vector<std::string> node_module_options() {
    const auto in_executable = iprobe({"list", kNode, "--functions", "v8::internal::Runtime_*", "--count"});
    if (in_executable.exit_code == 0 && std::stoul(in_executable.out) > 0) return {};
    return {"--module", "libnode"};
}

// A report of a runtime that walks its frames (attach_plan.cpp): functions
// named `walked` (called by its generated code) show no completed calls,
// their exits being off, and a thousand others completed calls.
void check_walked_exits_off(const json& report, const std::string& walked) {
    EXPECT_EQ(report["lost"], 0);
    std::size_t walked_functions = 0, completed_functions = 0;
    for (const auto& f : report["functions"]) {
        const std::string name = f["name"];
        if (name.starts_with(walked)) {
            ++walked_functions;
            EXPECT_FALSE(f.contains("completed")) << name << ": its exit must be left off";
        } else if (f.contains("completed") && f["completed"].get<long long>() > 0) {
            ++completed_functions;
        }
    }
    EXPECT_GT(walked_functions, 0u) << "the program calls " << walked << "*";
    EXPECT_GT(completed_functions, 1000u) << "every other function's exits are on";
}

std::size_t lines_in(const std::string& path) {
    std::ifstream in(path);
    return static_cast<std::size_t>(std::count(std::istreambuf_iterator<char>(in), {}, '\n'));
}

// Attaches the trace handler (every function of `where`) to `program`,
// which writes a line to `out` now and then, lets it work, checks the
// report, detaches: the program works throughout.
void trace_while_it_runs(Child& program, const std::string& out, const std::vector<std::string>& where,
                         const std::string& walked) {
    for (int i = 0; i < 400 && lines_in(out) == 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_GT(lines_in(out), 0u) << "the program did not start";
    const std::string pid = std::to_string(program.pid());
    std::vector<std::string> attach{"attach", pid, "--handler", "trace", "--json"};
    attach.insert(attach.end(), where.begin(), where.end());
    auto r = iprobe(attach, std::chrono::seconds(600));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_GT(json::parse(r.out)["exits_runtime_reads"].get<std::size_t>(), 0u) << r.out;
    // The first attach too plans its sites while the program runs, between
    // a stop that injects the runtime and one that writes them.
    EXPECT_TRUE(json::parse(r.out)["planned_while_running"].get<bool>()) << r.out;
    EXPECT_GT(json::parse(r.out)["prepare_pause_us"].get<std::uint64_t>(), 0u) << r.out;
    const std::size_t before = lines_in(out);
    std::this_thread::sleep_for(std::chrono::seconds(3));
    ASSERT_TRUE(program.running()) << "the program died with its probes on";
    EXPECT_GT(lines_in(out), before) << "the program stopped working with its probes on";
    r = iprobe({"report", pid, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    check_walked_exits_off(json::parse(r.out), walked);

    r = iprobe({"detach", pid});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::size_t detached = lines_in(out);
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    ASSERT_TRUE(program.running()) << "the program died at the detach";
    EXPECT_GT(lines_in(out), detached);

    // Attached again, the sites are planned while it runs, though its heap
    // and JIT code are mapped and unmapped meanwhile (V8's, HotSpot's): a
    // plan compared on every mapping was made again inside the stop.
    r = iprobe(attach, std::chrono::seconds(600));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(json::parse(r.out)["planned_while_running"].get<bool>()) << r.out;
    r = iprobe({"detach", pid});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_TRUE(program.running());
}

// node, every function probed from its symbols and every return hooked.
// V8 finds the code of each exit frame on its stack from the return address
// of the C++ function its builtins called (a runtime function, a C++
// builtin, an API callback), and the frames of its builtins from theirs:
// with those returns hooked, node aborted at its first garbage collection
// ("Check failed: maybe_code.has_value()").  Those exits are left off; the
// script's output is the same as without probes, and every other function's
// calls complete.
TEST(PackagedNode, EveryReturnHookedButThoseV8ReadsAndTheScriptRunsAsWithout) {
    ASSERT_TRUE(std::filesystem::exists(kNode)) << "scripts/setup installs the nodejs package";
    const std::vector<std::string> where = node_module_options();
    // Exceptions with their stack, garbage enough for scavenges (each walks
    // the stack's exit frames), an API callback (readdirSync).
    const std::string script =
        "function f(n) { if (n == 0) throw new Error('deep'); return f(n - 1); }\n"
        "let caught = 0; for (let i = 0; i < 2000; i++) { try { f(30) } catch (e) { caught += e.stack.split('\\n').length > 1 } }\n"
        "const a = []; for (let i = 0; i < 300000; i++) a.push({i, s: 'k' + i});\n"
        "const listed = require('fs').readdirSync('/').length > 0;\n"
        "console.log(caught, a.length, JSON.parse(JSON.stringify(a.slice(0, 1000))).length, listed);\n";
    const auto plain = run({kNode, "-e", script});
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    ASSERT_EQ(plain.out, "2000 300000 1000 true\n");

    // --args --retval: every function's values planned from node's symbols
    // and the few units of DWARF it has (one index of them, not a walk per function)
    for (const std::vector<std::string>& handler :
         {std::vector<std::string>{"count", "--completed"}, {"trace"}, {"trace", "--args", "--retval"}}) {
        SCOPED_TRACE(handler.front());
        std::vector<std::string> args{"run", "--json", "--handler"};
        args.insert(args.end(), handler.begin(), handler.end());
        args.insert(args.end(), where.begin(), where.end());
        args.insert(args.end(), {"--", kNode, "-e", script});
        const auto r = iprobe(args, std::chrono::seconds(600));
        ASSERT_EQ(r.exit_code, 0) << r.err.substr(0, 2000);
        EXPECT_EQ(r.out, plain.out);
        check_walked_exits_off(json::parse(r.err.substr(r.err.rfind("\n{\"pid\"") + 1)), "v8::internal::Runtime_");
    }
}

TEST(PackagedNode, AttachedWhileItRunsThenDetachedAndItGoesOn) {
    ASSERT_TRUE(std::filesystem::exists(kNode)) << "scripts/setup installs the nodejs package";
    const std::vector<std::string> where = node_module_options();
    TempDir tmp;
    const std::string out = tmp.path() + "/ticks";
    Child node({kNode, "-e",
                "let a = [], n = 0;\n"
                "setInterval(() => {\n"
                "  for (let i = 0; i < 20000; i++) a.push({i, s: 'k' + i}); if (a.length > 200000) a = [];\n"
                "  try { JSON.parse('{') } catch (e) { e.stack }\n"
                "  require('fs').readdirSync('/');\n"
                "  if (++n % 10 == 0) console.log(n);\n"
                "}, 5);\n"},
               out);
    trace_while_it_runs(node, out, where, "v8::internal::Runtime_");
}

// A JVM (Debian's OpenJDK) attached while it runs: every function of
// libjvm traced, through its interpreter and compilers, exceptions, garbage
// collections and threads.  HotSpot takes a thread's last Java frame from
// the return address of the VM function its generated code called: with
// those returns hooked it died of SIGSEGV in frame::sender.
TEST(PackagedJava, AttachedWhileItRunsThenDetachedAndItGoesOn) {
    TempDir tmp;
    std::ofstream(tmp.path() + "/Busy.java") << R"(public class Busy {
  static int f(int n) { if (n == 0) throw new RuntimeException("deep"); return f(n - 1); }
  public static void main(String[] a) throws Exception {
    for (long round = 1;; round++) {
      int caught = 0;
      for (int i = 0; i < 200; i++) { try { f(30); } catch (RuntimeException e) { caught += e.getStackTrace().length > 1 ? 1 : 0; } }
      java.util.List<Object> l = new java.util.ArrayList<>();
      for (int i = 0; i < 200000; i++) { l.add(new int[]{i}); if (l.size() > 50000) l.clear(); }
      Thread t = new Thread(() -> { for (int i = 0; i < 10000; i++) Integer.toString(i).hashCode(); });
      t.start(); t.join();
      if (round % 10 == 0) System.out.println("round " + round + " caught " + caught);
      Thread.sleep(5);
    }
  }
}
)";
    const auto built = run({"javac", "-d", tmp.path(), tmp.path() + "/Busy.java"}, {}, std::chrono::seconds(300));
    ASSERT_EQ(built.exit_code, 0) << "scripts/setup installs openjdk-17-jdk-headless: " << built.err;
    const std::string out = tmp.path() + "/rounds";
    // a crash's hs_err file in tmp, not in the test's working directory
    Child java({"java", "-XX:ErrorFile=" + tmp.path() + "/hs_err_%p.log", "-cp", tmp.path(), "Busy"}, out);
    trace_while_it_runs(java, out, {"--module", "libjvm.so"}, "InterpreterRuntime::");
}

// `java` dlopens libjvm.so from its launcher: `iprobe run --module
// libjvm.so` probes it as it loads, before JNI_CreateJavaVM (and libjvm's
// constructors) run, with HotSpot's frame-walking exits left off.
TEST(PackagedJava, RunProbesLibjvmFromTheLoadOnAndCountsJniCreateJavaVmOnce) {
    TempDir tmp;
    std::ofstream(tmp.path() + "/Hello.java")
        << "public class Hello { public static void main(String[] a) { System.out.println(\"Hello\"); } }\n";
    const auto built = run({"javac", "-d", tmp.path(), tmp.path() + "/Hello.java"}, {}, std::chrono::seconds(300));
    ASSERT_EQ(built.exit_code, 0) << "scripts/setup installs openjdk-17-jdk-headless: " << built.err;
    const auto r = iprobe({"run", "--module", "libjvm.so", "--handler", "count", "--json", "--", "java",
                           "-XX:ErrorFile=" + tmp.path() + "/hs_err_%p.log", "-cp", tmp.path(), "Hello"},
                          std::chrono::seconds(300));
    EXPECT_EQ(r.exit_code, 0) << r.err.substr(0, 4000);
    EXPECT_EQ(r.out, "Hello\n");
    // the report: one JSON line on stderr (thousands of functions: parsed,
    // not matched with a regular expression)
    const auto at = r.err.find("{\"pid\"");
    ASSERT_NE(at, std::string::npos) << r.err.substr(0, 4000);
    const auto report = nlohmann::json::parse(r.err.substr(at, r.err.find('\n', at) - at));
    std::map<std::string, long long> calls;
    for (const auto& f : report["functions"]) calls[f["name"].get<std::string>()] += f["calls"].get<long long>();
    EXPECT_EQ(calls["JNI_CreateJavaVM"], 1);
    EXPECT_EQ(calls["Threads::create_vm(JavaVMInitArgs*, bool*)"], 1);
    EXPECT_GT(calls.size(), 1000u) << "libjvm's functions counted from the VM's start";
    EXPECT_EQ(report["lost"], 0);
    EXPECT_FALSE(report.contains("never_loaded"));
}

// Debian's python3 imports its C accelerator _json from lib-dynload with
// dlopen when `json` is imported: `iprobe run --module _json` probes it as
// it loads (Debian strips it: its exported functions, from .dynsym), so
// the module's init function, the first call into it, is counted once.
TEST(PackagedPython, RunProbesAnExtensionModuleFromTheImportOn) {
    const std::string python = "/usr/bin/python3";
    ASSERT_TRUE(std::filesystem::exists(python)) << "scripts/setup installs Debian's python3";
    const auto r = iprobe({"run", "--module", "_json", "--handler", "count", "--json", "--", python, "-c",
                           "import json; print(json.dumps({'a': [1, 2]}))"},
                          std::chrono::seconds(120));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "{\"a\": [1, 2]}\n");
    EXPECT_EQ(json_calls(r.err, "PyInit__json"), 1) << r.err;
    EXPECT_EQ(r.err.find("never_loaded"), std::string::npos) << r.err;
}

// A Go program that links C (cgo), as Debian's Go builds it, unstripped:
// goroutines run on small stacks that the Go runtime grows by moving them
// and scans by return address, so probes on Go's functions killed it
// ("fatal error: unknown pc" with exits hooked, a fault even with entries
// only).  Go's functions are refused ("go function"); the C beside them is
// probed, and the program runs as without probes.
TEST(PackagedGo, ACgoProgramRunsWithItsCProbedAndItsGoRefused) {
    TempDir tmp;
    {
        std::ofstream(tmp.path() + "/go.mod") << "module gop\ngo 1.19\n";
        std::ofstream(tmp.path() + "/main.go") << R"(package main

import "C"

import (
	"fmt"
	"sort"
	"strings"
	"sync"
)

//go:noinline
func fib(n int) int {
	if n < 2 {
		return n
	}
	return fib(n-1) + fib(n-2)
}

//go:noinline
func deep(n int) int { // grows the goroutine's stack: the runtime moves it
	var buf [256]byte
	buf[n%256] = byte(n)
	if n == 0 {
		return int(buf[0])
	}
	return deep(n-1) + int(buf[n%256])
}

func main() {
	var wg sync.WaitGroup
	sums := make([]int, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			s := []string{}
			for i := 0; i < 20000; i++ {
				s = append(s, strings.Repeat("x", i%7))
			}
			sort.Strings(s)
			sums[g] = fib(22) + deep(2000) + len(s)
		}(g)
	}
	wg.Wait()
	fmt.Println(sums)
}
)";
    }
    const std::string program = tmp.path() + "/gop";
    const auto built = sh("cd " + tmp.path() + " && GOCACHE=" + tmp.path() + "/cache GOPATH=" + tmp.path() +
                              "/gopath GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=1 go build -o gop . 2>&1",
                          std::chrono::seconds(600));
    ASSERT_EQ(built.exit_code, 0) << "scripts/setup installs golang-go: " << built.out;
    const auto plain = run({program});
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    ASSERT_EQ(plain.out, "[287927 287927 287927 287927]\n");

    const auto listed = iprobe({"list", program, "--refused", "--json"});
    ASSERT_EQ(listed.exit_code, 0) << listed.err;
    const json list = json::parse(listed.out);
    std::map<std::string, std::string> refused;
    for (const auto& f : list["refused"]) refused[f["function"]] = f["reason"];
    for (const char* go : {"main.fib", "main.deep", "main.main", "runtime.mallocgc"})
        EXPECT_EQ(refused[go], "go function") << go;
    std::size_t c_probes = 0;
    for (const auto& p : list["probes"]) {
        if (p["kind"] != "entry") continue;
        ++c_probes;
        EXPECT_EQ(p["function"].get<std::string>().find('.'), std::string::npos) << p["function"] << " is Go's";
    }
    EXPECT_GT(c_probes, 0u) << "cgo's C is probed";

    for (const std::vector<std::string>& handler :
         {std::vector<std::string>{"count"}, {"count", "--completed"}, {"trace"}}) {
        SCOPED_TRACE(handler.back());
        std::vector<std::string> args{"run", "--json", "--handler"};
        args.insert(args.end(), handler.begin(), handler.end());
        args.insert(args.end(), {"--", program});
        const auto r = iprobe(args, std::chrono::seconds(120));
        EXPECT_EQ(r.exit_code, 0) << r.err.substr(0, 2000);
        EXPECT_EQ(r.out, plain.out);
        EXPECT_EQ(json_calls(r.err, "main.fib"), -1) << "Go's functions are not probed";
    }
}

}  // namespace
}  // namespace iprobe::test
