// One command-line grammar for every iprobe tool: `--name value` and
// `--name=value` alike, `-x value` for a short name, flags take no value,
// an optional value only as `--name=value`,
// `--` ends the options (what follows is positional), `-h`/`--help` asks for
// the help, which is generated from the same table the parser reads.
#pragma once

#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace iprobe {

struct ArgOption {
    std::string_view name;            // "--probes"
    std::string_view value_name;      // "LIST"; empty: a flag
    std::string_view help;            // may span lines ('\n'), each indented under the option in --help
    std::string_view short_name = {};  // "-o", or empty
    // The value may be left out (`--backtrace` or `--backtrace=8`, never
    // `--backtrace 8`): given alone it parses as an empty value.
    bool optional_value = false;
};

class ParsedArgs {
public:
    bool help_requested() const { return help_; }
    bool has(std::string_view name) const { return values_.count(std::string(name)) != 0; }
    // The last value given for `name`, or `fallback`.
    std::string value(std::string_view name, std::string_view fallback = {}) const;
    // Every value given for `name`, in order (options that may repeat).
    std::vector<std::string> values(std::string_view name) const;
    const std::vector<std::string>& positionals() const { return positionals_; }
    // What followed `--` when the spec takes a command there (fperf record -- PROGRAM ARGS).
    const std::vector<std::string>& command() const { return command_; }

private:
    friend class ArgSpec;
    bool help_ = false;
    std::map<std::string, std::vector<std::string>, std::less<>> values_;
    std::vector<std::string> positionals_;
    std::vector<std::string> command_;
};

class ArgSpec {
public:
    // `synopsis`: the "usage: ..." lines; `about`: what the tool does, before
    // the options; `footer`: exit codes and notes, after them.
    ArgSpec(std::string command, std::string synopsis, std::string about, std::vector<ArgOption> options,
            std::string footer = {});

    // Throws Error(usage) naming the bad argument, with the synopsis and a
    // pointer to --help.  With -h/--help anywhere before `--`, returns at once
    // with help_requested() set.
    ParsedArgs parse(std::span<const std::string> args) const;
    ParsedArgs parse(int argc, char** argv, int first) const;
    // For a tool's main: the arguments, or nullopt once --help is printed on
    // stdout (the tool then exits 0).
    std::optional<ParsedArgs> parse_or_print_help(std::span<const std::string> args) const;
    std::optional<ParsedArgs> parse_or_print_help(int argc, char** argv, int first) const;

    // `--` then starts a command line of its own, kept apart (ParsedArgs::command).
    ArgSpec& command_after_dashes() {
        command_after_dashes_ = true;
        return *this;
    }

    std::string help() const;
    // Error(usage) for a mistake found after parsing (a missing PID, ...).
    [[noreturn]] void fail(const std::string& message) const;

private:
    const ArgOption* find(std::string_view name) const;

    std::string command_, synopsis_, about_, footer_;
    std::vector<ArgOption> options_;
    bool command_after_dashes_ = false;
};

}  // namespace iprobe
