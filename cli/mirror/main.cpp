// iprobe-mirror: `iprobe mirror` (traffic duplicator / aggregator) and
// `iprobe replay` (feed a recording into a service).
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "iprobe/proxy/mirror.h"
#include "iprobe/proxy/replay.h"
#include "iprobe/support/args.h"
#include "iprobe/support/error.h"
#include "iprobe/support/json.h"
#include "iprobe/support/number.h"

using namespace iprobe;
using namespace iprobe::proxy;

namespace {

const ArgSpec kMirrorSpec(
    "iprobe mirror",
    "usage: iprobe mirror --listen ADDR:PORT --production ADDR:PORT [--debug ADDR:PORT] [options]\n"
    "       iprobe mirror --capture [IFACE:]PORT --debug ADDR:PORT [options]\n"
    "       iprobe mirror --upstream ADDR:PORT --listen ADDR:PORT --debug-listen ADDR:PORT [options]",
    "Duplicator: clients connect to --listen and are passed through to --production;\n"
    "every client byte stream is also fed, through a bounded per-connection buffer,\n"
    "to --debug (a debug copy of the service).  Production never waits on the debug\n"
    "copy: when a connection's buffer is full, that connection's debug side is\n"
    "closed and counted (never a stream with a hole), and the time until then (the\n"
    "debug window) is reported.  Without --debug it is a plain proxy.\n"
    "\n"
    "Capture (--capture): nothing is put in production's path.  Its traffic on\n"
    "PORT is captured off interface IFACE (default any; the kernel's TPACKET_V3\n"
    "ring and a BPF filter, through libpcap), every TCP connection is rebuilt in\n"
    "both directions (reordering, retransmissions, overlaps, sequence wrap), and\n"
    "each client connection gets its own connection to --debug, fed the client's\n"
    "bytes; the copy's replies are compared with production's captured replies.\n"
    "Connections already open are joined at their next request (--join).  When\n"
    "the capture loses a connection's bytes (its ring was full: the receiver\n"
    "acknowledged bytes the capture never saw), that connection's debug side is\n"
    "closed and counted.  Needs root or CAP_NET_RAW.\n"
    "\n"
    "Aggregator (--upstream): placed between a service and a backend it calls.\n"
    "Production's outbound connections arrive on --listen and pass through to the\n"
    "backend at --upstream; the debug copy's outbound connections arrive on\n"
    "--debug-listen, never reach the backend, and get production's recorded replies:\n"
    "the N-th debug connection receives the N-th production connection's replies,\n"
    "in order (this assumes the debug copy opens its connections in the same order\n"
    "and sends the same requests; divergence checking compares its requests with\n"
    "production's byte for byte).",
    {
        {"--listen", "ADDR:PORT", "where clients (or, as aggregator, production's outbound connections) connect"},
        {"--production", "ADDR:PORT", "the real service"},
        {"--capture", "[IFACE:]PORT", "capture production's traffic on PORT off IFACE (default any)\n"
                                      "instead of proxying it (no --listen, no --production); without\n"
                                      "--debug or --record it only follows the connections (--stats)"},
        {"--capture-buffer", "SIZE", "the kernel's capture ring (default 32M): what a stalled mirror\n"
                                     "may fall behind before the capture loses packets"},
        {"--join", "PROTOCOL", "join connections already open at their next request: resp, http,\n"
                               "or off (only connections whose SYN is captured); default: the\n"
                               "--divergence protocol when it is resp or http, else off"},
        {"--debug", "ADDR:PORT", "a debug copy fed a copy of every client stream; repeat for\n"
                                 "several copies, each fed the whole stream through a buffer of its own"},
        {"--upstream", "ADDR:PORT", "aggregator: the backend production calls"},
        {"--debug-listen", "ADDR:PORT", "aggregator: where the debug copy's outbound connections arrive"},
        {"--buffer", "SIZE", "per-connection buffer toward the debug side (default 4M; K/M/G suffixes)"},
        {"--buffer-total", "SIZE", "all connections together (default 1G)"},
        {"--debug-linger", "SECONDS", "time a debug leg may take to finish after its client left (default 30)"},
        {"--divergence", "MODE", "compare production's and the debug copy's replies:\n"
                                 "off (default), stream (byte for byte), resp (per redis reply),\n"
                                 "http (per HTTP/1.1 response)"},
        {"--divergence-rules", "FILE", "leave more noise out of the comparison; one rule per line ('#' comments):\n"
                                       "  resp.ignore-command NAME   replies to NAME are not compared\n"
                                       "  http.ignore-header NAME    header NAME is left out of the comparison\n"
                                       "  http.ignore-body GLOB      bodies for request paths matching GLOB are not compared\n"
                                       "always ignored: replies to COMMAND INFO TIME RANDOMKEY CLIENT HELLO LASTSAVE\n"
                                       "SLOWLOG MEMORY LATENCY DEBUG CONFIG, and the Date header.  Replies that\n"
                                       "differ only as another interleaving of concurrent connections would\n"
                                       "make them (INCR of a key shared by clients) are counted reordered,\n"
                                       "apart from divergence (proxy/README.md)."},
        {"--every-difference", "", "with --divergence: report every reply that differs (up to 100), not only\n"
                                   "each connection's first (what `iprobe debug --patch` shows)"},
        {"--record", "FILE", "save every client->server stream and production's replies with\n"
                             "timestamps (zstd) for `iprobe replay`"},
        {"--stats", "ADDR:PORT", "serve the counters as JSON (HTTP GET or any line); SIGUSR1 prints them to stderr"},
        {"--json", "", "ready line and final stats as JSON on stdout"},
        {"--quiet", "", "no log lines on stderr"},
        {"--ready-fd", "N", "once listening, write the JSON readiness event (as with --json) to\n"
                            "file descriptor N and close it: for a supervisor waiting on a pipe"},
        {"--control-fd", "N", "a socket on which a supervisor sends commands, one JSON line each,\n"
                              "answered on it: {\"command\":\"record\",\"path\":FILE} records the\n"
                              "connections opened from then on into FILE (\"\" stops recording);\n"
                              "with --hold, {\"command\":\"checkpoint\"} (production frozen now) and\n"
                              "{\"command\":\"release\"} (the clone is ready)"},
        {"--hold", "", "capture: keep every connection's bytes, feeding no copy yet, until\n"
                       "the release command; the checkpoint command marks, from production's\n"
                       "sockets, the first request each connection's copy must start at\n"
                       "(how `iprobe debug --capture` gives its clone every write)"},
        {"--hook-socket", "PATH", "a Unix socket taking the same commands as --control-fd (the CRIU\n"
                                  "post-dump hook sends checkpoint there)"},
    },
    "Once listening it prints one line on stdout: \"listening on ADDR:PORT\" (with\n"
    "--json: {\"event\":\"listening\",...}); port 0 picks a free port.  SIGTERM/SIGINT\n"
    "stop it cleanly; the final counters go to stderr (stdout with --json).\n"
    "exit codes: 0 ok, 1 failed, 2 usage, 3 bad input, 4 permission, 5 not found, 6 busy (port in use)");

const ArgSpec kReplaySpec(
    "iprobe replay",
    "usage: iprobe replay FILE --to ADDR:PORT [--speed X] [--drain-timeout SECONDS] [--compare MODE] [--json]",
    "Feeds a recording made by `iprobe mirror --record FILE` into a service: each\n"
    "recorded client connection is opened again and its bytes are sent in order at\n"
    "the recorded times scaled by --speed (default 1; 0 = as fast as possible).\n"
    "Replies are read; with --compare they are compared with production's replies\n"
    "as recorded (how faithful the replay was), else discarded.  With --compare\n"
    "resp or http, requests go in production's order across connections: each\n"
    "once the other connections' earlier requests were answered, and a difference\n"
    "only another order of requests concurrent at production explains is counted\n"
    "reordered; otherwise order across connections follows the timestamps only.\n"
    "After the last byte it waits up to --drain-timeout (default\n"
    "10) seconds for the service to answer and close each connection.",
    {
        {"--to", "ADDR:PORT", "the service to feed"},
        {"--speed", "X", "time scale of the recorded gaps (default 1; 0 = as fast as possible)"},
        {"--drain-timeout", "SECONDS", "how long to wait for replies after the last byte (default 10)"},
        {"--compare", "MODE", "compare the replies with the recorded ones: resp, http, stream or off\n"
                              "(default); exit 1 when any differ"},
        {"--divergence-rules", "FILE", "leave more noise out of the comparison (as `iprobe mirror`)"},
        {"--every-difference", "", "with --compare: report every reply that differs (up to 100), not only\n"
                                   "each connection's first"},
        {"--json", "", "the result as JSON on stdout"},
    });


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

int parse_control_fd(std::string_view text) {
    const int fd = parse_ready_fd(text);
    int type = 0;
    socklen_t len = sizeof type;
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM)
        throw Error("--control-fd " + std::string(text) + ": not a stream socket (use a socketpair)", ExitCode::usage);
    return fd;
}

int mirror_main(int argc, char** argv) {
    const auto parsed = kMirrorSpec.parse_or_print_help(argc, argv, 2);
    if (!parsed) return 0;
    const ParsedArgs& a = *parsed;
    if (!a.positionals().empty()) kMirrorSpec.fail("unexpected argument '" + a.positionals().front() + "'");
    MirrorOptions opt;
    opt.json = a.has("--json");
    opt.quiet = a.has("--quiet");
    const auto endpoint = [&](const char* name) -> std::optional<Endpoint> {
        if (!a.has(name)) return std::nullopt;
        return parse_endpoint(a.value(name), name);
    };
    if (a.has("--capture")) {
        opt.capture = parse_capture_spec(a.value("--capture"), "--capture");
        if (a.has("--listen") || a.has("--production") || a.has("--upstream") || a.has("--debug-listen"))
            kMirrorSpec.fail("--capture takes no --listen, --production, --upstream or --debug-listen: nothing is in production's path");
        if (a.has("--capture-buffer")) opt.capture->ring = parse_size_or_usage(a.value("--capture-buffer"), "--capture-buffer");
    } else {
        for (const char* name : {"--capture-buffer", "--join"})
            if (a.has(name)) kMirrorSpec.fail(std::string(name) + " belongs to --capture");
        if (!a.has("--listen")) kMirrorSpec.fail("--listen is required (or --capture)");
        opt.listen = *endpoint("--listen");
    }
    opt.production = endpoint("--production");
    for (const auto& d : a.values("--debug")) opt.debug.push_back(parse_endpoint(d, "--debug"));
    opt.upstream = endpoint("--upstream");
    opt.debug_listen = endpoint("--debug-listen");
    opt.stats = endpoint("--stats");
    if (a.has("--buffer")) opt.buffer = parse_size_or_usage(a.value("--buffer"), "--buffer");
    if (a.has("--buffer-total")) opt.buffer_total = parse_size_or_usage(a.value("--buffer-total"), "--buffer-total");
    if (a.has("--debug-linger")) opt.debug_linger_s = parse_number(a.value("--debug-linger"), "--debug-linger");
    if (a.has("--divergence")) opt.divergence = parse_protocol(a.value("--divergence"));
    const std::string rules_path = a.value("--divergence-rules");
    opt.record_path = a.value("--record");
    const int ready_fd = a.has("--ready-fd") ? parse_ready_fd(a.value("--ready-fd")) : -1;
    if (a.has("--control-fd")) opt.control_fd = parse_control_fd(a.value("--control-fd"));
    opt.hold = a.has("--hold");
    opt.hook_socket = a.value("--hook-socket");
    if (opt.hold && !opt.capture) kMirrorSpec.fail("--hold is for --capture (a proxy holds nothing back)");
    if (opt.capture) {
        if (a.has("--join")) {
            const std::string join = a.value("--join");
            if (join != "resp" && join != "http" && join != "off")
                kMirrorSpec.fail("--join '" + join + "': expected resp, http or off");
            opt.capture->join = parse_protocol(join);
        } else if (opt.divergence == Protocol::resp || opt.divergence == Protocol::http) {
            opt.capture->join = opt.divergence;
        }
        if (opt.divergence != Protocol::off && opt.debug.empty())
            kMirrorSpec.fail("--divergence needs --debug (a copy to compare with)");
        if (opt.debug.empty() && opt.record_path.empty())
            kMirrorSpec.fail("--capture needs --debug ADDR:PORT (the copy that gets the captured traffic) or --record FILE");
    } else if (opt.upstream) {
        if (opt.production || !opt.debug.empty())
            kMirrorSpec.fail("--upstream (aggregator) does not take --production/--debug; use --listen and --debug-listen");
        if (!opt.debug_listen) kMirrorSpec.fail("--upstream needs --debug-listen (where the debug copy's connections arrive)");
    } else {
        if (!opt.production) kMirrorSpec.fail("--production is required (or --upstream for the aggregator)");
        if (opt.debug_listen) kMirrorSpec.fail("--debug-listen belongs to the aggregator (--upstream)");
        if (opt.divergence != Protocol::off && opt.debug.empty())
            kMirrorSpec.fail("--divergence needs --debug (a copy to compare with)");
    }
    if (!rules_path.empty()) opt.rules = DivergenceRules::load(rules_path);
    opt.rules.every_difference = a.has("--every-difference");

    run_mirror(opt, [&](const MirrorReady& r) {
        if (opt.json) {
            std::printf("%s\n", ready_event_json(r, ::getpid()).c_str());
        } else {
            if (r.listen) std::printf("listening on %s", r.listen->str().c_str());
            else std::printf("capturing on %s", r.capture.c_str());
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
    const auto parsed = kReplaySpec.parse_or_print_help(argc, argv, 2);
    if (!parsed) return 0;
    const ParsedArgs& a = *parsed;
    ReplayOptions opt;
    const bool json = a.has("--json");
    if (a.positionals().empty()) kReplaySpec.fail("no recording given");
    if (a.positionals().size() > 1) kReplaySpec.fail("more than one recording given");
    opt.path = a.positionals().front();
    if (!a.has("--to")) kReplaySpec.fail("--to is required");
    opt.to = parse_endpoint(a.value("--to"), "--to");
    if (a.has("--speed")) opt.speed = parse_number(a.value("--speed"), "--speed");
    if (a.has("--drain-timeout")) opt.drain_timeout_s = parse_number(a.value("--drain-timeout"), "--drain-timeout");
    if (a.has("--compare")) opt.compare = parse_protocol(a.value("--compare"));
    if (a.has("--divergence-rules")) opt.rules = DivergenceRules::load(a.value("--divergence-rules"));
    opt.rules.every_difference = a.has("--every-difference");
    const ReplayResult r = run_replay(opt);
    if (json) {
        std::printf("%s\n", to_json(r).c_str());
    } else {
        std::printf("replayed %llu connections, %llu bytes sent, %llu bytes of replies, in %.3f s (recorded over %.3f s)\n",
                    static_cast<unsigned long long>(r.connections), static_cast<unsigned long long>(r.bytes_sent),
                    static_cast<unsigned long long>(r.bytes_received), r.elapsed_s, r.recorded_s);
        if (opt.compare != Protocol::off) std::printf("%s\n", comparison_summary(r.comparison).c_str());
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
    return r.comparison.mismatches ? static_cast<int>(ExitCode::failure) : 0;
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
