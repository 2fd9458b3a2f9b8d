// Inputs coldpatch must refuse, each with its own clear error, leaving the
// file byte-identical; re-runs; `iprobe list` on the results.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "binary_checks.h"
#include "iprobe/probelist/probe_list.h"
#include "testutil.h"

namespace iprobe::test {
namespace {

constexpr char kProgram[] = R"(#include <stdio.h>
__attribute__((noinline)) int twice(int x) { return 2 * x; }
int main(void) { printf("%d\n", twice(21)); return 0; }
)";

void write_bytes(const std::string& path, const std::vector<std::uint8_t>& bytes) {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

bool exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

class BadInput : public ::testing::Test {
protected:
    void SetUp() override {
        std::ofstream(dir_ / "prog.c") << kProgram;
        compile(dir_.path(), "gcc -O2 -finstrument-functions prog.c -o instrumented");
        compile(dir_.path(), "gcc -O2 prog.c -o plain");
    }

    // Runs coldpatch on `file`, expects `code` and `message` in stderr, and
    // that neither the file nor a probe list changed.
    void expect_refused(const std::string& file, int code, const std::string& message) {
        const auto before = file_bytes(file);
        struct stat st_before {};
        ::stat(file.c_str(), &st_before);
        const auto r = run({bin("iprobe"), "coldpatch", file});
        EXPECT_EQ(r.exit_code, code) << r.out << r.err;
        EXPECT_NE(r.err.find(message), std::string::npos) << "stderr: " << r.err;
        EXPECT_EQ(file_bytes(file), before) << "the file changed";
        struct stat st_after {};
        ::stat(file.c_str(), &st_after);
        EXPECT_EQ(st_after.st_ino, st_before.st_ino) << "the file was replaced";
        EXPECT_FALSE(exists(file + ".probes"));
    }

    TempDir dir_;
};

TEST_F(BadInput, NotAnElfFile) {
    std::ofstream(dir_ / "script.sh") << "#!/bin/sh\necho hello\n";
    expect_refused(dir_ / "script.sh", 3, "not an ELF file");
}

TEST_F(BadInput, EmptyFile) {
    std::ofstream(dir_ / "empty");
    expect_refused(dir_ / "empty", 3, "not an ELF file");
}

TEST_F(BadInput, TruncatedElf) {
    const auto full = file_bytes(dir_ / "instrumented");
    for (const std::size_t keep : {std::size_t(10), std::size_t(64), std::size_t(700), full.size() / 2, full.size() - 100}) {
        SCOPED_TRACE("kept " + std::to_string(keep) + " bytes");
        const std::string path = dir_ / ("truncated-" + std::to_string(keep));
        write_bytes(path, std::vector<std::uint8_t>(full.begin(), full.begin() + keep));
        expect_refused(path, 3, "truncated or corrupt ELF");
    }
}

TEST_F(BadInput, CorruptSectionTable) {
    auto bytes = file_bytes(dir_ / "instrumented");
    // e_shoff (offset 0x28) pointing far past the end of the file.
    const std::uint64_t bogus = bytes.size() * 4;
    std::memcpy(bytes.data() + 0x28, &bogus, sizeof bogus);
    write_bytes(dir_ / "corrupt", bytes);
    expect_refused(dir_ / "corrupt", 3, "truncated or corrupt ELF");
}

TEST_F(BadInput, NotX86_64) {
    auto bytes = file_bytes(dir_ / "instrumented");
    bytes[18] = 183;  // e_machine = EM_AARCH64
    bytes[19] = 0;
    write_bytes(dir_ / "aarch64", bytes);
    expect_refused(dir_ / "aarch64", 3, "aarch64; iprobe handles x86-64 only");
}

TEST_F(BadInput, ClassByteOf32BitIsDescribedAsSuch) {
    auto bytes = file_bytes(dir_ / "instrumented");
    bytes[4] = 1;  // EI_CLASS = ELFCLASS32, e_machine still x86-64
    write_bytes(dir_ / "class32", bytes);
    const auto r = run({bin("iprobe"), "coldpatch", dir_ / "class32"});
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_EQ(r.err.find("is an ELF file for x86-64"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("32-bit"), std::string::npos) << r.err;
}

TEST_F(BadInput, ADirectoryIsBadInput) {
    const auto r = run({bin("iprobe"), "coldpatch", dir_.path()});
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("a directory"), std::string::npos) << r.err;
}

TEST_F(BadInput, NoPlaceholders) { expect_refused(dir_ / "plain", 3, "no placeholders"); }

TEST_F(BadInput, ObjectFileIsNotLinked) {
    compile(dir_.path(), "gcc -O2 -finstrument-functions -c prog.c -o prog.o");
    expect_refused(dir_ / "prog.o", 3, "not a linked executable or shared library");
}

TEST_F(BadInput, MissingFile) {
    const auto r = run({bin("iprobe"), "coldpatch", dir_ / "nope"});
    EXPECT_EQ(r.exit_code, 5);
    EXPECT_NE(r.err.find("nope"), std::string::npos);
}

TEST_F(BadInput, UsageErrors) {
    EXPECT_EQ(run({bin("iprobe"), "coldpatch"}).exit_code, 2);
    EXPECT_EQ(run({bin("iprobe"), "coldpatch", "--bogus", dir_ / "instrumented"}).exit_code, 2);
    EXPECT_EQ(run({bin("iprobe"), "list"}).exit_code, 2);
    EXPECT_EQ(run({bin("iprobe"), "list", dir_ / "instrumented", "--kind", "sideways"}).exit_code, 2);
    const auto help = run({bin("iprobe"), "coldpatch", "--help"});
    EXPECT_EQ(help.exit_code, 0);
    EXPECT_NE(help.out.find("usage: iprobe coldpatch FILE"), std::string::npos);
    EXPECT_EQ(file_bytes(dir_ / "instrumented"), file_bytes(dir_ / "instrumented"));
}

TEST_F(BadInput, RerunIsHarmless) {
    const std::string f = dir_ / "instrumented";
    ASSERT_EQ(::chmod(f.c_str(), 0751), 0);
    const auto first = run({bin("iprobe"), "coldpatch", f});
    ASSERT_EQ(first.exit_code, 0) << first.err;
    struct stat st {};
    ::stat(f.c_str(), &st);
    EXPECT_EQ(st.st_mode & 07777, 0751u) << "mode kept";
    const auto binary = file_bytes(f);
    const auto list = file_bytes(f + ".probes");
    const auto second = run({bin("iprobe"), "coldpatch", f});
    EXPECT_EQ(second.exit_code, 0);
    EXPECT_NE(second.out.find("already coldpatched"), std::string::npos) << second.out;
    EXPECT_NE(second.out.find("nothing to do"), std::string::npos) << second.out;
    EXPECT_EQ(file_bytes(f), binary);
    EXPECT_EQ(file_bytes(f + ".probes"), list);
    EXPECT_EQ(run({f}).out, "42\n");
}

TEST_F(BadInput, StaleProbeListOfAnotherBuildIsReplaced) {
    // A list left beside a rebuilt binary names another build-id: coldpatch
    // patches the new build and replaces the list.
    compile(dir_.path(), "gcc -O0 -finstrument-functions prog.c -o other && cp instrumented fresh");
    ASSERT_EQ(run({bin("iprobe"), "coldpatch", "-q", dir_ / "other"}).exit_code, 0);
    compile(dir_.path(), "cp other.probes fresh.probes");
    const auto r = run({bin("iprobe"), "coldpatch", dir_ / "fresh"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("coldpatched fresh"), std::string::npos);
    const probelist::ProbeList list = probelist::ProbeList::load(dir_ / "fresh.probes");
    EXPECT_EQ(list.module, "fresh");
    EXPECT_EQ(count_hook_calls(dir_ / "fresh").total(), 0);
}

TEST_F(BadInput, OutputElsewhereLeavesInputAlone) {
    const auto original = file_bytes(dir_ / "instrumented");
    const auto r = run({bin("iprobe"), "coldpatch", dir_ / "instrumented", "-o", dir_ / "patched", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("\"outcome\":\"patched\""), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"probes\":4"), std::string::npos) << r.out;
    EXPECT_EQ(file_bytes(dir_ / "instrumented"), original);
    EXPECT_FALSE(exists(dir_ / "instrumented.probes"));
    const probelist::ProbeList list = probelist::ProbeList::load(dir_ / "patched.probes");
    EXPECT_EQ(list.probes.size(), 4u);
    expect_only_sites_changed(dir_ / "instrumented", dir_ / "patched", list);
    EXPECT_EQ(run({dir_ / "patched"}).out, "42\n");
}

TEST_F(BadInput, ListShowsSelectsAndRefuses) {
    ASSERT_EQ(run({bin("iprobe"), "coldpatch", "-q", dir_ / "instrumented"}).exit_code, 0);
    const auto table = run({bin("iprobe"), "list", dir_ / "instrumented"});
    EXPECT_EQ(table.exit_code, 0);
    EXPECT_NE(table.out.find("ID     KIND"), std::string::npos) << table.out;
    const auto by_list = run({bin("iprobe"), "list", dir_ / "instrumented.probes"});
    EXPECT_EQ(by_list.out, table.out);
    EXPECT_EQ(run({bin("iprobe"), "list", dir_ / "instrumented", "--count"}).out, "4\n");
    EXPECT_EQ(run({bin("iprobe"), "list", dir_ / "instrumented", "--count", "--kind", "entry"}).out, "2\n");
    EXPECT_EQ(run({bin("iprobe"), "list", dir_ / "instrumented", "--count", "--functions", "tw*"}).out, "2\n");
    const auto json = run({bin("iprobe"), "list", dir_ / "instrumented", "--json", "--functions", "twice",
                           "--kind", "exit"});
    EXPECT_EQ(json.exit_code, 0);
    EXPECT_EQ(json.out.front(), '{');
    EXPECT_NE(json.out.find("\"selected\":1"), std::string::npos) << json.out;
    EXPECT_NE(json.out.find("\"function\":\"twice\""), std::string::npos);
    EXPECT_NE(json.out.find("\"placeholder\":\"0f1f440000\""), std::string::npos);
    EXPECT_NE(json.out.find("\"original\":\"e8"), std::string::npos);

    // Nobody prepared it: its probes come from its symbols (flow unprepared);
    // stripped of them too, it has none.
    const auto plain = run({bin("iprobe"), "list", dir_ / "plain", "--json", "--functions", "twice"});
    EXPECT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_NE(plain.out.find("\"flow\":\"unprepared\""), std::string::npos) << plain.out;
    compile(dir_.path(), "strip --strip-all plain -o stripped");
    const auto none = run({bin("iprobe"), "list", dir_ / "stripped"});
    EXPECT_EQ(none.exit_code, 3);
    EXPECT_NE(none.err.find("no probes"), std::string::npos) << none.err;
    EXPECT_EQ(run({bin("iprobe"), "list", dir_ / "missing"}).exit_code, 5);
}

}  // namespace
}  // namespace iprobe::test
