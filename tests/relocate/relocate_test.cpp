// Probes on a binary nobody prepared: the relocation cases of
// targets/reloc_cases.{c,S}, built with plain gcc (no iprobe-cc, no pads),
// listed from their symbols, attached live, counted exactly, detached back
// to the file's own bytes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "hotpatch_fixture.h"
#include "iprobe/relocate/entry_relocation.h"
#include "iprobe/support/error.h"

namespace iprobe::test {
namespace {

using nlohmann::json;

std::string target(const std::string& name) { return std::string(RELOC_TARGETS) + "/" + name; }

// The cases that must be probe-able, and those refused with their reason.
const std::set<std::string> kProbeable = {"rip_load",     "rip_lea",         "short_branch", "endbr_rip",
                                          "call_first",   "jump_first",      "table_switch", "keeps_registers",
                                          "leaf_add",     "keeps_r11",       "r11_leaf",     "call_unwound",
                                          "call_unwound_indirect"};
const std::map<std::string, std::string> kRefused = {{"loop_to_entry", "branch into entry"},
                                                     {"tiny", "too short"},
                                                     {"jrcxz_first", "unrelocatable instruction"},
                                                     {"twice", "too short"}};

json list_json(const std::string& binary) {
    const auto r = iprobe({"list", binary, "--refused", "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out);
}

class RelocatedEntries : public ::testing::TestWithParam<std::string> {};

TEST_P(RelocatedEntries, ListSaysWhichFunctionsAreProbeableAndWhyNotTheOthers) {
    const json list = list_json(target(GetParam()));
    EXPECT_EQ(list["flow"], "unprepared");
    std::map<std::string, json> entries;
    for (const auto& p : list["probes"])
        if (p["kind"] == "entry") entries[p["function"]] = p;
    for (const auto& name : kProbeable) EXPECT_TRUE(entries.count(name)) << name << " should be probe-able";
    std::map<std::string, std::string> refused;
    for (const auto& f : list["refused"]) refused[f["function"]] = f["reason"];
    for (const auto& [name, reason] : kRefused) {
        EXPECT_EQ(refused[name], reason) << name;
        EXPECT_FALSE(entries.count(name)) << name << " must not be probe-able";
    }
    EXPECT_EQ(list["functions"].get<std::size_t>(), list["probeable"].get<std::size_t>() + list["refused"].size());
    EXPECT_EQ(list["refused_by_reason"]["too short"], 2);

    // endbr64 stays in place: the site follows it where the compiler put one.
    const json& endbr = entries["endbr_rip"];
    EXPECT_EQ(endbr["site"].get<std::uint64_t>(), endbr["function_address"].get<std::uint64_t>() + 4);
    const json& rip = entries["rip_load"];
    EXPECT_EQ(rip["site"], rip["function_address"]);
    EXPECT_EQ(rip["relocated"].get<std::string>().substr(0, 4), "8b05");  // mov disp32(%rip), %eax moved
    const json& table = entries["table_switch"];
    const bool cet = GetParam() == "reloc_cases_cet";
    EXPECT_EQ(table["site"].get<std::uint64_t>() - table["function_address"].get<std::uint64_t>(), cet ? 4u : 0u);
}

TEST_P(RelocatedEntries, EachEnabledCaseIsCountedExactlyAndBehavesTheSame) {
    for (const std::string handler : {"count", "trace"}) {
        SCOPED_TRACE(handler);
        HpTarget t(1, target(GetParam()));
        const auto file_bytes = file_text_of(t.pid(), "/" + GetParam());
        ASSERT_EQ(text_of(t.pid(), "/" + GetParam()), file_bytes);
        ASSERT_EQ(t.command("run 100"), 0);

        std::vector<std::string> attach{"attach", std::to_string(t.pid()), "--handler", handler};
        if (handler == "count") attach.push_back("--completed");
        auto r = iprobe(attach);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_NE(text_of(t.pid(), "/" + GetParam()), file_bytes);
        EXPECT_EQ(t.command("run 1000"), 0) << "a relocated function returned something else";

        r = iprobe({"report", std::to_string(t.pid()), "--json"});
        ASSERT_EQ(r.exit_code, 0) << r.err;
        for (const auto& name : kProbeable) {
            EXPECT_EQ(json_calls(r.out, name), 1000) << name;
            EXPECT_EQ(json_completed(r.out, name), 1000) << name;
        }
        for (const auto& [name, reason] : kRefused) EXPECT_EQ(json_calls(r.out, name), -1) << name;
        EXPECT_EQ(json_number(r.out, "lost"), 0);

        const auto status = iprobe({"status", std::to_string(t.pid())});
        EXPECT_NE(status.out.find("sites: relocated entries"), std::string::npos) << status.out;

        r = iprobe({"detach", std::to_string(t.pid())});
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(text_of(t.pid(), "/" + GetParam()), file_bytes) << "detach must leave the file's bytes";
        EXPECT_EQ(t.command("run 100"), 0);
        r = iprobe({"report", std::to_string(t.pid()), "--json"});
        EXPECT_EQ(json_calls(r.out, "rip_load"), 1000) << "nothing counted after detach";
    }
}

TEST_P(RelocatedEntries, SomeFunctionsOnlyAndAddingMoreLater) {
    HpTarget t(1, target(GetParam()));
    const auto file_bytes = file_text_of(t.pid(), "/" + GetParam());
    auto r = iprobe({"attach", std::to_string(t.pid()), "--handler", "count", "--functions", "short_branch,rip_*"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_EQ(t.command("run 500"), 0);
    r = iprobe({"attach", std::to_string(t.pid()), "--handler", "count", "--functions", "call_first", "--entry-only"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_EQ(t.command("run 300"), 0);
    r = iprobe({"report", std::to_string(t.pid()), "--json"});
    EXPECT_EQ(json_calls(r.out, "short_branch"), 800);
    EXPECT_EQ(json_calls(r.out, "rip_load"), 800);
    EXPECT_EQ(json_calls(r.out, "rip_lea"), 800);
    EXPECT_EQ(json_calls(r.out, "call_first"), 300);
    EXPECT_EQ(json_calls(r.out, "endbr_rip"), -1);
    // Asking for a refused function names no probe, and says why.
    r = iprobe({"attach", std::to_string(t.pid()), "--functions", "loop_to_entry"});
    EXPECT_EQ(r.exit_code, 5) << r.err;
    EXPECT_NE(r.err.find("loop_to_entry: branch into entry"), std::string::npos) << r.err;
    r = iprobe({"attach", std::to_string(t.pid()), "--handler", "count", "--functions", "tiny,jump_first", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json_number(r.out, "refused"), 1) << r.out;
    r = iprobe({"detach", std::to_string(t.pid()), "--functions", "rip_*"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_EQ(t.command("run 10"), 0);
    r = iprobe({"detach", std::to_string(t.pid())});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(text_of(t.pid(), "/" + GetParam()), file_bytes);
}

// `iprobe run` enables every probe before the program's entry point runs.
// _start finds argc where a call leaves its return address: hooking its
// return handed main a trampoline's address as argc (jsoncpp's own test
// suite aborted).  It is refused, and the program gets its arguments.
TEST_P(RelocatedEntries, TheProgramsEntryPointIsRefusedAndMainGetsItsArguments) {
    const json list = list_json(target(GetParam()));
    std::string reason;
    for (const auto& f : list["refused"])
        if (f["function"] == "_start") reason = f["reason"];
    EXPECT_EQ(reason, "no return address") << list["refused"].dump();
    for (const auto& p : list["probes"]) EXPECT_NE(p["function"], "_start");

    const std::string expected = "argc 4: " + target(GetParam()) + " --args one two\n";
    for (const std::vector<std::string>& handler : {std::vector<std::string>{"count", "--completed"}, {"trace"}}) {
        SCOPED_TRACE(handler.front());
        std::vector<std::string> args{"run", "--json", "--handler"};
        args.insert(args.end(), handler.begin(), handler.end());
        args.insert(args.end(), {"--", target(GetParam()), "--args", "one", "two"});
        const auto r = iprobe(args);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.out, expected);
        EXPECT_EQ(json_calls(r.err, "main"), 1) << r.err;
        EXPECT_EQ(json_completed(r.err, "main"), 1) << r.err;
    }
}

// libc probed (a library nobody prepared): the runtime's first event in a
// thread claims its sums and ring, which called libc (pthread_sigmask,
// madvise): a probe there fired inside the claim and claimed again, without
// end (every process died of a stack overflow).  The claims make their own
// system calls now, and anything probed inside one is dropped and counted,
// so libc's counts are the program's own calls, exactly.
TEST_P(RelocatedEntries, LibcProbedCountsTheProgramsOwnCallsExactly) {
    for (const std::string handler : {"count", "trace"}) {
        SCOPED_TRACE(handler);
        const auto r = iprobe({"run", "--json", "--handler", handler, "--module", "libc.so.6", "--functions",
                               "sigprocmask,pthread_sigmask,getppid,madvise", "--", target(GetParam()), "--libc",
                               "20000", "3"});
        EXPECT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.out, "libc calls 20000 in 3 threads\n");
        EXPECT_EQ(json_calls(r.err, "sigprocmask"), 60000) << r.err;
        EXPECT_EQ(json_calls(r.err, "pthread_sigmask"), 60000) << "sigprocmask's own, none of the runtime's";
        EXPECT_EQ(json_calls(r.err, "getppid"), 60000);
        EXPECT_EQ(json_calls(r.err, "madvise"), -1) << "the runtime's madvise is not libc's";
    }
}

INSTANTIATE_TEST_SUITE_P(PlainGcc, RelocatedEntries, ::testing::Values("reloc_cases", "reloc_cases_cet"));

// The trampoline's bytes, case by case (relocate/entry_relocation.h).
TEST(Trampoline, RipRelativeOperandIsReaimed) {
    // mov 0x10(%rip), %eax at 0x401000 (reads 0x401016), moved to 0x405000
    const std::vector<std::uint8_t> moved = {0x8b, 0x05, 0x10, 0x00, 0x00, 0x00};
    const auto t = relocate::trampoline(moved, 0x401000, 0x405000);
    ASSERT_EQ(t.size(), 6u + 5u);
    std::int32_t disp;
    std::memcpy(&disp, t.data() + 2, 4);
    EXPECT_EQ(0x405006 + static_cast<std::int64_t>(disp), 0x401016);
    EXPECT_EQ(t[6], 0xe9);  // jmp back to 0x401006
    std::int32_t back;
    std::memcpy(&back, t.data() + 7, 4);
    EXPECT_EQ(0x40500b + static_cast<std::int64_t>(back), 0x401006);
}

TEST(Trampoline, ShortConditionalBranchBecomesRel32) {
    // test %edi,%edi; je +5 (to 0x401009); lea 1(%rdi),%eax
    const std::vector<std::uint8_t> moved = {0x85, 0xff, 0x74, 0x05, 0x8d, 0x47, 0x01};
    const auto t = relocate::trampoline(moved, 0x401000, 0x405000);
    ASSERT_EQ(t.size(), 2u + 6u + 3u + 5u);
    EXPECT_EQ(t[2], 0x0f);
    EXPECT_EQ(t[3], 0x84);  // je rel32
    std::int32_t rel;
    std::memcpy(&rel, t.data() + 4, 4);
    EXPECT_EQ(0x405008 + static_cast<std::int64_t>(rel), 0x401009);
}

// A moved call leaves the return address of the original code (a 64-bit
// one: push's sign-extended low half, then the high half), then jumps.
TEST(Trampoline, ACallPushesTheReturnAddressTheOriginalWouldHave) {
    const std::uint64_t site = 0x7f0012345000, at = 0x7f0012349000, callee = 0x7f0012350000;
    // sub $8, %rsp; call callee
    std::vector<std::uint8_t> moved = {0x48, 0x83, 0xec, 0x08, 0xe8, 0, 0, 0, 0};
    const std::int32_t rel = static_cast<std::int32_t>(callee - (site + 9));
    std::memcpy(moved.data() + 5, &rel, 4);
    const auto t = relocate::trampoline(moved, site, at);
    const std::uint64_t back = site + 9;
    std::vector<std::uint8_t> expected = {0x48, 0x83, 0xec, 0x08, 0x68};  // sub; push $low
    const auto put32 = [&](std::uint32_t v) {
        for (int i = 0; i < 4; i++) expected.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
    };
    put32(static_cast<std::uint32_t>(back));
    for (std::uint8_t b : {0xc7, 0x44, 0x24, 0x04}) expected.push_back(b);  // movl $high, 4(%rsp)
    put32(static_cast<std::uint32_t>(back >> 32));
    expected.push_back(0xe9);  // jmp callee
    put32(static_cast<std::uint32_t>(callee - (at + expected.size() + 4)));
    expected.push_back(0xe9);  // jmp back (never taken: the callee returns there)
    put32(static_cast<std::uint32_t>(back - (at + expected.size() + 4)));
    EXPECT_EQ(t, expected);

    // call *disp(%rip) becomes jmp *disp'(%rip) after the same push
    const std::vector<std::uint8_t> indirect = {0x48, 0x83, 0xec, 0x08, 0xff, 0x15, 0x00, 0x10, 0x00, 0x00};
    const auto u = relocate::trampoline(indirect, site, at);
    ASSERT_EQ(u.size(), 4u + 13u + 6u + 5u);
    EXPECT_EQ(u[17], 0xff);
    EXPECT_EQ(u[18], 0x25);  // FF /4, rip-relative
    std::int32_t disp;
    std::memcpy(&disp, u.data() + 19, 4);
    EXPECT_EQ(at + 23 + static_cast<std::int64_t>(disp), site + 10 + 0x1000) << "still reads the same pointer";
}

TEST(Trampoline, OutOfReachIsRefusedNotWritten) {
    const std::vector<std::uint8_t> moved = {0x8b, 0x05, 0x10, 0x00, 0x00, 0x00};
    EXPECT_THROW(relocate::trampoline(moved, 0x401000, 0x7f0000000000ull), Error);
}

// Symbol sizes and section sizes come from the file: ends past 2^64 must
// clamp to the code, not wrap below it (found by the symbol_probes fuzzer).
TEST(PlanEntries, SizesThatWrapPastTheAddressSpaceAreClamped) {
    // push %rbp; mov %rsp,%rbp; nop x4; pop %rbp; ret, twice
    const std::vector<std::uint8_t> bytes = {0x55, 0x48, 0x89, 0xe5, 0x90, 0x90, 0x90, 0x90, 0x5d, 0xc3,
                                             0x55, 0x48, 0x89, 0xe5, 0x90, 0x90, 0x90, 0x90, 0x5d, 0xc3};
    const std::vector<relocate::CodeRange> code = {{0x401000, bytes}};
    const std::vector<relocate::FunctionRange> functions = {{0x401000, ~std::uint64_t{0} - 0x10},
                                                            {0x40100a, 10}};
    const auto none = [](std::uint64_t, void*, std::size_t) { return false; };
    const auto plans = relocate::plan_entries(code, functions, none);
    ASSERT_EQ(plans.size(), 2u);
    EXPECT_TRUE(plans[0].ok()) << plans[0].detail;
    EXPECT_EQ(plans[0].length, 5u);  // push, mov, nop: the jump's 5 bytes
    EXPECT_EQ(relocate::to_string(plans[1].refusal), "undecodable");
    EXPECT_EQ(plans[1].detail, "outside the executable sections");  // all of it is the first's

    const std::vector<relocate::CodeRange> at_the_top = {{~std::uint64_t{0} - 4, bytes}};
    const std::vector<relocate::FunctionRange> one = {{~std::uint64_t{0} - 4, 10}};
    const auto top = relocate::plan_entries(at_the_top, one, none);
    ASSERT_EQ(top.size(), 1u);
    EXPECT_FALSE(top[0].ok());
}

TEST(RelocatedEntriesCli, StatusOfAPreparedBinarySaysPads) {
    HpTarget t(1, targets_dir() + "/hp_target_entry");
    ASSERT_EQ(iprobe({"attach", std::to_string(t.pid()), "--handler", "count", "--functions", "work"}).exit_code, 0);
    const auto status = iprobe({"status", std::to_string(t.pid()), "--json"});
    // "pad", or "pad+relocated" with small leaves left unpadded
    EXPECT_NE(status.out.find("\"sites\":\"pad"), std::string::npos) << status.out;
}

}  // namespace
}  // namespace iprobe::test
