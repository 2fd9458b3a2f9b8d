// The --adapt controller's decisions on observations made up here: which
// functions go first, how many, when they come back, and that it does not
// flap.  (debug_window_test.cpp runs it against a real clone.)
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "iprobe/launcher/adapt_controller.h"

using namespace iprobe::launcher;

namespace {

constexpr double kEntryNs = 10, kExitNs = 20;  // one call: 30 ns

// A clone whose functions are called `calls_per_s` times a second each, fed
// `fed` of the `arrival` bytes per second; cumulative counters advance with
// every step.
class Scenario {
public:
    explicit Scenario(std::vector<double> calls_per_s, AdaptConfig config = {})
        : rates_(std::move(calls_per_s)), events_(rates_.size()), controller_(rates_.size(), kEntryNs, kExitNs, config) {}

    AdaptDecision step(double dt, double fill, double lag_ms, double busy, double arrival = 1e6, double fed = 1e6) {
        t_ += dt;
        arrival_ += arrival * dt;
        fed_ += fed * dt;
        for (std::size_t f = 0; f < rates_.size(); ++f)
            if (controller_.on(f)) {
                events_[f].entries += static_cast<std::uint64_t>(rates_[f] * dt);
                events_[f].exits += static_cast<std::uint64_t>(rates_[f] * dt);
            }
        AdaptObservation o;
        o.t_s = t_;
        o.fill = fill;
        o.lag_ms = lag_ms;
        o.arrival_bytes = arrival_;
        o.fed_bytes = fed_;
        o.busy = busy;
        o.events = events_;
        AdaptDecision d = controller_.observe(o);
        controller_.applied(d, t_);
        return d;
    }
    AdaptController& controller() { return controller_; }
    double t() const { return t_; }

private:
    std::vector<double> rates_;
    std::vector<FunctionEvents> events_;
    AdaptController controller_;
    double t_ = 0, arrival_ = 0, fed_ = 0;
};

using Action = AdaptDecision::Action;

TEST(AdaptController, KeepsEverythingWhileTheCloneKeepsUp) {
    Scenario s({1e6, 1e5, 1e4});
    for (int i = 0; i < 100; ++i) EXPECT_EQ(s.step(0.25, 0.01, 5, 0.5).action, Action::none) << i;
    EXPECT_EQ(s.controller().on_count(), 3u);
}

TEST(AdaptController, MeasuresEachFunctionsCostFromItsCallsAndTheCostOfAProbe) {
    Scenario s({1e6, 1e5, 0});
    s.step(0.25, 0, 0, 0.5);
    s.step(0.25, 0, 0, 0.5);
    // 1e6 calls/s, 30 ns each: 3% of a CPU.
    EXPECT_NEAR(s.controller().cost(0), 0.03, 1e-9);
    EXPECT_NEAR(s.controller().cost(1), 0.003, 1e-9);
    EXPECT_EQ(s.controller().cost(2), 0.0);
}

TEST(AdaptController, DropsTheCostliestFirstWhenTheBufferFills) {
    // Costs 30%, 3%, 0.3%, 24% of a CPU.
    Scenario s({1e7, 1e6, 1e5, 8e6});
    s.step(0.25, 0.05, 10, 0.9);
    const AdaptDecision d = s.step(0.25, 0.6, 100, 0.9);
    ASSERT_EQ(d.action, Action::drop);
    // Half the cost at least: the costliest alone is not, the two costliest are.
    EXPECT_EQ(d.functions, (std::vector<std::size_t>{0, 3}));
    EXPECT_NEAR(d.cost, 0.54, 1e-9);
    EXPECT_NE(d.reason.find("debug buffer 60% full"), std::string::npos) << d.reason;
    EXPECT_FALSE(s.controller().on(0));
    EXPECT_TRUE(s.controller().on(1));
}

TEST(AdaptController, DropsWhatTheCloneNeedsToCatchUpWhenFarBehind) {
    // Costs 30%, 15%, 3%, 1.5%; the clone is busy and takes only 40% of the
    // traffic (its lag grows 0.6 s a second; it was fed 40% of the bytes):
    // it must free 0.95 * (1 - 0.8 * 0.4) = 65% of a CPU, more than the
    // probes' 49.5%: all of them go.
    Scenario s({1e7, 5e6, 1e6, 5e5});
    s.step(0.25, 0.0, 100, 0.95);
    const AdaptDecision d = s.step(0.25, 0.0, 250, 0.95, 1e6, 4e5);
    ASSERT_EQ(d.action, Action::drop);
    EXPECT_EQ(d.functions, (std::vector<std::size_t>{0, 1, 2, 3}));
    EXPECT_NE(d.reason.find("taking 40% of the traffic"), std::string::npos) << d.reason;
}

TEST(AdaptController, AGrowingLagIsFallingBehindBeforeTheBufferShowsIt) {
    Scenario s({1e7, 1e6});
    s.step(0.25, 0.0, 0, 0.9);
    s.step(0.25, 0.0, 150, 0.9);  // below the low mark: not yet
    EXPECT_EQ(s.controller().on_count(), 2u);
    EXPECT_EQ(s.step(0.25, 0.0, 300, 0.9).action, Action::drop);  // 0.6 s/s and past 200 ms
}

TEST(AdaptController, WaitsForTheEffectOfADropBeforeTheNext) {
    AdaptConfig c;
    c.cooldown_s = 1;
    // Costs 30%, 15%, 6%, 3%; the lag grows 0.2 s a second: the clone takes
    // 80% of the traffic and must free 0.9 * (1 - 0.8 * 0.8) = 32.4%: the
    // two costliest.
    Scenario s({1e7, 5e6, 2e6, 1e6}, c);
    s.step(0.25, 0.05, 100, 0.9);
    ASSERT_EQ(s.step(0.25, 0.55, 150, 0.9).functions, (std::vector<std::size_t>{0, 1}));
    // Still behind, but within the cooldown: nothing more yet ...
    EXPECT_EQ(s.step(0.25, 0.6, 200, 0.9).action, Action::none);
    EXPECT_EQ(s.step(0.25, 0.6, 250, 0.9).action, Action::none);
    EXPECT_EQ(s.step(0.25, 0.6, 300, 0.9).action, Action::none);
    // ... unless the buffer is nearly full: then what is left (9%, less
    // than the clone still needs) goes at once.
    EXPECT_EQ(s.step(0.1, 0.85, 320, 0.9).functions, (std::vector<std::size_t>{2, 3}));
    EXPECT_EQ(s.controller().on_count(), 0u);
}

TEST(AdaptController, RestoresTheCheapestWithinTheMeasuredIdleTimeAfterACalmPeriod) {
    // Costs 30%, 6%, 3%, 0.6% of a CPU at this load.
    Scenario s({1e7, 2e6, 1e6, 2e5});
    s.step(0.25, 0.0, 0, 0.9);
    ASSERT_EQ(s.step(0.25, 0.0, 2500, 0.99).action, Action::drop);
    ASSERT_EQ(s.controller().on_count(), 0u);
    // Caught up, but not for long enough: nothing comes back.
    EXPECT_EQ(s.step(0.5, 0.0, 20, 0.4).action, Action::none);
    EXPECT_EQ(s.step(0.5, 0.0, 20, 0.4).action, Action::none);
    EXPECT_EQ(s.step(0.5, 0.0, 20, 0.4).action, Action::none);
    EXPECT_EQ(s.step(0.5, 0.0, 20, 0.4).action, Action::none);
    // Two seconds calm, 60% idle, restore within half of it (30%): the three
    // cheapest (9.6%), not the 30% one.
    const AdaptDecision d = s.step(0.5, 0.0, 20, 0.4);
    ASSERT_EQ(d.action, Action::restore);
    EXPECT_EQ(d.functions, (std::vector<std::size_t>{3, 2, 1}));
    EXPECT_NEAR(d.cost, 0.096, 1e-6);
    EXPECT_FALSE(s.controller().on(0));
}

TEST(AdaptController, PredictsACostAtTheLoadItWillRunAt) {
    // Measured at 1 MB/s fed; restored when the traffic halved: half the cost.
    Scenario s({1e7, 2e5});
    s.step(0.25, 0.0, 0, 0.9);
    s.step(0.25, 0.0, 0, 0.9);
    ASSERT_EQ(s.step(0.25, 0.7, 0, 0.9).action, Action::drop);
    ASSERT_FALSE(s.controller().on(0));
    for (int i = 0; i < 8; ++i) s.step(0.25, 0.0, 0, 0.2, 5e5, 5e5);
    const AdaptDecision d = s.step(0.25, 0.0, 0, 0.2, 5e5, 5e5);
    ASSERT_EQ(d.action, Action::restore);
    EXPECT_NEAR(d.cost, 0.15, 1e-6);
}

TEST(AdaptController, DoesNotFlapWhenARestoreMakesItFallBehindAgain) {
    AdaptConfig c;
    c.calm_s = 2;
    Scenario s({1e7}, c);
    s.step(0.25, 0.0, 0, 0.9);
    ASSERT_EQ(s.step(0.25, 0.7, 0, 0.9).action, Action::drop);
    int restores = 0, drops = 1;
    double last_restore = 0;
    std::vector<double> gaps;
    // The load allows no probes: every restore is followed by a drop.  The
    // wait before each restore doubles (2, 4, 8, ... s), so over a minute
    // there are a handful of changes, not one per calm period.
    while (s.t() < 60) {
        const bool on = s.controller().on(0);
        const AdaptDecision d = on ? s.step(0.25, 0.7, 0, 0.95) : s.step(0.25, 0.0, 0, 0.1);
        if (d.action == Action::restore) {
            if (restores) gaps.push_back(s.t() - last_restore);
            last_restore = s.t();
            ++restores;
        }
        if (d.action == Action::drop) ++drops;
    }
    EXPECT_LE(restores, 5);
    EXPECT_EQ(drops, restores + 1);
    for (std::size_t i = 1; i < gaps.size(); ++i) EXPECT_GT(gaps[i], gaps[i - 1] * 1.5) << i;
    EXPECT_GE(s.controller().calm_s(), 16.0);
}

// At saturation nothing fits and the predicted costs are too low: with
// 400 functions dropped, the restores come in steps (cheapest first, a
// quarter of the dropped, then half, then all, while they hold), never all
// at once, and a restore the clone cannot carry halves the next step.
TEST(AdaptController, RestoresStepwiseCheapestFirstAndSmallerAfterAFlap) {
    std::vector<double> rates;
    for (int f = 0; f < 400; ++f) rates.push_back(1e2 * (f + 1));  // f=399: 0.12% of a CPU, 24% in all
    Scenario s(rates);
    s.step(0.25, 0.0, 0, 0.9);
    ASSERT_EQ(s.step(0.25, 0.0, 3000, 1.0).action, Action::drop);
    ASSERT_EQ(s.controller().on_count(), 0u) << "far behind at saturation: everything goes";
    std::vector<std::size_t> steps;
    AdaptDecision d;
    // Calm and idle: all 400 fit the idle time as predicted (what made the
    // controller bring every one back at once), yet it restores in steps.
    for (int i = 0; i < 200 && s.controller().on_count() < 400; ++i) {
        d = s.step(0.25, 0.0, 10, 0.0);
        if (d.action == Action::restore) {
            steps.push_back(d.functions.size());
            // Cheapest first: each restored function costs no more than any still off.
            for (std::size_t f : d.functions)
                for (std::size_t g = 0; g < 400; ++g)
                    if (!s.controller().on(g)) {
                        EXPECT_LE(f, g);
                    }
            if (steps.size() == 2) break;
        }
    }
    ASSERT_EQ(steps.size(), 2u);
    EXPECT_EQ(steps[0], 100u) << "a quarter of the 400 dropped";
    EXPECT_EQ(steps[1], 150u) << "half of the 300 still off, the first step having held";
    EXPECT_NEAR(s.controller().restore_step(), 0.5, 1e-9);
    // Now the clone falls behind again: the next restore brings back less.
    ASSERT_EQ(s.step(0.25, 0.7, 500, 1.0).action, Action::drop);
    EXPECT_NEAR(s.controller().restore_step(), 0.25, 1e-9);
    const std::size_t off = 400 - s.controller().on_count();
    for (int i = 0; i < 400; ++i) {
        d = s.step(0.25, 0.0, 10, 0.0);
        if (d.action == Action::restore) break;
    }
    ASSERT_EQ(d.action, Action::restore);
    EXPECT_EQ(d.functions.size(), static_cast<std::size_t>(std::ceil(0.25 * static_cast<double>(off))));
}

TEST(AdaptController, ProbesThatCostNothingMeasurableAreNotBlamed) {
    // Falling behind with probes that are never hit: nothing to gain.
    Scenario s({0, 0});
    s.step(0.25, 0.0, 0, 0.9);
    EXPECT_EQ(s.step(0.25, 0.9, 3000, 0.9).action, Action::none);
    EXPECT_EQ(s.controller().on_count(), 2u);
}

}  // namespace
