// Stopping the world (StoppedProcess) on a process whose threads are
// everywhere a service's are: spinning in user code, blocked in read(), in
// nanosleep and in a futex wait.  Every thread is stopped (none makes
// progress), and once let go each finishes its system call exactly as if
// nothing had happened: the bytes written, the whole sleep, no EINTR.  The
// stop waits for the kernel's SIGCHLD, so it must also work, and leave this
// process's signal mask as it was, when SIGCHLD has a handler of the
// program's own (then it polls) or is blocked by it.
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <new>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <pthread.h>
#include <string>
#include <thread>

#include "process.h"
#include "testutil.h"

namespace iprobe::test {
namespace {

using namespace std::chrono_literals;
using hotpatch::StoppedProcess;

constexpr int kEach = 4;  // threads of each kind
constexpr long kSleepNs = 1'500'000'000;
constexpr char kBytes[8] = {'s', 't', 'o', 'p', 'p', 'e', 'd', '!'};

// Shared with the child (MAP_SHARED before fork): its threads' progress and
// results.
struct Shared {
    std::atomic<long> spins[kEach];
    std::atomic<int> started;
    std::atomic<int> futex_word;
    long read_result[kEach];
    char read_bytes[kEach][sizeof kBytes];
    long sleep_result[kEach];
    long slept_ns[kEach];
    int futex_eintr[kEach];
};

struct Arg {
    Shared* shared;
    int index;
    int fd;
};

long now_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1'000'000'000L + ts.tv_nsec;
}

void* spinner(void* p) {
    auto* a = static_cast<Arg*>(p);
    a->shared->started++;
    for (;;) a->shared->spins[a->index].fetch_add(1, std::memory_order_relaxed);
}

void* reader(void* p) {
    auto* a = static_cast<Arg*>(p);
    a->shared->started++;
    a->shared->read_result[a->index] = ::read(a->fd, a->shared->read_bytes[a->index], sizeof kBytes);
    return nullptr;
}

void* sleeper(void* p) {
    auto* a = static_cast<Arg*>(p);
    a->shared->started++;
    const long from = now_ns();
    timespec ts{kSleepNs / 1'000'000'000, kSleepNs % 1'000'000'000};
    a->shared->sleep_result[a->index] = ::nanosleep(&ts, nullptr) == 0 ? 0 : errno;
    a->shared->slept_ns[a->index] = now_ns() - from;
    return nullptr;
}

void* waiter(void* p) {
    auto* a = static_cast<Arg*>(p);
    a->shared->started++;
    while (a->shared->futex_word.load() == 0)
        if (::syscall(SYS_futex, &a->shared->futex_word, FUTEX_WAIT, 0, nullptr, nullptr, 0) != 0 && errno == EINTR)
            a->shared->futex_eintr[a->index]++;
    return nullptr;
}

// The child: kEach threads of each kind, the main thread blocked reading
// `control` until the test closes it, then joins them all (the spinners
// are left to exit_group).
[[noreturn]] void child_main(Shared* shared, const int (&pipes)[kEach][2], int control) {
    pthread_t t[4 * kEach];
    Arg args[4 * kEach];
    int n = 0;
    for (int i = 0; i < kEach; i++) {
        args[n] = {shared, i, -1}, pthread_create(&t[n], nullptr, spinner, &args[n]), n++;
        args[n] = {shared, i, pipes[i][0]}, pthread_create(&t[n], nullptr, reader, &args[n]), n++;
        args[n] = {shared, i, -1}, pthread_create(&t[n], nullptr, sleeper, &args[n]), n++;
        args[n] = {shared, i, -1}, pthread_create(&t[n], nullptr, waiter, &args[n]), n++;
    }
    char c;
    while (::read(control, &c, 1) > 0) {
    }
    for (int i = 0; i < n; i++)
        if (i % 4 != 0) pthread_join(t[i], nullptr);
    ::_exit(0);
}

char thread_state(pid_t pid, pid_t tid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/stat");
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto close = s.rfind(')');
    return close == std::string::npos || close + 2 >= s.size() ? 0 : s[close + 2];
}

std::string tracer_of(pid_t pid, pid_t tid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("TracerPid:", 0) == 0) return line.substr(line.find_first_not_of(" \t", 10));
    return "?";
}

int count_in_state(pid_t pid, char state) {
    int n = 0;
    for (pid_t tid : hotpatch::list_threads(pid)) n += thread_state(pid, tid) == state;
    return n;
}

class StopTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (!is_root()) GTEST_SKIP() << "needs root (ptrace)";
        void* m = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        ASSERT_NE(m, MAP_FAILED);
        shared_ = new (m) Shared{};
        for (auto& p : pipes_) ASSERT_EQ(::pipe(p), 0);
        int control[2];
        ASSERT_EQ(::pipe(control), 0);
        child_ = ::fork();
        ASSERT_GE(child_, 0);
        if (child_ == 0) {
            ::close(control[1]);
            child_main(shared_, pipes_, control[0]);
        }
        ::close(control[0]);
        control_ = control[1];
        // Every thread started, the blocked ones asleep in their calls.
        const auto until = std::chrono::steady_clock::now() + 20s;
        while ((shared_->started.load() < 4 * kEach || count_in_state(child_, 'S') < 3 * kEach + 1) &&
               std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(1ms);
        ASSERT_EQ(shared_->started.load(), 4 * kEach);
        ASSERT_EQ(count_in_state(child_, 'S'), 3 * kEach + 1) << "readers, sleepers, waiters and main blocked";
    }
    void TearDown() override {
        if (child_ > 0) {
            ::kill(child_, SIGKILL);
            ::waitpid(child_, nullptr, 0);
        }
        if (shared_) ::munmap(shared_, sizeof(Shared));
    }

    // Stops the child, checks every thread is stopped and none runs, lets it
    // go, then finishes each blocked call and checks its outcome.
    void stop_and_restore() {
        sigset_t mask_before, mask_after;
        ASSERT_EQ(::pthread_sigmask(SIG_SETMASK, nullptr, &mask_before), 0);
        long spins_stopped[kEach];
        {
            StoppedProcess process(child_);
            EXPECT_EQ(process.threads().size(), static_cast<std::size_t>(4 * kEach + 1));
            EXPECT_EQ(count_in_state(child_, 't'), 4 * kEach + 1) << "every thread in a ptrace stop";
            for (int i = 0; i < kEach; i++) spins_stopped[i] = shared_->spins[i].load();
            std::this_thread::sleep_for(50ms);
            for (int i = 0; i < kEach; i++) EXPECT_EQ(shared_->spins[i].load(), spins_stopped[i]) << "spinner " << i;
        }
        ASSERT_EQ(::pthread_sigmask(SIG_SETMASK, nullptr, &mask_after), 0);
        for (int sig = 1; sig < NSIG; sig++)
            EXPECT_EQ(sigismember(&mask_after, sig), sigismember(&mask_before, sig)) << "signal " << sig;
        for (pid_t tid : hotpatch::list_threads(child_)) EXPECT_EQ(tracer_of(child_, tid), "0") << "thread " << tid;
        std::this_thread::sleep_for(50ms);
        for (int i = 0; i < kEach; i++) EXPECT_GT(shared_->spins[i].load(), spins_stopped[i]) << "spinner " << i;
        EXPECT_EQ(count_in_state(child_, 'S'), 3 * kEach + 1) << "the blocked calls went back to sleep";

        for (auto& p : pipes_) ASSERT_EQ(::write(p[1], kBytes, sizeof kBytes), static_cast<ssize_t>(sizeof kBytes));
        shared_->futex_word = 1;
        ::syscall(SYS_futex, &shared_->futex_word, FUTEX_WAKE, 4 * kEach, nullptr, nullptr, 0);
        ::close(control_);
        int status = 0;
        ASSERT_EQ(::waitpid(child_, &status, 0), child_);
        child_ = 0;
        ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
        for (int i = 0; i < kEach; i++) {
            EXPECT_EQ(shared_->read_result[i], static_cast<long>(sizeof kBytes)) << "reader " << i;
            EXPECT_EQ(std::memcmp(shared_->read_bytes[i], kBytes, sizeof kBytes), 0) << "reader " << i;
            EXPECT_EQ(shared_->sleep_result[i], 0) << "sleeper " << i << ": " << std::strerror(static_cast<int>(shared_->sleep_result[i]));
            EXPECT_GE(shared_->slept_ns[i], kSleepNs) << "sleeper " << i << " woke early";
            EXPECT_EQ(shared_->futex_eintr[i], 0) << "waiter " << i;
        }
    }

    Shared* shared_ = nullptr;
    int pipes_[kEach][2]{};
    int control_ = -1;
    pid_t child_ = 0;
};

TEST_F(StopTest, EveryThreadStopsAndEachBlockedCallFinishesAsIfNothingHappened) { stop_and_restore(); }

TEST_F(StopTest, SameWhenTheProgramHandlesSigchld) {
    static std::atomic<int> handled{0};
    struct sigaction sa {}, old {};
    sa.sa_handler = [](int) { handled++; };
    ASSERT_EQ(::sigaction(SIGCHLD, &sa, &old), 0);
    stop_and_restore();
    ::sigaction(SIGCHLD, &old, nullptr);
    // The child's exit still reached the program's handler: the stop took
    // none of its notifications away for good.
    EXPECT_GE(handled.load(), 1);
}

TEST_F(StopTest, SameWhenTheProgramBlocksSigchld) {
    sigset_t chld, old;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &chld, &old), 0);
    stop_and_restore();
    // Still blocked, and the child's exit is still pending for the program.
    sigset_t pending;
    sigpending(&pending);
    EXPECT_TRUE(sigismember(&pending, SIGCHLD));
    const timespec none{0, 0};
    while (::sigtimedwait(&chld, nullptr, &none) == SIGCHLD) {
    }
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

}  // namespace
}  // namespace iprobe::test
