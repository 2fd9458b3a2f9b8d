// The debug session's mirror on its own (mirror_supervisor.h): a real
// iprobe-mirror between a client and two echo servers of this test, one
// production and one debug copy.  Its readiness and stats endpoint, what it
// counts, its recording and its end are read through the supervisor's
// channels, as the session reads them.  No root, no CRIU.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "iprobe/launcher/mirror_supervisor.h"
#include "iprobe/support/error.h"
#include "testutil.h"

namespace fs = std::filesystem;
using namespace iprobe;
using namespace iprobe::launcher;
using iprobe::test::TempDir;

namespace {

// A TCP server on 127.0.0.1 that echoes what each connection sends and
// keeps every byte it received.
class EchoServer {
public:
    EchoServer() {
        fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1;
        ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0) return;
        socklen_t len = sizeof a;
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
        port_ = ntohs(a.sin_port);
        thread_ = std::thread([this] { serve(); });
    }
    ~EchoServer() {
        stop_ = true;
        if (thread_.joinable()) thread_.join();
        ::close(fd_);
    }
    int port() const { return port_; }
    std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
    std::string received() {
        std::lock_guard<std::mutex> lock(m_);
        return received_;
    }

private:
    void serve() {
        std::vector<pollfd> fds = {{fd_, POLLIN, 0}};
        while (!stop_) {
            if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
            for (std::size_t i = fds.size(); i-- > 1;) {
                if (!fds[i].revents) continue;
                char buf[4096];
                const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
                if (n <= 0) {
                    ::close(fds[i].fd);
                    fds.erase(fds.begin() + static_cast<std::ptrdiff_t>(i));
                    continue;
                }
                {
                    std::lock_guard<std::mutex> lock(m_);
                    received_.append(buf, static_cast<std::size_t>(n));
                }
                (void)!::write(fds[i].fd, buf, static_cast<std::size_t>(n));
            }
            if (fds[0].revents)
                if (const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC); c >= 0) fds.push_back({c, POLLIN, 0});
        }
        for (std::size_t i = 1; i < fds.size(); ++i) ::close(fds[i].fd);
    }

    int fd_ = -1, port_ = 0;
    std::atomic<bool> stop_{false};
    std::mutex m_;
    std::string received_;
    std::thread thread_;
};

int connect_to(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

// Sends `what` and reads as many bytes back.
std::string round_trip(int fd, const std::string& what) {
    (void)!::write(fd, what.data(), what.size());
    std::string got;
    while (got.size() < what.size()) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 5000) <= 0) break;
        char buf[256];
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) break;
        got.append(buf, static_cast<std::size_t>(n));
    }
    return got;
}

template <typename F>
bool eventually(F done) {
    for (int i = 0; i < 500; ++i) {
        if (done()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return done();
}

class MirrorSupervisorTest : public ::testing::Test {
protected:
    void SetUp() override {
        tool_ = iprobe::test::build_dir() + "/libexec/iprobe/iprobe-mirror";
        if (!fs::exists(tool_)) FAIL() << "iprobe-mirror is not built (target iprobe-mirror)";
        listen_port_ = iprobe::test::free_port();
    }
    std::vector<std::string> argv() const {
        return {tool_, "mirror", "--listen", "127.0.0.1:" + std::to_string(listen_port_), "--production",
                production_.address(), "--debug", debug_.address(), "--stats", "127.0.0.1:0", "--ready-fd", "3"};
    }
    std::string tool_;
    int listen_port_ = 0;
    EchoServer production_, debug_;
};

}  // namespace

TEST_F(MirrorSupervisorTest, StartsReadyWithItsStatsAndCountsEveryByteItCopies) {
    MirrorSupervisor mirror;
    mirror.start(argv());
    ASSERT_TRUE(mirror.started());
    EXPECT_GT(mirror.stats_endpoint().port(), 0);
    const int client = connect_to(listen_port_);
    ASSERT_GE(client, 0);
    EXPECT_EQ(round_trip(client, "hello, production\n"), "hello, production\n");
    EXPECT_TRUE(eventually([&] { return debug_.received() == "hello, production\n"; })) << debug_.received();
    EXPECT_EQ(production_.received(), "hello, production\n");
    std::optional<proxy::MirrorStats> stats;
    EXPECT_TRUE(eventually([&] {
        stats = mirror.stats();
        return stats && stats->debug_targets.size() == 1 && stats->debug_targets[0].bytes == 18;
    }));
    ASSERT_TRUE(stats);
    EXPECT_EQ(stats->bytes.client_to_production, 18u);
    EXPECT_EQ(stats->bytes.production_to_client, 18u);
    EXPECT_EQ(stats->connections.accepted, 1u);
    EXPECT_EQ(stats->debug_targets[0].address, debug_.address());
    // The document as the mirror serves it says the same.
    const auto document = mirror.stats_document();
    ASSERT_TRUE(document);
    EXPECT_EQ(proxy::parse_mirror_stats(*document).bytes.client_to_production, 18u);
    ::close(client);
    EXPECT_FALSE(mirror.ended());
}

TEST_F(MirrorSupervisorTest, RecordsTheConnectionsOpenedAfterTheCommandAndSaysWhichWereOpen) {
    TempDir tmp;
    MirrorSupervisor mirror;
    mirror.start(argv());
    const int before = connect_to(listen_port_);
    ASSERT_GE(before, 0);
    EXPECT_EQ(round_trip(before, "old\n"), "old\n");
    // One connection open when the recording starts: in no recording.
    const std::string path = tmp.path() + "/input.rec";
    EXPECT_EQ(mirror.record(path), 1u);
    EXPECT_TRUE(fs::exists(path));
    const int after = connect_to(listen_port_);
    ASSERT_GE(after, 0);
    EXPECT_EQ(round_trip(after, "new\n"), "new\n");
    EXPECT_EQ(mirror.record(""), 2u);  // stopped, with both open
    ::close(after);
    ::close(before);
    EXPECT_TRUE(eventually([&] { return fs::file_size(path) > 0; }));
    // A file it cannot write is refused with the mirror's reason.
    EXPECT_THROW(mirror.record(tmp.path() + "/no/such/dir/input.rec"), Error);
    EXPECT_FALSE(mirror.ended()) << "a refused command ended the mirror";
}

TEST_F(MirrorSupervisorTest, RelaysWhatTheMirrorSaysForPeople) {
    MirrorSupervisor mirror;
    mirror.start(argv());
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    std::string said;
    for (int i = 0; i < 50 && said.find('\n') == std::string::npos; ++i) {
        pollfd p{mirror.output_fd(), POLLIN, 0};
        if (::poll(&p, 1, 100) > 0) mirror.relay_output(out[1]);
        char buf[512];
        pollfd r{out[0], POLLIN, 0};
        if (::poll(&r, 1, 0) > 0) said.append(buf, static_cast<std::size_t>(::read(out[0], buf, sizeof buf)));
    }
    ::close(out[0]);
    ::close(out[1]);
    EXPECT_NE(said.find(std::to_string(listen_port_)), std::string::npos) << said;
}

TEST_F(MirrorSupervisorTest, SaysOnceHowItEndedAndStopLeavesNoChild) {
    MirrorSupervisor mirror;
    mirror.start(argv());
    const pid_t pid = mirror.pid();
    EXPECT_FALSE(mirror.ended());
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    std::optional<std::string> how;
    EXPECT_TRUE(eventually([&] { return (how = mirror.ended()).has_value(); }));
    EXPECT_EQ(how.value_or(""), "was killed by signal Killed");
    EXPECT_FALSE(mirror.ended()) << "said twice";
    EXPECT_FALSE(mirror.started());

    MirrorSupervisor second;
    second.start(argv());
    const pid_t second_pid = second.pid();
    second.stop();
    EXPECT_FALSE(second.started());
    EXPECT_NE(::kill(second_pid, 0), 0) << "stop() left the mirror or its zombie";
}

TEST_F(MirrorSupervisorTest, AMirrorThatCannotStartThrowsWithItsExitCode) {
    MirrorSupervisor first;
    first.start(argv());
    // --listen taken by the first: the second mirror exits before it is ready.
    MirrorSupervisor second;
    try {
        second.start(argv());
        FAIL() << "a second mirror on the same --listen started";
    } catch (const Error& e) {
        EXPECT_NE(e.code(), ExitCode::ok);
        EXPECT_NE(std::string(e.what()).find("exited before it was ready"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(second.started());
    EXPECT_FALSE(first.ended());
}
