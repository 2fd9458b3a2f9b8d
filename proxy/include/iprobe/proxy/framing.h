// Message framing for the divergence checker: cuts a byte stream into the
// protocol's messages (RESP for redis, HTTP/1.1) and hashes each one, so the
// production and debug replies can be compared message by message and a
// mismatch can name the request that caused it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace iprobe::proxy {

enum class Protocol { off, stream, resp, http };
Protocol parse_protocol(std::string_view name);  // throws Error(usage)
const char* protocol_name(Protocol p);

enum class Role { request, response };

// What the divergence checker leaves out (noise).  File format, one rule per
// line, '#' starts a comment:
//   resp.ignore-command NAME    replies to command NAME are not compared (TIME, INFO, RANDOMKEY…)
//   http.ignore-header NAME     header NAME is left out of the response hash (Date, Server…)
//   http.ignore-body GLOB       bodies of responses to requests whose path matches GLOB are not compared
struct DivergenceRules {
    std::vector<std::string> ignore_commands;  // upper case
    std::vector<std::string> ignore_headers;   // lower case
    std::vector<std::string> ignore_body_paths;
    // Report every reply that differs (up to the report limit), not only the
    // first of each connection: what a patched clone changed (`iprobe debug --patch`).
    bool every_difference = false;

    static DivergenceRules parse(std::string_view text, std::string_view origin);  // throws Error(bad_input)
    static DivergenceRules load(const std::string& path);
    // Always applied (a rule file adds to them): resp.ignore-command COMMAND,
    // INFO, TIME, RANDOMKEY, CLIENT, HELLO, LASTSAVE, SLOWLOG, MEMORY, LATENCY,
    // DEBUG, CONFIG; http.ignore-header Date.
    static DivergenceRules defaults();
    bool ignores_command(std::string_view upper_name) const;
    bool ignores_header(std::string_view lower_name) const;
    bool ignores_body(std::string_view path) const;
};

struct Message {
    std::uint64_t hash = 0;
    std::string excerpt;        // responses: start of the raw message, for reports
    std::string summary;        // requests: "SET key value" / "GET /path HTTP/1.1"
    std::string verb;           // requests: RESP command (upper case) or HTTP method
    std::string path;           // HTTP requests: target
    std::size_t size = 0;       // bytes on the wire
};

class Framer {
public:
    virtual ~Framer() = default;
    // Appends every message completed by `bytes` to `out`.  After a protocol
    // violation the framer stops (failed() turns true) and emits nothing more.
    virtual void feed(std::span<const std::uint8_t> bytes, std::vector<Message>& out) = 0;
    // The peer closed its side: completes a message delimited by the close.
    virtual void finish(std::vector<Message>& out) { (void)out; }
    // Responses only: the request the next response answers (HTTP needs the
    // method and path to know whether a body follows and whether to hash it).
    virtual void expect(const Message& request) { (void)request; }
    bool failed() const { return !error_.empty(); }
    const std::string& error() const { return error_; }

    static std::unique_ptr<Framer> create(Protocol protocol, Role role, const DivergenceRules& rules);

protected:
    std::string error_;
};

// Whether `bytes` (a client's segment) begins a request: where a connection
// already open can be joined mid-stream.  RESP: an array of bulk strings
// ("*3\r\n$3\r\nSET..."), which redis client libraries send, or whole lines
// of inline commands ("PING\r\n", "SET k v\r\n": redis-cli, telnet, health
// checks); HTTP/1.x: a request line ("GET /path HTTP/1.1").  Null for
// protocols without such a mark.
using RequestStartTest = bool (*)(std::span<const std::uint8_t> bytes);
RequestStartTest request_start_test(Protocol protocol);

// FNV-1a, 64 bit: a stable message fingerprint (not a security hash).
constexpr std::uint64_t kHashSeed = 0xcbf29ce484222325ULL;
inline std::uint64_t hash_bytes(std::uint64_t h, const std::uint8_t* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}
// Printable form of raw protocol bytes for reports ("\r\n" shown escaped).
std::string printable(std::string_view raw, std::size_t max = 120);

}  // namespace iprobe::proxy
