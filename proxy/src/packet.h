// A captured frame's TCP segment: link, IPv4/IPv6 and TCP headers parsed,
// nothing copied.  Private to the proxy library (the capture's reader).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

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

}  // namespace iprobe::proxy::mirror_impl
