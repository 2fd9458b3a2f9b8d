#include "iprobe/proxy/framing.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstring>

#include "iprobe/support/error.h"
#include "iprobe/support/file.h"
#include "iprobe/support/glob.h"

namespace iprobe::proxy {

namespace {

constexpr std::size_t kExcerpt = 96;
constexpr std::size_t kMaxLine = 64 * 1024;       // longest RESP line / HTTP header block we frame
// Redis itself refuses more than INT_MAX elements in one aggregate; a bulk
// string longer than 2^62 bytes exists on no wire, and the counts stay far
// from overflow when doubled (maps) or stepped over the trailing CRLF.
constexpr long long kMaxAggregate = 0x7fffffffLL;
constexpr long long kMaxBulk = 1LL << 62;
constexpr std::size_t kSummaryArg = 40;
constexpr std::size_t kSummaryArgs = 6;

std::string upper(std::string_view s) {
    std::string out(s);
    for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return out;
}
std::string lower(std::string_view s) {
    std::string out(s);
    for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}
std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
}
bool parse_int(std::string_view s, long long& v) {
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// Shared bookkeeping of the message being framed: hash, excerpt, size.
// Only responses keep an excerpt (reports quote replies; a request is named
// by its summary), which spares an allocation per request.
class MessageBuilder {
public:
    explicit MessageBuilder(Role role) : excerpt_limit_(role == Role::response ? kExcerpt : 0) {}
    void add(const std::uint8_t* p, std::size_t n) {
        hash_ = hash_bytes(hash_, p, n);
        add_unhashed(p, n);
    }
    void add_unhashed(const std::uint8_t* p, std::size_t n) {
        size_ += n;
        if (excerpt_.size() < excerpt_limit_)
            excerpt_.append(reinterpret_cast<const char*>(p), std::min(n, excerpt_limit_ - excerpt_.size()));
    }
    void hash_only(std::string_view s) {
        hash_ = hash_bytes(hash_, reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
    }
    Message take() {
        Message m;
        m.hash = hash_;
        m.excerpt = std::move(excerpt_);
        m.size = size_;
        hash_ = kHashSeed;
        excerpt_.clear();
        size_ = 0;
        return m;
    }

private:
    std::size_t excerpt_limit_;
    std::uint64_t hash_ = kHashSeed;
    std::string excerpt_;
    std::size_t size_ = 0;
};

// RESP2/RESP3 values; requests may also be inline commands ("PING\r\n").
class RespFramer final : public Framer {
public:
    explicit RespFramer(Role role) : role_(role), msg_(role) {}

    void feed(std::span<const std::uint8_t> bytes, std::vector<Message>& out) override {
        const std::uint8_t* p = bytes.data();
        std::size_t n = bytes.size();
        while (n > 0 && !failed()) {
            if (bulk_left_ > 0) {
                const std::size_t take = static_cast<std::size_t>(std::min<long long>(bulk_left_, static_cast<long long>(n)));
                msg_.add(p, take);
                if (collecting_arg_ && bulk_left_ > 2) {
                    const std::size_t payload = static_cast<std::size_t>(std::min<long long>(bulk_left_ - 2, static_cast<long long>(take)));
                    auto& arg = args_.back();
                    if (arg.size() < kSummaryArg)
                        arg.append(reinterpret_cast<const char*>(p), std::min(payload, kSummaryArg - arg.size()));
                }
                bulk_left_ -= static_cast<long long>(take);
                p += take;
                n -= take;
                if (bulk_left_ == 0) element_done(out);
                continue;
            }
            const auto* nl = static_cast<const std::uint8_t*>(std::memchr(p, '\n', n));
            const std::size_t take = nl ? static_cast<std::size_t>(nl - p) + 1 : n;
            msg_.add(p, take);
            line_.append(reinterpret_cast<const char*>(p), take);
            p += take;
            n -= take;
            if (line_.size() > kMaxLine) {
                error_ = "RESP line longer than 64 KiB";
                return;
            }
            if (nl) {
                line_done(out);
                line_.clear();
            }
        }
    }

private:
    void line_done(std::vector<Message>& out) {
        std::string_view line(line_);
        line.remove_suffix(1);  // '\n'
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (depth_.empty() && role_ == Role::request && (line.empty() || line[0] != '*')) {
            if (trim(line).empty()) {  // stray newline between commands: not a command
                msg_.take();
                return;
            }
            inline_command(line);
            emit(out);
            return;
        }
        if (line.empty()) {
            error_ = "empty RESP line";
            return;
        }
        long long count = 0;
        switch (line[0]) {
        case '+': case '-': case ':': case '_': case ',': case '#': case '(':
            element_done(out);
            return;
        case '$': case '!': case '=':
            if (!parse_int(line.substr(1), count) || count < -1) break;
            if (count > kMaxBulk) {
                error_ = "RESP bulk length out of range: '" + printable(line, 40) + "'";
                return;
            }
            if (count == -1) {
                if (collecting_arg_) args_.emplace_back("(nil)");
                element_done(out);
            } else {
                if (collecting_arg_) args_.emplace_back();
                bulk_left_ = count + 2;
            }
            return;
        case '*': case '~': case '>': case '%': case '|':
            if (!parse_int(line.substr(1), count) || count < -1) break;
            if (count > kMaxAggregate) {
                error_ = "RESP aggregate length out of range: '" + printable(line, 40) + "'";
                return;
            }
            if (line[0] == '%') count *= 2;
            if (line[0] == '|') count = count * 2 + 1;  // the attribute and the value it annotates
            if (role_ == Role::request && depth_.empty()) collecting_arg_ = true;
            if (count <= 0) {
                element_done(out);
            } else {
                depth_.push_back(count);
            }
            return;
        default:
            break;
        }
        error_ = "not RESP: '" + printable(line, 40) + "'";
    }

    void element_done(std::vector<Message>& out) {
        while (!depth_.empty()) {
            if (--depth_.back() > 0) return;
            depth_.pop_back();
        }
        emit(out);
    }

    void inline_command(std::string_view line) {
        std::size_t i = 0;
        while (i < line.size()) {
            while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
            const std::size_t start = i;
            while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
            if (i > start) args_.emplace_back(line.substr(start, std::min(i - start, kSummaryArg)));
        }
    }

    void emit(std::vector<Message>& out) {
        Message m = msg_.take();
        if (role_ == Role::request) {
            if (!args_.empty()) m.verb = upper(args_.front());
            for (std::size_t i = 0; i < args_.size() && i < kSummaryArgs; ++i) {
                if (i) m.summary += ' ';
                m.summary += printable(args_[i], kSummaryArg);
            }
            if (args_.size() > kSummaryArgs) m.summary += " …";
        }
        args_.clear();
        collecting_arg_ = false;
        out.push_back(std::move(m));
    }

    Role role_;
    MessageBuilder msg_;
    std::string line_;
    std::vector<long long> depth_;  // elements still to come per open aggregate
    long long bulk_left_ = 0;       // payload + CRLF still to come
    bool collecting_arg_ = false;
    std::vector<std::string> args_;
};

// HTTP/1.1 messages: header block, then a body delimited by Content-Length,
// chunked transfer coding, or (responses) the close of the connection.
class HttpFramer final : public Framer {
public:
    HttpFramer(Role role, const DivergenceRules& rules) : role_(role), rules_(rules), msg_(role) {}

    void expect(const Message& request) override { pending_.push_back({request.verb == "HEAD", rules_.ignores_body(request.path)}); }

    void feed(std::span<const std::uint8_t> bytes, std::vector<Message>& out) override {
        const std::uint8_t* p = bytes.data();
        std::size_t n = bytes.size();
        while (n > 0 && !failed()) {
            switch (state_) {
            case State::headers: {
                const std::size_t take = scan_line(p, n);
                msg_.add_unhashed(p, take);
                head_.append(reinterpret_cast<const char*>(p), take);
                p += take;
                n -= take;
                if (head_.size() > kMaxLine) {
                    error_ = "HTTP header block longer than 64 KiB";
                    return;
                }
                if (head_ends()) headers_done(out);
                break;
            }
            case State::body:
            case State::chunk_data: {
                const std::size_t take = std::min<std::size_t>(left_, n);
                body(p, take);
                p += take;
                n -= take;
                left_ -= take;
                if (left_ == 0) {
                    if (state_ == State::body) {
                        emit(out);
                    } else {
                        state_ = State::chunk_crlf;
                    }
                }
                break;
            }
            case State::body_to_close:
                body(p, n);
                n = 0;
                break;
            case State::chunk_size:
            case State::chunk_crlf:
            case State::chunk_trailer: {
                const std::size_t take = scan_line(p, n);
                msg_.add_unhashed(p, take);
                line_.append(reinterpret_cast<const char*>(p), take);
                p += take;
                n -= take;
                if (line_.size() > kMaxLine) {
                    error_ = "HTTP chunk line too long";
                    return;
                }
                if (!line_.empty() && line_.back() == '\n') {
                    chunk_line(out);
                    line_.clear();
                }
                break;
            }
            }
        }
    }

    void finish(std::vector<Message>& out) override {
        if (state_ == State::body_to_close) emit(out);
    }

private:
    enum class State { headers, body, body_to_close, chunk_size, chunk_data, chunk_crlf, chunk_trailer };
    struct Expected {
        bool head;
        bool skip_body;
    };

    static std::size_t scan_line(const std::uint8_t* p, std::size_t n) {
        const auto* nl = static_cast<const std::uint8_t*>(std::memchr(p, '\n', n));
        return nl ? static_cast<std::size_t>(nl - p) + 1 : n;
    }
    bool head_ends() const {
        if (head_ == "\r\n" || head_ == "\n") return false;  // tolerated empty line before a message
        return head_.ends_with("\r\n\r\n") || head_.ends_with("\n\n");
    }

    void body(const std::uint8_t* p, std::size_t n) {
        if (skip_body_) msg_.add_unhashed(p, n); else msg_.add(p, n);
    }

    void headers_done(std::vector<Message>& out) {
        std::string_view head(head_);
        std::vector<std::string_view> lines;
        while (!head.empty()) {
            const auto nl = head.find('\n');
            std::string_view line = head.substr(0, nl);
            if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
            if (!line.empty()) lines.push_back(line);
            head.remove_prefix(nl == std::string_view::npos ? head.size() : nl + 1);
        }
        if (lines.empty()) {
            error_ = "empty HTTP header block";
            return;
        }
        const std::string start_line(lines.front());  // head_ is reused below
        const std::string_view start = start_line;
        msg_.hash_only(start);
        long long length = -1;
        bool chunked = false;
        for (std::size_t i = 1; i < lines.size(); ++i) {
            const auto colon = lines[i].find(':');
            if (colon == std::string_view::npos) {
                error_ = "bad HTTP header line '" + printable(lines[i], 40) + "'";
                return;
            }
            const std::string name = lower(trim(lines[i].substr(0, colon)));
            const std::string_view value = trim(lines[i].substr(colon + 1));
            if (name == "content-length" && !parse_int(value, length)) {
                error_ = "bad Content-Length";
                return;
            }
            if (name == "transfer-encoding" && lower(value).find("chunked") != std::string::npos) chunked = true;
            if (!rules_.ignores_header(name)) {
                msg_.hash_only(name);
                msg_.hash_only(":");
                msg_.hash_only(value);
                msg_.hash_only("\n");
            }
        }
        head_.clear();
        bool no_body = false;
        skip_body_ = false;
        if (role_ == Role::request) {
            const auto sp1 = start.find(' ');
            const auto sp2 = start.find(' ', sp1 + 1);
            if (sp1 == std::string_view::npos) {
                error_ = "bad HTTP request line '" + printable(start, 40) + "'";
                return;
            }
            verb_ = std::string(start.substr(0, sp1));
            path_ = std::string(start.substr(sp1 + 1, sp2 == std::string_view::npos ? std::string_view::npos : sp2 - sp1 - 1));
            summary_ = std::string(start);
            no_body = !chunked && length <= 0;
        } else {
            if (!start.starts_with("HTTP/") || start.size() < 12) {
                error_ = "bad HTTP status line '" + printable(start, 40) + "'";
                return;
            }
            const int status = std::atoi(std::string(start.substr(9, 3)).c_str());
            if (status >= 100 && status < 200) {  // interim: the final response still follows
                msg_.take();
                return;
            }
            Expected e{false, false};
            if (!pending_.empty()) {
                e = pending_.front();
                pending_.erase(pending_.begin());
            }
            skip_body_ = e.skip_body;
            no_body = e.head || status == 204 || status == 304 || (!chunked && length == 0);
            if (!no_body && !chunked && length < 0) {
                state_ = State::body_to_close;
                return;
            }
        }
        if (no_body) {
            emit(out);
        } else if (chunked) {
            state_ = State::chunk_size;
        } else {
            left_ = static_cast<std::size_t>(length);
            state_ = State::body;
        }
    }

    void chunk_line(std::vector<Message>& out) {
        std::string_view line = trim(line_);
        if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
        line = trim(line);
        if (state_ == State::chunk_crlf) {
            if (!line.empty()) error_ = "missing CRLF after HTTP chunk";
            state_ = State::chunk_size;
            return;
        }
        if (state_ == State::chunk_trailer) {
            if (line.empty()) emit(out);
            return;
        }
        const auto semi = line.find(';');
        const std::string_view hex = trim(line.substr(0, semi));
        std::size_t size = 0;
        const auto r = std::from_chars(hex.data(), hex.data() + hex.size(), size, 16);
        if (hex.empty() || r.ec != std::errc() || r.ptr != hex.data() + hex.size()) {
            error_ = "bad HTTP chunk size '" + printable(line, 40) + "'";
            return;
        }
        if (size == 0) {
            state_ = State::chunk_trailer;
        } else {
            left_ = size;
            state_ = State::chunk_data;
        }
    }

    void emit(std::vector<Message>& out) {
        Message m = msg_.take();
        if (role_ == Role::request) {
            m.verb = std::move(verb_);
            m.path = std::move(path_);
            m.summary = printable(summary_, 120);
        }
        state_ = State::headers;
        out.push_back(std::move(m));
    }

    Role role_;
    const DivergenceRules& rules_;
    MessageBuilder msg_;
    State state_ = State::headers;
    std::string head_, line_, verb_, path_, summary_;
    std::size_t left_ = 0;
    bool skip_body_ = false;
    std::vector<Expected> pending_;
};

// An inline command line ("PING", "SET k v"): a command name of letters
// (at most 32), then printable arguments, ended by "\n" or "\r\n".
bool inline_command_line(std::string_view line) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::size_t name = 0;
    while (name < line.size() && std::isalpha(static_cast<unsigned char>(line[name]))) ++name;
    if (name == 0 || name > 32 || (name < line.size() && line[name] != ' ')) return false;
    for (const char c : line)
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t') return false;
    return true;
}

bool starts_resp_request(std::span<const std::uint8_t> bytes) {
    const std::string_view whole(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    if (!whole.empty() && whole[0] != '*') {
        // Inline commands (redis-cli typed, telnet, health checks): the segment
        // is whole lines, each one such command; a bulk string's tail cut off
        // mid-message rarely is (and then shows as mismatches, not silence).
        if (whole.size() > 64 * 1024 || whole.back() != '\n') return false;
        for (std::size_t at = 0; at < whole.size();) {
            const std::size_t nl = whole.find('\n', at);
            if (!inline_command_line(whole.substr(at, nl - at))) return false;
            at = nl + 1;
        }
        return true;
    }
    // "*<count>\r\n$<length>\r\n": a count of 1 to 7 digits, then a bulk string's length.
    const std::string_view s = whole.substr(0, 32);
    if (s.size() < 6 || s[0] != '*' || s[1] < '1' || s[1] > '9') return false;
    std::size_t i = 2;
    while (i < s.size() && i < 9 && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    return s.substr(i).starts_with("\r\n$") && i + 3 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 3]));
}

bool starts_http_request(std::span<const std::uint8_t> bytes) {
    // "METHOD SP target SP HTTP/1.x" within the segment's first line.
    const std::string_view s(reinterpret_cast<const char*>(bytes.data()), std::min<std::size_t>(bytes.size(), 8192));
    const auto eol = s.find("\r\n");
    if (eol == std::string_view::npos) return false;
    const std::string_view line = s.substr(0, eol);
    const auto sp = line.find(' ');
    if (sp == 0 || sp == std::string_view::npos || sp > 16) return false;
    for (std::size_t i = 0; i < sp; ++i)
        if (line[i] < 'A' || line[i] > 'Z') return false;
    const auto sp2 = line.rfind(' ');
    return sp2 > sp + 1 && (line.substr(sp2 + 1) == "HTTP/1.1" || line.substr(sp2 + 1) == "HTTP/1.0");
}

}  // namespace

RequestStartTest request_start_test(Protocol protocol) {
    switch (protocol) {
    case Protocol::resp: return starts_resp_request;
    case Protocol::http: return starts_http_request;
    default: return nullptr;
    }
}

Protocol parse_protocol(std::string_view name) {
    if (name == "off") return Protocol::off;
    if (name == "stream") return Protocol::stream;
    if (name == "resp") return Protocol::resp;
    if (name == "http") return Protocol::http;
    throw Error("--divergence '" + std::string(name) + "': expected off, stream, resp or http", ExitCode::usage);
}

const char* protocol_name(Protocol p) {
    switch (p) {
    case Protocol::off: return "off";
    case Protocol::stream: return "stream";
    case Protocol::resp: return "resp";
    case Protocol::http: return "http";
    }
    return "?";
}

std::unique_ptr<Framer> Framer::create(Protocol protocol, Role role, const DivergenceRules& rules) {
    if (protocol == Protocol::resp) return std::make_unique<RespFramer>(role);
    if (protocol == Protocol::http) return std::make_unique<HttpFramer>(role, rules);
    return nullptr;
}

DivergenceRules DivergenceRules::parse(std::string_view text, std::string_view origin) {
    DivergenceRules rules;
    int lineno = 0;
    while (!text.empty()) {
        ++lineno;
        const auto nl = text.find('\n');
        std::string_view line = text.substr(0, nl);
        text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
        if (const auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
        line = trim(line);
        if (line.empty()) continue;
        const auto sp = line.find_first_of(" \t");
        const std::string_view key = line.substr(0, sp);
        const std::string_view arg = sp == std::string_view::npos ? std::string_view{} : trim(line.substr(sp + 1));
        const auto where = std::string(origin) + ":" + std::to_string(lineno) + ": ";
        if (arg.empty() || arg.find_first_of(" \t") != std::string_view::npos)
            throw Error(where + "expected '<rule> <one argument>'", ExitCode::bad_input);
        if (key == "resp.ignore-command") {
            rules.ignore_commands.push_back(upper(arg));
        } else if (key == "http.ignore-header") {
            rules.ignore_headers.push_back(lower(arg));
        } else if (key == "http.ignore-body") {
            rules.ignore_body_paths.emplace_back(arg);
        } else {
            throw Error(where + "unknown rule '" + std::string(key) +
                            "' (known: resp.ignore-command, http.ignore-header, http.ignore-body)",
                        ExitCode::bad_input);
        }
    }
    return rules;
}

DivergenceRules DivergenceRules::load(const std::string& path) {
    std::vector<std::uint8_t> bytes;
    try {
        bytes = read_file(path);
    } catch (const std::exception& e) {
        throw Error("--divergence-rules " + path + ": cannot read: " + e.what(), ExitCode::not_found);
    }
    DivergenceRules rules = parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path);
    const DivergenceRules base = defaults();
    rules.ignore_commands.insert(rules.ignore_commands.end(), base.ignore_commands.begin(), base.ignore_commands.end());
    rules.ignore_headers.insert(rules.ignore_headers.end(), base.ignore_headers.begin(), base.ignore_headers.end());
    return rules;
}

DivergenceRules DivergenceRules::defaults() {
    DivergenceRules rules;
    // Replies that differ between two healthy copies of a service: clocks,
    // per-process ids and hash-table order, server statistics.
    rules.ignore_commands = {"COMMAND", "INFO", "TIME", "RANDOMKEY", "CLIENT", "HELLO",
                             "LASTSAVE", "SLOWLOG", "MEMORY", "LATENCY", "DEBUG", "CONFIG"};
    rules.ignore_headers = {"date"};
    return rules;
}

bool DivergenceRules::ignores_command(std::string_view name) const {
    return std::find(ignore_commands.begin(), ignore_commands.end(), name) != ignore_commands.end();
}
bool DivergenceRules::ignores_header(std::string_view name) const {
    return std::find(ignore_headers.begin(), ignore_headers.end(), name) != ignore_headers.end();
}
bool DivergenceRules::ignores_body(std::string_view path) const {
    return std::any_of(ignore_body_paths.begin(), ignore_body_paths.end(),
                       [&](const std::string& g) { return glob_match(g, path); });
}

std::string printable(std::string_view raw, std::size_t max) {
    // Most requests are plain text: copied as they are (this runs for every
    // request the divergence checker frames).
    if (raw.size() <= max && std::all_of(raw.begin(), raw.end(), [](char ch) {
            const auto c = static_cast<unsigned char>(ch);
            return c >= 0x20 && c < 0x7f && c != '\\';
        }))
        return std::string(raw);
    std::string out;
    for (const char ch : raw) {
        if (out.size() >= max) {
            out += "…";
            break;
        }
        const auto c = static_cast<unsigned char>(ch);
        if (c == '\r') out += "\\r";
        else if (c == '\n') out += "\\n";
        else if (c == '\\') out += "\\\\";
        else if (c < 0x20 || c >= 0x7f) {
            char hex[8];
            std::snprintf(hex, sizeof hex, "\\x%02x", c);
            out += hex;
        } else out += ch;
    }
    return out;
}

}  // namespace iprobe::proxy
