#include "iprobe/proxy/address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "iprobe/support/error.h"

namespace iprobe::proxy {

int Endpoint::port() const {
    if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(addr).sin6_port);
    return ntohs(reinterpret_cast<const sockaddr_in&>(addr).sin_port);
}

std::string Endpoint::str() const {
    char host[INET6_ADDRSTRLEN] = "?";
    if (addr.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(addr).sin6_addr, host, sizeof host);
        return "[" + std::string(host) + "]:" + std::to_string(port());
    }
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(addr).sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(port());
}

Endpoint parse_endpoint(std::string_view text, std::string_view what) {
    const auto bad = [&](const std::string& why) -> Error {
        return Error(std::string(what) + " '" + std::string(text) + "': " + why +
                         " (expected ADDR:PORT, e.g. 127.0.0.1:7000, [::1]:7000 or localhost:6379)",
                     ExitCode::usage);
    };
    std::string host, port;
    if (!text.empty() && text.front() == '[') {
        const auto close = text.find(']');
        if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':')
            throw bad("unterminated IPv6 address");
        host = std::string(text.substr(1, close - 1));
        port = std::string(text.substr(close + 2));
    } else {
        const auto colon = text.rfind(':');
        if (colon == std::string_view::npos) throw bad("no port");
        host = std::string(text.substr(0, colon));
        port = std::string(text.substr(colon + 1));
        if (host.find(':') != std::string::npos) throw bad("IPv6 addresses need brackets");
    }
    if (host.empty()) throw bad("no address");
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(port) > 65535)
        throw bad("port must be a number 0-65535");
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
    if (rc != 0 || !found) throw bad(std::string("cannot resolve address: ") + gai_strerror(rc));
    Endpoint ep;
    std::memcpy(&ep.addr, found->ai_addr, found->ai_addrlen);
    ep.len = found->ai_addrlen;
    freeaddrinfo(found);
    return ep;
}

UniqueFd listen_on(const Endpoint& at, std::string_view what) {
    UniqueFd fd(::socket(at.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) throw_errno(std::string(what) + ": socket");
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (at.family() == AF_INET6) ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&at.addr), at.len) != 0) {
        const int err = errno;
        if (err == EADDRINUSE)
            throw Error(std::string(what) + " " + at.str() +
                            ": address already in use (another process listens there; pick another port)",
                        ExitCode::busy);
        if (err == EADDRNOTAVAIL)
            throw Error(std::string(what) + " " + at.str() + ": no local interface has this address",
                        ExitCode::usage);
        if (err == EACCES)
            throw Error(std::string(what) + " " + at.str() + ": permission denied (ports below 1024 need root)",
                        ExitCode::permission);
        errno = err;
        throw_errno(std::string(what) + " " + at.str() + ": bind");
    }
    if (::listen(fd.get(), 1024) != 0) throw_errno(std::string(what) + " " + at.str() + ": listen");
    return fd;
}

UniqueFd listen_unix(const std::string& path) {
    sockaddr_un at{};
    at.sun_family = AF_UNIX;
    if (path.empty() || path.size() >= sizeof at.sun_path)
        throw Error("--hook-socket '" + path + "': a path of 1 to " + std::to_string(sizeof at.sun_path - 1) +
                        " bytes",
                    ExitCode::usage);
    std::memcpy(at.sun_path, path.data(), path.size());
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) throw_errno("--hook-socket: socket");
    ::unlink(path.c_str());
    const mode_t old = ::umask(077);
    const int bound = ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&at), sizeof at);
    ::umask(old);
    if (bound != 0) throw_errno("--hook-socket " + path + ": bind");
    if (::listen(fd.get(), 16) != 0) throw_errno("--hook-socket " + path + ": listen");
    return fd;
}

Endpoint local_endpoint(int fd) {
    Endpoint ep;
    ep.len = sizeof ep.addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&ep.addr), &ep.len);
    return ep;
}

UniqueFd start_connect(const Endpoint& to) {
    UniqueFd fd(::socket(to.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) return fd;
    const int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to.addr), to.len) != 0 && errno != EINPROGRESS) {
        const int err = errno;
        fd.reset();
        errno = err;
    }
    return fd;
}

}  // namespace iprobe::proxy
