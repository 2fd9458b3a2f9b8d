// The binary trace file (iprobe/hotpatch/trace_file.h), byte for byte: ring
// records as drained are written as 8-byte event words, escapes for what a
// word cannot hold, blocks per thread; the reader gives back every event;
// and the nesting (CallNesting) a reader makes of the events.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "iprobe/hotpatch/exit_marks.h"
#include "iprobe/hotpatch/output.h"
#include "iprobe/hotpatch/trace_file.h"
#include "iprobe/hotpatch/trace_reader.h"
#include "iprobe/support/error.h"
#include "testutil.h"
#include "values_reader.h"

namespace iprobe::hotpatch {
namespace {

iprobe_rt_record record(std::uint8_t kind, std::uint32_t probe, std::uint32_t tid, std::uint64_t tsc,
                        std::uint8_t nargs = 0, std::uint16_t depth = 0) {
    iprobe_rt_record r{};
    r.tsc = tsc;
    r.probe = probe;
    r.tid = tid;
    r.kind = kind;
    r.nargs = nargs;
    r.depth = depth;
    return r;
}

iprobe_rt_record words(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
    iprobe_rt_record r{};
    const std::uint64_t w[4] = {a, b, c, d};
    std::memcpy(&r, w, sizeof r);
    return r;
}

template <typename T>
void put(std::string& out, T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

std::uint64_t event_word(std::uint64_t kind, std::uint64_t probe, std::uint64_t delta) {
    return kind | probe << 2 | delta << 24;
}

void put_escape(std::string& out, const std::vector<iprobe_rt_record>& records) {
    put(out, std::uint64_t{3} | static_cast<std::uint64_t>(records.size()) << 2);
    for (const auto& r : records) out.append(reinterpret_cast<const char*>(&r), sizeof r);
}

// A trace file's header as the writer puts it, for process 4242.
std::string file_header(std::uint32_t version, const WallClock& clock) {
    std::string out("IPRBTRC1", 8);
    put(out, version);
    put(out, std::uint32_t{4242});
    put(out, clock.tsc_base);
    put(out, clock.realtime_base);
    put(out, clock.ns_per_tick);
    return out;
}

std::string file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// `ring` (a ring of mask + 1 records, read from 0) written to `path` in one
// run, process 4242, its entry probes named `functions`: the events written.
std::uint64_t write_run(const std::string& path, const std::vector<iprobe_rt_record>& ring, std::uint64_t mask,
                        const WallClock& clock, const std::vector<std::string>& functions) {
    TraceFileWriter writer(path, 4242, clock);
    writer.write({ring.data(), mask, 0, ring.size(), true, 0});
    std::vector<ProbeInfo> probes;
    for (const std::string& f : functions) probes.push_back({f, f, "", 0, probelist::ProbeKind::entry, ""});
    writer.finish(probes);
    return writer.events();
}

struct Expected {
    std::uint32_t tid, probe;
    probelist::ProbeKind kind;
    std::uint64_t tsc;
    std::uint16_t depth = 0;
    std::uint8_t nargs = 0;
    std::uint64_t args[4] = {0, 0, 0, 0};
};

TEST(TraceFile, RecordsBecomeEventWordsAndEscapesByteForByteAndReadBackWhole) {
    constexpr auto entry = IPROBE_RT_REC_ENTRY, exit = IPROBE_RT_REC_EXIT, point = IPROBE_RT_REC_POINT;
    // Ring 0, thread 100: plain events, a point whose argument record comes
    // in the ring's next run, a nested handler's event.
    std::vector<iprobe_rt_record> ring0 = {
        record(entry, 5, 100, 1000), record(exit, 6, 100, 1100), record(point, 7, 100, 1150, 4),
        words(1, 2, 3, 4),           record(entry, 5, 100, 1200, 0, 1), record(exit, 5, 100, 1300),
        record(entry, 9, 100, 1400), record(exit, 9, 100, 1500)};
    // Ring 1, thread 200: a clock step back, an entry with values (its two
    // continuation records passed over), a probe index beyond 22 bits, a
    // delta beyond 40 bits, then a point cut off from its argument record.
    std::vector<iprobe_rt_record> ring1 = {
        record(entry, 1, 200, 900),  record(exit, 1, 200, 800),        record(entry, 2, 200, 850, 2),
        words(7, 7, 7, 7),           words(8, 8, 8, 8),                record(entry, 1u << 22, 200, 860),
        record(exit, 3, 200, 860 + (1ull << 40)), record(point, 4, 200, 870 + (1ull << 40), 4)};
    const WallClock clock{1000, 5'000'000'000ull, 0.5};
    test::TempDir dir;
    const std::string path = dir / "t.trace";
    {
        TraceFileWriter writer(path, 4242, clock);
        writer.write({ring0.data(), 7, 0, 3, false, 0});  // the point's arguments: next run
        writer.write({ring0.data(), 7, 3, 8, true, 0});
        writer.write({ring1.data(), 7, 0, 8, true, 1});   // the last point's arguments never come
        writer.write({ring0.data(), 7, 0, 2, true, 0});   // ring 0 again, a new block
        EXPECT_EQ(writer.events(), 7u + 6u + 2u);
        EXPECT_EQ(writer.values_events(), 1u);
        EXPECT_EQ(writer.values_bytes(), 8u * 11);
        writer.finish({{"five", "five", "", 0, probelist::ProbeKind::entry, ""},
                       {"six", "six", "", 0, probelist::ProbeKind::exit, ""}});
    }

    std::string want = file_header(kTraceFileVersion, clock);
    // block: thread 100
    put(want, std::uint32_t{100});
    put(want, std::uint32_t{5 + 9 + 5});  // 5 event words, an escape of 2 records, one of 1
    put(want, std::uint64_t{1000});
    put(want, event_word(0, 5, 0));
    put(want, event_word(1, 6, 100));
    put_escape(want, {ring0[2], ring0[3]});
    put_escape(want, {ring0[4]});
    put(want, event_word(1, 5, 100));
    put(want, event_word(0, 9, 100));
    put(want, event_word(1, 9, 100));
    // block: thread 200
    put(want, std::uint32_t{200});
    put(want, std::uint32_t{1 + 4 * 5 + 11});
    put(want, std::uint64_t{900});
    put(want, event_word(0, 1, 0));
    put_escape(want, {ring1[1]});
    // the entry with values: head (2 records, 8 words), probe, delta, its words
    put(want, std::uint64_t{3} | std::uint64_t{2} << 12 | std::uint64_t{8} << 20);
    put(want, std::uint64_t{2});
    put(want, std::uint64_t{50});
    for (std::uint64_t w : {7, 7, 7, 7, 8, 8, 8, 8}) put(want, w);
    put_escape(want, {ring1[5]});
    put_escape(want, {ring1[6]});
    iprobe_rt_record without_args = ring1[7];
    without_args.nargs = 0;
    put_escape(want, {without_args});
    // block: thread 100 again
    put(want, std::uint32_t{100});
    put(want, std::uint32_t{2});
    put(want, std::uint64_t{1000});
    put(want, event_word(0, 5, 0));
    put(want, event_word(1, 6, 100));
    const std::uint64_t table_at = want.size();
    put(want, std::uint32_t{2});
    put(want, std::uint8_t{0});
    put(want, std::uint16_t{4});
    want += "five";
    put(want, std::uint8_t{1});
    put(want, std::uint16_t{3});
    want += "six";
    put(want, std::uint32_t{0});  // types: nothing typed (the writer had no ValueTypes)
    put(want, std::uint32_t{0});
    put(want, std::uint32_t{0});
    put(want, table_at);
    want += "IPRBEND1";
    ASSERT_EQ(file_bytes(path), want);

    using K = probelist::ProbeKind;
    std::vector<Expected> expected = {
        {100, 5, K::entry, 1000},      {100, 6, K::exit, 1100},
        {100, 7, K::point, 1150, 0, 4, {1, 2, 3, 4}},
        {100, 5, K::entry, 1200, 1},   {100, 5, K::exit, 1300},
        {100, 9, K::entry, 1400},      {100, 9, K::exit, 1500},
        {200, 1, K::entry, 900},       {200, 1, K::exit, 800},
        {200, 2, K::entry, 850},       {200, 1u << 22, K::entry, 860},
        {200, 3, K::exit, 860 + (1ull << 40)}, {200, 4, K::point, 870 + (1ull << 40)},
        {100, 5, K::entry, 1000},      {100, 6, K::exit, 1100}};
    TraceFileReader file(path);
    EXPECT_EQ(file.pid(), 4242);
    ASSERT_EQ(file.probes().size(), 2u);
    EXPECT_EQ(file.probes()[1].function, "six");
    EXPECT_EQ(file.probes()[1].kind, K::exit);
    std::vector<Event> got;
    while (file.next([&](const Event& e) { got.push_back(e); })) {
    }
    ASSERT_EQ(got.size(), expected.size());
    for (std::size_t i = 0; i < got.size(); i++) {
        SCOPED_TRACE("event " + std::to_string(i));
        EXPECT_EQ(got[i].tid, expected[i].tid);
        EXPECT_EQ(got[i].probe, expected[i].probe);
        EXPECT_EQ(got[i].kind, expected[i].kind);
        EXPECT_EQ(got[i].tsc, expected[i].tsc);
        EXPECT_EQ(got[i].time_ns, clock.ns(expected[i].tsc));
        EXPECT_EQ(got[i].depth, expected[i].depth);
        EXPECT_EQ(got[i].nargs, expected[i].nargs);
        for (int a = 0; a < 4; a++) EXPECT_EQ(got[i].args[a], expected[i].args[a]);
    }
}

// Where a ring dropped events (a GAP record, count in `frame`) and an
// entry whose exit is not traced (a point at an entry probe; with values,
// an entry whose spec says IPROBE_RT_VALUES_NO_EXIT): the file keeps the
// GAP raw, counts no event for it and gives its count to the thread's next
// event; both entries read back as entries that open no call, and the
// nesting starts afresh after the gap.
TEST(TraceFile, AGapAndEntriesWithoutTheirExitReadBackAsTheRuntimeMeantThem) {
    iprobe_rt_record gap = record(IPROBE_RT_REC_GAP, 0, 100, 1100);
    gap.frame = 42;
    iprobe_rt_record no_exit = record(IPROBE_RT_REC_ENTRY, 0, 100, 1300);
    no_exit.values = IPROBE_RT_VALUES_NO_EXIT;
    std::vector<iprobe_rt_record> ring = {record(IPROBE_RT_REC_ENTRY, 1, 100, 1000), gap,
                                          record(IPROBE_RT_REC_POINT, 0, 100, 1200), no_exit,
                                          record(IPROBE_RT_REC_ENTRY, 1, 100, 1400)};
    const WallClock clock{1000, 5'000'000'000ull, 0.5};
    test::TempDir dir;
    const std::string path = dir / "gap.trace";
    EXPECT_EQ(write_run(path, ring, 7, clock, {"leaf", "work"}), 4u) << "the GAP is not an event";
    std::string want;
    put(want, event_word(0, 1, 0));
    put_escape(want, {gap});
    put(want, event_word(2, 0, 100));  // the point at leaf's entry probe: one word
    const std::string bytes = file_bytes(path);
    EXPECT_NE(bytes.find(want), std::string::npos) << "entry, raw GAP, point word";
    TraceFileReader file(path);
    std::vector<Event> got;
    while (file.next([&](const Event& e) { got.push_back(e); })) {
    }
    ASSERT_EQ(got.size(), 4u);
    EXPECT_EQ(got[0].dropped_before, 0u);
    EXPECT_TRUE(got[0].exit_traced);
    EXPECT_EQ(got[1].dropped_before, 42u);
    for (const std::size_t i : {1, 2}) {
        SCOPED_TRACE("event " + std::to_string(i));
        EXPECT_EQ(got[i].kind, probelist::ProbeKind::entry);
        EXPECT_FALSE(got[i].exit_traced);
    }
    EXPECT_EQ(got[2].dropped_before, 0u);
    EXPECT_TRUE(got[3].exit_traced);
    // nesting: work open, then the gap (work may have ended): leaf, leaf
    // at depth 0 opening nothing, then work at depth 0
    CallNesting nesting;
    std::vector<TraceRecord> shown;
    for (const Event& e : got) nesting.records(e, file.probes()[e.probe], [&](const TraceRecord& r) { shown.push_back(r); });
    ASSERT_EQ(shown.size(), 4u);
    EXPECT_EQ(shown[1].dropped_before, 42u);
    for (const std::size_t i : {1, 2, 3}) EXPECT_EQ(shown[i].depth, 0) << i;
    EXPECT_FALSE(shown[1].exit_traced);
    EXPECT_TRUE(shown[3].exit_traced);
}

std::vector<Event> events_of(const std::string& path);

// Exits recorded without a time (attach --no-durations: tsc
// IPROBE_RT_NO_TIME) are words whose ticks say so, and the block's clock
// stays where it was: the entry after them counts its ticks from the last
// stamped event.  One the word cannot hold (a nested handler's) is escaped
// raw, a GAP before one keeps the clock too, and a block may start with
// one.  Read back: each in its place, not stamped; the nesting closes the
// calls they end and puts them at their thread's latest time, and the text
// shows "-" where the time goes.
TEST(TraceFile, ExitsWithoutATimeKeepTheirPlaceAndTheClockStays) {
    iprobe_rt_record gap = record(IPROBE_RT_REC_GAP, 0, 100, IPROBE_RT_NO_TIME);
    gap.frame = 3;
    const iprobe_rt_record nested_exit = record(IPROBE_RT_REC_EXIT, 1, 100, IPROBE_RT_NO_TIME, 0, 1);
    std::vector<iprobe_rt_record> ring = {record(IPROBE_RT_REC_ENTRY, 0, 100, 1000),
                                          record(IPROBE_RT_REC_ENTRY, 1, 100, 1100),
                                          record(IPROBE_RT_REC_EXIT, 1, 100, IPROBE_RT_NO_TIME),
                                          record(IPROBE_RT_REC_EXIT, 0, 100, IPROBE_RT_NO_TIME),
                                          record(IPROBE_RT_REC_ENTRY, 1, 100, 1300),
                                          gap,
                                          nested_exit,
                                          record(IPROBE_RT_REC_EXIT, 1, 200, IPROBE_RT_NO_TIME),
                                          record(IPROBE_RT_REC_ENTRY, 0, 200, 1400)};
    const WallClock clock{1000, 5'000'000'000ull, 0.5};
    test::TempDir dir;
    const std::string path = dir / "unstamped.trace";
    EXPECT_EQ(write_run(path, ring, 15, clock, {"outer", "inner"}), 8u) << "the GAP is not an event";
    constexpr std::uint64_t kNoTime = (1ull << 40) - 1;
    std::string want;
    put(want, std::uint32_t{100});
    put(want, std::uint32_t{5 + 5 + 5});
    put(want, std::uint64_t{1000});
    put(want, event_word(0, 0, 0));
    put(want, event_word(0, 1, 100));
    put(want, event_word(1, 1, kNoTime));
    put(want, event_word(1, 0, kNoTime));
    put(want, event_word(0, 1, 200));  // from 1100: the clock stayed
    put_escape(want, {gap});
    put_escape(want, {nested_exit});
    put(want, std::uint32_t{200});
    put(want, std::uint32_t{2});
    put(want, std::uint64_t{1300});  // a block opened by an exit without a time: the clock so far
    put(want, event_word(1, 1, kNoTime));
    put(want, event_word(0, 0, 100));
    const std::string bytes = file_bytes(path);
    EXPECT_EQ(bytes.substr(40, want.size()), want) << "the blocks, byte for byte";
    TraceFileReader file(path);
    std::vector<Event> got;
    while (file.next([&](const Event& e) { got.push_back(e); })) {
    }
    ASSERT_EQ(got.size(), 8u);
    const bool stamped[] = {true, true, false, false, true, false, false, true};
    const std::uint64_t tsc[] = {1000, 1100, 0, 0, 1300, 0, 0, 1400};
    for (std::size_t i = 0; i < got.size(); i++) {
        SCOPED_TRACE("event " + std::to_string(i));
        EXPECT_EQ(got[i].stamped, stamped[i]);
        EXPECT_EQ(got[i].tsc, tsc[i]);
        EXPECT_EQ(got[i].time_ns, stamped[i] ? clock.ns(tsc[i]) : 0);
    }
    EXPECT_EQ(got[5].dropped_before, 3u);
    EXPECT_EQ(got[5].depth, 1u);
    CallNesting nesting;
    std::vector<TraceRecord> shown;
    for (const Event& e : got) nesting.records(e, file.probes()[e.probe], [&](const TraceRecord& r) { shown.push_back(r); });
    ASSERT_EQ(shown.size(), 8u);
    const int depth[] = {0, 1, 1, 0, 0, 0, 0, 0};
    for (std::size_t i = 0; i < shown.size(); i++) {
        SCOPED_TRACE("record " + std::to_string(i));
        EXPECT_EQ(shown[i].stamped, stamped[i]);
        EXPECT_EQ(shown[i].depth, depth[i]);
    }
    EXPECT_EQ(shown[2].time_ns, clock.ns(1100)) << "the latest time of its thread";
    EXPECT_EQ(shown[3].time_ns, clock.ns(1100));
    EXPECT_EQ(shown[6].time_ns, 0u) << "thread 200 had no time yet";
    EXPECT_TRUE(std::regex_search(trace_text_line(shown[2]), std::regex("^ {10}-     100   <- inner\n$")))
        << trace_text_line(shown[2]);
    std::ostringstream json;
    make_output(OutputFormat::json, json)->trace(shown[2]);
    EXPECT_NE(json.str().find("\"stamped\":false"), std::string::npos) << json.str();
}

// A version 5 file's exit word with 2^40 - 1 ticks was a time: read as one.
TEST(TraceFile, AVersion5ExitWithTheLongestDeltaIsStamped) {
    const WallClock clock{1000, 5'000'000'000ull, 0.5};
    std::string v5 = file_header(5, clock);
    put(v5, std::uint32_t{100});
    put(v5, std::uint32_t{1});
    put(v5, std::uint64_t{1000});
    put(v5, event_word(1, 0, (1ull << 40) - 1));
    const std::uint64_t table_at = v5.size();
    put(v5, std::uint32_t{1});
    put(v5, std::uint8_t{0});
    put(v5, std::uint16_t{4});
    v5 += "five";
    for (int i = 0; i < 3; i++) put(v5, std::uint32_t{0});  // no types
    put(v5, table_at);
    v5 += "IPRBEND1";
    test::TempDir dir;
    const std::string path = dir / "v5.trace";
    std::ofstream(path, std::ios::binary) << v5;
    const std::vector<Event> got = events_of(path);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_TRUE(got[0].stamped);
    EXPECT_EQ(got[0].tsc, 1000 + (1ull << 40) - 1);
}

// Two GAPs of one thread in a row add up (the event after the first was
// dropped too), go to that thread's next event only, once; another
// thread's GAP replaces a count its owner never got to.
TEST(TraceFile, APendingGapGoesToItsOwnersNextEventOnce) {
    PendingGap gap;
    gap.add(100, 42);
    gap.add(100, 3);
    EXPECT_EQ(gap.take(200), 0u);
    EXPECT_EQ(gap.take(100), 45u);
    EXPECT_EQ(gap.take(100), 0u);
    gap.add(100, 5);
    gap.add(200, 7);
    EXPECT_EQ(gap.take(100), 0u);
    EXPECT_EQ(gap.take(200), 7u);
}

// Where a detach lost exits (an exit mark): the file keeps the mark raw in
// a block of its own, no event; reading back, it goes to its thread's first
// event at or after its instant (not to one recorded before it and written
// after: that thread was inside its handler at the stop), once, naming its
// function; the nesting closes that many of the function's open calls, the
// innermost first, and says so once.  Version 4 (no marks) still reads; a
// mark in a version 4 file is refused.
TEST(TraceFile, AnExitMarkIsKeptAndClosesItsCallsBeforeItsThreadsNextEvent) {
    constexpr auto entry = IPROBE_RT_REC_ENTRY, exit = IPROBE_RT_REC_EXIT;
    // probes: 0 leaf's entry, 1 leaf's exit, 2 work's entry, 3 work's exit
    // ring 0: two records drained before the detach's marks, four after
    std::vector<iprobe_rt_record> ring = {record(entry, 2, 100, 1000), record(entry, 0, 100, 1100),
                                          record(entry, 0, 100, 1140), record(entry, 0, 100, 1200),
                                          record(exit, 1, 100, 1300),  record(exit, 3, 100, 1400)};
    std::vector<iprobe_rt_record> other = {record(entry, 0, 200, 1160), record(exit, 1, 200, 1170)};
    const ExitMark mark{100, 1, 1150, 2};
    const WallClock clock{1000, 5'000'000'000ull, 0.5};
    test::TempDir dir;
    const std::string path = dir / "marks.trace";
    {
        TraceFileWriter writer(path, 4242, clock);
        writer.write({ring.data(), 7, 0, 2, true, 0});
        writer.mark(mark);
        writer.write({other.data(), 7, 0, other.size(), true, 1});
        writer.write({ring.data(), 7, 2, ring.size(), true, 0});
        EXPECT_EQ(writer.events(), 8u) << "the mark is not an event";
        writer.finish({{"leaf", "leaf", "", 0, probelist::ProbeKind::entry, ""},
                       {"leaf", "leaf", "", 0, probelist::ProbeKind::exit, ""},
                       {"work", "work", "", 0, probelist::ProbeKind::entry, ""},
                       {"work", "work", "", 0, probelist::ProbeKind::exit, ""}});
    }
    iprobe_rt_record raw = record(IPROBE_RT_REC_EXITS_LOST, 1, 100, 1150);
    raw.frame = 2;
    std::string want;
    put(want, std::uint32_t{100});
    put(want, std::uint32_t{5});
    put(want, std::uint64_t{1150});
    put_escape(want, {raw});
    const std::string bytes = file_bytes(path);
    EXPECT_NE(bytes.find(want), std::string::npos) << "the mark's block";

    auto read = [](const std::string& file) {
        TraceFileReader reader(file);
        std::vector<Event> got;
        while (reader.next([&](const Event& e) { got.push_back(e); })) {
        }
        return got;
    };
    const std::vector<Event> got = read(path);
    ASSERT_EQ(got.size(), 8u);
    for (std::size_t i = 0; i < got.size(); i++)
        EXPECT_EQ(got[i].exits_lost_before.empty(), got[i].tsc != 1200) << "event " << i << " at " << got[i].tsc;
    const Event& next = got[5];  // thread 200's two came between
    ASSERT_EQ(next.tsc, 1200u);
    ASSERT_EQ(next.exits_lost_before.size(), 1u);
    EXPECT_EQ(next.exits_lost_before[0], (LostExits{"leaf", 2, clock.ns(1150)}));

    // work, leaf and leaf (the one in its handler at the stop) open; the
    // two leaf calls closed: the next leaf nests in work, as it ran
    CallNesting nesting;
    const std::vector<ProbeInfo> probes = {{"leaf", "leaf", "", 0, probelist::ProbeKind::entry, ""},
                                           {"leaf", "leaf", "", 0, probelist::ProbeKind::exit, ""},
                                           {"work", "work", "", 0, probelist::ProbeKind::entry, ""},
                                           {"work", "work", "", 0, probelist::ProbeKind::exit, ""}};
    std::string text;
    for (const Event& e : got)
        if (e.tid == 100)
            nesting.records(e, probes[e.probe], [&](const TraceRecord& r) {
                // without the time and thread columns
                static const std::regex head("(^|\n)[0-9]+\\.[0-9]{9} +[0-9]+ ");
                text += std::regex_replace(trace_text_line(r), head, "$1");
                if (r.exits_lost_before) {
                    EXPECT_EQ(r.exits_closed, (std::vector<std::string>{"leaf", "leaf"}));
                    EXPECT_EQ(r.exits_lost_ns, clock.ns(1150));
                }
            });
    EXPECT_EQ(text,
              "-> work\n"
              "  -> leaf\n"
              "    -> leaf\n"
              "-- 2 calls in flight lost their exit at a detach --\n"
              "  -> leaf\n"
              "  <- leaf\n"
              "<- work\n");

    // version 4: the same without the mark reads; with it, refused
    std::string v4 = bytes;
    v4[8] = 4;
    const std::size_t mark_at = v4.find(want);
    std::string unmarked = v4.substr(0, mark_at) + v4.substr(mark_at + want.size());
    std::uint64_t table_at;
    std::memcpy(&table_at, unmarked.data() + unmarked.size() - 16, 8);
    table_at -= want.size();
    std::memcpy(unmarked.data() + unmarked.size() - 16, &table_at, 8);
    std::ofstream(dir / "v4.trace", std::ios::binary) << unmarked;
    const std::vector<Event> old = read(dir / "v4.trace");
    ASSERT_EQ(old.size(), 8u);
    for (const Event& e : old) EXPECT_TRUE(e.exits_lost_before.empty());
    std::ofstream(dir / "v4-marked.trace", std::ios::binary) << v4;
    try {
        read(dir / "v4-marked.trace");
        ADD_FAILURE() << "a mark in a version 4 file was read";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("event kind 6"), std::string::npos) << e.what();
    }
}

// The queue a detacher writes and a reader takes (rt_layout.h): marks come
// out oldest first, once; a full queue coalesces, into the newest mark of
// the same thread (its function named only when both name the same), else
// two marks of one thread, else the two oldest: every count is kept.  A
// queue being written is not taken.
TEST(ExitMarks, AFullQueueCoalescesAndNeverDropsACount) {
    iprobe_rt_exit_marks queue{};
    EXPECT_TRUE(take_exit_marks(queue).empty());
    add_exit_marks(queue, std::vector<ExitMark>{{7, 1, 100, 1}, {7, 3, 100, 2}});
    EXPECT_EQ(take_exit_marks(queue), (std::vector<ExitMark>{{7, 1, 100, 1}, {7, 3, 100, 2}}));
    EXPECT_TRUE(take_exit_marks(queue).empty()) << "taken once";

    std::vector<ExitMark> many;
    for (std::uint64_t i = 0; i < IPROBE_RT_EXIT_MARKS; i++) many.push_back({7, 1, 200 + i, 1});
    add_exit_marks(queue, many);
    add_exit_marks(queue, std::vector<ExitMark>{{7, 1, 300, 5}, {7, 9, 301, 6}});
    std::vector<ExitMark> got = take_exit_marks(queue);
    ASSERT_EQ(got.size(), std::size_t{IPROBE_RT_EXIT_MARKS});
    EXPECT_EQ(got.back(), (ExitMark{7, IPROBE_RT_EXIT_MARK_ANY, 301, 1 + 5 + 6}));
    std::uint64_t total = 0;
    for (const ExitMark& m : got) total += m.count;
    EXPECT_EQ(total, IPROBE_RT_EXIT_MARKS + 5u + 6u);

    // full of other threads' marks: two of one thread become one
    many.clear();
    for (std::uint32_t i = 0; i < IPROBE_RT_EXIT_MARKS; i++) many.push_back({i % 2 ? 20 + i : 10u, 1, 400u + i, 1});
    add_exit_marks(queue, many);
    add_exit_marks(queue, std::vector<ExitMark>{{99, 1, 500, 3}});
    got = take_exit_marks(queue);
    ASSERT_EQ(got.size(), std::size_t{IPROBE_RT_EXIT_MARKS});
    EXPECT_EQ(got.front(), (ExitMark{21, 1, 401, 1})) << "thread 10's first two are one now";
    EXPECT_EQ(got[1], (ExitMark{10, 1, 402, 2}));
    EXPECT_EQ(got.back(), (ExitMark{99, 1, 500, 3}));

    add_exit_marks(queue, std::vector<ExitMark>{{7, 1, 600, 1}});
    queue.state |= IPROBE_RT_EXIT_MARKS_WRITING;
    EXPECT_TRUE(take_exit_marks(queue).empty()) << "a detacher is writing";
    add_exit_marks(queue, std::vector<ExitMark>{{7, 1, 700, 1}});  // the next detacher takes it over
    EXPECT_EQ(take_exit_marks(queue).size(), 2u);

    PendingExitMarks pending;
    pending.add({7, 1, 100, 1});
    pending.add({8, 1, 100, 1});
    pending.add({7, 3, 200, 2});
    EXPECT_TRUE(pending.take(7, 99).empty()) << "recorded before the stop";
    EXPECT_EQ(pending.take(7, 150), (std::vector<ExitMark>{{7, 1, 100, 1}}));
    EXPECT_EQ(pending.take(7, 200), (std::vector<ExitMark>{{7, 3, 200, 2}}));
    EXPECT_FALSE(pending.empty());
    EXPECT_EQ(pending.take(8, 1000).size(), 1u);
    EXPECT_TRUE(pending.empty());
}

// A lost call below calls still open (their exits on): only it is closed;
// a mark naming more than one function closes the innermost calls.
TEST(CallNesting, AnExitMarkClosesItsFunctionsCallsWhereverTheyAreOpen) {
    auto event = [](probelist::ProbeKind kind, std::uint64_t tsc) {
        Event e;
        e.tid = 1;
        e.kind = kind;
        e.tsc = tsc;
        e.time_ns = tsc;
        return e;
    };
    const ProbeInfo a{"a", "a", "", 0, probelist::ProbeKind::entry, ""}, f{"f", "f", "", 0, probelist::ProbeKind::entry, ""},
        h{"h", "h", "", 0, probelist::ProbeKind::entry, ""};
    CallNesting nesting;
    std::vector<TraceRecord> shown;
    const auto sink = [&](const TraceRecord& r) { shown.push_back(r); };
    nesting.records(event(probelist::ProbeKind::entry, 1), a, sink);
    nesting.records(event(probelist::ProbeKind::entry, 2), f, sink);
    nesting.records(event(probelist::ProbeKind::entry, 3), h, sink);
    Event exit_h = event(probelist::ProbeKind::exit, 5);
    exit_h.exits_lost_before = {{"f", 1, 4}};
    nesting.records(exit_h, h, sink);
    ASSERT_EQ(shown.size(), 4u);
    EXPECT_EQ(shown[3].exits_lost_before, 1u);
    EXPECT_EQ(shown[3].exits_closed, std::vector<std::string>{"f"});
    EXPECT_EQ(shown[3].depth, 1) << "h's exit, inside a";
    Event next = event(probelist::ProbeKind::entry, 7);
    next.exits_lost_before = {{"", 5, 6}};  // more than asked are open: all of them
    nesting.records(next, h, sink);
    EXPECT_EQ(shown[4].exits_closed, std::vector<std::string>{"a"});
    EXPECT_EQ(shown[4].exits_lost_before, 5u);
    EXPECT_EQ(shown[4].depth, 0);
}

// A version 2 file (the previous iprobe's: version 3 without values events
// and without the types table) still reads, event for event.
TEST(TraceFile, ReadsAVersion2File) {
    const iprobe_rt_record nested = record(IPROBE_RT_REC_ENTRY, 5, 100, 1200, 0, 1);
    const WallClock clock{1000, 5'000'000'000ull, 0.5};
    std::string v2 = file_header(2, clock);
    put(v2, std::uint32_t{100});
    put(v2, std::uint32_t{2 + 5});
    put(v2, std::uint64_t{1000});
    put(v2, event_word(0, 5, 0));
    put(v2, event_word(1, 6, 100));
    put_escape(v2, {nested});
    const std::uint64_t table_at = v2.size();
    put(v2, std::uint32_t{1});
    put(v2, std::uint8_t{0});
    put(v2, std::uint16_t{4});
    v2 += "five";
    put(v2, table_at);
    v2 += "IPRBEND1";
    test::TempDir dir;
    const std::string path = dir / "v2.trace";
    std::ofstream(path, std::ios::binary) << v2;
    TraceFileReader file(path);
    EXPECT_EQ(file.pid(), 4242);
    ASSERT_EQ(file.probes().size(), 1u);
    EXPECT_EQ(file.probes()[0].function, "five");
    std::vector<Event> got;
    while (file.next([&](const Event& e) { got.push_back(e); })) {
    }
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[0].probe, 5u);
    EXPECT_EQ(got[0].tsc, 1000u);
    EXPECT_EQ(got[1].kind, probelist::ProbeKind::exit);
    EXPECT_EQ(got[1].tsc, 1100u);
    EXPECT_EQ(got[2].tsc, 1200u);
    EXPECT_EQ(got[2].depth, 1u);
    EXPECT_EQ(got[2].time_ns, clock.ns(1200));
}

// An inlined copy's entry (IPROBE_RT_VALUES_COPY in the spec it was recorded
// under) is escaped whole, so the file keeps what nests it in its host.
TEST(TraceFile, KeepsAnInlinedCopysEntryAsOne) {
    iprobe_rt_record copy = record(IPROBE_RT_REC_ENTRY, 1, 100, 1000, 1);
    copy.values = IPROBE_RT_VALUES_AT_SITE | IPROBE_RT_VALUES_COPY | IPROBE_RT_VALUES_ARGS;
    copy.frame = 0x7ffc0000;
    iprobe_rt_record host = record(IPROBE_RT_REC_ENTRY, 0, 100, 900, 1);
    host.values = IPROBE_RT_VALUES_AT_SITE | IPROBE_RT_VALUES_HOOK | IPROBE_RT_VALUES_ARGS;
    host.frame = 0x7ffc0000;
    std::vector<iprobe_rt_record> ring = {host, words(5, 0, 0, 0), copy, words(6, 0, 0, 0)};
    test::TempDir dir;
    const std::string path = dir / "t.trace";
    {
        TraceFileWriter writer(path, 4242, WallClock{0, 0, 1});
        writer.write({ring.data(), 3, 0, 4, true, 0});
        writer.finish({});
    }
    TraceFileReader file(path);
    std::vector<Event> got;
    while (file.next([&](const Event& e) { got.push_back(e); })) {
    }
    ASSERT_EQ(got.size(), 2u);
    EXPECT_FALSE(got[0].inlined_copy);
    EXPECT_TRUE(got[1].inlined_copy);
    EXPECT_EQ(got[1].frame, 0x7ffc0000u);
}

// The nesting of a thread's calls by their frames (the return slots): an
// inlined copy's entry has its host's and nests in the call open there; a
// new call at an open call's frame ends it (and what is open above it),
// unwound; an exit at a frame ends only calls below it.
TEST(CallNesting, InlinedCopiesNestInTheirHostsFrameANewCallThereUnwindsIt) {
    using K = probelist::ProbeKind;
    CallNesting nesting;
    std::vector<TraceRecord> out;
    auto event = [&](K kind, std::uint64_t frame, bool copy, const std::string& function) {
        Event e;
        e.tid = 7;
        e.kind = kind;
        e.frame = frame;
        e.inlined_copy = copy;
        nesting.records(e, ProbeInfo{function, function, "", 0, kind, ""}, [&](const TraceRecord& r) { out.push_back(r); });
    };
    constexpr std::uint64_t host = 0x7000, callee = 0x6f00;
    event(K::entry, host, false, "host");
    event(K::entry, host, true, "copy");     // inlined into host
    event(K::entry, host, true, "inner");    // inlined into the copy
    event(K::entry, callee, false, "leaf");  // a real call
    event(K::exit, callee, false, "leaf");
    event(K::exit, host, false, "inner");
    event(K::exit, host, false, "copy");
    event(K::exit, host, false, "host");
    event(K::entry, host, false, "host");
    event(K::entry, host, true, "copy");
    event(K::entry, host, false, "host");  // host again where it was (a longjmp): both gone
    struct Want {
        K kind;
        const char* function;
        int depth;
        bool unwound;
    };
    const std::vector<Want> want = {
        {K::entry, "host", 0, false}, {K::entry, "copy", 1, false}, {K::entry, "inner", 2, false},
        {K::entry, "leaf", 3, false}, {K::exit, "leaf", 3, false},  {K::exit, "inner", 2, false},
        {K::exit, "copy", 1, false},  {K::exit, "host", 0, false},  {K::entry, "host", 0, false},
        {K::entry, "copy", 1, false}, {K::exit, "copy", 1, true},   {K::exit, "host", 0, true},
        {K::entry, "host", 0, false}};
    ASSERT_EQ(out.size(), want.size());
    for (std::size_t i = 0; i < want.size(); i++) {
        SCOPED_TRACE("record " + std::to_string(i));
        EXPECT_EQ(out[i].kind, want[i].kind);
        EXPECT_EQ(out[i].function, want[i].function);
        EXPECT_EQ(out[i].depth, want[i].depth);
        EXPECT_EQ(out[i].unwound, want[i].unwound);
    }
}

// A block's word count beyond the file, an escape cut by its block's end,
// an escaped record of no known kind: refused, one line, not half-read.
TEST(TraceFile, RefusesCorruptBlocks) {
    const WallClock clock{0, 0, 1};
    test::TempDir dir;
    const std::string path = dir / "t.trace";
    std::vector<iprobe_rt_record> ring = {record(IPROBE_RT_REC_ENTRY, 1, 7, 10), record(IPROBE_RT_REC_EXIT, 1, 7, 20, 0, 1)};
    {
        TraceFileWriter writer(path, 1, clock);
        writer.write({ring.data(), 1, 0, 2, true, 0});
        writer.finish({});
    }
    const std::string good = file_bytes(path);
    auto refused = [&](std::string bytes, const std::string& says) {
        std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
        try {
            TraceFileReader file(path);
            while (file.next([](const Event&) {})) {
            }
            ADD_FAILURE() << "not refused: " << says;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
            EXPECT_EQ(e.code(), ExitCode::bad_input);
        }
    };
    constexpr std::size_t block = 40, words = block + 4, escape_record = block + 16 + 8 + 8;
    std::string bytes = good;
    bytes[words] = 9;  // 9 words where 5 are
    refused(bytes, "corrupt trace file");
    bytes = good;
    bytes[words] = 4;  // the escape's record runs past the block's end
    refused(bytes, "escaped record");
    bytes = good;
    bytes[escape_record + offsetof(iprobe_rt_record, kind)] = 9;
    refused(bytes, "event kind 9");
}

// A process's types, as a test gives them: probe 0 an entry whose function
// takes an int, a string, a struct, an enum and a double and returns a long;
// probe 1 its exit.  Counts what it is asked.
struct TestTypes final : ValueTypes {
    elf::FunctionValues f;
    int functions = 0, frames = 0;
    TestTypes() {
        auto slot = [](const std::string& name, elf::ValueType t, bool vector, std::uint8_t reg) {
            elf::ValueSlot v;
            v.name = name;
            v.type = std::move(t);
            v.parts.push_back({vector, reg});
            return v;
        };
        elf::ValueType point{"struct point", elf::ValueClass::structure, 8, {}, {}};
        point.members.push_back({"x", 0, std::make_shared<const elf::ValueType>(elf::ValueType{"int", elf::ValueClass::signed_int, 4, {}, {}})});
        point.members.push_back({"y", 4, std::make_shared<const elf::ValueType>(elf::ValueType{"int", elf::ValueClass::signed_int, 4, {}, {}})});
        f.params = {slot("n", {"int", elf::ValueClass::signed_int, 4, {}, {}}, false, 0),
                    slot("s", {"const char*", elf::ValueClass::string, 8, {}, {}}, false, 1),
                    slot("p", point, false, 2),
                    slot("c", {"enum color", elf::ValueClass::enumeration, 4, {{0, "RED"}, {1, "GREEN"}}, {}}, false, 3),
                    slot("d", {"double", elf::ValueClass::floating, 8, {}, {}}, true, 0)};
        elf::ValueSlot k;
        k.name = "k";
        k.type = {"int", elf::ValueClass::signed_int, 4, {}, {}};
        k.constant = 5;
        f.params.push_back(k);
        f.ret = slot("", {"long", elf::ValueClass::signed_int, 8, {}, {}}, false, 0);
        f.typed = true;
    }
    bool knows(std::uint32_t probe) override { return probe < 2; }
    std::uint32_t entry_distance(std::uint32_t) override { return 1; }
    const elf::FunctionValues& function(std::uint32_t) override {
        functions++;
        return f;
    }
    std::uint64_t site(std::uint32_t probe) override { return 0x1000 + probe; }
    Frame symbolize(std::uint64_t address) override {
        frames++;
        return {address, "caller_" + std::to_string(address), "main.c", static_cast<std::uint32_t>(address % 1000)};
    }
};

std::vector<Event> events_of(const std::string& path) {
    TraceFileReader file(path);
    std::vector<Event> got;
    while (file.next([&](const Event& e) { got.push_back(e); })) {
    }
    return got;
}

// Values events keep their words (trailing zeros left out) and the file
// keeps what typing them takes: read back, each is what decode_values()
// makes of the ring's words with the process's types, whether its records
// came in one run or two; one cut off by what the ring had published has
// none, as live.
TEST(TraceFile, ValuesEventsReadBackTypedAsTheLiveReaderTypesThem) {
    constexpr auto entry = IPROBE_RT_REC_ENTRY, exit = IPROBE_RT_REC_EXIT;
    iprobe_rt_values_spec args{};
    args.flags = IPROBE_RT_VALUES_ARGS | IPROBE_RT_VALUES_BACKTRACE;
    args.gprs = 4;
    args.xmms = 1;
    args.strings = 1u << 1;
    args.backtrace = 3;
    iprobe_rt_values_spec ret{};
    ret.flags = IPROBE_RT_VALUES_RETVAL;
    double d = 2.5;
    std::uint64_t d_bits;
    std::memcpy(&d_bits, &d, 8);
    char text[64] = "user:42";
    std::vector<std::uint64_t> entry_words = {10, 0x5000, std::uint64_t{4} << 32 | 3, 1, d_bits, 8};
    for (int i = 0; i < 8; i++) {
        std::uint64_t w;
        std::memcpy(&w, text + 8 * i, 8);
        entry_words.push_back(w);
    }
    for (std::uint64_t w : {2, 0x401234, 0x405678}) entry_words.push_back(w);
    entry_words.resize(20, 0);  // 5 records
    const std::vector<std::uint64_t> exit_words = {55, 0xdead, 0xbeef, 0};  // rdx, xmm0: what a long return leaves there
    auto head = [](std::uint8_t kind, std::uint32_t probe, std::uint64_t tsc, std::uint8_t nargs, const iprobe_rt_values_spec& spec) {
        iprobe_rt_record r = record(kind, probe, 100, tsc, nargs);
        r.values = IPROBE_RT_VALUES_PACK(spec);
        r.frame = 0x7ffc1000;
        return r;
    };
    std::vector<iprobe_rt_record> ring = {head(entry, 0, 1000, 5, args)};
    for (std::size_t i = 0; i < 20; i += 4)
        ring.push_back(words(entry_words[i], entry_words[i + 1], entry_words[i + 2], entry_words[i + 3]));
    ring.push_back(head(exit, 1, 1300, 1, ret));
    ring.push_back(words(55, 0xdead, 0xbeef, 0));
    ring.push_back(head(entry, 0, 1400, 5, args));  // its records never published
    TestTypes types;
    test::TempDir dir;
    const std::string path = dir / "t.trace";
    {
        TraceFileWriter writer(path, 4242, WallClock{0, 0, 1}, &types);
        writer.write({ring.data(), 15, 0, 3, false, 0});  // the entry's values go on in the next run
        writer.write({ring.data(), 15, 3, 9, true, 0});
        EXPECT_EQ(writer.values_events(), 3u);
        EXPECT_EQ(writer.values_bytes(), 8u * (4 + 17) + 8u * (4 + 1) + 8u * 4) << "trailing zeros and return words the type does not use left out";
        writer.finish({});
    }
    EXPECT_EQ(types.frames, 2) << "each backtrace address symbolized once";
    const std::vector<Event> got = events_of(path);
    ASSERT_EQ(got.size(), 3u);
    Event want_entry;
    want_entry.kind = probelist::ProbeKind::entry;
    want_entry.probe = 0;
    decode_values(want_entry, IPROBE_RT_VALUES_PACK(args), entry_words, types);
    Event want_exit;
    want_exit.kind = probelist::ProbeKind::exit;
    want_exit.probe = 1;
    decode_values(want_exit, IPROBE_RT_VALUES_PACK(ret), exit_words, types);
    ASSERT_TRUE(want_entry.has_values);
    ASSERT_EQ(want_entry.values.size(), 6u);
    EXPECT_EQ(want_entry.values[1].text, "\"user:42\"");
    EXPECT_EQ(want_entry.values[2].text, "{x = 3, y = 4}");
    EXPECT_EQ(want_entry.values[3].text, "GREEN");
    EXPECT_EQ(want_entry.values[4].text, "2.5");
    EXPECT_EQ(want_entry.backtrace.size(), 2u);
    ASSERT_TRUE(want_exit.retval);
    EXPECT_EQ(want_exit.retval->text, "55");
    EXPECT_TRUE(got[0].has_values);
    EXPECT_EQ(got[0].values, want_entry.values);
    EXPECT_EQ(got[0].backtrace, want_entry.backtrace);
    EXPECT_EQ(got[0].frame, 0x7ffc1000u);
    EXPECT_EQ(got[0].tsc, 1000u);
    EXPECT_TRUE(got[1].has_values);
    EXPECT_EQ(got[1].retval, want_exit.retval);
    EXPECT_EQ(got[1].tsc, 1300u);
    EXPECT_FALSE(got[2].has_values);  // cut off: no words, as live
    EXPECT_TRUE(got[2].values.empty());
    EXPECT_EQ(got[2].tsc, 1400u);
    EXPECT_EQ(got[2].frame, 0x7ffc1000u);
}

// A file of another version is refused naming both; a values event cut by
// its block's end, or a types table cut short, is refused as corrupt.
TEST(TraceFile, RefusesOtherVersionsAndCorruptValues) {
    iprobe_rt_values_spec ret{};
    ret.flags = IPROBE_RT_VALUES_RETVAL;
    iprobe_rt_record exit = record(IPROBE_RT_REC_EXIT, 1, 7, 20, 1);
    exit.values = IPROBE_RT_VALUES_PACK(ret);
    std::vector<iprobe_rt_record> ring = {exit, words(55, 0, 0, 0)};
    TestTypes types;
    test::TempDir dir;
    const std::string path = dir / "t.trace";
    {
        TraceFileWriter writer(path, 1, WallClock{0, 0, 1}, &types);
        writer.write({ring.data(), 1, 0, 2, true, 0});
        writer.finish({});
    }
    const std::string good = file_bytes(path);
    ASSERT_EQ(events_of(path).size(), 1u);
    auto refused = [&](const std::string& bytes, const std::string& says) {
        std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
        try {
            events_of(path);
            ADD_FAILURE() << "not refused: " << says;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
            EXPECT_EQ(e.code(), ExitCode::bad_input);
        }
    };
    std::string bytes = good;
    bytes[8] = 1;
    refused(bytes, "trace file version 1, but this iprobe reads versions 2 to 6 (written by an older iprobe");
    bytes[8] = 7;
    refused(bytes, "trace file version 7, but this iprobe reads versions 2 to 6 (written by a newer iprobe");
    bytes[8] = 2;  // version 2 has no values events
    refused(bytes, "a values event in a version 2 file");
    constexpr std::size_t block = 40, count = block + 4;
    bytes = good;
    bytes[count] = 3;  // the values event's head, probe and delta, not its word
    refused(bytes, "values event");
    refused(good.substr(0, good.size() - 20), "ends early");
    // the types table cut: the footer moved down over it
    bytes = good.substr(0, good.size() - 16 - 4);
    bytes += good.substr(good.size() - 16);
    refused(bytes, "corrupt trace file");
}

}  // namespace
}  // namespace iprobe::hotpatch
