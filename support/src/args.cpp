#include "iprobe/support/args.h"

#include <algorithm>
#include <cstdio>

#include "iprobe/support/error.h"

namespace iprobe {

std::string ParsedArgs::value(std::string_view name, std::string_view fallback) const {
    auto it = values_.find(name);
    return it == values_.end() || it->second.empty() ? std::string(fallback) : it->second.back();
}

std::vector<std::string> ParsedArgs::values(std::string_view name) const {
    auto it = values_.find(name);
    return it == values_.end() ? std::vector<std::string>{} : it->second;
}

ArgSpec::ArgSpec(std::string command, std::string synopsis, std::string about, std::vector<ArgOption> options,
                 std::string footer)
    : command_(std::move(command)), synopsis_(std::move(synopsis)), about_(std::move(about)),
      footer_(std::move(footer)), options_(std::move(options)) {}

const ArgOption* ArgSpec::find(std::string_view name) const {
    for (const auto& o : options_)
        if (o.name == name || (!o.short_name.empty() && o.short_name == name)) return &o;
    return nullptr;
}

void ArgSpec::fail(const std::string& message) const {
    throw Error(message + "\n" + synopsis_.substr(0, synopsis_.find('\n')) + "\n(see '" + command_ + " --help')",
                ExitCode::usage);
}

ParsedArgs ArgSpec::parse(std::span<const std::string> args) const {
    ParsedArgs out;
    for (std::size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        if (a == "--") {
            auto& into = command_after_dashes_ ? out.command_ : out.positionals_;
            into.insert(into.end(), args.begin() + static_cast<long>(i) + 1, args.end());
            break;
        }
        if (a == "-h" || a == "--help") {
            out.help_ = true;
            return out;
        }
        // "-" (stdin) and "-123" (a negative number, for the tool to reject
        // with its own reason) are operands, not options.
        if (a.size() < 2 || a[0] != '-' || (a[1] >= '0' && a[1] <= '9')) {
            out.positionals_.push_back(a);
            continue;
        }
        const auto eq = a.starts_with("--") ? a.find('=') : std::string::npos;
        const std::string name = a.substr(0, eq);
        const ArgOption* option = find(name);
        if (!option) fail("unknown option '" + name + "'");
        const std::string key(option->name);
        if (option->optional_value) {
            out.values_[key].push_back(eq != std::string::npos ? a.substr(eq + 1) : std::string());
            continue;
        }
        if (option->value_name.empty()) {
            if (eq != std::string::npos) fail(key + " takes no value");
            out.values_[key].emplace_back();
            continue;
        }
        if (eq != std::string::npos) {
            out.values_[key].push_back(a.substr(eq + 1));
        } else if (i + 1 < args.size()) {
            out.values_[key].push_back(args[++i]);
        } else {
            fail(key + " needs a value (" + std::string(option->value_name) + ")");
        }
    }
    return out;
}

ParsedArgs ArgSpec::parse(int argc, char** argv, int first) const {
    std::vector<std::string> args;
    for (int i = first; i < argc; ++i) args.emplace_back(argv[i]);
    return parse(args);
}

std::optional<ParsedArgs> ArgSpec::parse_or_print_help(std::span<const std::string> args) const {
    ParsedArgs parsed = parse(args);
    if (!parsed.help_requested()) return parsed;
    std::fputs(help().c_str(), stdout);
    return std::nullopt;
}

std::optional<ParsedArgs> ArgSpec::parse_or_print_help(int argc, char** argv, int first) const {
    std::vector<std::string> args;
    for (int i = first; i < argc; ++i) args.emplace_back(argv[i]);
    return parse_or_print_help(args);
}

std::string ArgSpec::help() const {
    std::string out = synopsis_;
    if (!out.ends_with('\n')) out += '\n';
    if (!about_.empty()) out += "\n" + about_ + (about_.ends_with('\n') ? "" : "\n");
    if (!options_.empty()) {
        std::vector<std::string> heads;
        std::size_t width = 0;
        for (const auto& o : options_) {
            std::string head = "  ";
            if (!o.short_name.empty()) head += std::string(o.short_name) + ", ";
            head += o.name;
            if (o.optional_value) head += "[=" + std::string(o.value_name) + "]";
            else if (!o.value_name.empty()) head += " " + std::string(o.value_name);
            width = std::max(width, head.size());
            heads.push_back(std::move(head));
        }
        width = std::min<std::size_t>(width + 2, 30);
        out += "\noptions:\n";
        for (std::size_t k = 0; k < options_.size(); ++k) {
            std::string line = heads[k];
            std::string_view help = options_[k].help;
            bool first = true;
            while (true) {
                const auto nl = help.find('\n');
                const std::string_view piece = help.substr(0, nl);
                if (first && line.size() + 1 >= width) {
                    out += line + "\n";
                    line.clear();
                }
                line.resize(std::max(line.size(), width), ' ');
                out += line + std::string(piece) + "\n";
                line.clear();
                first = false;
                if (nl == std::string_view::npos) break;
                help.remove_prefix(nl + 1);
            }
        }
    }
    if (!footer_.empty()) out += "\n" + footer_ + (footer_.ends_with('\n') ? "" : "\n");
    return out;
}

}  // namespace iprobe
