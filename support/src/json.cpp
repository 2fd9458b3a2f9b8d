#include "iprobe/support/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace iprobe {

void JsonWriter::escape(std::string& out, std::string_view s) {
    out += '"';
    for (const char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
                    out += buf;
                } else {
                    out += c;
                }
        }
    }
    out += '"';
}

void JsonWriter::separate() {
    if (after_key_) {
        after_key_ = false;
        return;
    }
    if (!first_.empty()) {
        if (!first_.back()) out_ += ',';
        first_.back() = false;
    }
}

JsonWriter& JsonWriter::begin_object() { separate(); out_ += '{'; first_.push_back(true); return *this; }
JsonWriter& JsonWriter::end_object() { out_ += '}'; first_.pop_back(); return *this; }
JsonWriter& JsonWriter::begin_array() { separate(); out_ += '['; first_.push_back(true); return *this; }
JsonWriter& JsonWriter::end_array() { out_ += ']'; first_.pop_back(); return *this; }

JsonWriter& JsonWriter::key(std::string_view k) {
    separate();
    escape(out_, k);
    out_ += ':';
    after_key_ = true;
    return *this;
}

JsonWriter& JsonWriter::value(std::string_view v) { separate(); escape(out_, v); return *this; }
JsonWriter& JsonWriter::value(std::int64_t v) { separate(); out_ += std::to_string(v); return *this; }
JsonWriter& JsonWriter::value(std::uint64_t v) { separate(); out_ += std::to_string(v); return *this; }
JsonWriter& JsonWriter::value(bool v) { separate(); out_ += v ? "true" : "false"; return *this; }
JsonWriter& JsonWriter::value(const std::vector<std::string>& items) {
    begin_array();
    for (const auto& item : items) value(item);
    return end_array();
}
JsonWriter& JsonWriter::null() { separate(); out_ += "null"; return *this; }

JsonWriter& JsonWriter::raw(std::string_view json) {
    separate();
    out_ += json;
    return *this;
}

JsonWriter& JsonWriter::value(double v) {
    separate();
    if (!std::isfinite(v)) {
        out_ += "null";
    } else {
        // The shortest text that reads back as the same double: 0.0123, not
        // %.17g's 0.012300000000000001.
        char buf[32];
        const auto r = std::to_chars(buf, buf + sizeof buf, v);
        out_.append(buf, r.ptr);
    }
    return *this;
}

}  // namespace iprobe
