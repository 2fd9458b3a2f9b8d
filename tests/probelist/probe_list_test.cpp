#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstring>

#include "iprobe/probelist/probe_list.h"
#include "iprobe/support/error.h"
#include "testutil.h"

namespace iprobe {
namespace {

probelist::ProbeList sample_list() {
    probelist::ProbeList list;
    list.flags = IPROBE_PL_FLAG_PIE | IPROBE_PL_FLAG_DWARF;
    list.module = "/usr/bin/service";
    list.build_id = {0xde, 0xad, 0xbe, 0xef, 0x01, 0x02};
    list.enter_target = 0x1030;
    list.exit_target = 0x1040;
    list.enter_got_slot = 0x4018;
    list.exit_got_slot = 0x4020;
    probelist::Probe exit_probe;
    exit_probe.kind = probelist::ProbeKind::exit;
    exit_probe.site = 0x1200;
    exit_probe.function_address = 0x11f0;
    exit_probe.function = "_ZN3foo3barEv";
    exit_probe.demangled = "foo::bar()";
    exit_probe.file = "src/foo.cc";
    exit_probe.line = 42;
    exit_probe.original = {0xe8, 1, 2, 3, 4};
    exit_probe.placeholder = {0x0f, 0x1f, 0x44, 0x00, 0x00};
    probelist::Probe entry_probe = exit_probe;
    entry_probe.kind = probelist::ProbeKind::entry;
    entry_probe.site = 0x11f8;
    probelist::Probe rip = exit_probe;
    rip.form = probelist::SiteForm::call_rip_indirect;
    rip.size = 6;
    rip.site = 0x2000;
    rip.function = rip.demangled = "plain_c";
    rip.file.clear();
    rip.line = 0;
    rip.shared_site = true;
    list.probes = {exit_probe, rip, entry_probe};
    list.normalize();
    return list;
}

TEST(ProbeList, NormalizeSortsBySiteAndNumbersIds) {
    const auto list = sample_list();
    ASSERT_EQ(list.probes.size(), 3u);
    EXPECT_EQ(list.probes[0].site, 0x11f8u);
    EXPECT_EQ(list.probes[1].site, 0x1200u);
    EXPECT_EQ(list.probes[2].site, 0x2000u);
    for (std::uint32_t i = 0; i < 3; ++i) EXPECT_EQ(list.probes[i].id, i);
}

TEST(ProbeList, RoundTripIsExact) {
    const auto list = sample_list();
    const auto bytes = list.serialize();
    const auto back = probelist::ProbeList::deserialize(bytes, "mem");
    EXPECT_EQ(back.serialize(), bytes);
    EXPECT_EQ(back.module, list.module);
    EXPECT_EQ(back.build_id, list.build_id);
    EXPECT_EQ(back.build_id_hex(), "deadbeef0102");
    EXPECT_EQ(back.flags, list.flags);
    EXPECT_EQ(back.enter_got_slot, 0x4018u);
    ASSERT_EQ(back.probes.size(), 3u);
    EXPECT_EQ(back.probes[1].demangled, "foo::bar()");
    EXPECT_EQ(back.probes[1].function, "_ZN3foo3barEv");
    EXPECT_EQ(back.probes[1].file, "src/foo.cc");
    EXPECT_EQ(back.probes[1].line, 42u);
    EXPECT_EQ(back.probes[1].kind, probelist::ProbeKind::exit);
    EXPECT_EQ(back.probes[2].form, probelist::SiteForm::call_rip_indirect);
    EXPECT_TRUE(back.probes[2].shared_site);
    EXPECT_FALSE(back.probes[1].shared_site);
    EXPECT_EQ(back.probes[2].size, 6);
    EXPECT_EQ(back.probes[2].file, "");
    EXPECT_EQ(back.probes[0].placeholder[0], 0x0f);
}

TEST(ProbeList, SaveAndLoadThroughFile) {
    test::TempDir dir;
    const auto list = sample_list();
    list.save(dir / "a.probes");
    EXPECT_EQ(probelist::ProbeList::load(dir / "a.probes").serialize(), list.serialize());
}

TEST(ProbeList, RejectsCorruptInput) {
    auto bytes = sample_list().serialize();
    EXPECT_THROW(probelist::ProbeList::deserialize(std::span(bytes).first(10), "short"), Error);
    auto bad_magic = bytes;
    bad_magic[0] = 'X';
    EXPECT_THROW(probelist::ProbeList::deserialize(bad_magic, "magic"), Error);
    auto bad_version = bytes;
    bad_version[8] = 99;
    try {
        probelist::ProbeList::deserialize(bad_version, "version");
        FAIL() << "version 99 accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("version 99"), std::string::npos);
        EXPECT_EQ(e.code(), ExitCode::bad_input);
    }
    auto truncated = bytes;
    truncated.resize(bytes.size() - 5);
    EXPECT_THROW(probelist::ProbeList::deserialize(truncated, "truncated"), Error);
}

// Each record field a reader acts on is checked before the list is used:
// exit 3 naming the file, the record and the field.
void expect_rejected(const std::vector<std::uint8_t>& bytes, const std::string& says) {
    try {
        probelist::ProbeList::deserialize(bytes, "app.probes");
        FAIL() << "accepted; wanted: " << says;
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::bad_input) << e.what();
        EXPECT_NE(std::string(e.what()).find("app.probes: "), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
}

iprobe_pl_record* record(std::vector<std::uint8_t>& bytes, std::size_t i) {
    return reinterpret_cast<iprobe_pl_record*>(bytes.data() + sizeof(iprobe_pl_header) + i * sizeof(iprobe_pl_record));
}
iprobe_pl_header* header(std::vector<std::uint8_t>& bytes) { return reinterpret_cast<iprobe_pl_header*>(bytes.data()); }

TEST(ProbeList, RejectsBadRecordsNamingRecordAndField) {
    const auto good = sample_list().serialize();
    auto b = good;
    record(b, 1)->id = 0xffffffff;
    expect_rejected(b, "record 1: id 4294967295");
    b = good;
    record(b, 2)->id = 0x80000003;
    expect_rejected(b, "record 2: id 2147483651");
    b = good;
    record(b, 0)->id = 1;  // a duplicate of record 1's
    expect_rejected(b, "record 0: id 1 is not its index 0");
    b = good;
    record(b, 1)->kind = 9;
    expect_rejected(b, "record 1: kind 9");
    b = good;
    record(b, 1)->site_form = 0;
    expect_rejected(b, "record 1: site_form 0");
    b = good;
    record(b, 0)->site_size = 8;
    expect_rejected(b, "record 0: site_size 8");
    b = good;
    record(b, 1)->site_address = record(b, 0)->site_address + 2;
    expect_rejected(b, "record 1: site_address overlaps record 0");
    b = good;
    record(b, 2)->site_address = ~0ull - 2;
    expect_rejected(b, "record 2: site_address wraps");
    b = good;
    record(b, 2)->source_file = 0xfffffff0;
    expect_rejected(b, "record 2: source_file");
}

TEST(ProbeList, CountsAndSizesAreBoundedByTheFile) {
    const auto good = sample_list().serialize();
    auto b = good;
    header(b)->probe_count = 0xffffffff;
    expect_rejected(b, "do not fit in the file");
    b = good;
    // count * size + offset wraps around 2^64 to a small number
    header(b)->probe_count = 0xffffffff;
    header(b)->record_size = 0xffffffff;
    expect_rejected(b, "record_size");
    b = good;
    header(b)->records_offset = ~0ull - 100;
    expect_rejected(b, "do not fit in the file");
    b = good;
    header(b)->strings_size = ~0ull;
    expect_rejected(b, "strings");
    b = good;
    header(b)->header_size = 0xffffffff;
    expect_rejected(b, "header_size");
}

TEST(ProbeList, OnlyRegularFilesAreRead) {
    test::TempDir dir;
    try {
        probelist::ProbeList::load(dir.path());
        FAIL() << "a directory was read";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::bad_input) << e.what();
        EXPECT_NE(std::string(e.what()).find("a directory"), std::string::npos) << e.what();
    }
    const std::string fifo = dir / "fifo";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    try {
        probelist::ProbeList::load(fifo);  // must not wait for a writer
        FAIL() << "a FIFO was read";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::bad_input) << e.what();
        EXPECT_NE(std::string(e.what()).find("a FIFO"), std::string::npos) << e.what();
    }
}

TEST(ProbeList, LoadsOneHundredThousandProbes) {
    probelist::ProbeList list;
    for (std::uint32_t i = 0; i < 100000; ++i) {
        probelist::Probe p;
        p.site = 0x1000 + i * 16;
        p.kind = i % 2 ? probelist::ProbeKind::exit : probelist::ProbeKind::entry;
        p.function = p.demangled = "fn_" + std::to_string(i / 2);
        list.probes.push_back(p);
    }
    list.normalize();
    const auto back = probelist::ProbeList::deserialize(list.serialize(), "big");
    ASSERT_EQ(back.probes.size(), 100000u);
    EXPECT_EQ(back.probes[99999].demangled, "fn_49999");
}

TEST(ProbeSelector, GlobsKindsAndFiles) {
    const auto list = sample_list();
    probelist::ProbeSelector by_name;
    by_name.function_globs = {"foo::*"};
    EXPECT_EQ(by_name.select(list).size(), 2u);
    probelist::ProbeSelector raw;
    raw.function_globs = {"_ZN3foo*"};
    EXPECT_EQ(raw.select(list).size(), 2u);
    probelist::ProbeSelector kinds;
    kinds.kinds = {probelist::ProbeKind::entry};
    EXPECT_EQ(kinds.select(list).size(), 1u);
    probelist::ProbeSelector files;
    files.file_globs = {"foo.cc"};
    EXPECT_EQ(files.select(list).size(), 2u);
    probelist::ProbeSelector none;
    none.function_globs = {"nothing*"};
    EXPECT_TRUE(none.select(list).empty());
    EXPECT_EQ(probelist::ProbeSelector{}.select(list).size(), 3u);
}

}  // namespace
}  // namespace iprobe
