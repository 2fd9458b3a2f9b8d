// iprobe-mirror: `iprobe mirror` (traffic duplicator / aggregator) and
// `iprobe replay` (feed a recording into a service).
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "iprobe/proxy/mirror.h"
#include "iprobe/proxy/replay.h"
#include "iprobe/support/error.h"
#include "iprobe/support/json.h"

using namespace iprobe;
using namespace iprobe::proxy;

namespace {

constexpr const char* kMirrorUsage = R"(usage: iprobe mirror --listen ADDR:PORT --production ADDR:PORT [--debug ADDR:PORT] [options]
       iprobe mirror --upstream ADDR:PORT --listen ADDR:PORT --debug-listen ADDR:PORT [options]

Duplicator: clients connect to --listen and are passed through to --production;
every client byte stream is also fed, through a bounded per-connection buffer,
to --debug (a debug copy of the service).  Production never waits on the debug
copy: when a connection's buffer is full, that connection's debug side is
closed and counted (never a stream with a hole), and the time until then (the
debug window) is reported.  Without --debug it is a plain proxy.

Aggregator (--upstream): placed between a service and a backend it calls.
Production's outbound connections arrive on --listen and pass through to the
backend at --upstream; the debug copy's outbound connections arrive on
--debug-listen, never reach the backend, and get production's recorded replies:
the N-th debug connection receives the N-th production connection's replies,
in order (this assumes the debug copy opens its connections in the same order
and sends the same requests; divergence checking compares its requests with
production's byte for byte).

options:
  --buffer SIZE             per-connection buffer toward the debug side (default 4M; K/M/G suffixes)
  --buffer-total SIZE       all connections together (default 1G)
  --debug-linger SECONDS    time a debug leg may take to finish after its client left (default 30)
  --divergence MODE         compare production's and the debug copy's replies:
                            off (default), stream (byte for byte), resp (per redis reply),
                            http (per HTTP/1.1 response)
  --divergence-rules FILE   leave more noise out of the comparison; one rule per line ('#' comments):
                              resp.ignore-command NAME   replies to NAME are not compared
                              http.ignore-header NAME    header NAME is left out of the comparison
                              http.ignore-body GLOB      bodies for request paths matching GLOB are not compared
                            always ignored: replies to COMMAND INFO TIME RANDOMKEY CLIENT HELLO LASTSAVE
                            SLOWLOG MEMORY LATENCY DEBUG CONFIG, and the Date header.  Replies that
                            depend on how requests of different connections interleave (INCR of a
                            key shared by clients) can differ legitimately and are reported.
  --record FILE             save every client->server stream with timestamps (zstd) for `iprobe replay`
  --stats ADDR:PORT         serve the counters as JSON (HTTP GET or any line); SIGUSR1 prints them to stderr
  --json                    ready line and final stats as JSON on stdout
  --quiet                   no log lines on stderr
  --ready-fd N              once listening, write the JSON readiness event (as with --json) to
                            file descriptor N and close it: for a supervisor waiting on a pipe

Once listening it prints one line on stdout: "listening on ADDR:PORT" (with
--json: {"event":"listening",...}); port 0 picks a free port.  SIGTERM/SIGINT
stop it cleanly; the final counters go to stderr (stdout with --json).
exit codes: 0 ok, 1 failed, 2 usage, 3 bad input, 4 permission, 5 not found, 6 busy (port in use)
)";

constexpr const char* kReplayUsage = R"(usage: iprobe replay FILE --to ADDR:PORT [--speed X] [--drain-timeout SECONDS] [--json]

Feeds a recording made by `iprobe mirror --record FILE` into a service: each
recorded client connection is opened again and its bytes are sent in order at
the recorded times scaled by --speed (default 1; 0 = as fast as possible).
Replies are read and discarded.  Order across connections follows the
timestamps only.  After the last byte it waits up to --drain-timeout (default
10) seconds for the service to answer and close each connection.
)";

[[noreturn]] void usage_error(const std::string& msg, const char* usage) {
    throw Error(msg + "\n" + std::string(usage).substr(0, std::string(usage).find('\n')) + "\n(see --help)",
                ExitCode::usage);
}

std::size_t parse_size(std::string_view text, const char* what) {
    std::size_t digits = 0;
    while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
    std::size_t mult = 1;
    const std::string_view suffix = text.substr(digits);
    if (suffix == "" || suffix == "B") mult = 1;
    else if (suffix == "K" || suffix == "k" || suffix == "KiB") mult = 1024;
    else if (suffix == "M" || suffix == "m" || suffix == "MiB") mult = 1024 * 1024;
    else if (suffix == "G" || suffix == "g" || suffix == "GiB") mult = std::size_t(1) << 30;
    else digits = 0;
    if (digits == 0 || digits > 12)
        throw Error(std::string(what) + " '" + std::string(text) + "': expected a size like 65536, 64K, 4M or 1G",
                    ExitCode::usage);
    const std::size_t v = std::stoull(std::string(text.substr(0, digits))) * mult;
    if (v == 0) throw Error(std::string(what) + " must be more than 0", ExitCode::usage);
    return v;
}

double parse_number(std::string_view text, const char* what) {
    char* end = nullptr;
    const std::string s(text);
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end || v < 0) throw Error(std::string(what) + " '" + s + "': expected a number >= 0", ExitCode::usage);
    return v;
}

int parse_ready_fd(std::string_view text) {
    const double fd = parse_number(text, "--ready-fd");
    if (fd < 3 || fd != static_cast<int>(fd) || ::fcntl(static_cast<int>(fd), F_GETFD) < 0)
        throw Error("--ready-fd " + std::string(text) + ": not an open file descriptor above 2", ExitCode::usage);
    return static_cast<int>(fd);
}

int mirror_main(int argc, char** argv) {
    MirrorOptions opt;
    bool have_listen = false;
    std::string rules_path;
    int ready_fd = -1;
    for (int i = 2; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (a == "-h" || a == "--help") {
            std::fputs(kMirrorUsage, stdout);
            return 0;
        }
        if (a == "--json") { opt.json = true; continue; }
        if (a == "--quiet") { opt.quiet = true; continue; }
        std::string_view value;
        std::string_view name = a;
        if (const auto eq = a.find('='); a.starts_with("--") && eq != std::string_view::npos) {
            name = a.substr(0, eq);
            value = a.substr(eq + 1);
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            usage_error(std::string(a).starts_with("--") ? std::string(a) + " needs a value" : "unexpected argument '" + std::string(a) + "'", kMirrorUsage);
        }
        if (name == "--listen") { opt.listen = parse_endpoint(value, "--listen"); have_listen = true; }
        else if (name == "--production") opt.production = parse_endpoint(value, "--production");
        else if (name == "--debug") opt.debug = parse_endpoint(value, "--debug");
        else if (name == "--upstream") opt.upstream = parse_endpoint(value, "--upstream");
        else if (name == "--debug-listen") opt.debug_listen = parse_endpoint(value, "--debug-listen");
        else if (name == "--stats") opt.stats = parse_endpoint(value, "--stats");
        else if (name == "--buffer") opt.buffer = parse_size(value, "--buffer");
        else if (name == "--buffer-total") opt.buffer_total = parse_size(value, "--buffer-total");
        else if (name == "--debug-linger") opt.debug_linger_s = parse_number(value, "--debug-linger");
        else if (name == "--divergence") opt.divergence = parse_protocol(value);
        else if (name == "--divergence-rules") rules_path = std::string(value);
        else if (name == "--record") opt.record_path = std::string(value);
        else if (name == "--ready-fd") ready_fd = parse_ready_fd(value);
        else usage_error("unknown option '" + std::string(name) + "'", kMirrorUsage);
    }
    if (!have_listen) usage_error("--listen is required", kMirrorUsage);
    if (opt.upstream) {
        if (opt.production || opt.debug)
            usage_error("--upstream (aggregator) does not take --production/--debug; use --listen and --debug-listen", kMirrorUsage);
        if (!opt.debug_listen) usage_error("--upstream needs --debug-listen (where the debug copy's connections arrive)", kMirrorUsage);
    } else {
        if (!opt.production) usage_error("--production is required (or --upstream for the aggregator)", kMirrorUsage);
        if (opt.debug_listen) usage_error("--debug-listen belongs to the aggregator (--upstream)", kMirrorUsage);
        if (opt.divergence != Protocol::off && !opt.debug)
            usage_error("--divergence needs --debug (a copy to compare with)", kMirrorUsage);
    }
    if (!rules_path.empty()) opt.rules = DivergenceRules::load(rules_path);

    run_mirror(opt, [&](const MirrorReady& r) {
        if (opt.json) {
            std::printf("%s\n", ready_event_json(r, ::getpid()).c_str());
        } else {
            std::printf("listening on %s", r.listen.str().c_str());
            if (r.debug_listen) std::printf(" debug-listen %s", r.debug_listen->str().c_str());
            if (r.stats) std::printf(" stats %s", r.stats->str().c_str());
            std::printf("\n");
        }
        std::fflush(stdout);
        if (ready_fd >= 0) {
            const std::string event = ready_event_json(r, ::getpid()) + "\n";
            (void)!::write(ready_fd, event.data(), event.size());
            ::close(ready_fd);
        }
    });
    return 0;
}

int replay_main(int argc, char** argv) {
    ReplayOptions opt;
    bool json = false, have_to = false;
    for (int i = 2; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (a == "-h" || a == "--help") {
            std::fputs(kReplayUsage, stdout);
            return 0;
        }
        if (a == "--json") { json = true; continue; }
        if (!a.starts_with("--")) {
            if (!opt.path.empty()) usage_error("more than one recording given", kReplayUsage);
            opt.path = std::string(a);
            continue;
        }
        if (i + 1 >= argc) usage_error(std::string(a) + " needs a value", kReplayUsage);
        const std::string_view value = argv[++i];
        if (a == "--to") { opt.to = parse_endpoint(value, "--to"); have_to = true; }
        else if (a == "--speed") opt.speed = parse_number(value, "--speed");
        else if (a == "--drain-timeout") opt.drain_timeout_s = parse_number(value, "--drain-timeout");
        else usage_error("unknown option '" + std::string(a) + "'", kReplayUsage);
    }
    if (opt.path.empty()) usage_error("no recording given", kReplayUsage);
    if (!have_to) usage_error("--to is required", kReplayUsage);
    const ReplayResult r = run_replay(opt);
    if (json) {
        JsonWriter j;
        j.begin_object();
        j.field("connections", r.connections);
        j.field("connect_failures", r.connect_failures);
        j.field("send_failures", r.send_failures);
        j.field("bytes_sent", r.bytes_sent);
        j.field("bytes_received", r.bytes_received);
        j.field("unfinished", r.unfinished);
        j.field("recorded_s", r.recorded_s);
        j.field("elapsed_s", r.elapsed_s);
        j.end_object();
        std::printf("%s\n", j.str().c_str());
    } else {
        std::printf("replayed %llu connections, %llu bytes sent, %llu bytes of replies, in %.3f s (recorded over %.3f s)\n",
                    static_cast<unsigned long long>(r.connections), static_cast<unsigned long long>(r.bytes_sent),
                    static_cast<unsigned long long>(r.bytes_received), r.elapsed_s, r.recorded_s);
    }
    if (r.connect_failures || r.send_failures) {
        std::fprintf(stderr, "iprobe replay: %llu connections could not connect to %s, %llu failed while sending\n",
                     static_cast<unsigned long long>(r.connect_failures), opt.to.str().c_str(),
                     static_cast<unsigned long long>(r.send_failures));
        return static_cast<int>(r.connect_failures == r.connections ? ExitCode::unavailable : ExitCode::failure);
    }
    if (r.unfinished) {
        std::fprintf(stderr, "iprobe replay: %llu connections were still open after the drain timeout\n",
                     static_cast<unsigned long long>(r.unfinished));
        return static_cast<int>(ExitCode::failure);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string_view cmd = argc > 1 ? argv[1] : "";
    const char* prog = cmd == "replay" ? "iprobe replay" : "iprobe mirror";
    return run_reporting_errors(prog, [&] {
        if (cmd == "mirror") return mirror_main(argc, argv);
        if (cmd == "replay") return replay_main(argc, argv);
        std::fprintf(stderr, "iprobe-mirror: run as `iprobe mirror` or `iprobe replay` (argv[1] = mirror|replay)\n");
        return static_cast<int>(ExitCode::usage);
    });
}
