// libFuzzer target: the safetensors reader and `moe-ep --load` on arbitrary bytes (the work
// itself is in load_one.h). scripts/test.sh runs it for a bounded time under ASan + UBSan.
#include <cstddef>
#include <cstdint>

#include "load_one.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moe_ep::cli::fuzz::load_one(data, size);
  return 0;
}
