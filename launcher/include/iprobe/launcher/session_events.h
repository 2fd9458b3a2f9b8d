// What a session (`iprobe debug`, `iprobe investigate`) tells its user: with
// --json one JSON object a line on stdout, `{"event":WHAT,...}`; else a line
// for people on stderr, prefixed with the tool's name.
#pragma once

#include <cstdio>
#include <functional>
#include <string>

#include "iprobe/support/json.h"

namespace iprobe::launcher {

class SessionEvents {
public:
    SessionEvents(bool json, std::string tool) : json_(json), tool_(std::move(tool)) {}

    void operator()(const std::string& what, const std::string& human,
                    const std::function<void(JsonWriter&)>& fields = {}) const {
        if (!json_) {
            std::fprintf(stderr, "%s: %s\n", tool_.c_str(), human.c_str());
            return;
        }
        JsonWriter w;
        w.begin_object().field("event", what);
        if (fields) fields(w);
        else w.field("message", human);  // never an event that says nothing
        w.end_object();
        std::printf("%s\n", w.str().c_str());
        std::fflush(stdout);
    }
    bool json() const { return json_; }

private:
    bool json_;
    std::string tool_;
};

}  // namespace iprobe::launcher
