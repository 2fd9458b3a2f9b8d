#include "iprobe/support/glob.h"

#include <fnmatch.h>

namespace iprobe {

bool glob_match(std::string_view pattern, std::string_view text) {
    // fnmatch needs NUL-terminated strings.
    const std::string p(pattern), t(text);
    return ::fnmatch(p.c_str(), t.c_str(), 0) == 0;
}

std::vector<std::string> split_list(std::string_view list, char sep) {
    std::vector<std::string> out;
    std::size_t start = 0;
    while (start <= list.size()) {
        std::size_t end = list.find(sep, start);
        if (end == std::string_view::npos) end = list.size();
        if (end > start) out.emplace_back(list.substr(start, end - start));
        start = end + 1;
    }
    return out;
}

}  // namespace iprobe
