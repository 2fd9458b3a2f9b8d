#include "socket_diag.h"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "packet.h"

namespace iprobe::proxy::mirror_impl {

namespace {

// The kernel's TCP states (include/net/tcp_states.h).
constexpr int kTcpTimeWait = 6, kTcpCloseWait = 8, kTcpLastAck = 9, kTcpListen = 10, kTcpClosing = 11;

struct Request {
    nlmsghdr header;
    inet_diag_req_v2 diag;
};

}  // namespace

SocketDiag::SocketDiag() : fd_(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG)) {}

// Sends one request and hands each reply message to `on`, until the kernel is
// done (a dump's DONE, or the one answer of an exact lookup).  False on error.
template <typename On>
static bool exchange(int fd, std::uint32_t seq, const inet_diag_req_v2& diag, bool dump, On on) {
    Request req{};
    req.header.nlmsg_len = sizeof req;
    req.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    req.header.nlmsg_flags = NLM_F_REQUEST | (dump ? NLM_F_DUMP : 0);
    req.header.nlmsg_seq = seq;
    req.diag = diag;
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    if (::sendto(fd, &req, sizeof req, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0) return false;
    alignas(nlmsghdr) char buf[32768];
    for (;;) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 1000) != 1) return false;
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) return false;
        auto len = static_cast<unsigned>(n);
        for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
            if (h->nlmsg_seq != seq) continue;
            if (h->nlmsg_type == NLMSG_DONE) return true;
            if (h->nlmsg_type == NLMSG_ERROR) {
                const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
                return e->error == -ENOENT;  // an exact lookup that found nothing
            }
            if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY) {
                on(*static_cast<const inet_diag_msg*>(NLMSG_DATA(h)), h);
                if (!dump) return true;
            }
        }
    }
}

bool SocketDiag::listening(int family, std::uint16_t port) {
    if (!fd_) return false;
    inet_diag_req_v2 diag{};
    diag.sdiag_family = static_cast<std::uint8_t>(family);
    diag.sdiag_protocol = IPPROTO_TCP;
    diag.idiag_states = 1u << kTcpListen;
    bool found = false;
    exchange(fd_.get(), ++seq_, diag, true, [&](const inet_diag_msg& m, const nlmsghdr*) {
        if (ntohs(m.id.idiag_sport) == port) found = true;
    });
    return found;
}

namespace {

SocketDiag::Connection connection_of(const inet_diag_msg& m, const nlmsghdr* h) {
    SocketDiag::Connection c;
    c.open = m.idiag_state != kTcpTimeWait;
    c.unread = m.idiag_rqueue;
    auto attr_len = static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(sizeof m));
    for (auto* a = reinterpret_cast<const rtattr*>(&m + 1); RTA_OK(a, attr_len); a = RTA_NEXT(a, attr_len)) {
        if (a->rta_type != INET_DIAG_INFO) continue;
        tcp_info info{};
        std::memcpy(&info, RTA_DATA(a), std::min<std::size_t>(RTA_PAYLOAD(a), sizeof info));
        c.counted = RTA_PAYLOAD(a) >= offsetof(tcp_info, tcpi_bytes_received) + sizeof info.tcpi_bytes_received;
        if (c.counted) c.bytes_received = info.tcpi_bytes_received;
    }
    // The client's FIN takes one sequence number, which the kernel counts in
    // bytes_received and, until production has read to the end of the
    // stream, in the receive queue; counted as a byte it would make
    // production look one byte further on than any captured stream.
    if (m.idiag_state == kTcpCloseWait || m.idiag_state == kTcpLastAck || m.idiag_state == kTcpClosing) {
        if (c.counted && c.bytes_received > 0) --c.bytes_received;
        if (c.unread > 0) --c.unread;
    }
    return c;
}

}  // namespace

std::vector<std::pair<FlowKey, SocketDiag::Connection>> SocketDiag::connections(int family, std::uint16_t port) {
    std::vector<std::pair<FlowKey, Connection>> out;
    if (!fd_) return out;
    inet_diag_req_v2 diag{};
    diag.sdiag_family = static_cast<std::uint8_t>(family);
    diag.sdiag_protocol = IPPROTO_TCP;
    diag.idiag_states = ~0u & ~(1u << kTcpListen) & ~(1u << kTcpTimeWait);
    diag.idiag_ext = 1u << (INET_DIAG_INFO - 1);
    exchange(fd_.get(), ++seq_, diag, true, [&](const inet_diag_msg& m, const nlmsghdr* h) {
        if (ntohs(m.id.idiag_sport) != port || m.id.idiag_dport == 0) return;
        FlowKey key;
        key.family = family;
        key.server_port = port;
        key.client_port = ntohs(m.id.idiag_dport);
        std::memcpy(key.server.data(), m.id.idiag_src, family == AF_INET ? 4 : 16);
        std::memcpy(key.client.data(), m.id.idiag_dst, family == AF_INET ? 4 : 16);
        out.emplace_back(key, connection_of(m, h));
    });
    return out;
}

std::optional<SocketDiag::Connection> SocketDiag::lookup(const FlowKey& key) {
    if (!fd_) return std::nullopt;
    inet_diag_req_v2 diag{};
    diag.sdiag_family = static_cast<std::uint8_t>(key.family);
    diag.sdiag_protocol = IPPROTO_TCP;
    diag.idiag_states = ~0u;
    diag.idiag_ext = 1u << (INET_DIAG_INFO - 1);
    // Production's side: the server's address is the source.
    diag.id.idiag_sport = htons(key.server_port);
    diag.id.idiag_dport = htons(key.client_port);
    std::memcpy(diag.id.idiag_src, key.server.data(), key.family == AF_INET ? 4 : 16);
    std::memcpy(diag.id.idiag_dst, key.client.data(), key.family == AF_INET ? 4 : 16);
    diag.id.idiag_cookie[0] = diag.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    std::optional<Connection> found;
    exchange(fd_.get(), ++seq_, diag, false,
             [&](const inet_diag_msg& m, const nlmsghdr* h) { found = connection_of(m, h); });
    return found;
}

}  // namespace iprobe::proxy::mirror_impl
