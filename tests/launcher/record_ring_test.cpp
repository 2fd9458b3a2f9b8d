// The record ring (record_ring.h) on its own: how generations are numbered
// and described on disk, what --max-size removes, and a debug session's side
// of it (SessionRecording): which generation is complete, when the ring is
// checked, what stopping a recording leaves.  No CRIU, no mirror: the
// checkpoints and inputs here are files of known sizes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "iprobe/launcher/record_ring.h"
#include "iprobe/support/error.h"
#include "testutil.h"

namespace fs = std::filesystem;
using namespace iprobe;
using namespace iprobe::launcher;
using iprobe::test::TempDir;

namespace {

void write_bytes(const std::string& path, std::size_t n) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path, std::ios::binary) << std::string(n, 'x');
}

std::string text_of(const std::string& path) {
    std::ifstream in(path);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST(RecordRing, NumbersGenerationsAndReadsBackWhatItSaved) {
    TempDir tmp;
    const std::string dir = tmp.path() + "/ring";
    RecordRing ring(dir, 1 << 20);
    GenerationInfo first = ring.begin("127.0.0.1:6379", "resp");
    EXPECT_EQ(first.generation, 1);
    EXPECT_EQ(first.dir, dir + "/gen-000001");
    EXPECT_EQ(input_path(first), dir + "/gen-000001/input.rec");
    EXPECT_EQ(checkpoint_path(first), dir + "/gen-000001/checkpoint");
    first.open_at_start = 3;
    first.complete = true;
    ring.save(first);
    const GenerationInfo second = ring.begin("127.0.0.1:6379", "resp");
    EXPECT_EQ(second.generation, 2);
    ring.save(second);

    const auto listed = list_generations(dir);
    ASSERT_EQ(listed.size(), 2u);
    EXPECT_EQ(listed[0].generation, 1);
    EXPECT_EQ(listed[0].dir, first.dir);
    EXPECT_EQ(listed[0].service, "127.0.0.1:6379");
    EXPECT_EQ(listed[0].protocol, "resp");
    EXPECT_EQ(listed[0].open_at_start, 3u);
    EXPECT_TRUE(listed[0].complete);
    EXPECT_DOUBLE_EQ(listed[0].started_at_s, first.started_at_s);
    EXPECT_EQ(listed[1].generation, 2);
    EXPECT_FALSE(listed[1].complete);
    EXPECT_EQ(listed[1].open_at_start, 0u);
    // A ring reopened numbers after the newest there.
    RecordRing again(dir, 1 << 20);
    EXPECT_EQ(again.begin("127.0.0.1:6379", "resp").generation, 3);
}

TEST(RecordRing, RefusesADirectoryHoldingOtherThings) {
    TempDir tmp;
    write_bytes(tmp.path() + "/ring/notes.txt", 1);
    try {
        RecordRing ring(tmp.path() + "/ring", 1 << 20);
        FAIL() << "a directory with other files was taken";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::bad_input);
        EXPECT_NE(std::string(e.what()).find("notes.txt"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(fs::exists(tmp.path() + "/ring/notes.txt"));
}

TEST(RecordRing, TrimRemovesTheOldestButNeverTheCurrent) {
    TempDir tmp;
    const std::string dir = tmp.path() + "/ring";
    RecordRing ring(dir, 10000);
    std::vector<GenerationInfo> gens;
    for (int i = 0; i < 3; ++i) {
        gens.push_back(ring.begin("127.0.0.1:1", "off"));
        write_bytes(input_path(gens.back()), 4000);
    }
    // 12000 bytes of input (plus no generation.json yet): the oldest goes,
    // 8000 remain, the current one alone is under the size.
    EXPECT_FALSE(ring.trim(gens[2]));
    EXPECT_FALSE(fs::exists(gens[0].dir));
    EXPECT_TRUE(fs::exists(gens[1].dir));
    EXPECT_TRUE(fs::exists(gens[2].dir));
    // The current generation alone over the size: every other goes, it stays,
    // and its recording must stop.
    write_bytes(input_path(gens[2]), 12000);
    EXPECT_TRUE(ring.trim(gens[2]));
    EXPECT_FALSE(fs::exists(gens[1].dir));
    EXPECT_TRUE(fs::exists(input_path(gens[2])));
}

TEST(SessionRecording, AGenerationIsCompleteWhenItsInputWasRecordedToItsEnd) {
    TempDir tmp;
    const std::string dir = tmp.path() + "/ring";
    SessionRecording rec(dir, 1 << 20, "10.0.0.1:80", "http");
    rec.next_generation();
    EXPECT_EQ(rec.current().generation, 1);
    EXPECT_EQ(rec.checkpoint(), dir + "/gen-000001/checkpoint");
    EXPECT_EQ(rec.input(), dir + "/gen-000001/input.rec");
    EXPECT_FALSE(rec.recording());
    rec.switched(true, 2);  // the mirror records from here; 2 connections were open
    EXPECT_TRUE(rec.recording());
    rec.save();
    rec.next_generation();  // the first closes, complete: its input ran to its end
    EXPECT_EQ(rec.current().generation, 2);
    EXPECT_EQ(rec.current().open_at_start, 0u);
    rec.switched(false, 0);  // stopped (as at --max-size)
    rec.stopped();
    rec.finish();  // not recording: the second stays incomplete

    const auto listed = list_generations(dir);
    ASSERT_EQ(listed.size(), 2u);
    EXPECT_TRUE(listed[0].complete);
    EXPECT_EQ(listed[0].open_at_start, 2u);
    EXPECT_EQ(listed[0].service, "10.0.0.1:80");
    EXPECT_EQ(listed[0].protocol, "http");
    EXPECT_FALSE(listed[1].complete);
    EXPECT_NE(text_of(dir + "/gen-000002/generation.json").find("\"complete\":false"), std::string::npos)
        << text_of(dir + "/gen-000002/generation.json");
}

TEST(SessionRecording, TheRingIsCheckedAtMostOnceASecondAndOnlyWhileRecording) {
    TempDir tmp;
    SessionRecording rec(tmp.path() + "/ring", 1000, "127.0.0.1:1", "off");
    rec.next_generation();
    write_bytes(rec.input(), 5000);
    EXPECT_FALSE(rec.over_size(5.0)) << "checked while not recording";
    rec.switched(true, 0);
    EXPECT_TRUE(rec.over_size(5.0));
    EXPECT_FALSE(rec.over_size(5.5)) << "checked twice within a second";
    EXPECT_TRUE(rec.over_size(6.0));
    rec.switched(false, 0);
    rec.stopped();
    rec.finish();
    const auto listed = list_generations(tmp.path() + "/ring");
    ASSERT_EQ(listed.size(), 1u);
    EXPECT_FALSE(listed[0].complete);
}
