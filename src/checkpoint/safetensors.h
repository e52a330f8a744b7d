// A small reader/writer of the safetensors format (8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then raw data), for
// the checkpoint loaders (src/checkpoint/) and `moe-ep --load/--save`.
//
// Reading is in two steps so that nothing is read from a file that does not describe itself
// consistently: the header is parsed and checked in full first (every tensor's dtype, shape,
// byte size and data_offsets, inside the file and not overlapping), and only then are tensor
// bytes read, one checked tensor at a time. Every error names the file, the tensor, the field,
// the value found and the value expected.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moe_ep::io {

struct StTensor {
  std::string dtype;  // "BF16", "F32", "I32", "U8", "F8_E4M3", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data_offsets, relative to the start of the data section
  std::vector<uint8_t> data;    // filled by read_tensor_data / read_safetensors
  bool loaded = false;
  int64_t numel() const {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
  uint64_t nbytes() const { return end - begin; }
};

struct StFile {
  std::string label;  // the path (or a name for an in-memory buffer), for messages
  std::map<std::string, StTensor> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data section (8 + header length)
  uint64_t data_size = 0;   // bytes in the data section
};

// Largest header accepted (the format's own reference implementation uses 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

// Bytes per element of a safetensors dtype name; 0 for a name this reader does not know.
size_t st_dtype_bytes(const std::string& dtype);

// Parses and checks a header (the JSON text) of a file whose data section has `data_size`
// bytes. Throws moe_ep::Error (kInvalidArgument) naming what is wrong; reads no tensor data.
StFile parse_safetensors_header(const std::string& json, uint64_t data_size,
                                const std::string& label);

// The header of a file, checked against the file's size; no tensor data is read.
StFile read_safetensors_header(const std::string& path);
// Reads one tensor's bytes (its offsets were checked against the file by the header reader).
void read_tensor_data(const std::string& path, const StFile& file, StTensor& t);
// Reads bytes [offset, offset + count) of tensor `t`'s data into `out` (the range is checked
// against the tensor; a checkpoint loader reads one rank's experts this way).
void read_tensor_range(const std::string& path, const StFile& file, const StTensor& t,
                       uint64_t offset, uint64_t count, uint8_t* out);
// Header, then every tensor's bytes.
StFile read_safetensors(const std::string& path);

// The same from a buffer holding a whole file (tests and the fuzz target).
StFile parse_safetensors_buffer(const uint8_t* bytes, size_t size, const std::string& label,
                                bool with_data);

// Writes the file and checks that every byte reached it (throws otherwise); returns the file's
// size in bytes.
uint64_t write_safetensors(const std::string& path, const StFile& file);

}  // namespace moe_ep::io
