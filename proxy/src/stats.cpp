#include "iprobe/proxy/stats.h"

#include <poll.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>

#include "iprobe/proxy/mirror.h"
#include "iprobe/support/error.h"
#include "iprobe/support/json.h"

namespace iprobe::proxy {

void write_divergence_fields(JsonWriter& j, const DivergenceStats& d, CompareSource source) {
    j.field("mode", d.mode);
    j.field("compared", d.compared);
    j.field("ignored", d.ignored);
    j.field("mismatches", d.mismatches);
    j.field("diverged_connections", d.diverged_connections);
    j.field("unchecked_connections", d.unchecked_connections);
    j.field("reordered", d.reordered);
    j.field("unclassified", d.unclassified);
    j.key("reports").begin_array();
    for (const auto& r : d.reports) {
        j.begin_object();
        j.field("connection", r.connection);
        j.field(r.index_is_byte_offset ? "byte_offset" : "reply_index", r.index);
        j.field("request", r.request);
        j.field("production", r.production);
        if (source == CompareSource::replay) {
            j.field("replay", r.debug);
        } else {
            j.field("debug", r.debug);
            j.field("at_s", r.at_s);
            j.field("debug_target", r.debug_target);
        }
        j.end_object();
    }
    j.end_array();
}

void write_stats_fields(JsonWriter& j, const MirrorStats& s) {
    j.field("mode", s.mode);
    j.field("uptime_s", s.uptime_s);
    j.key("connections").begin_object();
    j.field("accepted", s.connections.accepted);
    j.field("active", s.connections.active);
    j.field("closed", s.connections.closed);
    j.field("lingering_debug", s.connections.lingering_debug);
    j.field("production_connect_failures", s.connections.production_connect_failures);
    j.field("production_errors", s.connections.production_errors);
    j.end_object();
    j.key("bytes").begin_object();
    j.field("client_to_production", s.bytes.client_to_production);
    j.field("production_to_client", s.bytes.production_to_client);
    j.field("to_debug", s.bytes.to_debug);
    j.field("from_debug", s.bytes.from_debug);
    j.end_object();
    j.key("debug").begin_object();
    if (!s.debug.address.empty()) j.field("address", s.debug.address);
    j.field("connections", s.debug.connections);
    j.field("connect_failures", s.debug.connect_failures);
    j.field("errors", s.debug.errors);
    j.field("closed_early", s.debug.closed_early);
    j.field("completed", s.debug.completed);
    j.field("linger_timeouts", s.debug.linger_timeouts);
    j.end_object();
    j.key("buffer").begin_object();
    j.field("per_connection_limit", s.buffer.per_connection_limit);
    j.field("total_limit", s.buffer.total_limit);
    j.field("buffered", s.buffer.buffered);
    j.field("high_water_total", s.buffer.high_water_total);
    j.field("high_water_connection", s.buffer.high_water_connection);
    j.field("overflows", s.buffer.overflows);
    j.end_object();
    j.key("debug_windows_ms").begin_object();
    j.field("count", s.debug_windows_ms.count);
    j.field("min", s.debug_windows_ms.min);
    j.field("mean", s.debug_windows_ms.mean);
    j.field("max", s.debug_windows_ms.max);
    j.key("recent").begin_array();
    for (double w : s.debug_windows_ms.recent) j.value(w);
    j.end_array();
    j.end_object();
    j.key("divergence").begin_object();
    write_divergence_fields(j, s.divergence, CompareSource::mirror);
    j.end_object();
    j.key("debug_targets").begin_array();
    for (const auto& d : s.debug_targets) {
        j.begin_object();
        j.field("address", d.address);
        j.field("connections", d.connections);
        j.field("connect_failures", d.connect_failures);
        j.field("overflows", d.overflows);
        j.field("diverged_connections", d.diverged_connections);
        j.field("open_legs", d.open_legs);
        j.field("buffered", d.buffered);
        j.field("max_fill", d.max_fill);
        j.field("max_pending_ms", d.max_pending_ms);
        j.field("max_reply_lag_ms", d.max_reply_lag_ms);
        j.field("replies_behind", d.replies_behind);
        j.field("bytes", d.bytes);
        j.end_object();
    }
    j.end_array();
    if (s.aggregator) {
        j.key("aggregator").begin_object();
        j.field("slots", s.aggregator->slots);
        j.field("unclaimed_production_connections", s.aggregator->unclaimed_production_connections);
        j.field("unmatched_debug_connections", s.aggregator->unmatched_debug_connections);
        j.end_object();
    }
    if (s.capture) {
        const auto& c = *s.capture;
        j.key("capture").begin_object();
        j.field("interface", c.interface);
        j.field("port", c.port);
        j.field("filter", c.filter);
        j.field("ring_bytes", c.ring_bytes);
        j.field("packets", c.packets);
        j.field("packets_before_start", c.packets_before_start);
        j.field("kernel_drops", c.kernel_drops);
        j.field("interface_drops", c.interface_drops);
        j.field("truncated_packets", c.truncated_packets);
        j.field("flows", c.flows);
        j.field("untracked_flows", c.untracked_flows);
        j.field("connections_from_start", c.connections_from_start);
        j.field("connections_joined", c.connections_joined);
        j.field("connections_unjoinable", c.connections_unjoinable);
        j.field("connections_joining", c.connections_joining);
        j.field("holding", c.holding);
        j.field("checkpoint_connections", c.checkpoint_connections);
        j.field("resumed_connections", c.resumed_connections);
        j.field("skipped_requests", c.skipped_requests);
        j.field("missed_connections", c.missed_connections);
        j.field("missed_requests", c.missed_requests);
        j.field("lost_connections", c.lost_connections);
        j.field("lost_reply_connections", c.lost_reply_connections);
        j.key("loss_causes").begin_object();
        for (const auto& [cause, n] : c.loss_causes) j.field(cause, n);
        j.end_object();
        j.field("checked_with_production", c.checked_with_production);
        j.field("out_of_order_segments", c.out_of_order_segments);
        j.field("retransmitted_bytes", c.retransmitted_bytes);
        j.field("overlapping_bytes", c.overlapping_bytes);
        j.field("cpu_s", c.cpu_s);
        j.end_object();
    }
    if (s.record) {
        j.key("record").begin_object();
        j.field("path", s.record->path);
        j.field("records", s.record->records);
        j.field("stopped_early", s.record->stopped_early);
        j.end_object();
    }
    j.key("open_connections").begin_array();
    for (const auto& c : s.open_connections) {
        j.begin_object();
        j.field("id", c.id);
        j.field("age_ms", c.age_ms);
        j.field("lingering", c.lingering);
        j.key("debug").begin_array();
        for (const auto& leg : c.debug) {
            j.begin_object();
            j.field("state", leg.state);
            j.field("buffered", leg.buffered);
            j.field("high_water", leg.high_water);
            j.field("fill", leg.fill);
            j.field("pending_ms", leg.pending_ms);
            j.field("replies_behind", leg.replies_behind);
            j.field("reply_lag_ms", leg.reply_lag_ms);
            j.end_object();
        }
        j.end_array();
        if (c.captured) {
            j.field("client", c.captured->client);
            j.field("capture", c.captured->status != "followed" ? c.captured->status
                               : c.captured->joined                ? "joined"
                                                                   : "from_start");
            j.field("lost_client_bytes", c.captured->lost_client_bytes);
            j.field("lost_replies", c.captured->lost_replies);
        }
        j.end_object();
    }
    j.end_array();
}

std::string to_json(const MirrorStats& stats) {
    JsonWriter j;
    j.begin_object();
    write_stats_fields(j, stats);
    j.end_object();
    return j.str();
}

namespace {

using Json = nlohmann::json;

// Reads `into` from `doc[key]`; a missing key keeps the default (older
// mirrors wrote fewer), a value of the wrong type is an error.
template <typename T>
void read(const Json& doc, const char* key, T& into) {
    if (auto it = doc.find(key); it != doc.end() && !it->is_null()) it->get_to(into);
}

const Json& object(const Json& doc, const char* key) {
    static const Json empty = Json::object();
    auto it = doc.find(key);
    if (it == doc.end()) return empty;
    if (!it->is_object()) throw Error(std::string("mirror stats: \"") + key + "\" is not an object", ExitCode::bad_input);
    return *it;
}

const Json& array(const Json& doc, const char* key) {
    static const Json empty = Json::array();
    auto it = doc.find(key);
    if (it == doc.end() || it->is_null()) return empty;
    if (!it->is_array()) throw Error(std::string("mirror stats: \"") + key + "\" is not an array", ExitCode::bad_input);
    return *it;
}

}  // namespace

MirrorStats parse_mirror_stats(std::string_view text) {
    MirrorStats s;
    try {
        const Json doc = Json::parse(text);
        if (!doc.is_object()) throw Error("mirror stats: not a JSON object", ExitCode::bad_input);
        read(doc, "mode", s.mode);
        read(doc, "uptime_s", s.uptime_s);
        const Json& c = object(doc, "connections");
        read(c, "accepted", s.connections.accepted);
        read(c, "active", s.connections.active);
        read(c, "closed", s.connections.closed);
        read(c, "lingering_debug", s.connections.lingering_debug);
        read(c, "production_connect_failures", s.connections.production_connect_failures);
        read(c, "production_errors", s.connections.production_errors);
        const Json& b = object(doc, "bytes");
        read(b, "client_to_production", s.bytes.client_to_production);
        read(b, "production_to_client", s.bytes.production_to_client);
        read(b, "to_debug", s.bytes.to_debug);
        read(b, "from_debug", s.bytes.from_debug);
        const Json& d = object(doc, "debug");
        read(d, "address", s.debug.address);
        read(d, "connections", s.debug.connections);
        read(d, "connect_failures", s.debug.connect_failures);
        read(d, "errors", s.debug.errors);
        read(d, "closed_early", s.debug.closed_early);
        read(d, "completed", s.debug.completed);
        read(d, "linger_timeouts", s.debug.linger_timeouts);
        const Json& buf = object(doc, "buffer");
        read(buf, "per_connection_limit", s.buffer.per_connection_limit);
        read(buf, "total_limit", s.buffer.total_limit);
        read(buf, "buffered", s.buffer.buffered);
        read(buf, "high_water_total", s.buffer.high_water_total);
        read(buf, "high_water_connection", s.buffer.high_water_connection);
        read(buf, "overflows", s.buffer.overflows);
        const Json& w = object(doc, "debug_windows_ms");
        read(w, "count", s.debug_windows_ms.count);
        read(w, "min", s.debug_windows_ms.min);
        read(w, "mean", s.debug_windows_ms.mean);
        read(w, "max", s.debug_windows_ms.max);
        read(w, "recent", s.debug_windows_ms.recent);
        const Json& v = object(doc, "divergence");
        read(v, "mode", s.divergence.mode);
        read(v, "compared", s.divergence.compared);
        read(v, "ignored", s.divergence.ignored);
        read(v, "mismatches", s.divergence.mismatches);
        read(v, "reordered", s.divergence.reordered);
        read(v, "unclassified", s.divergence.unclassified);
        read(v, "diverged_connections", s.divergence.diverged_connections);
        read(v, "unchecked_connections", s.divergence.unchecked_connections);
        for (const Json& r : array(v, "reports")) {
                DivergenceReportStats report;
                read(r, "connection", report.connection);
                report.index_is_byte_offset = r.contains("byte_offset");
                read(r, report.index_is_byte_offset ? "byte_offset" : "reply_index", report.index);
                read(r, "request", report.request);
                read(r, "production", report.production);
                read(r, "debug", report.debug);
                read(r, "at_s", report.at_s);
                read(r, "debug_target", report.debug_target);
                s.divergence.reports.push_back(std::move(report));
        }
        for (const Json& t : array(doc, "debug_targets")) {
            MirrorStats::DebugTarget d;
            read(t, "address", d.address);
            read(t, "connections", d.connections);
            read(t, "connect_failures", d.connect_failures);
            read(t, "overflows", d.overflows);
            read(t, "diverged_connections", d.diverged_connections);
            read(t, "open_legs", d.open_legs);
            read(t, "buffered", d.buffered);
            read(t, "max_fill", d.max_fill);
            read(t, "max_pending_ms", d.max_pending_ms);
            read(t, "max_reply_lag_ms", d.max_reply_lag_ms);
            read(t, "replies_behind", d.replies_behind);
            read(t, "bytes", d.bytes);
            s.debug_targets.push_back(std::move(d));
        }
        for (const Json& c : array(doc, "open_connections")) {
            MirrorStats::ConnectionStats cs;
            read(c, "id", cs.id);
            read(c, "age_ms", cs.age_ms);
            read(c, "lingering", cs.lingering);
            for (const Json& l : array(c, "debug")) {
                MirrorStats::ConnectionStats::Leg leg;
                read(l, "state", leg.state);
                read(l, "buffered", leg.buffered);
                read(l, "high_water", leg.high_water);
                read(l, "fill", leg.fill);
                read(l, "pending_ms", leg.pending_ms);
                read(l, "replies_behind", leg.replies_behind);
                read(l, "reply_lag_ms", leg.reply_lag_ms);
                cs.debug.push_back(std::move(leg));
            }
            if (c.contains("capture")) {
                MirrorStats::ConnectionStats::Captured captured;
                read(c, "client", captured.client);
                const std::string how = c.value("capture", "");
                captured.joined = how == "joined";
                if (how != "joined" && how != "from_start") captured.status = how;
                read(c, "lost_client_bytes", captured.lost_client_bytes);
                read(c, "lost_replies", captured.lost_replies);
                cs.captured = std::move(captured);
            }
            s.open_connections.push_back(std::move(cs));
        }
        if (doc.contains("aggregator")) {
            const Json& a = object(doc, "aggregator");
            MirrorStats::Aggregator agg;
            read(a, "slots", agg.slots);
            read(a, "unclaimed_production_connections", agg.unclaimed_production_connections);
            read(a, "unmatched_debug_connections", agg.unmatched_debug_connections);
            s.aggregator = agg;
        }
        if (doc.contains("capture")) {
            const Json& c = object(doc, "capture");
            MirrorStats::Capture cap;
            read(c, "interface", cap.interface);
            read(c, "port", cap.port);
            read(c, "filter", cap.filter);
            read(c, "ring_bytes", cap.ring_bytes);
            read(c, "packets", cap.packets);
            read(c, "packets_before_start", cap.packets_before_start);
            read(c, "kernel_drops", cap.kernel_drops);
            read(c, "interface_drops", cap.interface_drops);
            read(c, "truncated_packets", cap.truncated_packets);
            read(c, "flows", cap.flows);
            read(c, "untracked_flows", cap.untracked_flows);
            read(c, "connections_from_start", cap.connections_from_start);
            read(c, "connections_joined", cap.connections_joined);
            read(c, "connections_unjoinable", cap.connections_unjoinable);
            read(c, "connections_joining", cap.connections_joining);
            read(c, "holding", cap.holding);
            read(c, "checkpoint_connections", cap.checkpoint_connections);
            read(c, "resumed_connections", cap.resumed_connections);
            read(c, "skipped_requests", cap.skipped_requests);
            read(c, "missed_connections", cap.missed_connections);
            read(c, "missed_requests", cap.missed_requests);
            read(c, "lost_connections", cap.lost_connections);
            read(c, "lost_reply_connections", cap.lost_reply_connections);
            read(c, "loss_causes", cap.loss_causes);
            read(c, "checked_with_production", cap.checked_with_production);
            read(c, "out_of_order_segments", cap.out_of_order_segments);
            read(c, "retransmitted_bytes", cap.retransmitted_bytes);
            read(c, "overlapping_bytes", cap.overlapping_bytes);
            read(c, "cpu_s", cap.cpu_s);
            s.capture = cap;
        }
        if (doc.contains("record")) {
            const Json& r = object(doc, "record");
            MirrorStats::Record rec;
            read(r, "path", rec.path);
            read(r, "records", rec.records);
            read(r, "stopped_early", rec.stopped_early);
            s.record = rec;
        }
    } catch (const Json::exception& e) {
        throw Error(std::string("mirror stats: ") + e.what(), ExitCode::bad_input);
    }
    return s;
}

std::optional<std::string> fetch_mirror_stats(const Endpoint& at, std::chrono::milliseconds timeout) {
    UniqueFd s(::socket(at.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s) return std::nullopt;
    timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
    ::setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(s.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&at.addr), at.len) != 0) return std::nullopt;
    constexpr std::string_view request = "GET / HTTP/1.0\r\n\r\n";
    if (::send(s.get(), request.data(), request.size(), MSG_NOSIGNAL) < 0) return std::nullopt;
    std::string response;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(s.get(), buf, sizeof buf, 0)) > 0) response.append(buf, static_cast<size_t>(n));
    const auto body = response.find("\r\n\r\n");
    if (body == std::string::npos) return std::nullopt;
    std::string doc = response.substr(body + 4);
    while (!doc.empty() && (doc.back() == '\n' || doc.back() == '\r')) doc.pop_back();
    if (!doc.starts_with("{") || !doc.ends_with("}")) return std::nullopt;
    return doc;
}

std::string ready_event_json(const MirrorReady& ready, pid_t pid) {
    JsonWriter j;
    j.begin_object();
    j.field("event", ready.listen ? "listening" : "capturing");
    if (ready.listen) j.field("listen", ready.listen->str());
    if (!ready.capture.empty()) j.field("capture", ready.capture);
    if (ready.debug_listen) j.field("debug_listen", ready.debug_listen->str());
    if (ready.stats) j.field("stats", ready.stats->str());
    j.field("pid", static_cast<std::int64_t>(pid));
    j.end_object();
    return j.str();
}

MirrorReady parse_ready_event(std::string_view text) {
    try {
        const Json doc = Json::parse(text);
        const std::string event = doc.value("event", "");
        if (event != "listening" && event != "capturing")
            throw Error("not a mirror readiness event", ExitCode::bad_input);
        MirrorReady ready;
        if (event == "listening") ready.listen = parse_endpoint(doc.at("listen").get<std::string>(), "listen");
        if (event == "capturing") ready.capture = doc.at("capture").get<std::string>();
        if (doc.contains("debug_listen"))
            ready.debug_listen = parse_endpoint(doc.at("debug_listen").get<std::string>(), "debug_listen");
        if (doc.contains("stats")) ready.stats = parse_endpoint(doc.at("stats").get<std::string>(), "stats");
        return ready;
    } catch (const Json::exception& e) {
        throw Error(std::string("mirror readiness event: ") + e.what(), ExitCode::bad_input);
    }
}

namespace {
constexpr std::pair<MirrorCommand::Kind, const char*> kCommandNames[] = {
    {MirrorCommand::Kind::record, "record"},
    {MirrorCommand::Kind::checkpoint, "checkpoint"},
    {MirrorCommand::Kind::release, "release"},
};
}  // namespace

std::string to_json(const MirrorCommand& command) {
    JsonWriter j;
    j.begin_object();
    for (const auto& [kind, name] : kCommandNames)
        if (kind == command.kind) j.field("command", name);
    if (command.kind == MirrorCommand::Kind::record) j.field("path", command.path);
    j.end_object();
    return j.str();
}

MirrorCommand parse_mirror_command(std::string_view text) {
    try {
        const Json doc = Json::parse(text);
        const std::string name = doc.is_object() ? doc.value("command", "") : "";
        for (const auto& [kind, known] : kCommandNames)
            if (name == known) {
                MirrorCommand c;
                c.kind = kind;
                c.path = doc.value("path", "");
                return c;
            }
        throw Error("mirror command: unknown command '" + name + "' (record, checkpoint, release)", ExitCode::bad_input);
    } catch (const Json::exception& e) {
        throw Error(std::string("mirror command: ") + e.what(), ExitCode::bad_input);
    }
}

std::string to_json(const MirrorCommandReply& reply) {
    JsonWriter j;
    j.begin_object().field("ok", reply.ok);
    if (!reply.error.empty()) j.field("error", reply.error);
    j.field("open_connections", reply.open_connections).field("at_s", reply.at_s);
    j.field("connections", reply.connections).field("resumed", reply.resumed);
    j.field("skipped_requests", reply.skipped_requests);
    j.key("missed").begin_array();
    for (const auto& m : reply.missed) {
        j.begin_object().field("connection", m.connection).field("client", m.client);
        j.field("requests", m.requests).field("reason", m.reason).end_object();
    }
    j.end_array().end_object();
    return j.str();
}

MirrorCommandReply parse_mirror_command_reply(std::string_view text) {
    try {
        const Json doc = Json::parse(text);
        if (!doc.is_object() || !doc.contains("ok")) throw Error("not a mirror command reply", ExitCode::bad_input);
        MirrorCommandReply r;
        read(doc, "ok", r.ok);
        read(doc, "error", r.error);
        read(doc, "open_connections", r.open_connections);
        read(doc, "at_s", r.at_s);
        read(doc, "connections", r.connections);
        read(doc, "resumed", r.resumed);
        read(doc, "skipped_requests", r.skipped_requests);
        for (const Json& m : array(doc, "missed")) {
            MissedConnection missed;
            read(m, "connection", missed.connection);
            read(m, "client", missed.client);
            read(m, "requests", missed.requests);
            read(m, "reason", missed.reason);
            r.missed.push_back(std::move(missed));
        }
        return r;
    } catch (const Json::exception& e) {
        throw Error(std::string("mirror command reply: ") + e.what(), ExitCode::bad_input);
    }
}

}  // namespace iprobe::proxy
