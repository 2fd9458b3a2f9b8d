#include "packet.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pcap/dlt.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

namespace iprobe::proxy::mirror_impl {

namespace {

std::uint16_t be16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] << 8 | p[1]); }
std::uint32_t be32(const std::uint8_t* p) {
    return std::uint32_t(p[0]) << 24 | std::uint32_t(p[1]) << 16 | std::uint32_t(p[2]) << 8 | p[3];
}

constexpr std::uint16_t kEtherIpv4 = 0x0800, kEtherIpv6 = 0x86dd, kEtherVlan = 0x8100, kEtherQinQ = 0x88a8;

// The offset of the network header and its EtherType; false for other links.
bool network_header(int linktype, std::span<const std::uint8_t> f, std::size_t& at, std::uint16_t& type) {
    switch (linktype) {
    case DLT_EN10MB:
        if (f.size() < 14) return false;
        at = 14;
        type = be16(&f[12]);
        // libpcap puts the VLAN tags the kernel stripped back into the frame.
        while ((type == kEtherVlan || type == kEtherQinQ) && f.size() >= at + 4) {
            type = be16(&f[at + 2]);
            at += 4;
        }
        return true;
    case DLT_LINUX_SLL:
        if (f.size() < 16) return false;
        at = 16;
        type = be16(&f[14]);
        return true;
    case DLT_LINUX_SLL2:
        if (f.size() < 20) return false;
        at = 20;
        type = be16(&f[0]);
        return true;
    case DLT_RAW:
    case DLT_IPV4:
    case DLT_IPV6:
        if (f.empty()) return false;
        at = 0;
        type = (f[0] >> 4) == 6 ? kEtherIpv6 : kEtherIpv4;
        return true;
    default:
        return false;
    }
}

std::string address_str(int family, const std::array<std::uint8_t, 16>& a, std::uint16_t port) {
    char text[INET6_ADDRSTRLEN] = "?";
    ::inet_ntop(family, a.data(), text, sizeof text);
    return family == AF_INET6 ? "[" + std::string(text) + "]:" + std::to_string(port)
                              : std::string(text) + ":" + std::to_string(port);
}

}  // namespace

std::string FlowKey::client_str() const { return address_str(family, client, client_port); }

std::size_t FlowKeyHash::operator()(const FlowKey& k) const {
    // Addresses as 64-bit words, ports folded in, mixed by multiplication.
    std::uint64_t w[4];
    std::memcpy(w, k.client.data(), 16);
    std::memcpy(w + 2, k.server.data(), 16);
    std::uint64_t h = (std::uint64_t(k.client_port) << 16 | k.server_port) ^ 0x9e3779b97f4a7c15ULL;
    for (const std::uint64_t x : w) h = (h ^ x) * 0xff51afd7ed558ccdULL;
    return static_cast<std::size_t>(h ^ (h >> 32));
}

bool link_type_supported(int linktype) {
    switch (linktype) {
    case DLT_EN10MB:
    case DLT_LINUX_SLL:
    case DLT_LINUX_SLL2:
    case DLT_RAW:
    case DLT_IPV4:
    case DLT_IPV6:
        return true;
    default:
        return false;
    }
}

bool parse_tcp_packet(int linktype, std::span<const std::uint8_t> f, TcpPacket& out) {
    std::size_t at = 0;
    std::uint16_t type = 0;
    if (!network_header(linktype, f, at, type)) return false;
    // Bytes the TCP segment has on the wire from `at` (headers included), from
    // the IP header: the frame may be padded, or cut short by the snap length.
    std::size_t ip_end = 0;
    if (type == kEtherIpv4) {
        if (f.size() < at + 20 || (f[at] >> 4) != 4) return false;
        const std::size_t ihl = (f[at] & 0x0f) * 4u;
        const std::size_t total = be16(&f[at + 2]);
        if (ihl < 20 || f[at + 9] != IPPROTO_TCP) return false;
        if ((be16(&f[at + 6]) & 0x3fff) != 0) return false;  // a fragment
        out.family = AF_INET;
        out.src = {};
        out.dst = {};
        std::memcpy(out.src.data(), &f[at + 12], 4);
        std::memcpy(out.dst.data(), &f[at + 16], 4);
        // A segment the stack built larger than 64 KiB (GSO) says 0.
        ip_end = total != 0 ? at + total : f.size();
        at += ihl;
    } else if (type == kEtherIpv6) {
        if (f.size() < at + 40 || (f[at] >> 4) != 6) return false;
        const std::size_t payload = be16(&f[at + 4]);
        std::uint8_t next = f[at + 6];
        out.family = AF_INET6;
        std::memcpy(out.src.data(), &f[at + 8], 16);
        std::memcpy(out.dst.data(), &f[at + 24], 16);
        ip_end = payload != 0 ? at + 40 + payload : f.size();
        at += 40;
        // Extension headers: hop-by-hop, routing, destination options, AH.
        for (int i = 0; i < 8 && next != IPPROTO_TCP; ++i) {
            if (f.size() < at + 8) return false;
            if (next == IPPROTO_HOPOPTS || next == IPPROTO_ROUTING || next == IPPROTO_DSTOPTS) {
                next = f[at];
                at += (f[at + 1] + 1u) * 8;
            } else if (next == IPPROTO_AH) {
                next = f[at];
                at += (f[at + 1] + 2u) * 4;
            } else {
                return false;  // a fragment, or not TCP
            }
        }
        if (next != IPPROTO_TCP) return false;
    } else {
        return false;
    }
    if (f.size() < at + 20 || ip_end < at + 20) return false;
    const std::uint8_t* tcp = &f[at];
    const std::size_t header = (tcp[12] >> 4) * 4u;
    if (header < 20 || ip_end < at + header) return false;
    out.src_port = be16(tcp);
    out.dst_port = be16(tcp + 2);
    TcpSegment& s = out.segment;
    s.seq = be32(tcp + 4);
    s.ack = be32(tcp + 8);
    s.flags = tcp[13];
    const std::size_t payload_at = at + header;
    const std::size_t wire_payload = ip_end - payload_at;
    const std::size_t kept = f.size() > payload_at ? std::min(wire_payload, f.size() - payload_at) : 0;
    s.payload = f.subspan(std::min(payload_at, f.size()), kept);
    s.missing = wire_payload - kept;
    return true;
}

}  // namespace iprobe::proxy::mirror_impl
