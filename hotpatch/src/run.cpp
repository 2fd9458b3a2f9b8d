#include "iprobe/hotpatch/run.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>

#include "attach_plan.h"
#include "inject.h"
#include "iprobe/probelist/probe_source.h"
#include "iprobe/runtime/run_loads.h"
#include "iprobe/support/error.h"
#include "session.h"

extern char** environ;

namespace iprobe::hotpatch {

namespace {

// The names runtime/src/rt.c reads (run_hold).
constexpr const char* kFdVariable = IPROBE_RUN_FD_VARIABLE;
constexpr const char* kPreloadVariable = "IPROBE_RUN_LD_PRELOAD";
// The first byte on the channel: the runtime's (held), or exec_held's.
constexpr unsigned char kHeld = 'r';
constexpr unsigned char kExecFailed = 'e';

bool read_byte(int fd, unsigned char& byte) {
    for (;;) {
        const ssize_t n = ::read(fd, &byte, 1);
        if (n == 1) return true;
        if (n < 0 && errno == EINTR) continue;
        return false;
    }
}

void write_byte(int fd, unsigned char byte) {
    while (::write(fd, &byte, 1) < 0 && errno == EINTR) {
    }
}

bool read_all(int fd, void* data, std::size_t size) {
    auto* at = static_cast<unsigned char*>(data);
    while (size > 0) {
        const ssize_t n = ::read(fd, at, size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        at += n;
        size -= static_cast<std::size_t>(n);
    }
    return true;
}

// One batch of run_loads.h: the names of the objects a load added; false
// when the channel ended (or broke the format).
bool read_load_batch(int fd, std::vector<std::string>& names) {
    names.clear();
    for (;;) {
        std::uint16_t length = 0;
        if (!read_all(fd, &length, sizeof length)) return false;
        if (length == 0) return true;
        if (length > IPROBE_RUN_LOADS_MAX_NAME) return false;
        std::string name(length, '\0');
        if (!read_all(fd, name.data(), length)) return false;
        names.push_back(std::move(name));
    }
}

// Whether an ELF file is an executable (it asks for an interpreter), not
// a shared library.
bool is_executable_elf(std::ifstream& in) {
    Elf64_Ehdr header{};
    if (!in.seekg(0).read(reinterpret_cast<char*>(&header), sizeof header) || header.e_ident[EI_CLASS] != ELFCLASS64)
        return false;
    if (header.e_type == ET_EXEC) return true;
    for (unsigned i = 0; i < header.e_phnum; ++i) {
        Elf64_Phdr ph{};
        if (!in.seekg(static_cast<std::streamoff>(header.e_phoff + std::uint64_t{i} * header.e_phentsize))
                 .read(reinterpret_cast<char*>(&ph), sizeof ph))
            return false;
        if (ph.p_type == PT_INTERP) return true;
    }
    return false;
}

// The file name of the module a --probes SOURCE describes (the binary's
// own, or the one its probe list names), and whether it is an executable.
std::pair<std::string, bool> module_of_source(const std::string& source) {
    std::ifstream in(source, std::ios::binary);
    char magic[4] = {};
    in.read(magic, sizeof magic);
    if (in && std::string_view(magic, 4) == "\x7f" "ELF") return {basename_of(source), is_executable_elf(in)};
    const probelist::ProbeList list = probelist::load_probes(source);
    return {basename_of(list.module), !(list.flags & IPROBE_PL_FLAG_SHARED)};
}

}  // namespace

PendingModules::PendingModules(const AttachOptions& options) {
    if (!options.selections.empty()) return;
    for (const std::string& name : options.modules) entries_.push_back({name, {}});
    for (const std::string& source : options.probe_sources) {
        auto [name, executable] = module_of_source(source);
        if (executable) executables_.push_back(source);  // there from the start, whatever else is pending
        else entries_.push_back({std::move(name), source});
    }
}

std::optional<AttachOptions> PendingModules::take_loaded(const AttachOptions& options, pid_t pid,
                                                         std::vector<std::string>* taken) {
    AttachOptions o = options;
    o.pid = pid;
    o.modules.clear();
    o.probe_sources = std::exchange(executables_, {});
    std::erase_if(entries_, [&](const Entry& e) {
        try {
            module_source(pid, e.name);
        } catch (const Error& error) {
            if (error.code() == ExitCode::not_found) return false;  // not (yet)
            // otherwise (two modules by that name) the attach says so
        }
        if (e.source.empty()) o.modules.push_back(e.name);
        else o.probe_sources.push_back(e.source);
        if (taken) taken->push_back(e.source.empty() ? "--module " + e.name : "--probes " + e.source);
        return true;
    });
    if (o.modules.empty() && o.probe_sources.empty()) return std::nullopt;
    return o;
}

bool PendingModules::may_be_among(const std::vector<std::string>& loaded) const {
    for (const std::string& path : loaded) {
        if (path == "*") return true;
        const std::string base = basename_of(path);
        for (const Entry& e : entries_)
            if (module_named(base, e.name)) return true;
    }
    return false;
}

std::vector<std::string> PendingModules::named() const {
    std::vector<std::string> out;
    for (const Entry& e : entries_) out.push_back(e.source.empty() ? e.name : e.source);
    return out;
}

std::vector<std::string> PendingModules::described() const {
    std::vector<std::string> out;
    for (const Entry& e : entries_) out.push_back(e.source.empty() ? "--module " + e.name : "--probes " + e.source);
    return out;
}

std::string run_audit_library(const std::string& runtime) {
    const std::string path = (std::filesystem::path(runtime).parent_path() / IPROBE_RUN_AUDIT_LIBRARY).string();
    if (!std::filesystem::exists(path))
        throw Error("iprobe run's audit module " + path + " (beside the runtime) not found; build target "
                        "iprobe_run_audit",
                    ExitCode::not_found);
    return path;
}

HoldChannel HoldChannel::open() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) throw_errno("socketpair");
    return {fds[0], fds[1]};
}

std::string runtime_to_preload(const AttachOptions& options) { return runtime_path_of(options); }

void exec_held(const std::vector<std::string>& command, const std::string& runtime, int program_fd,
               const std::string& audit) {
    const int flags = ::fcntl(program_fd, F_GETFD);
    if (flags < 0 || ::fcntl(program_fd, F_SETFD, flags & ~FD_CLOEXEC) != 0) return;
    const char* preload = std::getenv("LD_PRELOAD");
    std::string value = runtime;
    if (preload && *preload) {
        value += ":" + std::string(preload);
        ::setenv(kPreloadVariable, preload, 1);
    } else {
        ::unsetenv(kPreloadVariable);
    }
    ::setenv("LD_PRELOAD", value.c_str(), 1);
    if (!audit.empty()) {
        const char* audits = std::getenv("LD_AUDIT");
        const std::string was = audits ? audits : "";
        ::setenv(IPROBE_RUN_AUDIT_VARIABLE, was.c_str(), 1);
        ::setenv("LD_AUDIT", was.empty() ? audit.c_str() : (audit + ":" + was).c_str(), 1);
    }
    ::setenv(kFdVariable, std::to_string(program_fd).c_str(), 1);
    std::vector<char*> argv;
    for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    const int err = errno;
    write_byte(program_fd, kExecFailed);
    errno = err;
}

namespace {

// Waits until the program is held; false if exec failed (it said why).
bool wait_until_held(int prober_fd, pid_t program) {
    unsigned char first = 0;
    const bool said = read_byte(prober_fd, first);
    if (said && first == kExecFailed) return false;
    if (!said || first != kHeld)
        throw Error("process " + std::to_string(program) +
                        " exited or exec'd without loading the iprobe runtime (a statically linked or set-user-ID "
                        "program ignores LD_PRELOAD): it ran without probes",
                    ExitCode::unavailable);
    return true;
}

// Attaches `o`, runs `before_release`, releases the held program: byte
// `go`, or the error's exit code for it to exit with (with `go_if_not_found`,
// an Error(not_found) lets it go all the same; rethrown either way).
AttachStats attach_and_release(int prober_fd, const AttachOptions& o, const std::function<void()>& before_release,
                               unsigned char go = 0, bool go_if_not_found = false) {
    try {
        const AttachStats stats = attach(o);
        if (before_release) before_release();
        write_byte(prober_fd, go);
        return stats;
    } catch (const Error& e) {
        const bool goes = go_if_not_found && e.code() == ExitCode::not_found;
        write_byte(prober_fd, goes ? go : static_cast<unsigned char>(e.code() == ExitCode::ok ? ExitCode::failure : e.code()));
        throw;
    } catch (...) {
        write_byte(prober_fd, static_cast<unsigned char>(ExitCode::failure));
        throw;
    }
}

}  // namespace

std::optional<AttachStats> enable_when_held(int prober_fd, pid_t program, const AttachOptions& options,
                                            const std::function<void()>& before_release) {
    if (!wait_until_held(prober_fd, program)) return std::nullopt;
    AttachOptions o = options;
    o.pid = program;
    return attach_and_release(prober_fd, o, before_release);
}

std::optional<AttachStats> enable_loaded_when_held(int prober_fd, pid_t program, const AttachOptions& options,
                                                   PendingModules& pending,
                                                   const std::function<void()>& before_release,
                                                   const std::function<void()>& when_held,
                                                   const std::function<void(const LaterAttach&)>& unprobed) {
    if (!wait_until_held(prober_fd, program)) return std::nullopt;
    std::optional<AttachOptions> loaded;
    LaterAttach start;
    try {
        if (when_held) when_held();
        loaded = pending.take_loaded(options, program, &start.named);
    } catch (...) {
        write_byte(prober_fd, static_cast<unsigned char>(ExitCode::failure));
        throw;
    }
    if (pending.empty() && loaded) return attach_and_release(prober_fd, *loaded, before_release);
    // Still pending: the audit module keeps its copy of the channel.
    if (!loaded) {
        write_byte(prober_fd, IPROBE_RUN_LOADS_WATCH);
        return AttachStats{};
    }
    try {
        return attach_and_release(prober_fd, *loaded, before_release, IPROBE_RUN_LOADS_WATCH, true);
    } catch (const Error& e) {
        if (e.code() != ExitCode::not_found) throw;
        start.error = e.what();
        start.code = e.code();
        if (unprobed) unprobed(start);
        return AttachStats{};
    }
}

void serve_later_loads(int prober_fd, pid_t program, const AttachOptions& options, PendingModules& pending,
                       const std::function<void(const LaterAttach&)>& after_attach) {
    std::vector<std::string> names;
    // Once nothing is pending (or the caller shut it down), the audit
    // module's next send fails and it stops asking.
    struct ShutDown {
        int fd;
        ~ShutDown() { ::shutdown(fd, SHUT_RDWR); }
    } shut_down{prober_fd};
    while (!pending.empty() && read_load_batch(prober_fd, names)) {
        if (pending.may_be_among(names)) {
            LaterAttach done;
            try {
                if (auto o = pending.take_loaded(options, program, &done.named)) done.stats = attach(*o);
            } catch (const Error& e) {
                done.error = e.what();
                done.code = e.code() == ExitCode::ok ? ExitCode::failure : e.code();
            } catch (const std::exception& e) {
                done.error = e.what();
                done.code = ExitCode::failure;
            }
            if (done.stats || !done.error.empty()) {
                try {
                    after_attach(done);
                } catch (...) {
                }
            }
        }
        write_byte(prober_fd, pending.empty() ? IPROBE_RUN_LOADS_GO : IPROBE_RUN_LOADS_WATCH);
    }
}

}  // namespace iprobe::hotpatch
