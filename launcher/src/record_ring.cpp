// The record ring on disk (record_ring.h) and a debug session's side of it.
#include "iprobe/launcher/record_ring.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "iprobe/support/error.h"
#include "iprobe/support/file.h"
#include "iprobe/support/json.h"

namespace fs = std::filesystem;

namespace iprobe::launcher {
namespace {

constexpr const char* kPrefix = "gen-";

int generation_number(const fs::path& p) {
    const std::string name = p.filename().string();
    if (name.rfind(kPrefix, 0) != 0 || name.size() == 4) return 0;
    for (std::size_t i = 4; i < name.size(); ++i)
        if (name[i] < '0' || name[i] > '9') return 0;
    return std::stoi(name.substr(4));
}

std::uint64_t tree_bytes(const std::string& dir) {
    std::uint64_t total = 0;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
        std::error_code size_ec;
        if (it->is_regular_file(size_ec)) total += it->file_size(size_ec);
    }
    return total;
}

double realtime_s() {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

GenerationInfo read_generation(const fs::path& dir) {
    GenerationInfo g;
    g.dir = dir.string();
    g.generation = generation_number(dir);
    try {
        const auto bytes = read_file((dir / "generation.json").string());
        const auto doc = nlohmann::json::parse(std::string(bytes.begin(), bytes.end()));
        g.started_at_s = doc.value("started_at_s", 0.0);
        g.service = doc.value("service", "");
        g.protocol = doc.value("protocol", "off");
        g.open_at_start = doc.value("open_at_start", 0ull);
        g.complete = doc.value("complete", false);
    } catch (const std::exception& e) {
        throw Error(g.dir + "/generation.json: " + e.what(), ExitCode::bad_input);
    }
    return g;
}

}  // namespace

std::string input_path(const GenerationInfo& g) { return g.dir + "/input.rec"; }
std::string checkpoint_path(const GenerationInfo& g) { return g.dir + "/checkpoint"; }

RecordRing::RecordRing(std::string dir, std::uint64_t max_bytes) : dir_(fs::absolute(dir).string()), max_bytes_(max_bytes) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) throw Error("--record " + dir_ + ": " + ec.message(), ExitCode::bad_input);
    for (const auto& e : fs::directory_iterator(dir_))
        if (!generation_number(e.path()))
            throw Error("--record " + dir_ + " holds other things than recorded generations (" +
                            e.path().filename().string() + "); give an empty or new directory",
                        ExitCode::bad_input);
}

GenerationInfo RecordRing::begin(const std::string& service, const std::string& protocol) {
    int newest = 0;
    for (const auto& e : fs::directory_iterator(dir_)) newest = std::max(newest, generation_number(e.path()));
    char name[32];
    std::snprintf(name, sizeof name, "%s%06d", kPrefix, newest + 1);
    GenerationInfo g;
    g.generation = newest + 1;
    g.dir = dir_ + "/" + name;
    g.started_at_s = realtime_s();
    g.service = service;
    g.protocol = protocol;
    fs::create_directories(g.dir);
    return g;
}

void RecordRing::save(const GenerationInfo& g) const {
    JsonWriter j;
    j.begin_object().field("generation", g.generation).field("started_at_s", g.started_at_s);
    j.field("service", g.service).field("protocol", g.protocol).field("open_at_start", g.open_at_start);
    const std::string text = j.field("complete", g.complete).end_object().str() + "\n";
    write_file_atomic(g.dir + "/generation.json", text.data(), text.size());
}

bool RecordRing::trim(const GenerationInfo& current) {
    std::vector<std::pair<int, std::string>> gens;
    for (const auto& e : fs::directory_iterator(dir_))
        if (const int n = generation_number(e.path())) gens.emplace_back(n, e.path().string());
    std::sort(gens.begin(), gens.end());
    std::uint64_t total = 0;
    std::vector<std::uint64_t> sizes;
    for (const auto& [n, path] : gens) total += sizes.emplace_back(tree_bytes(path));
    for (std::size_t i = 0; i < gens.size() && total > max_bytes_; ++i) {
        if (gens[i].first == current.generation) continue;
        std::error_code ec;
        fs::remove_all(gens[i].second, ec);
        total -= sizes[i];
    }
    return tree_bytes(current.dir) > max_bytes_;
}

std::vector<GenerationInfo> list_generations(const std::string& dir) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw Error(dir + ": no such recording directory", ExitCode::not_found);
    std::vector<GenerationInfo> out;
    for (const auto& e : fs::directory_iterator(dir))
        if (generation_number(e.path()) && fs::exists(e.path() / "generation.json")) out.push_back(read_generation(e.path()));
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.generation < b.generation; });
    return out;
}

void SessionRecording::next_generation() {
    if (current_.generation > 0) {  // the previous generation's input ends here
        current_.complete = on_;
        ring_.save(current_);
    }
    current_ = ring_.begin(service_, protocol_);
}

void SessionRecording::switched(bool on, std::uint64_t open) {
    on_ = on;
    current_.open_at_start = open;
}

bool SessionRecording::over_size(double now_s) {
    if (!on_ || now_s - last_check_s_ < 1) return false;
    last_check_s_ = now_s;
    return ring_.trim(current_);
}

void SessionRecording::stopped() {
    current_.complete = false;
    ring_.save(current_);
}

void SessionRecording::finish() {
    if (!on_) return;
    current_.complete = true;
    ring_.save(current_);
}

}  // namespace iprobe::launcher
