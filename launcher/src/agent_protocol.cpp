#include "iprobe/launcher/agent_protocol.h"

#include <array>
#include <limits>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "iprobe/support/error.h"
#include "iprobe/support/json.h"

namespace iprobe::launcher::agent_protocol {
namespace {

using Json = nlohmann::json;  // the reader; messages are written with JsonWriter

// ---- bytes as JSON: valid UTF-8 as a string, anything else as base64

bool valid_utf8(const std::string& s) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const std::size_t n = s.size();
    for (std::size_t i = 0; i < n;) {
        const unsigned char c = p[i];
        std::size_t len;
        std::uint32_t cp;
        if (c < 0x80) {
            ++i;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            len = 2, cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3, cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4, cp = c & 0x07;
        } else {
            return false;
        }
        if (i + len > n) return false;
        for (std::size_t k = 1; k < len; ++k) {
            if ((p[i + k] & 0xc0) != 0x80) return false;
            cp = cp << 6 | (p[i + k] & 0x3f);
        }
        constexpr std::array<std::uint32_t, 5> kMin = {0, 0, 0x80, 0x800, 0x10000};  // no overlong forms
        if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += len;
    }
    return true;
}

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64(const std::string& in) {
    std::string out;
    out.reserve((in.size() + 2) / 3 * 4);
    for (std::size_t i = 0; i < in.size(); i += 3) {
        std::uint32_t v = static_cast<unsigned char>(in[i]) << 16;
        if (i + 1 < in.size()) v |= static_cast<unsigned char>(in[i + 1]) << 8;
        if (i + 2 < in.size()) v |= static_cast<unsigned char>(in[i + 2]);
        out += kBase64[v >> 18 & 63];
        out += kBase64[v >> 12 & 63];
        out += i + 1 < in.size() ? kBase64[v >> 6 & 63] : '=';
        out += i + 2 < in.size() ? kBase64[v & 63] : '=';
    }
    return out;
}

std::string unbase64(const std::string& in) {
    if (in.size() % 4 != 0) throw Error("bad base64 in the clone protocol", ExitCode::bad_input);
    std::string out;
    for (std::size_t i = 0; i < in.size(); i += 4) {
        std::uint32_t v = 0;
        int pad = 0;
        for (std::size_t k = 0; k < 4; ++k) {
            const char c = in[i + k];
            std::uint32_t d = 0;
            if (c == '=' && i + 4 == in.size() && k >= 2) {
                ++pad;
            } else if (const char* at = std::char_traits<char>::find(kBase64, 64, c); at && !pad) {
                d = static_cast<std::uint32_t>(at - kBase64);
            } else {
                throw Error("bad base64 in the clone protocol", ExitCode::bad_input);
            }
            v = v << 6 | d;
        }
        out += static_cast<char>(v >> 16 & 0xff);
        if (pad < 2) out += static_cast<char>(v >> 8 & 0xff);
        if (pad < 1) out += static_cast<char>(v & 0xff);
    }
    return out;
}

// `key` with `bytes` as a string when valid UTF-8, else as {"base64":...}.
void bytes_field(JsonWriter& j, const char* key, const std::string& bytes) {
    if (valid_utf8(bytes)) j.field(key, bytes);
    else j.key(key).begin_object().field("base64", base64(bytes)).end_object();
}

std::string bytes_at(const Json& doc, const char* key) {
    const Json& v = doc.at(key);
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.size() == 1 && v.contains("base64") && v["base64"].is_string())
        return unbase64(v["base64"].get<std::string>());
    throw Error(std::string("'") + key + "' is not a string in the clone protocol", ExitCode::bad_input);
}

std::uint64_t unsigned_at(const Json& doc, const char* key) {
    const Json& v = doc.at(key);
    if (!v.is_number_unsigned()) throw Error(std::string("'") + key + "' is not a count in the clone protocol", ExitCode::bad_input);
    return v.get<std::uint64_t>();
}

template <typename Int>
Int int_at(const Json& doc, const char* key) {
    const Json& v = doc.at(key);
    if (!v.is_number_integer() || v.get<std::int64_t>() < std::numeric_limits<Int>::min() ||
        v.get<std::int64_t>() > std::numeric_limits<Int>::max())
        throw Error(std::string("'") + key + "' is not a number in range in the clone protocol", ExitCode::bad_input);
    return static_cast<Int>(v.get<std::int64_t>());
}

bool bool_at(const Json& doc, const char* key) {
    const Json& v = doc.at(key);
    if (!v.is_boolean()) throw Error(std::string("'") + key + "' is not true or false in the clone protocol", ExitCode::bad_input);
    return v.get<bool>();
}

// ---- each message: its type name, its fields out and in

// Writes each message's fields into its open object.
struct Codec {
    JsonWriter& j;
    void operator()(const Clone& m) const {
        bytes_field(j, "name", m.name);
        j.field("shell_job", m.shell_job).field("source_pid", m.source_pid);
    }
    void operator()(const PageServerReady& m) const { j.field("port", m.port); }
    void operator()(const File& m) const {
        bytes_field(j, "name", m.name);
        j.field("size", m.size);
    }
    void operator()(const Snapshot& m) const {
        j.field("index", m.index);
        bytes_field(j, "path", m.path);
        j.field("size", m.size);
    }
    void operator()(const Restore&) const {}
    void operator()(const Restored& m) const {
        j.field("clone_pid", m.clone_pid).field("keeper_pid", m.keeper_pid).field("restore_us", m.restore_us);
    }
    void operator()(const Abort&) const {}
    void operator()(const Destroy& m) const { bytes_field(j, "name", m.name); }
    void operator()(const Destroyed&) const {}
    void operator()(const Keep&) const {}
    void operator()(const Kept&) const {}
    void operator()(const Failure& m) const {
        j.field("exit_code", m.exit_code);
        bytes_field(j, "message", m.message);
    }
};

struct TypeName {
    const char* operator()(const Clone&) const { return "clone"; }
    const char* operator()(const PageServerReady&) const { return "page_server"; }
    const char* operator()(const File&) const { return "file"; }
    const char* operator()(const Snapshot&) const { return "snapshot"; }
    const char* operator()(const Restore&) const { return "restore"; }
    const char* operator()(const Restored&) const { return "restored"; }
    const char* operator()(const Abort&) const { return "abort"; }
    const char* operator()(const Destroy&) const { return "destroy"; }
    const char* operator()(const Destroyed&) const { return "destroyed"; }
    const char* operator()(const Keep&) const { return "keep"; }
    const char* operator()(const Kept&) const { return "kept"; }
    const char* operator()(const Failure&) const { return "error"; }
};

Message from_json(const std::string& type, const Json& d) {
    if (type == "clone") return Clone{bytes_at(d, "name"), bool_at(d, "shell_job"), int_at<pid_t>(d, "source_pid")};
    if (type == "page_server") return PageServerReady{int_at<int>(d, "port")};
    if (type == "file") return File{bytes_at(d, "name"), unsigned_at(d, "size")};
    if (type == "snapshot") return Snapshot{unsigned_at(d, "index"), bytes_at(d, "path"), unsigned_at(d, "size")};
    if (type == "restore") return Restore{};
    if (type == "restored")
        return Restored{int_at<pid_t>(d, "clone_pid"), int_at<pid_t>(d, "keeper_pid"), unsigned_at(d, "restore_us")};
    if (type == "abort") return Abort{};
    if (type == "destroy") return Destroy{bytes_at(d, "name")};
    if (type == "destroyed") return Destroyed{};
    if (type == "keep") return Keep{};
    if (type == "kept") return Kept{};
    if (type == "error") return Failure{int_at<int>(d, "exit_code"), bytes_at(d, "message")};
    throw Error("unknown message type '" + type.substr(0, 64) + "' in the clone protocol", ExitCode::bad_input);
}

}  // namespace

const char* type_name(const Message& message) { return std::visit(TypeName{}, message); }

std::string encode(const Message& message) {
    JsonWriter j;
    j.begin_object().field("type", type_name(message));
    std::visit(Codec{j}, message);
    return j.end_object().str() + "\n";
}

Message decode(const std::string& line) {
    Json doc;
    try {
        doc = Json::parse(line);
    } catch (const Json::exception& e) {
        throw Error(std::string("a line of the clone protocol is not JSON: ") + e.what(), ExitCode::bad_input);
    }
    if (!doc.is_object() || !doc.contains("type") || !doc["type"].is_string())
        throw Error("a line of the clone protocol has no \"type\"", ExitCode::bad_input);
    try {
        return from_json(doc["type"].get<std::string>(), doc);
    } catch (const Json::exception& e) {
        throw Error("a '" + doc["type"].get<std::string>().substr(0, 64) + "' message of the clone protocol lacks a field: " +
                        e.what(),
                    ExitCode::bad_input);
    }
}

}  // namespace iprobe::launcher::agent_protocol
