#include "iprobe/fperf/profile.h"

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "iprobe/support/error.h"
#include "iprobe/support/file.h"
#include "iprobe/support/glob.h"
#include "iprobe/support/json.h"

namespace iprobe::fperf {

using iprobe::Error;
using iprobe::ExitCode;

namespace {

constexpr const char* kMagicLine = "fperf-data\t1";

std::string clean(std::string s) {
    for (auto& c : s)
        if (c == '\t' || c == '\n' || c == '\r') c = ' ';
    return s;
}

std::vector<std::string> split_tabs(const std::string& line) {
    std::vector<std::string> out;
    std::size_t start = 0;
    while (true) {
        const auto tab = line.find('\t', start);
        out.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
        if (tab == std::string::npos) break;
        start = tab + 1;
    }
    return out;
}

std::uint64_t to_u64(const std::string& s, int base = 10) {
    try {
        std::size_t used = 0;
        const auto v = std::stoull(s, &used, base);
        if (used != s.size()) throw std::invalid_argument(s);
        return v;
    } catch (const std::exception&) {
        throw Error("fperf.data: bad number '" + s + "'", ExitCode::bad_input);
    }
}

std::string fmt(double v, int precision = 1) {
    if (std::isnan(v)) return "-";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", precision, v);
    return buf;
}

// 1234567 -> "1.23M": tables stay narrow.
std::string human(double v) {
    if (std::isnan(v)) return "-";
    const char* units[] = {"", "k", "M", "G", "T"};
    int u = 0;
    while (std::fabs(v) >= 1000 && u < 4) {
        v /= 1000;
        u++;
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, u == 0 && v == std::floor(v) ? "%.0f%s" : "%.3g%s", v, units[u]);
    return buf;
}

std::string human_ns(double ns) {
    if (std::isnan(ns)) return "-";
    char buf[64];
    if (ns < 1e3) std::snprintf(buf, sizeof buf, "%.0fns", ns);
    else if (ns < 1e6) std::snprintf(buf, sizeof buf, "%.2fus", ns / 1e3);
    else if (ns < 1e9) std::snprintf(buf, sizeof buf, "%.2fms", ns / 1e6);
    else std::snprintf(buf, sizeof buf, "%.2fs", ns / 1e9);
    return buf;
}

std::string show(const Metric& m, double v) { return m.unit == "ns" ? human_ns(v) : human(v); }

// Functions by estimated CPU time, then calls: where the time went first.
std::vector<const FunctionProfile*> ranked(const Profile& p) {
    const Metric cpu = report_metrics(p)[1];
    std::vector<const FunctionProfile*> out;
    for (const auto& f : p.functions) out.push_back(&f);
    std::stable_sort(out.begin(), out.end(), [&](auto* a, auto* b) {
        const double ea = metric_estimated_total(*a, cpu), eb = metric_estimated_total(*b, cpu);
        if (ea != eb) return ea > eb;
        return a->calls > b->calls;
    });
    return out;
}

double sum_estimated(const Profile& p, const Metric& m) {
    double s = 0;
    for (const auto& f : p.functions) s += metric_estimated_total(f, m);
    return s;
}

std::string xml_escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            default: out += c;
        }
    }
    return out;
}

}  // namespace

std::string Profile::get(const std::string& key, const std::string& fallback) const {
    const auto it = meta.find(key);
    return it == meta.end() ? fallback : it->second;
}

double Profile::number(const std::string& key, double fallback) const {
    const auto it = meta.find(key);
    if (it == meta.end()) return fallback;
    try {
        return std::stod(it->second);
    } catch (const std::exception&) {
        return fallback;
    }
}

void Profile::save(const std::string& path) const {
    std::ostringstream out;
    out << kMagicLine << '\n';
    for (const auto& [k, v] : meta) out << "meta\t" << clean(k) << '\t' << clean(v) << '\n';
    for (const auto& e : events)
        out << "event\t" << clean(e.name) << '\t' << (e.measured ? "measured" : "unavailable") << '\t'
            << clean(e.reason) << '\t' << clean(e.backend) << '\n';
    for (const auto& f : functions) {
        char addr[32];
        std::snprintf(addr, sizeof addr, "%" PRIx64, f.address);
        out << "function\t" << addr << '\t' << f.calls << '\t' << f.samples << '\t' << f.wall_ns << '\t' << f.cpu_ns;
        for (std::size_t e = 0; e < events.size(); e++) out << '\t' << (e < f.events.size() ? f.events[e] : 0);
        out << '\t' << clean(f.module) << '\t' << clean(f.name) << '\n';
    }
    const auto text = out.str();
    iprobe::write_file_atomic(path, text.data(), text.size());
}

Profile Profile::load(const std::string& path) {
    const auto bytes = iprobe::read_file(path);
    std::istringstream in(std::string(bytes.begin(), bytes.end()));
    std::string line;
    if (!std::getline(in, line) || line != kMagicLine)
        throw Error(path + " is not an fperf data file (record one with `fperf record`)", ExitCode::bad_input);
    Profile p;
    struct Finish {
        Profile& p;
        // Which functions lost their probes is a meta entry, so the line
        // format stays the same.
        void operator()() const {
            for (const auto& a : iprobe::split_list(p.get("probes_removed")))
                for (auto& f : p.functions)
                    if (f.address == to_u64(a, 16)) f.probes_removed = true;
        }
    } finish{p};
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        const auto f = split_tabs(line);
        if (f[0] == "meta" && f.size() == 3) {
            p.meta[f[1]] = f[2];
        } else if (f[0] == "event" && (f.size() == 4 || f.size() == 5)) {  // 4: before backends were named
            p.events.push_back({f[1], f[2] == "measured", f[3], f.size() == 5 ? f[4] : "papi"});
        } else if (f[0] == "function" && f.size() == 8 + p.events.size()) {
            FunctionProfile fp;
            fp.address = to_u64(f[1], 16);
            fp.calls = to_u64(f[2]);
            fp.samples = to_u64(f[3]);
            fp.wall_ns = to_u64(f[4]);
            fp.cpu_ns = to_u64(f[5]);
            for (std::size_t e = 0; e < p.events.size(); e++) fp.events.push_back(to_u64(f[6 + e]));
            fp.module = f[6 + p.events.size()];
            fp.name = f[7 + p.events.size()];
            p.functions.push_back(std::move(fp));
        } else {
            throw Error(path + ": malformed line: " + line.substr(0, 80), ExitCode::bad_input);
        }
    }
    finish();
    return p;
}

std::vector<Metric> report_metrics(const Profile& profile) {
    std::vector<Metric> out = {{"wall", "ns", -1, false, profile.number("wall_floor_ns")},
                               {"cpu", "ns", -1, true, profile.number("cpu_floor_ns")}};
    for (std::size_t e = 0; e < profile.events.size(); e++)
        if (profile.events[e].measured) out.push_back({profile.events[e].name, "", static_cast<int>(e), false, 0});
    return out;
}

std::uint64_t metric_total(const FunctionProfile& f, const Metric& m) {
    if (m.event >= 0) return static_cast<std::size_t>(m.event) < f.events.size() ? f.events[m.event] : 0;
    return m.is_cpu ? f.cpu_ns : f.wall_ns;
}

double metric_mean(const FunctionProfile& f, const Metric& m) {
    if (f.samples == 0) return NAN;
    return std::max(0.0, static_cast<double>(metric_total(f, m)) / static_cast<double>(f.samples) - m.floor);
}

double metric_estimated_total(const FunctionProfile& f, const Metric& m) {
    if (f.samples == 0) return 0;
    return metric_mean(f, m) * static_cast<double>(f.calls);
}

std::string render_table(const Profile& p, std::size_t limit) {
    std::ostringstream out;
    const auto metrics = report_metrics(p);
    out << "target: " << p.get("command", "pid " + p.get("pid")) << "  (pid " << p.get("pid") << ")\n";
    out << "recorded " << fmt(p.number("duration_ns") / 1e9, 2) << "s, budget " << p.get("budget") << ", interval "
        << human_ns(p.number("interval_ns")) << ", " << p.get("intervals", "0") << " refills\n";
    out << "cost per sample " << human_ns(p.number("sample_cost_ns")) << ", per counted call "
        << human_ns(p.number("count_cost_ns")) << " (" << p.get("cost_source") << ")\n";
    out << "means are per sampled call, less what an empty function measures (wall "
        << human_ns(p.number("wall_floor_ns")) << ", cpu " << human_ns(p.number("cpu_floor_ns")) << ")\n";
    out << "calls seen " << p.get("total_calls") << ", samples taken " << p.get("total_samples")
        << ", functions called " << p.get("functions_called") << ", sampled " << p.get("functions_sampled") << "\n";
    out << "estimated overhead " << fmt(p.number("overhead_estimate") * 100, 2) << "% of the "
        << p.get("overhead_base", "wall time") << " (samples x cost + calls x count cost; "
        << fmt(p.number("overhead_of_wall") * 100, 2) << "% of wall time)\n";
    bool any_unavailable = false;
    for (const auto& e : p.events)
        if (!e.measured) {
            if (!any_unavailable) out << "unavailable events (not measured, no values shown):\n";
            any_unavailable = true;
            out << "  " << e.name << ": " << e.reason << "\n";
        }
    out << "measured per sampled call: wall, cpu";
    for (const auto& m : metrics)
        if (m.event >= 0) out << ", " << m.name << " (" << p.events[m.event].backend << ")";
    out << "\n\n";

    const double cpu_sum = sum_estimated(p, metrics[1]);
    char line[512];
    std::snprintf(line, sizeof line, "%-32s %10s %9s %10s %10s %7s", "function", "calls", "samples", "mean wall",
                  "mean cpu", "cpu%");
    out << line;
    for (const auto& m : metrics)
        if (m.event >= 0) out << ' ' << std::string(std::max<int>(0, 14 - static_cast<int>(std::min<std::size_t>(m.name.size(), 14))), ' ') << m.name.substr(0, 14);
    out << '\n';
    std::size_t shown = 0;
    for (const auto* f : ranked(p)) {
        if (limit && shown++ >= limit) break;
        std::string name = f->name.size() > 32 ? f->name.substr(0, 31) + "~" : f->name;
        const double share = cpu_sum > 0 ? metric_estimated_total(*f, metrics[1]) / cpu_sum * 100 : NAN;
        std::snprintf(line, sizeof line, "%-32s %10s %9s %10s %10s %7s", name.c_str(),
                      (std::to_string(f->calls) + (f->probes_removed ? "+" : "")).c_str(), std::to_string(f->samples).c_str(),
                      human_ns(metric_mean(*f, metrics[0])).c_str(), human_ns(metric_mean(*f, metrics[1])).c_str(),
                      fmt(share, 1).c_str());
        out << line;
        for (const auto& m : metrics)
            if (m.event >= 0) {
                char cell[32];
                std::snprintf(cell, sizeof cell, " %14s", fmt(metric_mean(*f, m), 2).c_str());
                out << cell;
            }
        out << '\n';
    }
    if (limit && p.functions.size() > limit)
        out << "... " << p.functions.size() - limit << " more (--limit 0 shows all)\n";
    if (!p.get("probes_removed").empty())
        out << "calls+ : probes removed while recording (counting them alone would break the budget); "
               "calls seen until then\n";
    return out.str();
}

namespace {

// The profile file keeps meta values as text; --json gives a number where the
// whole text is one, so readers need not parse "42" themselves.
void meta_value(iprobe::JsonWriter& j, std::string_view v) {
    const char* end = v.data() + v.size();
    std::int64_t integer = 0;
    if (auto r = std::from_chars(v.data(), end, integer); r.ec == std::errc() && r.ptr == end && !v.empty()) {
        j.value(integer);
        return;
    }
    double real = 0;
    if (auto r = std::from_chars(v.data(), end, real); r.ec == std::errc() && r.ptr == end && !v.empty() &&
                                                        std::isfinite(real)) {
        j.value(real);
        return;
    }
    j.value(v);
}

}  // namespace

std::string render_json(const Profile& p) {
    iprobe::JsonWriter j;
    const auto metrics = report_metrics(p);
    j.begin_object();
    j.key("meta").begin_object();
    for (const auto& [k, v] : p.meta) {
        j.key(k);
        meta_value(j, v);
    }
    j.end_object();
    j.field("overhead_estimate", p.number("overhead_estimate"));
    j.key("events").begin_array();
    for (const auto& e : p.events) {
        j.begin_object().field("name", e.name).field("measured", e.measured);
        if (e.measured) j.field("backend", e.backend);
        if (!e.measured) j.field("reason", e.reason);
        j.end_object();
    }
    j.end_array();
    j.key("functions").begin_array();
    std::vector<double> sums;
    for (const auto& m : metrics) sums.push_back(sum_estimated(p, m));
    for (const auto* f : ranked(p)) {
        char addr[32];
        std::snprintf(addr, sizeof addr, "0x%" PRIx64, f->address);
        j.begin_object().field("name", f->name).field("module", f->module).field("address", addr);
        j.field("calls", f->calls).field("samples", f->samples).field("probes_removed", f->probes_removed);
        j.key("metrics").begin_object();
        for (std::size_t i = 0; i < metrics.size(); i++) {
            const auto& m = metrics[i];
            j.key(m.name).begin_object();
            j.field("sampled_total", metric_total(*f, m));
            if (f->samples) {
                j.field("mean", metric_mean(*f, m));
                j.field("estimated_total", metric_estimated_total(*f, m));
                j.field("share", sums[i] > 0 ? metric_estimated_total(*f, m) / sums[i] : 0.0);
            } else {
                j.key("mean").null();
                j.key("estimated_total").null();
                j.key("share").null();
            }
            j.end_object();
        }
        j.end_object().end_object();
    }
    j.end_array();
    j.end_object();
    return j.str() + "\n";
}

std::string render_csv(const Profile& p) {
    const auto metrics = report_metrics(p);
    std::vector<double> sums;
    for (const auto& m : metrics) sums.push_back(sum_estimated(p, m));
    std::ostringstream out;
    out << "function,module,calls,samples";
    for (const auto& m : metrics) out << ",mean_" << m.name << ",total_" << m.name << ",share_" << m.name;
    out << '\n';
    auto quote = [](const std::string& s) {
        std::string q = "\"";
        for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
        return q + "\"";
    };
    for (const auto* f : ranked(p)) {
        out << quote(f->name) << ',' << quote(f->module) << ',' << f->calls << ',' << f->samples;
        for (std::size_t i = 0; i < metrics.size(); i++) {
            if (!f->samples) {
                out << ",,,";
                continue;
            }
            const double est = metric_estimated_total(*f, metrics[i]);
            out << ',' << fmt(metric_mean(*f, metrics[i]), 3) << ',' << fmt(est, 0) << ','
                << fmt(sums[i] > 0 ? est / sums[i] : 0, 6);
        }
        out << '\n';
    }
    return out.str();
}

// One panel per metric: the top functions' share of the estimated total as
// horizontal bars, labelled with the share and the mean per call.
std::string render_svg(const Profile& p, std::size_t top) {
    const auto metrics = report_metrics(p);
    const int width = 1000, bar_left = 340, bar_max = 440, row = 22, panel_gap = 36;
    std::vector<std::vector<std::pair<const FunctionProfile*, double>>> panels;
    std::vector<double> sums;
    for (const auto& m : metrics) {
        std::vector<std::pair<const FunctionProfile*, double>> rows;
        for (const auto& f : p.functions)
            if (f.samples && metric_estimated_total(f, m) > 0) rows.emplace_back(&f, metric_estimated_total(f, m));
        std::stable_sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second > b.second; });
        if (rows.size() > top) rows.resize(top);
        panels.push_back(rows);
        sums.push_back(sum_estimated(p, m));
    }
    int height = 110;
    for (const auto& rows : panels) height += 40 + static_cast<int>(std::max<std::size_t>(rows.size(), 1)) * row + panel_gap;
    std::string unavailable;
    for (const auto& e : p.events)
        if (!e.measured) unavailable += (unavailable.empty() ? "" : ", ") + e.name;
    if (!unavailable.empty()) height += 24;

    std::ostringstream s;
    s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"13\">\n";
    s << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    std::string program = p.get("command", "pid " + p.get("pid"));
    program = program.substr(0, program.find(' '));
    if (const auto slash = program.rfind('/'); slash != std::string::npos) program = program.substr(slash + 1);
    s << "<text x=\"20\" y=\"32\" font-size=\"20\" font-weight=\"bold\">fperf: where "
      << xml_escape(program) << " (pid " << xml_escape(p.get("pid")) << ") spends it</text>\n";
    s << "<text x=\"20\" y=\"56\" fill=\"#444\">budget " << xml_escape(p.get("budget")) << ", "
      << p.get("total_samples") << " samples of " << p.get("total_calls") << " calls, "
      << p.get("functions_sampled") << " of " << p.get("functions_called")
      << " called functions sampled, estimated overhead " << fmt(p.number("overhead_estimate") * 100, 2)
      << "%</text>\n";
    s << "<text x=\"20\" y=\"76\" fill=\"#444\">bars: share of the estimated total (mean per sampled call x calls); "
         "label: share, mean per call</text>\n";
    int y = 100;
    if (!unavailable.empty()) {
        s << "<text x=\"20\" y=\"" << y << "\" fill=\"#a33\">not measured (unavailable here): "
          << xml_escape(unavailable) << "</text>\n";
        y += 24;
    }
    const char* colors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
                            "#ff9da7", "#9c755f", "#bab0ac"};
    for (std::size_t i = 0; i < metrics.size(); i++) {
        const auto& m = metrics[i];
        y += 22;
        s << "<text x=\"20\" y=\"" << y << "\" font-size=\"15\" font-weight=\"bold\">"
          << xml_escape(m.name == "wall" ? "wall time" : m.name == "cpu" ? "thread CPU time" : m.name)
          << "</text>\n";
        y += 12;
        if (panels[i].empty()) {
            s << "<text x=\"" << bar_left << "\" y=\"" << y + 15 << "\" fill=\"#888\">"
              << (p.functions.empty() ? "no samples" : "0 in every sample") << "</text>\n";
            y += row;
        }
        const double biggest = panels[i].empty() ? 0 : panels[i].front().second;
        for (const auto& [f, est] : panels[i]) {
            const double share = sums[i] > 0 ? est / sums[i] : 0;
            const int w = biggest > 0 ? std::max(1, static_cast<int>(bar_max * est / biggest)) : 1;
            std::string name = f->name.size() > 40 ? f->name.substr(0, 39) + "~" : f->name;
            s << "<text x=\"" << bar_left - 8 << "\" y=\"" << y + 15 << "\" text-anchor=\"end\">"
              << xml_escape(name) << "</text>\n";
            s << "<rect x=\"" << bar_left << "\" y=\"" << y + 3 << "\" width=\"" << w << "\" height=\"" << row - 6
              << "\" fill=\"" << colors[i % 10] << "\"/>\n";
            s << "<text x=\"" << bar_left + w + 6 << "\" y=\"" << y + 15 << "\" fill=\"#333\">" << fmt(share * 100, 1)
              << "%  (" << xml_escape(show(m, metric_mean(*f, m))) << "/call)</text>\n";
            y += row;
        }
        y += panel_gap - 12;
    }
    s << "</svg>\n";
    return s.str();
}

} // namespace iprobe::fperf
