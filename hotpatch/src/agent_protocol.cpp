#include "iprobe/hotpatch/agent_protocol.h"

#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "iprobe/support/error.h"
#include "iprobe/support/json.h"

namespace iprobe::hotpatch {

// Messages are written with JsonWriter and read with nlohmann; ordered, so
// that a value passed on as JSON text (a Value's) keeps its fields' order.
using Json = nlohmann::ordered_json;

namespace {

std::string hex_address(std::uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
    return buf;
}

// Each writes its fields into an object the caller opened.
void attach_fields(JsonWriter& j, const AttachStats& st) {
    j.field("selected", st.selected)
        .field("enabled", st.enabled)
        .field("already_enabled", st.already_enabled)
        .field("total_enabled", st.total_enabled)
        .field("threads", st.threads)
        .field("pause_us", st.pause_us)
        .field("stop_us", st.stop_us)
        .field("prepare_pause_us", st.prepare_pause_us)
        .field("write_pause_us", st.write_pause_us)
        .field("runtime_injected", st.runtime_injected)
        .field("handler_injected", st.handler_injected)
        .field("planned_while_running", st.planned_while_running)
        .field("refused", st.refused)
        .field("refused_example", st.refused_example)
        .field("exits_left_off", st.exits_left_off)
        .field("exits_runtime_reads", st.exits_runtime_reads)
        .field("exits_return_twice", st.exits_return_twice)
        .field("inherited_sites_restored", st.inherited_sites_restored)
        .field("values_unavailable", st.values_unavailable)
        .field("values_untyped", st.values_untyped)
        .field("values_optimized_out", st.values_optimized_out)
        .field("values_no_return", st.values_no_return)
        .field("when_undecidable", st.when_undecidable)
        .field("ring_records", static_cast<std::uint64_t>(st.ring_records))
        .field("thread_slots", static_cast<std::uint64_t>(st.thread_slots))
        .field("geometry_kept", st.geometry_kept)
        .field("modules", st.modules)
        .field("patched_skipped", st.patched_skipped);
}

AttachStats attach_of(const Json& doc) {
    AttachStats st;
    doc.at("selected").get_to(st.selected);
    doc.at("enabled").get_to(st.enabled);
    doc.at("already_enabled").get_to(st.already_enabled);
    doc.at("total_enabled").get_to(st.total_enabled);
    doc.at("threads").get_to(st.threads);
    doc.at("pause_us").get_to(st.pause_us);
    doc.at("stop_us").get_to(st.stop_us);
    st.prepare_pause_us = doc.value("prepare_pause_us", std::uint64_t{0});
    st.write_pause_us = doc.value("write_pause_us", st.pause_us);
    doc.at("runtime_injected").get_to(st.runtime_injected);
    st.handler_injected = doc.value("handler_injected", false);
    st.planned_while_running = doc.value("planned_while_running", false);
    st.refused = doc.value("refused", std::size_t{0});
    st.refused_example = doc.value("refused_example", std::string());
    st.exits_left_off = doc.value("exits_left_off", std::size_t{0});
    st.exits_runtime_reads = doc.value("exits_runtime_reads", std::size_t{0});
    st.exits_return_twice = doc.value("exits_return_twice", std::size_t{0});
    st.inherited_sites_restored = doc.value("inherited_sites_restored", std::size_t{0});
    st.values_unavailable = doc.value("values_unavailable", std::size_t{0});
    st.values_untyped = doc.value("values_untyped", std::size_t{0});
    st.values_optimized_out = doc.value("values_optimized_out", std::size_t{0});
    st.values_no_return = doc.value("values_no_return", std::size_t{0});
    st.when_undecidable = doc.value("when_undecidable", std::size_t{0});
    st.ring_records = doc.value("ring_records", std::uint32_t{0});
    st.thread_slots = doc.value("thread_slots", std::uint32_t{0});
    st.geometry_kept = doc.value("geometry_kept", false);
    st.modules = doc.value("modules", std::vector<std::string>());
    st.patched_skipped = doc.value("patched_skipped", std::vector<std::string>());
    return st;
}

void detach_fields(JsonWriter& j, const DetachStats& st) {
    j.field("disabled", st.disabled)
        .field("still_enabled", st.still_enabled)
        .field("not_restored", st.not_restored)
        .field("sites_restored", st.sites_restored)
        .field("exits_lost", st.exits_lost)
        .field("region_problem", st.region_problem)
        .field("threads", st.threads)
        .field("pause_us", st.pause_us)
        .field("stop_us", st.stop_us);
}

DetachStats detach_of(const Json& doc) {
    DetachStats st;
    doc.at("disabled").get_to(st.disabled);
    doc.at("still_enabled").get_to(st.still_enabled);
    doc.at("not_restored").get_to(st.not_restored);
    doc.at("sites_restored").get_to(st.sites_restored);
    st.exits_lost = doc.value("exits_lost", std::uint64_t{0});
    st.region_problem = doc.value("region_problem", std::string());
    doc.at("threads").get_to(st.threads);
    doc.at("pause_us").get_to(st.pause_us);
    doc.at("stop_us").get_to(st.stop_us);
    return st;
}

probelist::ProbeKind kind_of(const std::string& name) {
    for (auto k : {probelist::ProbeKind::entry, probelist::ProbeKind::exit, probelist::ProbeKind::point})
        if (name == probelist::to_string(k)) return k;
    throw Json::other_error::create(501, "unknown probe kind '" + name + "'", nullptr);
}

Value value_of(const Json& doc) {
    Value v;
    v.name = doc.value("name", std::string());
    doc.at("type").get_to(v.type);
    v.json = doc.at("value").dump();
    v.text = doc.contains("text") ? doc.at("text").get<std::string>() : v.json;
    return v;
}

std::vector<Value> values_of(const Json& array) {
    std::vector<Value> out;
    for (const Json& v : array) out.push_back(value_of(v));
    return out;
}

TraceRecord record_of(const Json& doc) {
    TraceRecord r;
    doc.at("time_ns").get_to(r.time_ns);
    doc.at("tid").get_to(r.tid);
    r.kind = kind_of(doc.at("kind").get<std::string>());
    doc.at("function").get_to(r.function);
    doc.at("depth").get_to(r.depth);
    r.unwound = doc.value("unwound", false);
    r.stamped = doc.value("stamped", true);
    r.exit_traced = doc.value("exit_traced", true);
    r.dropped_before = doc.value("dropped_before", std::uint64_t{0});
    r.exits_lost_before = doc.value("exits_lost_before", std::uint64_t{0});
    if (doc.contains("exits_closed")) doc.at("exits_closed").get_to(r.exits_closed);
    r.exits_lost_ns = doc.value("exits_lost_ns", std::uint64_t{0});
    if (doc.contains("args")) {
        if (r.kind == probelist::ProbeKind::point) {
            doc.at("args").get_to(r.args);
        } else {
            r.has_arguments = true;
            r.arguments = values_of(doc.at("args"));
        }
    }
    if (doc.contains("call_args")) {
        r.has_arguments = true;
        r.arguments = values_of(doc.at("call_args"));
    }
    if (doc.contains("retval")) r.retval = value_of(doc.at("retval"));
    if (doc.contains("backtrace"))
        for (const Json& f : doc.at("backtrace")) {
            Frame frame;
            frame.address = std::strtoull(f.at("address").get<std::string>().c_str(), nullptr, 16);
            frame.function = f.value("function", std::string());
            frame.file = f.value("file", std::string());
            frame.line = f.value("line", 0u);
            r.backtrace.push_back(std::move(frame));
        }
    r.in_signal = doc.value("in_signal", false);
    return r;
}

void patch_fields(JsonWriter& j, const PatchStats& st) {
    j.key("patched").begin_array();
    for (const PatchedFunction& f : st.patched)
        j.begin_object()
            .field("function", f.function)
            .field("module", f.module)
            .field("entry", f.entry)
            .field("library", f.library)
            .field("symbol", f.symbol)
            .field("replacement", f.replacement)
            .field("stub", f.stub)
            .field("signature_check", f.signature_check)
            .field("signature", f.signature)
            .end_object();
    j.end_array().field("injected", st.injected).field("threads", st.threads);
    j.field("pause_us", st.pause_us).field("stop_us", st.stop_us);
}

PatchStats patch_of(const Json& doc) {
    PatchStats st;
    for (const Json& f : doc.at("patched")) {
        PatchedFunction p;
        f.at("function").get_to(p.function);
        f.at("module").get_to(p.module);
        f.at("entry").get_to(p.entry);
        f.at("library").get_to(p.library);
        f.at("symbol").get_to(p.symbol);
        f.at("replacement").get_to(p.replacement);
        f.at("stub").get_to(p.stub);
        f.at("signature_check").get_to(p.signature_check);
        f.at("signature").get_to(p.signature);
        st.patched.push_back(std::move(p));
    }
    doc.at("injected").get_to(st.injected);
    doc.at("threads").get_to(st.threads);
    doc.at("pause_us").get_to(st.pause_us);
    doc.at("stop_us").get_to(st.stop_us);
    return st;
}

// Parses `text` as one JSON object and decodes it; any mismatch is the
// caller's bad input, said with `what` it should have been.
template <typename F>
auto decode(std::string_view text, const char* what, F&& of) {
    try {
        const Json doc = Json::parse(text);
        if (!doc.is_object()) throw Json::other_error::create(501, "not a JSON object", nullptr);
        return of(doc);
    } catch (const Json::exception& e) {
        throw Error(std::string("not ") + what + ": " + e.what(), ExitCode::bad_input);
    }
}

// {"pid":PID, then what `fields` writes}.
template <typename Stats>
std::string with_pid(pid_t pid, const Stats& stats, void (*fields)(JsonWriter&, const Stats&)) {
    JsonWriter j;
    j.begin_object().field("pid", pid);
    fields(j, stats);
    return j.end_object().str();
}

}  // namespace

void write_trace_record_fields(JsonWriter& j, const TraceRecord& r, bool with_text) {
    j.field("time_ns", r.time_ns)
        .field("tid", r.tid)
        .field("kind", probelist::to_string(r.kind))
        .field("function", r.function)
        .field("depth", r.depth);
    if (r.unwound) j.field("unwound", true);
    if (!r.stamped) j.field("stamped", false);
    if (!r.exit_traced) j.field("exit_traced", false);
    if (r.dropped_before) j.field("dropped_before", r.dropped_before);
    if (r.exits_lost_before) j.field("exits_lost_before", r.exits_lost_before);
    // which calls the nesting closed there, and when: for a decoder's Chrome spans
    if (with_text && r.exits_lost_before) {
        j.key("exits_closed").begin_array();
        for (const std::string& f : r.exits_closed) j.value(f);
        j.end_array().field("exits_lost_ns", r.exits_lost_ns);
    }
    if (r.kind == probelist::ProbeKind::point) {
        j.key("args").begin_array();
        for (std::uint64_t a : r.args) j.value(a);
        j.end_array();
    }
    auto value = [&](const Value& v) {
        j.field("type", v.type).key("value").raw(v.json.empty() ? "null" : v.json);
        if (with_text) j.field("text", v.text);
    };
    // An exit's arguments are its entry's, for people: sent to a decoder
    // only ("call_args"), never in the schema.
    const char* arguments = r.kind == probelist::ProbeKind::entry ? "args"
                            : r.kind == probelist::ProbeKind::exit && with_text ? "call_args"
                                                                                : nullptr;
    if (arguments && r.has_arguments) {
        j.key(arguments).begin_array();
        for (const Value& v : r.arguments) {
            j.begin_object().field("name", v.name);
            value(v);
            j.end_object();
        }
        j.end_array();
    }
    if (r.retval) {
        j.key("retval").begin_object();
        value(*r.retval);
        j.end_object();
    }
    if (!r.backtrace.empty()) {
        j.key("backtrace").begin_array();
        for (const Frame& f : r.backtrace) {
            j.begin_object().field("address", hex_address(f.address)).field("function", f.function);
            if (!f.file.empty()) j.field("file", f.file).field("line", f.line);
            j.end_object();
        }
        j.end_array();
    }
    if (r.in_signal) j.field("in_signal", true);
}

std::string to_json(const AttachStats& stats, pid_t pid) { return with_pid(pid, stats, attach_fields); }

AttachStats attach_stats_from_json(std::string_view json) { return decode(json, "an attach report", attach_of); }

std::string to_json(const DetachStats& stats, pid_t pid) { return with_pid(pid, stats, detach_fields); }

DetachStats detach_stats_from_json(std::string_view json) { return decode(json, "a detach report", detach_of); }

std::string to_json(const TraceRecord& record) {
    JsonWriter j;
    j.begin_object();
    write_trace_record_fields(j, record);
    return j.end_object().str();
}

TraceRecord trace_record_from_json(std::string_view json) { return decode(json, "a trace record", record_of); }

namespace agent {

namespace {

template <class... F>
struct Overloaded : F... {
    using F::operator()...;
};
// clang 14 (the fuzz build) deduces no aggregate's template arguments.
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace

std::string encode(const Request& request) {
    JsonWriter j;
    j.begin_object().field("id", request.id);
    std::visit(Overloaded{
                   [&](const Attach& a) {
                       j.field("op", "attach").field("functions", a.functions);
                       if (a.handler) j.field("handler", a.handler == HandlerMode::count ? "count" : "trace");
                       if (a.completed) j.field("completed", true);
                       if (a.values.args) j.field("args", true);
                       if (a.values.retval) j.field("retval", true);
                       if (a.values.backtrace) j.field("backtrace", a.values.backtrace);
                       if (!a.when.empty()) j.field("when", a.when);
                       if (!a.min_duration.empty()) j.field("min_duration", a.min_duration);
                   },
                   [&](const Detach& d) { j.field("op", "detach").field("functions", d.functions); },
                   [&](const Select& s) { j.field("op", "select").field("functions", s.functions); },
                   [&](const Status&) { j.field("op", "status"); },
                   [&](const Trace& t) {
                       j.field("op", "trace").field("on", t.on);
                       if (t.lossless) j.field("lossless", true);
                   },
                   [&](const Patch& p) {
                       j.field("op", "patch").field("force", p.force).key("patches").begin_array();
                       for (const FunctionPatch& f : p.patches)
                           j.begin_object()
                               .field("function", f.function)
                               .field("library", f.library)
                               .field("symbol", f.symbol)
                               .end_object();
                       j.end_array();
                   },
               },
               request.body);
    return j.end_object().str();
}

Request decode_request(std::string_view line) {
    return decode(line, "a probe agent request", [](const Json& doc) {
        Request r;
        doc.at("id").get_to(r.id);
        const std::string op = doc.at("op").get<std::string>();
        auto functions = [&] { return doc.value("functions", std::vector<std::string>()); };
        if (op == "attach") {
            Attach a{functions(), std::nullopt, doc.value("completed", false)};
            a.values.args = doc.value("args", false);
            a.values.retval = doc.value("retval", false);
            a.values.backtrace = doc.value("backtrace", 0u);
            a.when = doc.value("when", std::string());
            a.min_duration = doc.value("min_duration", std::string());
            if (doc.contains("handler")) {
                const std::string handler = doc.at("handler").get<std::string>();
                if (handler != "count" && handler != "trace")
                    throw Json::other_error::create(501, "unknown handler '" + handler + "'", nullptr);
                a.handler = handler == "count" ? HandlerMode::count : HandlerMode::trace;
            }
            r.body = std::move(a);
        }
        else if (op == "detach") r.body = Detach{functions()};
        else if (op == "select") r.body = Select{functions()};
        else if (op == "status") r.body = Status{};
        else if (op == "trace") r.body = Trace{doc.value("on", true), doc.value("lossless", false)};
        else if (op == "patch") {
            Patch p;
            p.force = doc.value("force", false);
            for (const Json& f : doc.at("patches"))
                p.patches.push_back({f.at("function").get<std::string>(), f.at("library").get<std::string>(),
                                     f.value("symbol", std::string())});
            r.body = p;
        }
        else throw Json::other_error::create(501, "unknown op '" + op + "'", nullptr);
        return r;
    });
}

std::string encode(const Message& message) {
    JsonWriter j;
    j.begin_object();
    std::visit(Overloaded{
                   [&](const Reply& r) {
                       j.field("type", "reply").field("id", r.id).field("ok", r.ok);
                       if (!r.ok) j.field("error", r.error).field("exit_code", r.exit_code);
                       if (r.attached) {
                           attach_fields(j.key("attached").begin_object(), *r.attached);
                           j.end_object();
                       }
                       if (r.detached) {
                           detach_fields(j.key("detached").begin_object(), *r.detached);
                           j.end_object();
                       }
                       if (r.patched) {
                           patch_fields(j.key("patched").begin_object(), *r.patched);
                           j.end_object();
                       }
                       if (r.status)
                           j.key("status")
                               .begin_object()
                               .field("pid", r.status->pid)
                               .field("functions", r.status->functions)
                               .field("tracing", r.status->tracing)
                               .field("trace_records", r.status->trace_records)
                               .end_object();
                   },
                   // The stream's bulk, with the values' text for people.
                   [&](const TraceRecord& t) { write_trace_record_fields(j.field("type", "trace"), t, true); },
                   [&](const TraceEnd& e) {
                       j.field("type", "trace_end").field("records", e.records).field("dropped", e.dropped);
                   },
                   [&](const Exit& e) { j.field("type", "exit").field("reason", e.reason); },
               },
               message);
    return j.end_object().str();
}

Message decode_message(std::string_view line) {
    return decode(line, "a probe agent message", [](const Json& doc) -> Message {
        const std::string type = doc.at("type").get<std::string>();
        if (type == "trace") return record_of(doc);
        if (type == "trace_end") return TraceEnd{doc.at("records").get<std::uint64_t>(), doc.at("dropped").get<std::uint64_t>()};
        if (type == "exit") return Exit{doc.at("reason").get<std::string>()};
        if (type != "reply") throw Json::other_error::create(501, "unknown message type '" + type + "'", nullptr);
        Reply r;
        doc.at("id").get_to(r.id);
        doc.at("ok").get_to(r.ok);
        if (!r.ok) {
            doc.at("error").get_to(r.error);
            doc.at("exit_code").get_to(r.exit_code);
        }
        if (doc.contains("attached")) r.attached = attach_of(doc.at("attached"));
        if (doc.contains("detached")) r.detached = detach_of(doc.at("detached"));
        if (doc.contains("patched")) r.patched = patch_of(doc.at("patched"));
        if (doc.contains("status")) {
            const Json& s = doc.at("status");
            AgentStatus st;
            s.at("pid").get_to(st.pid);
            s.at("functions").get_to(st.functions);
            s.at("tracing").get_to(st.tracing);
            s.at("trace_records").get_to(st.trace_records);
            r.status = st;
        }
        return r;
    });
}

}  // namespace agent
}  // namespace iprobe::hotpatch
