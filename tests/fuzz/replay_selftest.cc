// A target for checking replay_main.cc itself: it breaks its invariant (traps, as fuzz_util.h's
// checks do) on an input starting with "deja-trap" and accepts everything else.
#include <cstddef>
#include <cstdint>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const char kTrap[] = "deja-trap";
  if (size >= sizeof(kTrap) - 1 && std::memcmp(data, kTrap, sizeof(kTrap) - 1) == 0) {
    __builtin_trap();
  }
  return 0;
}
