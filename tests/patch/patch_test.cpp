// iprobe patch on a live service under load: every flow and language a
// function can be patched in, the checks made before anything is written,
// and how patches and probes live side by side.  Needs root (ptrace).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "hotpatch_fixture.h"
#include "quote_client.h"
#include "targets/quote.h"

using namespace iprobe::test;
using nlohmann::json;

namespace {

CommandResult cli(const std::vector<std::string>& args) { return iprobe::test::iprobe(args); }

std::string target(const std::string& name) { return std::string(PATCH_TARGETS) + "/" + name; }

class Service {
public:
    explicit Service(const std::string& binary) : port_(free_port()) {
        child_ = Child({target(binary), std::to_string(port_)});
        if (!wait_for_port(port_, std::chrono::seconds(20))) throw std::runtime_error(binary + " did not start");
    }
    pid_t pid() const { return child_.pid(); }
    std::string pid_text() const { return std::to_string(child_.pid()); }
    int port() const { return port_; }
    bool running() { return child_.running(); }
    // Quotes of items 0..99 on a fresh connection.
    std::vector<long> hundred_quotes() const {
        std::vector<long> items(100);
        for (long i = 0; i < 100; i++) items[static_cast<std::size_t>(i)] = i;
        const int fd = connect_local(port_);
        auto out = ask_quotes(fd, items);
        ::close(fd);
        return out;
    }

private:
    int port_;
    Child child_;
};

std::vector<long> expected(bool fixed) {
    std::vector<long> out;
    for (long i = 0; i < 100; i++) out.push_back(fixed ? QUOTE_FIXED(i) : QUOTE_BUGGY(i));
    return out;
}

json parse(const CommandResult& r) {
    try {
        return json::parse(r.out);
    } catch (const std::exception&) {
        ADD_FAILURE() << "not JSON: " << r.out << r.err;
        return json::object();
    }
}

std::uint64_t median(std::vector<std::uint64_t> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct Cycles {
    std::vector<std::uint64_t> patch_pause_us, revert_pause_us;
    json last_patch;
};

// `n` patch/revert cycles of `function` with `with`, each under `load`.
Cycles cycle(const Service& s, int n, const std::string& function, const std::string& with) {
    Cycles c;
    for (int i = 0; i < n; i++) {
        const auto p = cli({"patch", s.pid_text(), "--function", function, "--with", with, "--json"});
        EXPECT_EQ(p.exit_code, 0) << p.err;
        if (p.exit_code != 0) break;
        c.last_patch = parse(p);
        c.patch_pause_us.push_back(c.last_patch.value("pause_us", 0ull));
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
        const auto r = cli({"patch", s.pid_text(), "--revert", function, "--json"});
        EXPECT_EQ(r.exit_code, 0) << r.err;
        if (r.exit_code != 0) break;
        c.revert_pause_us.push_back(parse(r).value("pause_us", 0ull));
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
    return c;
}

void expect_every_reply_old_or_new(const QuoteCounts& c) {
    EXPECT_GT(c.replies, 0u);
    EXPECT_EQ(c.wrong, 0u) << "replies neither the old nor the new function gives";
    EXPECT_EQ(c.errors, 0u) << "connections lost";
    EXPECT_EQ(c.old_answers + c.new_answers, c.buggy_subset);
    EXPECT_GT(c.old_answers, 0u);
    EXPECT_GT(c.new_answers, 0u);
}

// Patched and reverted `cycles` times under four clients, then the code is as before.
// Pauses of `n` attaches of one probe (after a first that loads the runtime).
std::vector<std::uint64_t> attach_pauses(const Service& s, int n) {
    std::vector<std::uint64_t> out;
    for (int i = 0; i <= n; i++) {
        const auto a = cli({"attach", s.pid_text(), "--functions", "serve", "--entry-only", "--handler", "count", "--json"});
        EXPECT_EQ(a.exit_code, 0) << a.err;
        if (i > 0) out.push_back(parse(a).value("pause_us", 0ull));
        EXPECT_EQ(cli({"detach", s.pid_text()}).exit_code, 0);
    }
    return out;
}

void patch_under_load(const std::string& binary, const std::string& executable_name, const std::string& function,
                      const std::string& with, int cycles, bool expect_stub, bool compare_with_attach = false) {
    Service s(binary);
    const auto code_before = text_of(s.pid(), executable_name);
    ASSERT_FALSE(code_before.empty());
    ASSERT_EQ(s.hundred_quotes(), expected(false));
    Cycles c;
    QuoteCounts counts;
    std::vector<std::uint64_t> attach_us;
    {
        QuoteLoad load(4, [&] { return connect_local(s.port()); });
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        c = cycle(s, cycles, function, with);
        if (compare_with_attach) attach_us = attach_pauses(s, 10);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        load.stop();
        counts = load.counts();
    }
    ASSERT_EQ(c.patch_pause_us.size(), static_cast<std::size_t>(cycles));
    EXPECT_TRUE(s.running()) << "the service died";
    expect_every_reply_old_or_new(counts);
    EXPECT_EQ(c.last_patch["patched"][0].value("via_stub", !expect_stub), expect_stub) << c.last_patch.dump();
    EXPECT_EQ(text_of(s.pid(), executable_name), code_before) << "the code differs after the last revert";
    EXPECT_EQ(s.hundred_quotes(), expected(false));
    std::printf("%s: %d cycles, %llu replies (%llu old, %llu new in the bug's subset), pause per patch median %llu us "
                "max %llu us, per revert median %llu us\n",
                binary.c_str(), cycles, static_cast<unsigned long long>(counts.replies),
                static_cast<unsigned long long>(counts.old_answers), static_cast<unsigned long long>(counts.new_answers),
                static_cast<unsigned long long>(median(c.patch_pause_us)),
                static_cast<unsigned long long>(*std::max_element(c.patch_pause_us.begin(), c.patch_pause_us.end())),
                static_cast<unsigned long long>(median(c.revert_pause_us)));
    if (!compare_with_attach) return;
    // The same stop-the-world as an attach of one probe, on the same load.
    std::printf("attach of one probe, same load: pause median %llu us max %llu us\n",
                static_cast<unsigned long long>(median(attach_us)),
                static_cast<unsigned long long>(*std::max_element(attach_us.begin(), attach_us.end())));
    EXPECT_LE(median(c.patch_pause_us), 3 * median(attach_us) + 1000);
}

class Patch : public ::testing::Test {
protected:
    void SetUp() override {
        if (::geteuid() != 0) GTEST_SKIP() << "needs root (ptrace)";
    }
};

TEST_F(Patch, HelpAndUsageErrors) {
    const auto help = cli({"patch", "--help"});
    EXPECT_EQ(help.exit_code, 0);
    EXPECT_NE(help.out.find("usage: iprobe patch PID --function F --with LIB.so[:SYMBOL]"), std::string::npos);
    EXPECT_NE(cli({"--help"}).out.find("patch"), std::string::npos);
    Service s("patch_service");
    EXPECT_EQ(cli({"patch"}).exit_code, 2);
    EXPECT_EQ(cli({"patch", s.pid_text()}).exit_code, 2);
    EXPECT_EQ(cli({"patch", s.pid_text(), "--function", "quote"}).exit_code, 2);
    EXPECT_EQ(cli({"patch", s.pid_text(), "--function", "quote", "--with", target("libquote_fix.so"), "extra"}).exit_code, 2);
    EXPECT_EQ(cli({"patch", s.pid_text(), "--revert", "--function", "quote"}).exit_code, 2);
    EXPECT_EQ(cli({"patch", "nonsense", "--revert"}).exit_code, 2);
    EXPECT_EQ(cli({"patch", "4194303", "--revert"}).exit_code, 5);
}

TEST_F(Patch, WhatCannotBeFoundIsRefusedAndNothingChanges) {
    Service s("patch_service");
    const auto before = text_of(s.pid(), "patch_service");
    const auto fix = target("libquote_fix.so");
    auto r = cli({"patch", s.pid_text(), "--function", "quote", "--with", "/nonexistent/fix.so"});
    EXPECT_EQ(r.exit_code, 5) << r.err;
    r = cli({"patch", s.pid_text(), "--function", "quote", "--with", fix + ":no_such_symbol"});
    EXPECT_EQ(r.exit_code, 5) << r.err;
    EXPECT_NE(r.err.find("no_such_symbol"), std::string::npos) << r.err;
    r = cli({"patch", s.pid_text(), "--function", "no_such_function", "--with", fix});
    EXPECT_EQ(r.exit_code, 5) << r.err;
    r = cli({"patch", s.pid_text(), "--revert", "quote"});
    EXPECT_EQ(r.exit_code, 5) << r.err;
    EXPECT_NE(r.err.find("not patched"), std::string::npos) << r.err;
    EXPECT_EQ(text_of(s.pid(), "patch_service"), before);
    // Nothing was loaded either.
    EXPECT_EQ(file_text("/proc/" + s.pid_text() + "/maps").find("libquote_fix"), std::string::npos);
    EXPECT_EQ(s.hundred_quotes(), expected(false));
}

TEST_F(Patch, DifferentSignaturesAreRefusedUnlessForced) {
    Service s("patch_service");
    const auto before = text_of(s.pid(), "patch_service");
    const auto wrong = target("libquote_wrong.so");
    auto r = cli({"patch", s.pid_text(), "--function", "quote", "--with", wrong});
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("signatures differ"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("long(long)"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(" int(int, int)"), std::string::npos) << r.err;
    EXPECT_EQ(text_of(s.pid(), "patch_service"), before);
    r = cli({"patch", s.pid_text(), "--function", "quote", "--with", wrong, "--force", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(parse(r)["patched"][0]["signature_check"], "forced");
    EXPECT_EQ(cli({"patch", s.pid_text(), "--revert"}).exit_code, 0);
    EXPECT_EQ(text_of(s.pid(), "patch_service"), before);
    EXPECT_EQ(s.hundred_quotes(), expected(false));
}

TEST_F(Patch, TheFinstrumentFlowIsRefusedWithTheReason) {
    Service s("patch_service_fin");
    const auto before = text_of(s.pid(), "patch_service_fin");
    const auto r = cli({"patch", s.pid_text(), "--function", "quote", "--with", target("libquote_fix.so")});
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("-finstrument-functions"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("Rebuild"), std::string::npos) << r.err;
    EXPECT_EQ(text_of(s.pid(), "patch_service_fin"), before);
}

TEST_F(Patch, AFunctionTheRuntimeCallsIsRefused) {
    Child program({target("runtime_clash")});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto before = text_of(program.pid(), "runtime_clash");
    const auto r = cli({"patch", std::to_string(program.pid()), "--function", "close", "--with",
                        target("libquote_fix.so") + ":quote", "--force"});
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("called by the iprobe runtime"), std::string::npos) << r.err;
    EXPECT_EQ(text_of(program.pid(), "runtime_clash"), before);
    EXPECT_TRUE(program.running());
}

TEST_F(Patch, StatusListsWhatIsPatchedAfterTheToolExitsAndRevertRestoresTheCode) {
    Service s("patch_service");
    const auto before = text_of(s.pid(), "patch_service");
    auto r = cli({"patch", s.pid_text(), "--function", "quote", "--with", target("libquote_fix.so") + ":quote_v2"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("signature long(long) matches"), std::string::npos) << r.out;
    EXPECT_EQ(s.hundred_quotes(), expected(true));
    const auto st = cli({"status", s.pid_text(), "--json"});
    ASSERT_EQ(st.exit_code, 0) << st.err;
    const json doc = parse(st);
    ASSERT_EQ(doc["patched"].size(), 1u) << st.out;
    EXPECT_EQ(doc["patched"][0]["function"], "quote");
    EXPECT_EQ(doc["patched"][0]["symbol"], "quote_v2");
    EXPECT_EQ(doc["patched"][0]["library"], target("libquote_fix.so"));
    const auto text = cli({"status", s.pid_text()});
    EXPECT_NE(text.out.find("quote -> " + target("libquote_fix.so") + ":quote_v2"), std::string::npos) << text.out;
    // Two functions in one command, one stop; --revert without names puts both back.
    r = cli({"patch", s.pid_text(), "--function", "quote", "--with", target("libquote_fix.so"), "--function", "main",
             "--with", target("libquote_fix.so") + ":main_v2", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(parse(r)["patched"].size(), 2u) << r.out;
    EXPECT_EQ(parse(cli({"status", s.pid_text(), "--json"}))["patched"].size(), 2u);
    r = cli({"patch", s.pid_text(), "--revert", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(parse(r)["reverted"].size(), 2u) << r.out;
    EXPECT_EQ(text_of(s.pid(), "patch_service"), before);
    EXPECT_EQ(cli({"patch", s.pid_text(), "--function", "quote", "--with", target("libquote_fix.so"), "--function",
                   "quote", "--with", target("libquote_fix.so")})
                  .exit_code,
              2);
    // Patching again replaces the replacement.
    r = cli({"patch", s.pid_text(), "--function", "quote", "--with", target("libquote_fix.so")});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(parse(cli({"status", s.pid_text(), "--json"}))["patched"][0]["symbol"], "quote");
    r = cli({"patch", s.pid_text(), "--revert"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("reverted quote"), std::string::npos) << r.out;
    EXPECT_EQ(parse(cli({"status", s.pid_text(), "--json"}))["patched"].size(), 0u);
    EXPECT_EQ(text_of(s.pid(), "patch_service"), before);
    EXPECT_EQ(s.hundred_quotes(), expected(false));
}

TEST_F(Patch, AHundredCyclesUnderLoadEntryFlowC) {
    patch_under_load("patch_service", "patch_service", "quote", target("libquote_fix.so"), 100, true, true);
}

TEST_F(Patch, CyclesUnderLoadLlvmFlowC) {
    if (!std::filesystem::exists(target("patch_service_llvm"))) GTEST_SKIP() << "the LLVM flow is not built (no clang-14)";
    patch_under_load("patch_service_llvm", "patch_service_llvm", "quote", target("libquote_fix.so"), 20, true);
}

TEST_F(Patch, CyclesUnderLoadCxxMemberFunction) {
    patch_under_load("patch_service_cxx", "patch_service_cxx", "Pricing::quote", target("libquote_fix_cxx.so"), 20, true);
}

TEST_F(Patch, CyclesUnderLoadFunctionInASharedLibrary) {
    // libquote.so and the fix are both libraries, mapped close: a direct jmp.
    patch_under_load("patch_service_lib", "libquote.so", "quote", target("libquote_fix.so"), 20, false);
}

TEST_F(Patch, ProbesAndPatchesLiveSideBySide) {
    Service s("patch_service");
    const std::string pid = s.pid_text();
    const auto fix = target("libquote_fix.so");
    // Probes on quote: patching it is refused until they are off.
    ASSERT_EQ(cli({"attach", pid, "--functions", "quote", "--handler", "count"}).exit_code, 0);
    auto r = cli({"patch", pid, "--function", "quote", "--with", fix});
    EXPECT_EQ(r.exit_code, 6) << r.err;
    EXPECT_NE(r.err.find("detach"), std::string::npos) << r.err;
    ASSERT_EQ(cli({"detach", pid}).exit_code, 0);
    ASSERT_EQ(cli({"patch", pid, "--function", "quote", "--with", fix}).exit_code, 0);
    // Attach never writes over a patch: alone it is refused, among others skipped and said.
    r = cli({"attach", pid, "--functions", "quote", "--handler", "count"});
    EXPECT_EQ(r.exit_code, 6) << r.err;
    EXPECT_NE(r.err.find("replaced by 'iprobe patch'"), std::string::npos) << r.err;
    r = cli({"attach", pid, "--functions", "quote,serve", "--handler", "count", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(parse(r)["patched_skipped"], json::array({"quote"})) << r.out;
    // The replacement has an entry of its own: probed like any function.
    r = cli({"attach", pid, "--probes", fix, "--functions", "quote", "--handler", "count"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(s.hundred_quotes(), expected(true));
    const auto report = cli({"report", pid, "--json"});
    EXPECT_EQ(json_calls(report.out, "quote"), 100) << report.out;
    // Detaching every probe leaves the patch alone.
    ASSERT_EQ(cli({"detach", pid}).exit_code, 0);
    EXPECT_EQ(s.hundred_quotes(), expected(true));
    const auto st = parse(cli({"status", pid, "--json"}));
    EXPECT_EQ(st["patched"].size(), 1u);
    for (const auto& m : st["modules"]) EXPECT_EQ(m["foreign"], 0) << st.dump();
    ASSERT_EQ(cli({"patch", pid, "--revert", "quote"}).exit_code, 0);
    EXPECT_EQ(s.hundred_quotes(), expected(false));
}

}  // namespace
