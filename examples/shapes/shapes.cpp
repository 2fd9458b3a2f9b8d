// shapes: a small C++ program with class hierarchies (virtual calls),
// templates and exceptions, so that probes carry demangled C++ names.
// Its output is fully deterministic: a build with iprobe-c++ must print
// exactly what a normal build prints.
//
//   shapes [COUNT]      (default 12 shapes)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace geometry {

class Shape {
public:
    virtual ~Shape() = default;
    virtual double area() const = 0;
    virtual double perimeter() const = 0;
    virtual std::string name() const = 0;
};

class Circle : public Shape {
public:
    explicit Circle(double r) : r_(r) {
        if (r <= 0) throw std::invalid_argument("circle radius must be positive");
    }
    double area() const override { return M_PI * r_ * r_; }
    double perimeter() const override { return 2 * M_PI * r_; }
    std::string name() const override { return "circle"; }

private:
    double r_;
};

class Rectangle : public Shape {
public:
    Rectangle(double w, double h) : w_(w), h_(h) {
        if (w <= 0 || h <= 0) throw std::invalid_argument("rectangle sides must be positive");
    }
    double area() const override { return w_ * h_; }
    double perimeter() const override { return 2 * (w_ + h_); }
    std::string name() const override { return "rectangle"; }

protected:
    double w_, h_;
};

class Square final : public Rectangle {
public:
    explicit Square(double s) : Rectangle(s, s) {}
    std::string name() const override { return "square"; }
};

class Triangle : public Shape {
public:
    Triangle(double a, double b, double c) : a_(a), b_(b), c_(c) {
        if (a + b <= c || a + c <= b || b + c <= a) throw std::domain_error("not a triangle");
    }
    double area() const override {
        const double s = perimeter() / 2;
        return std::sqrt(s * (s - a_) * (s - b_) * (s - c_));
    }
    double perimeter() const override { return a_ + b_ + c_; }
    std::string name() const override { return "triangle"; }

private:
    double a_, b_, c_;
};

}  // namespace geometry

namespace stats {

template <typename T>
struct Summary {
    T total{};
    T largest{};
    std::size_t count = 0;

    void add(T value) {
        total += value;
        if (count == 0 || value > largest) largest = value;
        ++count;
    }
    T mean() const {
        if (count == 0) throw std::logic_error("mean of nothing");
        return total / static_cast<T>(count);
    }
};

template <typename Container, typename Fn>
auto summarize(const Container& items, Fn&& measure) {
    Summary<decltype(measure(*items.front()))> s;
    for (const auto& item : items) s.add(measure(*item));
    return s;
}

}  // namespace stats

namespace {

// A deterministic pseudo-random sequence (no library RNG: same on every libc).
unsigned next_value(unsigned& state) {
    state = state * 1103515245u + 12345u;
    return (state >> 16) % 10 + 1;
}

std::unique_ptr<geometry::Shape> make_shape(unsigned& state) {
    const unsigned kind = next_value(state) % 4;
    const double a = next_value(state), b = next_value(state), c = next_value(state);
    switch (kind) {
        case 0: return std::make_unique<geometry::Circle>(a - 1);  // may throw for radius 0
        case 1: return std::make_unique<geometry::Rectangle>(a, b);
        case 2: return std::make_unique<geometry::Square>(a);
        default: return std::make_unique<geometry::Triangle>(a, b, c);  // may throw
    }
}

}  // namespace

int main(int argc, char** argv) {
    const int count = argc > 1 ? std::atoi(argv[1]) : 12;
    unsigned state = 42;
    std::vector<std::unique_ptr<geometry::Shape>> shapes;
    std::map<std::string, int> rejected;
    for (int i = 0; i < count; ++i) {
        try {
            shapes.push_back(make_shape(state));
        } catch (const std::exception& e) {
            ++rejected[e.what()];
        }
    }
    for (const auto& s : shapes)
        std::printf("%-10s area %8.3f perimeter %8.3f\n", s->name().c_str(), s->area(), s->perimeter());
    for (const auto& [why, n] : rejected) std::printf("rejected %d: %s\n", n, why.c_str());

    const auto areas = stats::summarize(shapes, [](const geometry::Shape& s) { return s.area(); });
    const auto sides = stats::summarize(shapes, [](const geometry::Shape& s) { return static_cast<long>(s.perimeter()); });
    std::printf("shapes %zu, total area %.3f, largest %.3f, mean %.3f\n", areas.count, areas.total, areas.largest,
                areas.mean());
    std::printf("integer perimeters: total %ld, largest %ld\n", sides.total, sides.largest);
    try {
        stats::Summary<double> empty;
        std::printf("%f\n", empty.mean());
    } catch (const std::logic_error& e) {
        std::printf("caught: %s\n", e.what());
    }
    return 0;
}
