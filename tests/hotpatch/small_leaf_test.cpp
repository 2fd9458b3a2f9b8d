// The entry flow's pad threshold: iprobe-cc leaves a small function without a
// pad (its NOP would be a large share of each call) and lists it as a
// relocated entry, so no probe is lost: counted exactly beside a padded
// function, and detach restores the code byte for byte.  --pad-threshold=0
// pads every function.  targets/small_leaf_target.c.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "hotpatch_fixture.h"
#include "iprobe/elf/elf_file.h"

namespace iprobe::test {
namespace {

constexpr long kCalls = 100000;
constexpr std::uint8_t kNop5[5] = {0x0f, 0x1f, 0x44, 0x00, 0x00};
constexpr std::uint8_t kEndbr64[4] = {0xf3, 0x0f, 0x1e, 0xfa};

// The first 5 bytes of `function` in the file, after an endbr64.
std::vector<std::uint8_t> entry_bytes(const std::string& binary, const std::string& function) {
    const elf::ElfFile elf(binary);
    for (const elf::ElfSymbol& s : elf.symbols()) {
        if (s.name != function || !s.defined()) continue;
        const auto offset = elf.file_offset(s.address);
        if (!offset) break;
        const std::uint8_t* at = elf.bytes().data() + *offset;
        if (std::memcmp(at, kEndbr64, sizeof kEndbr64) == 0) at += sizeof kEndbr64;
        return {at, at + 5};
    }
    ADD_FAILURE() << function << " not found in " << binary;
    return {};
}

bool is_pad(const std::vector<std::uint8_t>& bytes) {
    return bytes.size() == 5 && std::equal(bytes.begin(), bytes.end(), kNop5);
}

// "relocated_entry" of the entry probe of `function` in `iprobe list --json`.
std::string relocated_field(const std::string& json, const std::string& function) {
    const auto at = json.find("\"function\":\"" + function + "\"");
    if (at == std::string::npos) return "absent";
    const auto object = json.rfind('{', at);
    const auto field = json.find("\"relocated_entry\":", object);
    if (field == std::string::npos || field > at) return "absent";
    return json.substr(field + 18, json.compare(field + 18, 4, "true") == 0 ? 4 : 5);
}

class SmallLeafTest : public ::testing::Test {
protected:
    const std::string unpadded_ = targets_dir() + "/small_leaf_target";
    const std::string padded_ = targets_dir() + "/small_leaf_padded";
};

TEST_F(SmallLeafTest, TheSmallLeafHasNoPadTheBigFunctionHasOne) {
    EXPECT_FALSE(is_pad(entry_bytes(unpadded_, "small_leaf"))) << "a small leaf gets no pad by default";
    EXPECT_TRUE(is_pad(entry_bytes(unpadded_, "big_function")));
    auto r = iprobe({"list", unpadded_, "--json", "--functions", "small_leaf,big_function", "--kind", "entry"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(relocated_field(r.out, "small_leaf"), "true") << r.out;
    EXPECT_EQ(relocated_field(r.out, "big_function"), "false") << r.out;
    EXPECT_NE(r.out.find("\"refused_by_reason\":{}"), std::string::npos) << "no function of it is refused: " << r.out;
}

TEST_F(SmallLeafTest, PadThresholdZeroPadsEveryFunction) {
    EXPECT_TRUE(is_pad(entry_bytes(padded_, "small_leaf")));
    EXPECT_TRUE(is_pad(entry_bytes(padded_, "big_function")));
    auto r = iprobe({"list", padded_, "--json", "--functions", "small_leaf,big_function", "--kind", "entry"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(relocated_field(r.out, "small_leaf"), "false") << r.out;
    EXPECT_EQ(relocated_field(r.out, "big_function"), "false") << r.out;
}

TEST_F(SmallLeafTest, BadThresholdIsAUsageError) {
    TempDir dir;
    auto r = run({bin("iprobe-cc"), "--pad-threshold=some", "-O2", "-o", dir / "x",
                  source_dir() + "/tests/hotpatch/targets/small_leaf_target.c"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--pad-threshold"), std::string::npos) << r.err;
}

class SmallLeafAttach : public SmallLeafTest {
protected:
    void SetUp() override {
        if (!is_root()) GTEST_SKIP() << "needs root (ptrace of any process, /run/iprobe)";
    }
};

TEST_F(SmallLeafAttach, CountsBothExactlyThenDetachRestoresTheCode) {
    for (const std::string& binary : {unpadded_, padded_}) {
        SCOPED_TRACE(binary);
        HpTarget target(1, binary);
        const std::string pid = std::to_string(target.pid());
        const std::string name = binary.substr(binary.rfind('/'));
        const auto text_before = text_of(target.pid(), name);
        ASSERT_FALSE(text_before.empty());
        ASSERT_EQ(text_before, file_text_of(target.pid(), name));

        auto a = iprobe({"attach", pid, "--functions", "small_leaf,big_function", "--handler", "count", "--completed"});
        ASSERT_EQ(a.exit_code, 0) << a.err;
        EXPECT_NE(a.out.find("enabled 4 probes"), std::string::npos) << a.out;
        EXPECT_NE(text_of(target.pid(), name), text_before) << "the sites are live";
        EXPECT_EQ(target.command("calls " + std::to_string(kCalls)), kCalls);
        auto r = iprobe({"report", pid, "--json"});
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(json_calls(r.out, "small_leaf"), kCalls) << r.out;
        EXPECT_EQ(json_completed(r.out, "small_leaf"), kCalls) << r.out;
        EXPECT_EQ(json_calls(r.out, "big_function"), kCalls) << r.out;
        EXPECT_EQ(json_completed(r.out, "big_function"), kCalls) << r.out;

        auto d = iprobe({"detach", pid});
        ASSERT_EQ(d.exit_code, 0) << d.err;
        EXPECT_EQ(text_of(target.pid(), name), text_before) << "code differs after detach";
        EXPECT_EQ(target.command("calls 1000"), 1000) << "runs on after detach";
    }
}

// The list given as a file (iprobe run --probes, the corpus's wrappers): the
// moved bytes come from the running module's file.
TEST_F(SmallLeafAttach, ProbeListGivenAsAFileStillRelocates) {
    HpTarget target(1, unpadded_);
    const std::string pid = std::to_string(target.pid());
    auto a = iprobe({"attach", pid, "--probes", unpadded_ + ".probes", "--functions", "small_leaf", "--handler", "count"});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(target.command("calls 1000"), 1000);
    auto r = iprobe({"report", pid, "--json"});
    EXPECT_EQ(json_calls(r.out, "small_leaf"), 1000) << r.out;
    ASSERT_EQ(iprobe({"detach", pid}).exit_code, 0);
}

}  // namespace
}  // namespace iprobe::test
