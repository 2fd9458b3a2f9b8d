// The one JSON writer of the project: --json output, events, the output
// model, protocol messages and state files are written with it, field by
// field in the order given (no DOM, no allocation beyond the output string).
// Reading is nlohmann's (a DOM, typed through from_json/get).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace iprobe {

class JsonWriter {
public:
    JsonWriter& begin_object();
    JsonWriter& end_object();
    JsonWriter& begin_array();
    JsonWriter& end_array();
    JsonWriter& key(std::string_view k);
    JsonWriter& value(std::string_view v);
    JsonWriter& value(const char* v) { return value(std::string_view(v)); }
    JsonWriter& value(std::int64_t v);
    JsonWriter& value(std::uint64_t v);
    JsonWriter& value(int v) { return value(static_cast<std::int64_t>(v)); }
    JsonWriter& value(unsigned v) { return value(static_cast<std::uint64_t>(v)); }
    JsonWriter& value(double v);
    JsonWriter& value(bool v);
    JsonWriter& value(const std::vector<std::string>& items);  // an array of strings
    JsonWriter& null();
    // A value that is already JSON (another tool's document), inserted as is.
    JsonWriter& raw(std::string_view json);

    template <typename T>
    JsonWriter& field(std::string_view k, const T& v) { key(k); return value(v); }

    const std::string& str() const { return out_; }

    static void escape(std::string& out, std::string_view s);

private:
    void separate();
    std::string out_;
    std::vector<bool> first_;  // per open container: no element written yet
    bool after_key_ = false;
};

}  // namespace iprobe
