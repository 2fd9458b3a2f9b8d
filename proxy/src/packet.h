// A captured frame's TCP segment: link, IPv4/IPv6 and TCP headers parsed,
// nothing copied.  Private to the proxy library (the capture's reader).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "iprobe/proxy/tcp_reassembly.h"

namespace iprobe::proxy::mirror_impl {

struct TcpPacket {
    int family = 0;  // AF_INET or AF_INET6
    std::array<std::uint8_t, 16> src{}, dst{};
    std::uint16_t src_port = 0, dst_port = 0;
    TcpSegment segment;  // payload points into the frame
};

// Parses a frame of pcap link type `linktype` (Ethernet, Linux cooked v1/v2,
// raw IP) that the capture kept `frame.size()` bytes of.  False for anything
// but an unfragmented TCP segment over IPv4 or IPv6.
bool parse_tcp_packet(int linktype, std::span<const std::uint8_t> frame, TcpPacket& out);
bool link_type_supported(int linktype);

// A connection as seen on the wire: its addresses, client first.
struct FlowKey {
    int family = 0;
    std::array<std::uint8_t, 16> client{}, server{};
    std::uint16_t client_port = 0, server_port = 0;
    bool operator==(const FlowKey&) const = default;
    std::string client_str() const;
};

struct FlowKeyHash {
    std::size_t operator()(const FlowKey& k) const;
};


}  // namespace iprobe::proxy::mirror_impl
