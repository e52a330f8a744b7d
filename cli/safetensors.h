// A small reader/writer of the safetensors format (8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then raw data), for
// `moe-ep --load/--save`.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moe_ep::cli {

struct StTensor {
  std::string dtype;  // "BF16", "F32", "I32", "U8", "F8_E4M3", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
  int64_t numel() const {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
};

struct StFile {
  std::map<std::string, StTensor> tensors;
  std::map<std::string, std::string> metadata;
};

StFile read_safetensors(const std::string& path);
void write_safetensors(const std::string& path, const StFile& file);

}  // namespace moe_ep::cli
