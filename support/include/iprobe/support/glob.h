#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace iprobe {

// Shell-style pattern match (*, ?, [...]) as fnmatch(3) without FNM_PATHNAME.
bool glob_match(std::string_view pattern, std::string_view text);

// "a,b,c" -> {"a","b","c"}; empty items dropped.
std::vector<std::string> split_list(std::string_view list, char sep = ',');

}  // namespace iprobe
