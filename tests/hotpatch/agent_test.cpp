// The probe agent's protocol (every message round-trips, bad lines are bad
// input) and the agent itself, over a socket pair, on a live coldpatched
// target: attach, trace, select, status, detach by name, exact counts.
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "hotpatch_fixture.h"
#include "iprobe/hotpatch/agent.h"
#include "iprobe/hotpatch/agent_protocol.h"
#include "iprobe/hotpatch/attach_report.h"
#include "iprobe/hotpatch/output.h"

#include <sstream>
#include "iprobe/support/error.h"

namespace iprobe::test {
namespace {

using namespace hotpatch;

AttachStats some_attach() {
    AttachStats st;
    st.selected = 12;
    st.enabled = 10;
    st.already_enabled = 2;
    st.total_enabled = 12;
    st.threads = 3;
    st.pause_us = 456;
    st.stop_us = 123;
    st.prepare_pause_us = 456;
    st.write_pause_us = 321;
    st.runtime_injected = true;
    st.refused = 1;
    st.refused_example = "f: too short";
    st.exits_left_off = 5;
    st.values_unavailable = 2;
    st.values_untyped = 1;
    st.values_no_return = 4;
    st.when_undecidable = 3;
    st.modules = {"/usr/bin/x"};
    st.patched_skipped = {"g", "h \"quoted\"\n"};
    return st;
}

// An attach of `iprobe debug --args --retval --backtrace=4 --when ...`.
agent::Attach values_attach() {
    agent::Attach a{{"setCommand"}};
    a.values = ValueOptions{true, true, 4};
    a.when = "key == \"user:42\"";
    a.min_duration = "2ms";
    return a;
}

DetachStats some_detach() {
    DetachStats st;
    st.disabled = 4;
    st.still_enabled = 8;
    st.not_restored = 1;
    st.sites_restored = 4;
    st.region_problem = "rewritten";
    st.threads = 2;
    st.pause_us = 99;
    st.stop_us = 9;
    return st;
}

TEST(AgentProtocol, ReportsRoundTripAndTheSummaryReadsAsTheCliPrintsIt) {
    const AttachStats st = some_attach();
    EXPECT_EQ(attach_stats_from_json(to_json(st, 77)), st);
    EXPECT_EQ(to_json(st, 77).rfind(R"({"pid":77,"selected":12,)", 0), 0u) << to_json(st, 77);
    EXPECT_EQ(detach_stats_from_json(to_json(some_detach(), 77)), some_detach());
    AttachStats plain = st;
    plain.refused = 0;
    plain.patched_skipped.clear();
    plain.exits_left_off = 0;
    plain.values_unavailable = plain.values_untyped = plain.values_no_return = plain.when_undecidable = 0;
    EXPECT_EQ(attach_summary(plain, 77),
              "enabled 10 probes in process 77 (2 already on, 12 on in total); 3 threads stopped for 456 us to load "
              "the runtime and map its areas, then 321 us to write the sites planned while it ran; runtime injected");
    AttachStats one_stop = plain;
    one_stop.prepare_pause_us = 0;
    one_stop.write_pause_us = one_stop.pause_us;
    EXPECT_EQ(attach_summary(one_stop, 77),
              "enabled 10 probes in process 77 (2 already on, 12 on in total); 3 threads stopped for 456 us; "
              "runtime injected");
    // A report of a tool before the two stops reads as one stop.
    nlohmann::json older = nlohmann::json::parse(to_json(one_stop, 77));
    older.erase("prepare_pause_us");
    older.erase("write_pause_us");
    EXPECT_EQ(attach_stats_from_json(older.dump()), one_stop);
    EXPECT_THROW(attach_stats_from_json("enabled 10 probes"), Error);
    EXPECT_THROW(attach_stats_from_json(R"({"enabled":10})"), Error);
    EXPECT_THROW(detach_stats_from_json("[1,2]"), Error);
}

TEST(AgentProtocol, TraceRecordsRoundTripInTheFieldOrderTheCliPrints) {
    TraceRecord entry{1700000000123456789ull, 42, probelist::ProbeKind::entry, "ns::f(int)", 3, {}, false};
    EXPECT_EQ(to_json(entry),
              R"j({"time_ns":1700000000123456789,"tid":42,"kind":"entry","function":"ns::f(int)","depth":3})j");
    EXPECT_EQ(trace_record_from_json(to_json(entry)), entry);
    TraceRecord point{5, 6, probelist::ProbeKind::point, "p", 0, {1, 2, 18446744073709551615ull}, true};
    EXPECT_EQ(trace_record_from_json(to_json(point)), point);
    EXPECT_THROW(trace_record_from_json(R"({"time_ns":1,"tid":1,"kind":"sideways","function":"f","depth":0})"), Error);
}

// Issue 29's values in the typed trace record: the JSON schema `iprobe trace
// --format json` prints, the text and Chrome writers, and the agent's
// messages, which give every Value back whole (its text too).
TEST(AgentProtocol, ValuesTravelInTheTraceRecordAndEachWriterShowsThem) {
    TraceRecord entry{1000000000, 7, probelist::ProbeKind::entry, "fib", 0, {}, false};
    entry.has_arguments = true;
    entry.arguments = {{"n", "int", "10", "10"}, {"s", "const char*", "\"key\"", "\"key\""}};
    entry.backtrace = {{0x401234, "main", "m.c", 12}, {0x401000, "", "", 0}};
    TraceRecord exit = entry;
    exit.kind = probelist::ProbeKind::exit;
    exit.backtrace.clear();
    exit.retval = Value{"", "long", "55", "55"};
    EXPECT_EQ(to_json(entry),
              R"j({"time_ns":1000000000,"tid":7,"kind":"entry","function":"fib","depth":0,)j"
              R"j("args":[{"name":"n","type":"int","value":10},{"name":"s","type":"const char*","value":"key"}],)j"
              R"j("backtrace":[{"address":"0x401234","function":"main","file":"m.c","line":12},)j"
              R"j({"address":"0x401000","function":""}]})j");
    EXPECT_EQ(to_json(exit),
              R"j({"time_ns":1000000000,"tid":7,"kind":"exit","function":"fib","depth":0,"retval":{"type":"long","value":55}})j");
    EXPECT_EQ(trace_text_line(entry),
              "1.000000000       7 -> fib(n=10, s=\"key\")\n"
              "                               from main (m.c:12)\n"
              "                               from 0x401000\n");
    EXPECT_EQ(trace_text_line(exit), "1.000000000       7 <- fib(n=10, s=\"key\") = 55\n");
    TraceRecord unwound = exit;
    unwound.retval.reset();
    unwound.unwound = true;
    EXPECT_EQ(trace_text_line(unwound), "1.000000000       7 <- fib(n=10, s=\"key\")  unwound (no return value)\n");
    std::ostringstream chrome;
    const auto writer = make_output(OutputFormat::chrome, chrome);
    writer->trace_begin(42);
    writer->trace(entry);
    writer->trace(exit);
    writer->trace_end();
    EXPECT_EQ(chrome.str(),
              "{\"traceEvents\":[\n"
              R"j({"name":"fib","ph":"B","ts":1e+06,"pid":42,"tid":7,"args":{"n":10,"s":"key","backtrace":["main","0x401000"]}},)j"
              "\n"
              R"j({"name":"fib","ph":"E","ts":1e+06,"pid":42,"tid":7,"args":{"retval":55}})j"
              "\n]}\n");
    for (const TraceRecord& r : {entry, exit, unwound}) {
        const agent::Message back = agent::decode_message(agent::encode(agent::Message{r}));
        EXPECT_EQ(std::get<TraceRecord>(back), r) << agent::encode(agent::Message{r});
    }
    EXPECT_EQ(trace_record_from_json(to_json(entry)).arguments[1].json, "\"key\"");
}

// The event after an exit mark (calls a detach left without their exits):
// JSON says how many, text says it on a line of its own, Chrome ends each
// closed call's span at the detach; the agent's message keeps which calls
// were closed and when, so a session's Chrome output is the same.
TEST(AgentProtocol, AnExitMarkTravelsInTheTraceRecordAndEachWriterShowsIt) {
    TraceRecord next{2000000000, 7, probelist::ProbeKind::entry, "v_spin", 0, {}, false};
    next.exits_lost_before = 2;
    next.exits_closed = {"v_wait", "v_loop"};
    next.exits_lost_ns = 1500000000;
    EXPECT_EQ(to_json(next),
              R"j({"time_ns":2000000000,"tid":7,"kind":"entry","function":"v_spin","depth":0,"exits_lost_before":2})j");
    EXPECT_EQ(trace_text_line(next),
              "2.000000000       7 -- 2 calls in flight lost their exit at a detach --\n"
              "2.000000000       7 -> v_spin\n");
    std::ostringstream chrome;
    const auto writer = make_output(OutputFormat::chrome, chrome);
    writer->trace_begin(42);
    writer->trace(next);
    writer->trace_end();
    EXPECT_EQ(chrome.str(),
              "{\"traceEvents\":[\n"
              R"j({"name":"v_wait","ph":"E","ts":1500000,"pid":42,"tid":7,"args":{"exit_lost_at_detach":true}},)j"
              "\n"
              R"j({"name":"v_loop","ph":"E","ts":1500000,"pid":42,"tid":7,"args":{"exit_lost_at_detach":true}},)j"
              "\n"
              R"j({"name":"v_spin","ph":"B","ts":2e+06,"pid":42,"tid":7,"args":{"exits_lost_before":2}})j"
              "\n]}\n");
    const agent::Message back = agent::decode_message(agent::encode(agent::Message{next}));
    EXPECT_EQ(std::get<TraceRecord>(back), next) << agent::encode(agent::Message{next});
}

// matched and undecided under --when are counters beside the calls.
TEST(AgentProtocol, PrometheusCountsMatchedAndUndecidedOfConditionedFunctions) {
    ReportResult r;
    r.pids = {5};
    FunctionStats f;
    f.function = "fib";
    f.calls = 100;
    f.conditioned = true;
    f.raw.matched = 7;
    f.raw.undecided = 2;
    FunctionStats plain;
    plain.function = "other";
    plain.calls = 3;
    r.functions = {f, plain};
    std::ostringstream text;
    make_output(OutputFormat::prometheus, text)->report(r);
    EXPECT_NE(text.str().find("\niprobe_function_matched_total{function=\"fib\"} 7\n"), std::string::npos) << text.str();
    EXPECT_NE(text.str().find("\niprobe_function_undecided_total{function=\"fib\"} 2\n"), std::string::npos) << text.str();
    EXPECT_EQ(text.str().find("iprobe_function_matched_total{function=\"other\"}"), std::string::npos) << text.str();
}

TEST(AgentProtocol, EveryRequestAndMessageRoundTrips) {
    const std::vector<agent::RequestBody> bodies = {agent::Attach{{"a", "b\"c"}}, agent::Attach{},
                                                     agent::Attach{{"c"}, HandlerMode::count, true},
                                                     agent::Attach{{"d"}, HandlerMode::trace, false},
                                                     values_attach(), agent::Detach{{"x"}},
                                                     agent::Select{{}}, agent::Status{}, agent::Trace{false},
                                                     agent::Trace{true, true},
                                                     agent::Patch{{{"f", "/lib/x.so", "g"}, {"h", "/lib/y.so", ""}}, true}};
    std::uint64_t id = 1;
    for (const auto& body : bodies) {
        const agent::Request back = agent::decode_request(agent::encode(agent::Request{id, body}));
        EXPECT_EQ(back.id, id);
        ASSERT_EQ(back.body.index(), body.index());
        std::visit(
            [&](const auto& b) {
                using T = std::decay_t<decltype(b)>;
                const T& sent = std::get<T>(body);
                if constexpr (std::is_same_v<T, agent::Trace>) {
                    EXPECT_EQ(b.on, sent.on);
                    EXPECT_EQ(b.lossless, sent.lossless);
                } else if constexpr (std::is_same_v<T, agent::Patch>) {
                    EXPECT_EQ(b.force, sent.force);
                    ASSERT_EQ(b.patches.size(), sent.patches.size());
                    for (std::size_t i = 0; i < b.patches.size(); ++i) {
                        EXPECT_EQ(b.patches[i].function, sent.patches[i].function);
                        EXPECT_EQ(b.patches[i].library, sent.patches[i].library);
                        EXPECT_EQ(b.patches[i].symbol, sent.patches[i].symbol);
                    }
                } else if constexpr (std::is_same_v<T, agent::Attach>) {
                    EXPECT_EQ(b.functions, sent.functions);
                    EXPECT_EQ(b.handler, sent.handler);
                    EXPECT_EQ(b.completed, sent.completed);
                    EXPECT_EQ(b.values, sent.values);
                    EXPECT_EQ(b.when, sent.when);
                    EXPECT_EQ(b.min_duration, sent.min_duration);
                } else if constexpr (!std::is_same_v<T, agent::Status>) {
                    EXPECT_EQ(b.functions, sent.functions);
                }
            },
            back.body);
        ++id;
    }
    agent::Reply full;
    full.id = 9;
    full.attached = some_attach();
    full.detached = some_detach();
    full.status = agent::AgentStatus{123, {"f", "g"}, true, 77};
    PatchStats patched;
    patched.patched = {{"quote(int)", "/srv/app", 0x401000, "/tmp/fix.so", "quote", 0x7f0000001000, 0x7f0000002000,
                        "match", "int (int)"}};
    patched.injected = {"/tmp/fix.so"};
    patched.threads = 4;
    patched.pause_us = 321;
    patched.stop_us = 21;
    full.patched = patched;
    agent::Reply failed;
    failed.id = 10;
    failed.ok = false;
    failed.error = "no probe of function z";
    failed.exit_code = 5;
    const std::vector<agent::Message> messages = {full, failed,
                                                  TraceRecord{1, 2, probelist::ProbeKind::exit, "f", 1, {}, false},
                                                  agent::TraceEnd{100, 7}, agent::Exit{"process 1 exited"}};
    for (const auto& m : messages) {
        const agent::Message back = agent::decode_message(agent::encode(m));
        ASSERT_EQ(back.index(), m.index()) << agent::encode(m);
        if (const auto* r = std::get_if<agent::Reply>(&m)) {
            const auto& b = std::get<agent::Reply>(back);
            EXPECT_EQ(b.id, r->id);
            EXPECT_EQ(b.ok, r->ok);
            EXPECT_EQ(b.error, r->error);
            EXPECT_EQ(b.exit_code, r->exit_code);
            EXPECT_EQ(b.attached, r->attached);
            EXPECT_EQ(b.detached, r->detached);
            EXPECT_EQ(b.status, r->status);
            ASSERT_EQ(b.patched.has_value(), r->patched.has_value());
            if (r->patched) {
                ASSERT_EQ(b.patched->patched.size(), 1u);
                const PatchedFunction &x = b.patched->patched[0], &y = r->patched->patched[0];
                EXPECT_EQ(std::tie(x.function, x.module, x.entry, x.library, x.symbol, x.replacement, x.stub,
                                   x.signature_check, x.signature),
                          std::tie(y.function, y.module, y.entry, y.library, y.symbol, y.replacement, y.stub,
                                   y.signature_check, y.signature));
                EXPECT_EQ(b.patched->injected, r->patched->injected);
                EXPECT_EQ(std::tie(b.patched->threads, b.patched->pause_us, b.patched->stop_us),
                          std::tie(r->patched->threads, r->patched->pause_us, r->patched->stop_us));
            }
        } else if (const auto* t = std::get_if<TraceRecord>(&m)) {
            EXPECT_EQ(std::get<TraceRecord>(back), *t);
        } else if (const auto* e = std::get_if<agent::TraceEnd>(&m)) {
            EXPECT_EQ(std::get<agent::TraceEnd>(back).records, e->records);
            EXPECT_EQ(std::get<agent::TraceEnd>(back).dropped, e->dropped);
        } else {
            EXPECT_EQ(std::get<agent::Exit>(back).reason, std::get<agent::Exit>(m).reason);
        }
    }
    for (const char* bad : {"", "attach", R"({"id":1})", R"({"id":1,"op":"explode"})", R"({"op":"status"})",
                            R"({"id":1,"op":"attach","handler":"sideways"})"})
        EXPECT_THROW(agent::decode_request(bad), Error) << bad;
    for (const char* bad : {"{}", R"({"type":"reply"})", R"({"type":"gossip"})"})
        EXPECT_THROW(agent::decode_message(bad), Error) << bad;
}

class AgentTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (!is_root()) GTEST_SKIP() << "needs root (ptrace of any process, /run/iprobe)";
    }
};

// An agent serving `pid` (hp_target's probes) on its own thread over a
// socket pair; `client` is the other end.  Dropping the client closes the
// channel, which ends the agent; the future then holds its exit code.
struct ServedAgent {
    explicit ServedAgent(pid_t pid, std::uint32_t ring_records = 0, const std::string& binary = targets_dir() + "/hp_target") {
        int pair[2];
        if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) throw_errno("socketpair");
        UniqueFd ours(pair[0]);
        theirs.reset(pair[1]);
        options.pid = pid;
        options.probe_sources = {binary};
        if (ring_records) options.attach.ring_records = ring_records;
        served = std::async(std::launch::async, [this] { return serve_agent(options, theirs.get(), theirs.get()); });
        client = std::make_unique<AgentClient>(std::move(ours), std::chrono::seconds(60));
    }
    AgentOptions options;
    UniqueFd theirs;
    std::future<int> served;
    std::unique_ptr<AgentClient> client;  // last: goes first, and the agent with it
};

// Trace records of `function` of kind `kind` among `records`.
std::size_t count(const std::vector<TraceRecord>& records, const std::string& function, probelist::ProbeKind kind) {
    return static_cast<std::size_t>(std::count_if(records.begin(), records.end(), [&](const TraceRecord& r) {
        return r.function == function && r.kind == kind;
    }));
}

// Pumps until `enough` holds of what arrived, or 20 s.
std::vector<TraceRecord> collect(AgentClient& client, const std::function<bool(const std::vector<TraceRecord>&)>& enough,
                                 std::vector<TraceRecord> so_far = {}) {
    for (int i = 0; i < 2000 && !enough(so_far); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        client.pump();
        for (auto& r : client.take_trace()) so_far.push_back(std::move(r));
    }
    return so_far;
}

TEST_F(AgentTest, OneAgentAttachesTracesSelectsAndDetachesByNameWithExactCounts) {
    HpTarget target(2);
    ServedAgent server(target.pid(), 1u << 12);
    {
        AgentClient& client = *server.client;
        const agent::Reply attached = client.call(agent::Attach{{"counted"}});
        ASSERT_TRUE(attached.attached);
        EXPECT_EQ(attached.attached->enabled, 2u);  // its entry and exit
        client.call(agent::Trace{true});
        EXPECT_EQ(target.command("burst 10"), 20);
        auto records = collect(client, [](const auto& r) { return r.size() >= 40; });
        EXPECT_EQ(count(records, "counted", probelist::ProbeKind::entry), 20u);
        EXPECT_EQ(count(records, "counted", probelist::ProbeKind::exit), 20u);
        EXPECT_EQ(records.size(), 40u);

        agent::Reply st = client.call(agent::Status{});
        ASSERT_TRUE(st.status);
        EXPECT_EQ(st.status->pid, target.pid());
        EXPECT_EQ(st.status->functions, std::vector<std::string>{"counted"});
        EXPECT_TRUE(st.status->tracing);

        // The selection changes in one request: counted off, in_signal on.
        const agent::Reply selected = client.call(agent::Select{{"in_signal"}});
        ASSERT_TRUE(selected.detached);
        EXPECT_EQ(selected.detached->disabled, 2u);
        ASSERT_TRUE(selected.attached);
        EXPECT_EQ(selected.attached->enabled, 2u);
        st = client.call(agent::Status{});
        EXPECT_EQ(st.status->functions, std::vector<std::string>{"in_signal"});
        client.take_trace();
        EXPECT_EQ(target.command("burst 5"), 10);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        client.pump();
        EXPECT_EQ(count(client.take_trace(), "counted", probelist::ProbeKind::entry), 0u);

        // A function the sources do not have: the agent says so, changes nothing and goes on.
        try {
            client.call(agent::Attach{{"no_such_function"}});
            ADD_FAILURE() << "attached a function that does not exist";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ExitCode::not_found);
            EXPECT_NE(std::string(e.what()).find("no_such_function"), std::string::npos) << e.what();
        }
        const agent::Reply detached = client.call(agent::Detach{{"in_signal"}});
        ASSERT_TRUE(detached.detached);
        EXPECT_EQ(detached.detached->disabled, 2u);
        EXPECT_EQ(detached.detached->still_enabled, 0u);
        EXPECT_TRUE(client.call(agent::Status{}).status->functions.empty());
        client.call(agent::Trace{false});
    }
    server.client.reset();  // the channel closes: the agent ends
    ASSERT_EQ(server.served.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    EXPECT_EQ(server.served.get(), 0);
}

// What `iprobe debug --adapt` does when it drops a function whose calls are
// in flight in a clone (-finstrument-functions flow): the agent's trace
// records say where the call lost its exit, on its thread's next event,
// and nest what follows at depth 0, as `iprobe trace` does.
TEST_F(AgentTest, ACallThatLostItsExitAtADetachIsClosedInTheAgentsTraceRecords) {
    const std::string binary = targets_dir() + "/values_finstrument";
    HpTarget target(1, binary);
    ServedAgent server(target.pid(), 0, binary);
    {
        AgentClient& client = *server.client;
        ASSERT_TRUE(client.call(agent::Attach{{"v_wait", "v_spin"}}).attached);
        client.call(agent::Trace{true});
        ASSERT_EQ(target.command("hold 3"), 1);
        const agent::Reply detached = client.call(agent::Detach{{"v_wait", "v_spin"}});
        ASSERT_TRUE(detached.detached);
        EXPECT_EQ(detached.detached->exits_lost, 1u);
        EXPECT_EQ(target.command("unblock"), 8);
        ASSERT_TRUE(client.call(agent::Attach{{"v_wait", "v_spin"}}).attached);
        EXPECT_EQ(target.command("go"), 3);
        const auto records = collect(client, [](const auto& r) { return r.size() >= 7; });
        ASSERT_EQ(records.size(), 7u);
        EXPECT_EQ(records[0].function, "v_wait");
        EXPECT_EQ(records[0].kind, probelist::ProbeKind::entry);
        EXPECT_EQ(records[1].function, "v_spin");
        EXPECT_EQ(records[1].kind, probelist::ProbeKind::entry);
        EXPECT_EQ(records[1].exits_lost_before, 1u);
        EXPECT_EQ(records[1].exits_closed, std::vector<std::string>{"v_wait"});
        for (std::size_t i = 0; i < records.size(); i++) {
            EXPECT_EQ(records[i].depth, 0) << i;
            EXPECT_EQ(records[i].exits_lost_before, i == 1 ? 1u : 0u) << i;
        }
        client.call(agent::Trace{false});
    }
    server.client.reset();
    ASSERT_EQ(server.served.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    EXPECT_EQ(server.served.get(), 0);
}

// A lossless trace through the agent (`iprobe debug --lossless`): rings of
// 1024 records take 2 threads x 50000 calls only because the threads wait
// for the agent; every entry and exit arrives, none dropped.
TEST_F(AgentTest, ALosslessTraceBringsEveryEventThroughRingsMuchSmallerThanTheBurst) {
    constexpr long kCalls = 50000;
    HpTarget target(2);
    ServedAgent server(target.pid(), 1024);
    {
        AgentClient& client = *server.client;
        ASSERT_TRUE(client.call(agent::Attach{{"counted"}}).attached);
        client.call(agent::Trace{true, true});
        auto burst = std::async(std::launch::async, [&] { return target.command("burst " + std::to_string(kCalls), std::chrono::seconds(120)); });
        auto records = collect(client, [&](const auto& r) { return r.size() >= 4u * kCalls; });
        EXPECT_EQ(burst.get(), 2 * kCalls);
        EXPECT_EQ(count(records, "counted", probelist::ProbeKind::entry), 2u * kCalls);
        EXPECT_EQ(count(records, "counted", probelist::ProbeKind::exit), 2u * kCalls);
        client.call(agent::Trace{false});
        for (int i = 0; i < 200 && client.trace_dropped() == 0 && client.pump(); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        EXPECT_EQ(client.trace_dropped(), 0u);
        TraceReader reader(target.pid(), TraceReader::Access::aggregates);
        EXPECT_EQ(reader.dropped(), 0u);
        // The trace's end turned lossless off: with nobody reading, the
        // threads drop (counted) at once rather than wait for anyone.
        EXPECT_EQ(target.command("burst " + std::to_string(kCalls)), 2 * kCalls);
        EXPECT_EQ(reader.dropped(), 4u * kCalls - 2u * 1024u);
        EXPECT_EQ(reader.lossless_timeouts(), 0u);
    }
    server.client.reset();
    ASSERT_EQ(server.served.wait_for(std::chrono::seconds(20)), std::future_status::ready);
}

// An attach of the count handler through the agent: entries alone (the exit
// left off and said), then --completed turns the exit on too, and the sums
// keep completed calls from then on; trace's handler refuses --completed.
TEST_F(AgentTest, ACountAttachCarriesCompletedAndLeavesTheExitsOffWithoutIt) {
    HpTarget target(1);
    ServedAgent server(target.pid());
    {
        AgentClient& client = *server.client;
        try {
            client.call(agent::Attach{{"counted"}, std::nullopt, true});  // the agent's handler: trace
            ADD_FAILURE() << "completed taken for the trace handler";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ExitCode::usage) << e.what();
        }
        agent::Reply r = client.call(agent::Attach{{"counted"}, HandlerMode::count, false});
        ASSERT_TRUE(r.attached);
        EXPECT_EQ(r.attached->enabled, 1u);
        EXPECT_EQ(r.attached->exits_left_off, 1u);
        EXPECT_EQ(target.command("burst 10"), 10);
        TraceReader reader(target.pid(), TraceReader::Access::aggregates);
        auto counted = [&] {
            for (const FunctionStats& f : reader.functions(reader.sums()))
                if (f.function == "counted") return f;
            return FunctionStats{};
        };
        EXPECT_EQ(counted().calls, 10u);
        EXPECT_FALSE(counted().has_completed());

        r = client.call(agent::Attach{{"counted"}, HandlerMode::count, true});
        ASSERT_TRUE(r.attached);
        EXPECT_EQ(r.attached->enabled, 1u);  // the exit
        EXPECT_EQ(r.attached->exits_left_off, 0u);
        EXPECT_EQ(target.command("burst 10"), 10);
        EXPECT_EQ(counted().calls, 20u);
        EXPECT_TRUE(counted().has_completed());
        EXPECT_EQ(counted().completed, 10u);
        client.call(agent::Detach{{"counted"}});
    }
    server.client.reset();
    ASSERT_EQ(server.served.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    EXPECT_EQ(server.served.get(), 0);
}

TEST_F(AgentTest, TheAgentSaysWhenItsTargetExits) {
    auto target = std::make_unique<HpTarget>(1);
    ServedAgent server(target->pid());
    AgentClient& client = *server.client;
    client.call(agent::Attach{{"counted"}});
    target.reset();  // killed
    for (int i = 0; i < 500 && client.pump(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_FALSE(client.alive());
    EXPECT_NE(client.exit_reason().find("exited"), std::string::npos) << client.exit_reason();
    EXPECT_THROW(client.call(agent::Status{}), Error);
    ASSERT_EQ(server.served.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    EXPECT_EQ(server.served.get(), 0);
}

}  // namespace
}  // namespace iprobe::test
