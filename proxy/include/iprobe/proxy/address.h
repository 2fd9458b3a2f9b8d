// TCP endpoints as users write them ("127.0.0.1:7000", "[::1]:7000",
// "localhost:6379") and the socket calls the proxy makes on them.
#pragma once

#include <sys/socket.h>

#include <string>
#include <string_view>

#include "iprobe/support/fd.h"

namespace iprobe::proxy {

struct Endpoint {
    sockaddr_storage addr{};
    socklen_t len = 0;

    int family() const { return addr.ss_family; }
    int port() const;
    std::string str() const;  // "127.0.0.1:7000" or "[::1]:7000"
};

// Parses ADDR:PORT; throws Error(usage) with the accepted forms on bad input.
// `what` names the option in the message (e.g. "--listen").
Endpoint parse_endpoint(std::string_view text, std::string_view what);

// A non-blocking listening socket; Error(busy) when the port is in use.
UniqueFd listen_on(const Endpoint& at, std::string_view what);
// A non-blocking listening Unix stream socket at `path` (mode 0600; an old
// socket file there is replaced).
UniqueFd listen_unix(const std::string& path);
// The address a socket is actually bound to (resolves port 0).
Endpoint local_endpoint(int fd);
// Starts a non-blocking connect; the fd is valid even when the connect is in
// progress.  Returns an invalid fd (and sets errno) on immediate failure.
UniqueFd start_connect(const Endpoint& to);

}  // namespace iprobe::proxy
