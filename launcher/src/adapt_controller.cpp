#include "iprobe/launcher/adapt_controller.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace iprobe::launcher {
namespace {

std::string percent(double share) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f%%", 100.0 * share);
    return buf;
}

std::string seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f s", s);
    return buf;
}

}  // namespace

AdaptController::AdaptController(std::size_t functions, double entry_ns, double exit_ns, AdaptConfig config)
    : c_(config),
      entry_ns_(entry_ns),
      exit_ns_(exit_ns),
      on_(functions, true),
      cost_(functions, 0),
      cost_per_byte_(functions, 0),
      measured_(functions, false),
      calm_s_(config.calm_s),
      step_share_(config.restore_share) {}

std::size_t AdaptController::on_count() const { return static_cast<std::size_t>(std::count(on_.begin(), on_.end(), true)); }

double AdaptController::total_cost() const {
    double total = 0;
    for (std::size_t f = 0; f < on_.size(); ++f)
        if (on_[f]) total += cost_[f];
    return total;
}

// Each function's share of a CPU in the last interval: its events there
// times the measured cost of one.  Also per byte the clone was fed, which
// predicts its cost at another load.
void AdaptController::measure(const AdaptObservation& o) {
    if (have_last_ && o.t_s > last_.t_s && o.events.size() == on_.size() && last_.events.size() == on_.size()) {
        const double dt = o.t_s - last_.t_s;
        arrival_rate_ = std::max(0.0, o.arrival_bytes - last_.arrival_bytes) / dt;
        const double fed_rate = std::max(0.0, o.fed_bytes - last_.fed_bytes) / dt;
        lag_rate_ = (o.lag_ms - last_.lag_ms) / 1000.0 / dt;
        fill_rate_ = (o.fill - last_.fill) / dt;
        // How much of the arriving traffic the clone takes: the bytes it was
        // fed against those that came (the kernel's buffers blur this while
        // they fill), and the growth of its lag behind production's replies.
        keeping_up_ = 1.0;
        if (arrival_rate_ > 0) keeping_up_ = std::min(keeping_up_, fed_rate / arrival_rate_);
        if (lag_rate_ > 0) keeping_up_ = std::min(keeping_up_, 1.0 - lag_rate_);
        keeping_up_ = std::clamp(keeping_up_, 0.0, 1.0);
        for (std::size_t f = 0; f < on_.size(); ++f) {
            if (!on_[f]) continue;
            const double entries = static_cast<double>(o.events[f].entries - std::min(o.events[f].entries, last_.events[f].entries));
            const double exits = static_cast<double>(o.events[f].exits - std::min(o.events[f].exits, last_.events[f].exits));
            const double share = (entries * entry_ns_ + exits * exit_ns_) / (dt * 1e9);
            // Smoothed over two intervals: one slow scheduling slice does not decide.
            cost_[f] = measured_[f] ? 0.5 * cost_[f] + 0.5 * share : share;
            if (fed_rate > 0) {
                const double per_byte = share / fed_rate;
                cost_per_byte_[f] = measured_[f] ? 0.5 * cost_per_byte_[f] + 0.5 * per_byte : per_byte;
            }
            measured_[f] = true;
        }
    }
    busy_ = o.busy;
    last_ = o;
    have_last_ = true;
}

bool AdaptController::falling_behind(const AdaptObservation& o) const {
    if (o.fill >= c_.high_fill || o.lag_ms >= c_.high_lag_ms) return true;
    if (o.lag_ms >= c_.low_lag_ms && lag_rate_ > c_.lag_trend) return true;
    return o.fill >= c_.low_fill && fill_rate_ > 0 && (1.0 - o.fill) / fill_rate_ < c_.horizon_s;
}

AdaptDecision AdaptController::observe(const AdaptObservation& o) {
    const bool had_last = have_last_;
    measure(o);
    const bool high = had_last && falling_behind(o);
    const bool low = o.fill <= c_.low_fill && o.lag_ms <= c_.low_lag_ms;
    if (!low) calm_since_ = -1;
    else if (calm_since_ < 0) calm_since_ = o.t_s;
    if (high && on_count() > 0 && (o.t_s - last_drop_ >= c_.cooldown_s || o.fill >= c_.panic_fill)) return drop(o);
    if (calm_since_ >= 0 && o.t_s - calm_since_ >= calm_s_ && on_count() < on_.size()) return restore(o);
    return {};
}

AdaptDecision AdaptController::drop(const AdaptObservation& o) {
    AdaptDecision d;
    const double total = total_cost();
    // Nothing measurable to shed: the probes are not what holds the clone back.
    if (total <= 0) return d;
    std::vector<std::size_t> order;
    for (std::size_t f = 0; f < on_.size(); ++f)
        if (on_[f]) order.push_back(f);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cost_[a] > cost_[b]; });
    // The CPU share to free: per request, the clone must get down to
    // drain_load of the time between arrivals; it now takes 1/keeping_up of it.
    const double needed = busy_ * (1.0 - c_.drain_load * keeping_up_);
    const double target = std::max(c_.shed_share * total, needed);
    for (std::size_t f : order) {
        if (!d.functions.empty() && d.cost >= target) break;
        d.functions.push_back(f);
        d.cost += cost_[f];
    }
    d.action = AdaptDecision::Action::drop;
    d.reason = (o.fill >= c_.low_fill ? "debug buffer " + percent(o.fill) + " full, "
                                      : std::string()) +
               "clone " + seconds(o.lag_ms / 1000) + " behind production, taking " + percent(keeping_up_) +
               " of the traffic";
    return d;
}

AdaptDecision AdaptController::restore(const AdaptObservation& o) {
    AdaptDecision d;
    auto predicted = [&](std::size_t f) {
        return measured_[f] && arrival_rate_ > 0 && cost_per_byte_[f] > 0 ? cost_per_byte_[f] * arrival_rate_ : cost_[f];
    };
    std::vector<std::size_t> off;
    for (std::size_t f = 0; f < on_.size(); ++f)
        if (!on_[f]) off.push_back(f);
    std::stable_sort(off.begin(), off.end(), [&](std::size_t a, std::size_t b) { return predicted(a) < predicted(b); });
    const double idle = std::max(0.0, 1.0 - busy_);
    const std::size_t step =
        std::max(c_.restore_min, static_cast<std::size_t>(std::ceil(next_step_share() * static_cast<double>(off.size()))));
    for (std::size_t f : off) {
        if (d.functions.size() >= step || d.cost + predicted(f) > idle * c_.headroom) break;
        d.functions.push_back(f);
        d.cost += predicted(f);
    }
    // The cheapest alone may still fit the whole idle time.
    if (d.functions.empty() && predicted(off.front()) <= idle) {
        d.functions.push_back(off.front());
        d.cost = predicted(off.front());
    }
    if (d.functions.empty()) return {};
    d.action = AdaptDecision::Action::restore;
    d.reason = "caught up for " + seconds(o.t_s - calm_since_) + ", clone " + percent(idle) + " idle";
    return d;
}

// The previous restore held (no drop since): a larger step this time.
double AdaptController::next_step_share() const {
    return last_restore_ > last_drop_ ? std::min(1.0, 2 * step_share_) : step_share_;
}

void AdaptController::applied(const AdaptDecision& d, double t_s) {
    if (d.action == AdaptDecision::Action::none) return;
    const bool restoring = d.action == AdaptDecision::Action::restore;
    for (std::size_t f : d.functions) on_[f] = restoring;
    if (restoring) {
        // A long quiet time since the last drop: the load has settled.
        if (t_s - last_drop_ > 4 * calm_s_) calm_s_ = std::max(c_.calm_s, calm_s_ / 2);
        step_share_ = next_step_share();
        last_restore_ = t_s;
    } else {
        // Dropped again soon after a restore: wait longer before the next,
        // and bring back less at a time.
        if (t_s - last_restore_ < 2 * calm_s_) {
            calm_s_ = std::min(c_.max_calm_s, 2 * calm_s_);
            step_share_ = std::max(1.0 / static_cast<double>(std::max<std::size_t>(1, on_.size())), step_share_ / 2);
        }
        last_drop_ = t_s;
    }
    calm_since_ = -1;
}

}  // namespace iprobe::launcher
