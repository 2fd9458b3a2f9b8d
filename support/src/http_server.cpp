#include "iprobe/support/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "iprobe/support/error.h"

namespace iprobe {
namespace {

constexpr std::size_t kMaxHead = 8192;
constexpr int kHeadTimeoutMs = 5000;

const char* reason_of(int status) {
    switch (status) {
        case 200: return "OK";
        case 400: return "Bad Request";
        case 404: return "Not Found";
        case 405: return "Method Not Allowed";
        case 431: return "Request Header Fields Too Large";
        default: return "Error";
    }
}

// Writes all of `data`, giving up after the peer stalls for 5 s.
void send_all(int fd, std::string_view data) {
    while (!data.empty()) {
        pollfd p{fd, POLLOUT, 0};
        if (::poll(&p, 1, kHeadTimeoutMs) <= 0) return;
        const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        data.remove_prefix(static_cast<std::size_t>(n));
    }
}

void respond(int fd, const HttpResponse& r, bool head_only) {
    std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + reason_of(r.status) + "\r\n";
    out += "Content-Type: " + (r.content_type.empty() ? std::string("text/plain; charset=utf-8") : r.content_type) + "\r\n";
    out += "Content-Length: " + std::to_string(r.body.size()) + "\r\nConnection: close\r\n\r\n";
    if (!head_only) out += r.body;
    send_all(fd, out);
}

// Ends the answer, then reads what the client still sends (at most 64 KiB,
// a quarter second of quiet) before closing: closing with unread input would reset the connection
// and lose the answer on its way.
void close_gently(UniqueFd fd) {
    ::shutdown(fd.get(), SHUT_WR);
    char buf[4096];
    std::size_t drained = 0;
    for (pollfd p{fd.get(), POLLIN, 0}; drained < 65536 && ::poll(&p, 1, 250) > 0;) {
        const ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
        if (n <= 0) break;
        drained += static_cast<std::size_t>(n);
    }
}

// The request head (up to the blank line), or empty when the client sent
// none in time; `too_large` when it outgrew kMaxHead.
std::string read_head(int fd, bool& too_large) {
    std::string head;
    char buf[2048];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kHeadTimeoutMs);
    while (head.find("\r\n\r\n") == std::string::npos && head.find("\n\n") == std::string::npos) {
        if (head.size() > kMaxHead) {
            too_large = true;
            return head;
        }
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        pollfd p{fd, POLLIN, 0};
        if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return {};
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return {};
        head.append(buf, static_cast<std::size_t>(n));
    }
    too_large = head.size() > kMaxHead;
    return head;
}

}  // namespace

HttpEndpoint::HttpEndpoint(const std::string& address) {
    const auto colon = address.rfind(':');
    if (colon == std::string::npos)
        throw Error("--serve " + address + ": give HOST:PORT (e.g. 127.0.0.1:9464, or :9464 for every address)",
                    ExitCode::usage);
    std::string host = address.substr(0, colon);
    const std::string port = address.substr(colon + 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 || std::stoi(port) > 65535)
        throw Error("--serve " + address + ": the port must be a number from 0 to 65535", ExitCode::usage);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    if (const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found); rc != 0)
        throw Error("--serve " + address + ": " + ::gai_strerror(rc), ExitCode::usage);
    std::string last_error;
    for (addrinfo* a = found; a && !listener_; a = a->ai_next) {
        UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
        if (!fd) continue;
        const int one = 1;
        ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 16) != 0) {
            last_error = std::strerror(errno);
            continue;
        }
        listener_ = std::move(fd);
    }
    ::freeaddrinfo(found);
    if (!listener_) throw Error("cannot listen on " + address + ": " + last_error, ExitCode::busy);
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&bound), &len);
    char text[INET6_ADDRSTRLEN] = "";
    int bound_port = 0;
    if (bound.ss_family == AF_INET6) {
        const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&bound);
        ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
        bound_port = ntohs(in6->sin6_port);
        address_ = "[" + std::string(text) + "]:" + std::to_string(bound_port);
    } else {
        const auto* in = reinterpret_cast<const sockaddr_in*>(&bound);
        ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
        bound_port = ntohs(in->sin_port);
        address_ = std::string(text) + ":" + std::to_string(bound_port);
    }
}

bool HttpEndpoint::serve_one(std::chrono::milliseconds wait,
                             const std::function<HttpResponse(std::string_view path)>& handler) {
    pollfd p{listener_.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return false;
    UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn) return false;
    answer(conn.get(), handler);
    close_gently(std::move(conn));
    return true;
}

void HttpEndpoint::answer(int fd, const std::function<HttpResponse(std::string_view path)>& handler) {
    bool too_large = false;
    const std::string head = read_head(fd, too_large);
    if (too_large) return respond(fd, {431, {}, "request head larger than 8 KiB\n"}, false);
    if (head.empty()) return;  // nothing in time
    // "METHOD TARGET HTTP/1.x"
    const std::string line = head.substr(0, head.find_first_of("\r\n"));
    const auto sp1 = line.find(' '), sp2 = line.rfind(' ');
    if (sp1 == std::string::npos || sp2 <= sp1 || line.compare(sp2 + 1, 5, "HTTP/") != 0)
        return respond(fd, {400, {}, "malformed request line\n"}, false);
    const std::string method = line.substr(0, sp1);
    const std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    if (method != "GET" && method != "HEAD") return respond(fd, {405, {}, "only GET\n"}, false);
    respond(fd, handler(target.substr(0, target.find('?'))), method == "HEAD");
}

}  // namespace iprobe
