// The fuzz targets without libFuzzer, for the test suite: a main that runs one target's
// LLVMFuzzerTestOneInput over every seed of its committed corpus, then over seeded random
// mutants of those seeds (bytes flipped, set, inserted, erased, duplicated, truncated, seeds
// spliced), so the targets' invariants are checked in every build, in seconds, with the release
// compiler. Coverage-guided fuzzing with the sanitizers is scripts/fuzz.sh (the `fuzz` preset).
//
// Usage: fuzz_replay_<target> CORPUS_DIR [MUTANTS (default 3000)] [SECONDS (default 20)]; ctest gives 1,000,000 and 15
// The mutation seed is DEJA_FUZZ_SEED or the time, printed. An input that breaks an invariant
// (the target traps) or crashes is written to $TMPDIR/fuzz_replay_<target>.crash before the
// process dies, and can be replayed alone: fuzz_replay_<target> FILE 0.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

// The input being run and where to keep it if it kills the process (set before any signal).
const std::vector<uint8_t>* g_current = nullptr;
char g_crash_path[4096] = {};

void OnFatal(int sig) {
  if (g_current != nullptr && g_crash_path[0] != '\0') {
    const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      size_t done = 0;
      while (done < g_current->size()) {
        const ssize_t n = ::write(fd, g_current->data() + done, g_current->size() - done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
      ::close(fd);
      const char msg[] = "fuzz replay: the input that failed is in ";
      (void)!::write(2, msg, sizeof(msg) - 1);
      (void)!::write(2, g_crash_path, std::strlen(g_crash_path));
      (void)!::write(2, "\n", 1);
    }
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

std::vector<uint8_t> ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void Run(const std::vector<uint8_t>& input) {
  g_current = &input;
  LLVMFuzzerTestOneInput(input.data(), input.size());
  g_current = nullptr;
}

std::vector<uint8_t> Mutate(std::mt19937_64& rng, const std::vector<std::vector<uint8_t>>& seeds) {
  std::vector<uint8_t> x = seeds[rng() % seeds.size()];
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t n = x.size();
    const size_t at = n == 0 ? 0 : rng() % n;
    switch (rng() % 7) {
      case 0:  // flip a bit
        if (n > 0) x[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 1: {  // set a byte, often to an interesting value
        static const uint8_t kSpecial[] = {0, 1, 0x7f, 0x80, 0xff, '"', '\\', '{', '}', '[', ']',
                                           ',', ':', '-', '0', '9', 'e', '.'};
        if (n > 0) x[at] = rng() % 2 ? kSpecial[rng() % sizeof(kSpecial)] : uint8_t(rng());
        break;
      }
      case 2: {  // insert random bytes
        const size_t k = 1 + rng() % 8;
        std::vector<uint8_t> bytes(k);
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
        x.insert(x.begin() + static_cast<std::ptrdiff_t>(std::min(at, n)), bytes.begin(),
                 bytes.end());
        break;
      }
      case 3:  // erase a range
        if (n > 0) {
          const size_t k = 1 + rng() % std::min<size_t>(n - at, 16);
          x.erase(x.begin() + static_cast<std::ptrdiff_t>(at),
                  x.begin() + static_cast<std::ptrdiff_t>(at + k));
        }
        break;
      case 4:  // duplicate a range
        if (n > 0 && n < (1u << 16)) {
          const size_t k = 1 + rng() % std::min<size_t>(n - at, 64);
          std::vector<uint8_t> part(x.begin() + static_cast<std::ptrdiff_t>(at),
                                    x.begin() + static_cast<std::ptrdiff_t>(at + k));
          x.insert(x.begin() + static_cast<std::ptrdiff_t>(at), part.begin(), part.end());
        }
        break;
      case 5:  // truncate
        x.resize(at);
        break;
      default: {  // splice: this one's head, another seed's tail
        const std::vector<uint8_t>& other = seeds[rng() % seeds.size()];
        if (!other.empty()) {
          x.resize(at);
          const size_t from = rng() % other.size();
          x.insert(x.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
        }
        break;
      }
    }
  }
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR|FILE [MUTANTS] [SECONDS]\n", argv[0]);
    return 2;
  }
  const std::filesystem::path corpus = argv[1];
  const long mutants = argc > 2 ? std::strtol(argv[2], nullptr, 10) : 3000;
  const double seconds = argc > 3 ? std::strtod(argv[3], nullptr) : 20.0;
  const char* tmp = std::getenv("TMPDIR");
  std::snprintf(g_crash_path, sizeof(g_crash_path), "%s/%s.crash",
                tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp",
                std::filesystem::path(argv[0]).filename().c_str());
  for (int sig : {SIGABRT, SIGILL, SIGSEGV, SIGBUS, SIGFPE, SIGTRAP}) std::signal(sig, OnFatal);
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);

  std::vector<std::vector<uint8_t>> seeds;
  if (std::filesystem::is_directory(corpus)) {
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(corpus)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) seeds.push_back(ReadFile(f));
  } else {
    seeds.push_back(ReadFile(corpus));
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "no seeds in %s\n", corpus.c_str());
    return 1;
  }
  for (const auto& s : seeds) Run(s);

  uint64_t seed = static_cast<uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  if (const char* env = std::getenv("DEJA_FUZZ_SEED")) seed = std::strtoull(env, nullptr, 10);
  std::mt19937_64 rng(seed);
  const auto start = std::chrono::steady_clock::now();
  long ran = 0;
  for (; ran < mutants; ++ran) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        seconds) {
      break;
    }
    Run(Mutate(rng, seeds));
  }
  std::printf("%zu seeds and %ld mutants (DEJA_FUZZ_SEED=%llu) ran; no invariant broken\n",
              seeds.size(), ran, static_cast<unsigned long long>(seed));
  return 0;
}
