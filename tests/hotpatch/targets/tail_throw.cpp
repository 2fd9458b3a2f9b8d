// An exception thrown through a tail call whose caller and callee both hook
// their return: their entries chain on one return-address slot
// (tests/hotpatch/run_test.cpp).  `tail_throw N`: N throws, each caught in main.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

__attribute__((noinline)) int inner(unsigned x) {
    if (x > 10) throw std::runtime_error("big");
    return static_cast<int>(x);
}

// -O2 makes this `jmp inner`
__attribute__((noinline)) int outer(int x) {
    if (x < 0) return -1;
    return inner(static_cast<unsigned>(x));
}

int main(int argc, char** argv) {
    const int throws = argc > 1 ? std::atoi(argv[1]) : 1;
    int caught = 0;
    for (int i = 0; i < throws; i++) {
        try {
            outer(100 + i);
        } catch (const std::exception&) {
            caught++;
        }
    }
    std::printf("caught %d\n", caught);
    return 0;
}
