// The scrape endpoint behind `iprobe report --serve`: GET answered with the
// handler's body, other methods and malformed requests refused, and a
// client that sends nothing or too much cannot hold it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <future>
#include <string>

#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/http_server.h"

namespace iprobe {
namespace {

int port_of(const HttpEndpoint& e) { return std::stoi(e.address().substr(e.address().rfind(':') + 1)); }

UniqueFd connect_to(int port) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    return fd;
}

// Sends `request` on a new connection while the endpoint serves one; the
// whole answer, read until the endpoint closes.
std::string ask(HttpEndpoint& endpoint, const std::string& request) {
    UniqueFd fd = connect_to(port_of(endpoint));
    EXPECT_EQ(::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
    EXPECT_TRUE(endpoint.serve_one(std::chrono::seconds(5), [](std::string_view path) {
        return HttpResponse{200, "text/plain", "path " + std::string(path) + "\n"};
    }));
    std::string answer;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd.get(), buf, sizeof buf, 0)) > 0;) answer.append(buf, static_cast<std::size_t>(n));
    return answer;
}

TEST(HttpEndpoint, AnswersGetWithTheHandlersBodyAndRefusesTheRest) {
    HttpEndpoint endpoint("127.0.0.1:0");
    EXPECT_EQ(endpoint.address().rfind("127.0.0.1:", 0), 0u) << endpoint.address();
    EXPECT_EQ(ask(endpoint, "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"),
              "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 14\r\nConnection: close\r\n\r\npath /metrics\n");
    EXPECT_EQ(ask(endpoint, "HEAD /metrics HTTP/1.0\r\n\r\n"),
              "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 14\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(ask(endpoint, "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405 ", 0), 0u);
    EXPECT_EQ(ask(endpoint, "nonsense\r\n\r\n").rfind("HTTP/1.1 400 ", 0), 0u);
    EXPECT_EQ(ask(endpoint, "GET /" + std::string(9000, 'a') + " HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 431 ", 0), 0u);
}

TEST(HttpEndpoint, AClientThatSendsNothingIsDroppedAndTheNextIsServed) {
    HttpEndpoint endpoint("127.0.0.1:0");
    UniqueFd silent = connect_to(port_of(endpoint));
    const auto started = std::chrono::steady_clock::now();
    EXPECT_TRUE(endpoint.serve_one(std::chrono::seconds(1), [](std::string_view) { return HttpResponse{}; }));
    const auto held = std::chrono::steady_clock::now() - started;
    EXPECT_GE(held, std::chrono::seconds(4));
    EXPECT_LT(held, std::chrono::seconds(8));
    char byte;
    EXPECT_EQ(::recv(silent.get(), &byte, 1, 0), 0) << "closed without an answer";
    EXPECT_EQ(ask(endpoint, "GET /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200 ", 0), 0u);
    EXPECT_FALSE(endpoint.serve_one(std::chrono::milliseconds(50), [](std::string_view) { return HttpResponse{}; }));
}

TEST(HttpEndpoint, BadAddressesAreUsageErrorsAndATakenPortIsBusy) {
    for (const char* bad : {"nowhere", "127.0.0.1:http", "127.0.0.1:70000", "no.such.host.invalid:80"}) {
        try {
            HttpEndpoint e(bad);
            ADD_FAILURE() << bad << " was accepted";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ExitCode::usage) << bad << ": " << e.what();
        }
    }
    HttpEndpoint first("127.0.0.1:0");
    try {
        HttpEndpoint second(first.address());
        ADD_FAILURE() << "two endpoints on " << first.address();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::busy) << e.what();
    }
}

}  // namespace
}  // namespace iprobe
