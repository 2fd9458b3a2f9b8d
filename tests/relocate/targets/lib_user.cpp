// A program built with plain g++ that calls into two packaged shared
// libraries nobody prepared for probes: zlib (C) and libstdc++ (C++).
// Commands arrive one per line on the FIFO given as argv[2] (argv[1] is
// ignored), each acknowledged on stdout as "ok <command> <value>":
//   run N   N rounds of: operator new + operator delete of one object,
//           compress2 + uncompress of a buffer (checked), crc32 of it;
//           value = rounds whose result was wrong (0)
//   quit    exit 0
#include <zlib.h>

#include <cstdio>
#include <cstring>

namespace {

struct Item {
    long value;
    char pad[40];
};

Item* volatile kept;  // the object escapes: new and delete are not elided

__attribute__((noinline)) void make(long v) { kept = new Item{v, {}}; }
__attribute__((noinline)) long drop() {
    const long v = kept->value;
    delete kept;
    return v;
}

long run(long n) {
    unsigned char in[512], packed[1024], back[512];
    long wrong = 0;
    for (long i = 0; i < n; i++) {
        for (unsigned j = 0; j < sizeof in; j++) in[j] = static_cast<unsigned char>((i + j / 7) & 0xff);
        make(i);
        wrong += drop() != i;
        uLongf packed_size = sizeof packed, back_size = sizeof back;
        wrong += compress2(packed, &packed_size, in, sizeof in, 6) != Z_OK;
        wrong += uncompress(back, &back_size, packed, packed_size) != Z_OK;
        wrong += back_size != sizeof in || std::memcmp(in, back, sizeof in) != 0;
        wrong += crc32(0, in, sizeof in) != crc32(0, back, sizeof back) ? 1 : 0;
    }
    return wrong;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s THREADS FIFO\n", argv[0]);
        return 2;
    }
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    std::printf("ready\n");
    for (;;) {
        // Read and write: the FIFO always has a writer (this), so it never
        // reads EOF; opened for reading only, a command written between the
        // last writer's EOF and the fclose was thrown away with the pipe.
        FILE* in = std::fopen(argv[2], "r+");
        if (!in) return 1;
        char line[128];
        while (std::fgets(line, sizeof line, in)) {
            long n = 0;
            if (std::sscanf(line, "run %ld", &n) == 1) {
                std::printf("ok run %ld\n", run(n));
            } else if (std::strncmp(line, "quit", 4) == 0) {
                std::printf("ok quit 0\n");
                return 0;
            }
        }
        std::fclose(in);
    }
}
