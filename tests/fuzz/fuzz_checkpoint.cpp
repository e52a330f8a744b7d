// libFuzzer target: the checkpoint loaders' JSON files (config.json, the index,
// hf_quant_config.json) on arbitrary bytes; the work is in checkpoint_load_one.h.
// scripts/test.sh runs it for a bounded time under ASan + UBSan.
#include <cstddef>
#include <cstdint>

#include "checkpoint_load_one.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moe_ep::fuzz::checkpoint_load_one(data, size);
  return 0;
}
