// A minimal HTTP/1.1 endpoint for a scrape (`iprobe report --serve`): GET
// only, one connection at a time, each answered and closed.  Bounded: the
// request head is at most 8 KiB and must arrive within 5 s, so a client
// that sends nothing or too much cannot hold the endpoint.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

#include "iprobe/support/fd.h"

namespace iprobe {

struct HttpResponse {
    int status = 200;
    std::string content_type;
    std::string body;
};

class HttpEndpoint {
public:
    // "HOST:PORT" (HOST a name or an IPv4 address, "[IPv6]" in brackets;
    // empty: every address); port 0 picks a free one.  Throws Error(usage)
    // for a malformed address, Error(busy) when the port is taken.
    explicit HttpEndpoint(const std::string& address);

    // "HOST:PORT" as bound (the port chosen when 0 was asked).
    std::string address() const { return address_; }

    // Waits up to `wait` for a connection and answers it with what
    // `handler` makes of the request's path (query string removed); a
    // method other than GET or HEAD gets 405, a malformed request 400.
    // False when no connection came.
    bool serve_one(std::chrono::milliseconds wait, const std::function<HttpResponse(std::string_view path)>& handler);

private:
    void answer(int fd, const std::function<HttpResponse(std::string_view path)>& handler);

    UniqueFd listener_;
    std::string address_;
};

}  // namespace iprobe
