#include "recording.h"

#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <cstring>

#include "iprobe/support/error.h"
#include "iprobe/support/file.h"

namespace iprobe::proxy {

namespace {

constexpr char kMagic[] = "iprobe-recording 2\n";
constexpr char kMagicV1[] = "iprobe-recording 1\n";  // no reply records
constexpr std::size_t kHeader = 20;

void put(std::string& out, const void* p, std::size_t n) { out.append(static_cast<const char*>(p), n); }

bool write_all(int fd, const void* data, std::size_t size) {
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
        const ssize_t w = ::write(fd, p, size);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        size -= static_cast<std::size_t>(w);
    }
    return true;
}

}  // namespace

Recorder::Recorder(const std::string& path, std::size_t max_queued) : path_(path), max_queued_(max_queued) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ < 0) throw_errno("--record " + path + ": cannot create", ExitCode::bad_input);
    if (!write_all(fd_, kMagic, sizeof kMagic - 1)) {
        ::close(fd_);
        throw_errno("--record " + path + ": write");
    }
    writer_ = std::thread([this] { writer_loop(); });
}

Recorder::~Recorder() { finish(); }

void Recorder::add(RecordKind kind, std::uint32_t connection, std::uint64_t t_ns, const void* data, std::size_t size) {
    std::lock_guard lock(mutex_);
    if (stopped_early_ || closing_) return;
    if (queue_.size() + kHeader + size > max_queued_) {
        stopped_early_ = true;
        wake_.notify_one();
        return;
    }
    const std::uint8_t head[4] = {static_cast<std::uint8_t>(kind), 0, 0, 0};
    const auto length = static_cast<std::uint32_t>(size);
    put(queue_, head, 4);
    put(queue_, &connection, 4);
    put(queue_, &t_ns, 8);
    put(queue_, &length, 4);
    if (size) put(queue_, data, size);
    ++records_;
    bytes_ += kHeader + size;
    if (queue_.size() >= 64 * 1024) wake_.notify_one();
}

void Recorder::finish() {
    {
        std::lock_guard lock(mutex_);
        if (closing_ && !writer_.joinable()) return;
        closing_ = true;
    }
    wake_.notify_one();
    if (writer_.joinable()) writer_.join();
    if (fd_ >= 0) {
        ::fsync(fd_);
        ::close(fd_);
        fd_ = -1;
    }
}

void Recorder::writer_loop() {
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, 3);
    std::string out(ZSTD_CStreamOutSize(), '\0');
    std::string batch;
    bool ok = true;
    for (;;) {
        bool last = false;
        {
            std::unique_lock lock(mutex_);
            wake_.wait_for(lock, std::chrono::milliseconds(200),
                           [&] { return closing_ || stopped_early_ || queue_.size() >= 64 * 1024; });
            batch.swap(queue_);
            queue_.clear();
            last = closing_ || stopped_early_;
        }
        ZSTD_inBuffer in{batch.data(), batch.size(), 0};
        const ZSTD_EndDirective mode = last ? ZSTD_e_end : ZSTD_e_flush;
        for (;;) {
            ZSTD_outBuffer o{out.data(), out.size(), 0};
            const std::size_t left = ZSTD_compressStream2(cctx, &o, &in, mode);
            if (ZSTD_isError(left)) {
                ok = false;
                break;
            }
            if (ok && o.pos && !write_all(fd_, out.data(), o.pos)) ok = false;
            if (left == 0 && in.pos == in.size) break;
        }
        batch.clear();
        if (last) break;
    }
    ZSTD_freeCCtx(cctx);
    if (!ok) {
        std::lock_guard lock(mutex_);
        stopped_early_ = true;
    }
}

std::vector<Record> read_recording(const std::string& path) {
    std::vector<std::uint8_t> file;
    try {
        file = read_file(path);
    } catch (const std::exception& e) {
        throw Error(path + ": cannot read recording: " + e.what(), ExitCode::not_found);
    }
    const std::size_t magic = sizeof kMagic - 1;
    static_assert(sizeof kMagic == sizeof kMagicV1);
    if (file.size() < magic ||
        (std::memcmp(file.data(), kMagic, magic) != 0 && std::memcmp(file.data(), kMagicV1, magic) != 0))
        throw Error(path + ": not an iprobe recording (made by `iprobe mirror --record`)", ExitCode::bad_input);
    ZSTD_DCtx* dctx = ZSTD_createDCtx();
    std::string raw;
    std::string out(ZSTD_DStreamOutSize(), '\0');
    ZSTD_inBuffer in{file.data() + magic, file.size() - magic, 0};
    while (in.pos < in.size) {
        ZSTD_outBuffer o{out.data(), out.size(), 0};
        const std::size_t rc = ZSTD_decompressStream(dctx, &o, &in);
        if (ZSTD_isError(rc)) {
            ZSTD_freeDCtx(dctx);
            throw Error(path + ": corrupt recording: " + ZSTD_getErrorName(rc), ExitCode::bad_input);
        }
        raw.append(out.data(), o.pos);
        if (o.pos == 0 && rc != 0 && in.pos == in.size) break;
    }
    ZSTD_freeDCtx(dctx);
    std::vector<Record> records;
    std::size_t pos = 0;
    while (pos + kHeader <= raw.size()) {
        Record r;
        r.kind = static_cast<RecordKind>(raw[pos]);
        std::uint32_t length = 0;
        std::memcpy(&r.connection, raw.data() + pos + 4, 4);
        std::memcpy(&r.t_ns, raw.data() + pos + 8, 8);
        std::memcpy(&length, raw.data() + pos + 16, 4);
        if (r.kind < RecordKind::open || r.kind > RecordKind::reply || pos + kHeader + length > raw.size()) break;
        r.bytes.assign(raw.data() + pos + kHeader, length);
        pos += kHeader + length;
        records.push_back(std::move(r));
    }
    return records;
}

}  // namespace iprobe::proxy
