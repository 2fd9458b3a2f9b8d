// Production's own TCP sockets, as the kernel reports them (sock_diag): how
// many bytes a connection's socket has received.  When the capture runs in
// production's network namespace this tells, per connection, whether bytes
// reached production that the capture never saw.  Private to the proxy library.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "iprobe/support/fd.h"

namespace iprobe::proxy::mirror_impl {

struct FlowKey;

class SocketDiag {
public:
    SocketDiag();  // available() false where sock_diag is not
    bool available() const { return static_cast<bool>(fd_); }

    // Whether a socket listens on `port` here (production is in this network
    // namespace, so its connections can be looked up).
    bool listening(int family, std::uint16_t port);

    struct Connection {
        bool open = false;                 // established or closing; false: TIME_WAIT
        bool counted = false;              // the kernel reports bytes_received (4.1 and later)
        // Stream bytes (the client's FIN, one sequence number, not counted).
        std::uint64_t bytes_received = 0;  // in order, from the client
        std::uint32_t unread = 0;          // of those, still in the socket's receive queue
    };
    // Production's side of the connection `key`; nullopt when it has no
    // socket any more.
    std::optional<Connection> lookup(const FlowKey& key);
    // Every connection production accepted on `port` (not listening, not
    // TIME_WAIT), client first in each key.
    std::vector<std::pair<FlowKey, Connection>> connections(int family, std::uint16_t port);

private:
    UniqueFd fd_;
    std::uint32_t seq_ = 0;
};

}  // namespace iprobe::proxy::mirror_impl
