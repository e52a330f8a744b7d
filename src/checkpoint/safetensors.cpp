#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "checkpoint/json.h"
#include "moe_ep/status.h"

namespace moe_ep::io {
namespace {

[[noreturn]] void bad(const std::string& label, const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, "safetensors file " + label + ": " + why);
}

std::string json_escape(const std::string& v) {
  std::string o;
  for (char c : v) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      o += buf;
    } else {
      o += c;
    }
  }
  return o;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t d = 0; d < s.size(); ++d) o += (d ? ", " : "") + std::to_string(s[d]);
  return o + "]";
}

// Checks one tensor's fields against each other and against the data section.
void check_tensor(const std::string& label, const std::string& name, const StTensor& t,
                  bool has_dtype, bool has_shape, bool has_offsets,
                  const std::vector<int64_t>& offsets, uint64_t data_size, StTensor& out) {
  const std::string who = "tensor '" + name + "'";
  if (!has_dtype) bad(label, who + " has no field 'dtype'");
  if (!has_shape) bad(label, who + " has no field 'shape'");
  if (!has_offsets) bad(label, who + " has no field 'data_offsets'");
  const size_t eb = st_dtype_bytes(t.dtype);
  if (eb == 0)
    bad(label, who + " field dtype: '" + t.dtype +
                   "' is not one of BF16, F16, F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, "
                   "BOOL, F8_E4M3, F8_E5M2, F8_E8M0");
  uint64_t numel = 1;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (t.shape[d] < 0)
      bad(label, who + " field shape " + shape_str(t.shape) + ": dimension " + std::to_string(d) +
                     " is " + std::to_string(t.shape[d]) + ", expected >= 0");
    const uint64_t s = uint64_t(t.shape[d]);
    if (s != 0 && numel > (uint64_t(1) << 62) / s)
      bad(label, who + " field shape " + shape_str(t.shape) + ": the element count overflows 2^62");
    numel *= s;
  }
  if (numel > (uint64_t(1) << 62) / eb)
    bad(label, who + " field shape " + shape_str(t.shape) + ": the byte size overflows 2^62");
  const uint64_t need = numel * eb;
  if (offsets.size() != 2)
    bad(label, who + " field data_offsets has " + std::to_string(offsets.size()) +
                   " entries, expected 2 [begin, end]");
  if (offsets[0] < 0 || offsets[1] < 0)
    bad(label, who + " field data_offsets [" + std::to_string(offsets[0]) + ", " +
                   std::to_string(offsets[1]) + "]: offsets must be >= 0");
  if (offsets[1] < offsets[0])
    bad(label, who + " field data_offsets [" + std::to_string(offsets[0]) + ", " +
                   std::to_string(offsets[1]) + "]: end is before begin");
  if (uint64_t(offsets[1]) > data_size)
    bad(label, who + " field data_offsets: end " + std::to_string(offsets[1]) +
                   " is past the end of the data section (" + std::to_string(data_size) +
                   " bytes; the file is truncated or the offset is wrong)");
  const uint64_t have = uint64_t(offsets[1] - offsets[0]);
  if (have != need)
    bad(label, who + " field data_offsets: spans " + std::to_string(have) + " bytes, expected " +
                   std::to_string(need) + " for shape " + shape_str(t.shape) + " of dtype " +
                   t.dtype + " (" + std::to_string(eb) + " B per element)");
  out.dtype = t.dtype;
  out.shape = t.shape;
  out.begin = uint64_t(offsets[0]);
  out.end = uint64_t(offsets[1]);
}

}  // namespace

size_t st_dtype_bytes(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "BF16" || d == "F16" || d == "I16" || d == "U16") return 2;
  if (d == "U8" || d == "I8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2" || d == "F8_E8M0")
    return 1;
  return 0;
}

StFile parse_safetensors_header(const std::string& header, uint64_t data_size,
                                const std::string& label) {
  StFile out;
  out.label = label;
  out.data_size = data_size;
  // The header is one object of objects, strings and arrays of integers, checked as it is read
  // (nothing nests deeper than the format's two levels).
  JsonReader j{header, "safetensors file " + label + ": malformed header"};
  bool seen_metadata = false;
  j.members([&](const std::string& name) {
    if (name == "__metadata__") {
      if (seen_metadata) bad(label, "the header has '__metadata__' twice");
      seen_metadata = true;
      j.members([&](const std::string& k) {
        if (!j.peek('"')) j.fail("metadata '" + k + "' must be a string");
        std::string v = j.str();
        if (!out.metadata.emplace(k, std::move(v)).second)
          bad(label, "metadata key '" + k + "' appears twice");
      });
      return;
    }
    if (name.empty()) bad(label, "a tensor has an empty name");
    if (out.tensors.count(name)) bad(label, "tensor '" + name + "' appears twice in the header");
    StTensor t;
    std::vector<int64_t> offsets;
    bool has_dtype = false, has_shape = false, has_offsets = false;
    j.members([&](const std::string& key) {
      bool* seen = nullptr;
      if (key == "dtype") {
        seen = &has_dtype;
        if (!j.peek('"')) j.fail("field dtype of tensor '" + name + "' must be a string");
        t.dtype = j.str();
      } else if (key == "shape") {
        seen = &has_shape;
        t.shape = j.int_array("field shape of tensor '" + name + "'");
      } else if (key == "data_offsets") {
        seen = &has_offsets;
        offsets = j.int_array("field data_offsets of tensor '" + name + "'");
      } else {
        bad(label, "tensor '" + name + "' has an unknown field '" + key +
                       "' (expected dtype, shape, data_offsets)");
      }
      if (*seen) bad(label, "tensor '" + name + "' has field '" + key + "' twice");
      *seen = true;
    });
    StTensor checked;
    check_tensor(label, name, t, has_dtype, has_shape, has_offsets, offsets, data_size, checked);
    out.tensors.emplace(name, std::move(checked));
  });
  j.ws();
  if (j.i != header.size()) j.fail("unexpected text after the header's closing '}'");

  // No two tensors may share bytes.
  std::vector<std::pair<const StTensor*, const std::string*>> by_begin;
  for (auto& [n, t] : out.tensors)
    if (t.nbytes() > 0) by_begin.push_back({&t, &n});
  std::sort(by_begin.begin(), by_begin.end(),
            [](auto& a, auto& b) { return a.first->begin < b.first->begin; });
  for (size_t k = 1; k < by_begin.size(); ++k) {
    const StTensor& a = *by_begin[k - 1].first;
    const StTensor& b = *by_begin[k].first;
    if (b.begin < a.end)
      bad(label, "tensor '" + *by_begin[k].second + "' field data_offsets [" +
                     std::to_string(b.begin) + ", " + std::to_string(b.end) +
                     ") overlaps tensor '" + *by_begin[k - 1].second + "' [" +
                     std::to_string(a.begin) + ", " + std::to_string(a.end) + ")");
  }
  return out;
}

namespace {

// The header length field, checked against the bytes that follow it.
uint64_t header_length(const uint8_t len_bytes[8], uint64_t file_size, const std::string& label) {
  uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | len_bytes[b];  // little-endian
  if (n > kMaxHeaderBytes)
    bad(label, "header length " + std::to_string(n) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes");
  if (n > file_size - 8)
    bad(label, "header length " + std::to_string(n) + " exceeds the " +
                   std::to_string(file_size - 8) + " bytes after the length field");
  if (n < 2) bad(label, "header length " + std::to_string(n) + " is too small for '{}'");
  return n;
}

}  // namespace

StFile read_safetensors_header(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) bad(path, "cannot be opened");
  const std::streamoff end = f.tellg();
  if (end < 0) bad(path, "its size cannot be determined");
  const uint64_t file_size = uint64_t(end);
  if (file_size < 8)
    bad(path, "is " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  f.seekg(0);
  uint8_t len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  if (!f) bad(path, "reading the header length failed");
  const uint64_t n = header_length(len, file_size, path);
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  if (!f) bad(path, "reading the " + std::to_string(n) + "-byte header failed");
  StFile out = parse_safetensors_header(header, file_size - 8 - n, path);
  out.data_start = 8 + n;
  return out;
}

void read_tensor_data(const std::string& path, const StFile& file, StTensor& t) {
  if (t.loaded) return;
  if (t.end > file.data_size || t.begin > t.end)
    bad(path, "internal: a tensor's offsets were not checked");  // parse_* guarantees this
  std::ifstream f(path, std::ios::binary);
  if (!f) bad(path, "cannot be opened");
  t.data.resize(t.nbytes());
  f.seekg(std::streamoff(file.data_start + t.begin));
  f.read(reinterpret_cast<char*>(t.data.data()), std::streamsize(t.nbytes()));
  if (!f) bad(path, "reading " + std::to_string(t.nbytes()) + " bytes of tensor data failed");
  t.loaded = true;
}

void read_tensor_range(const std::string& path, const StFile& file, const StTensor& t,
                       uint64_t offset, uint64_t count, uint8_t* out) {
  if (t.end > file.data_size || t.begin > t.end || offset > t.nbytes() ||
      count > t.nbytes() - offset)
    bad(path, "reading bytes [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
                  ") of a " + std::to_string(t.nbytes()) + "-byte tensor: outside the tensor");
  if (count == 0) return;
  std::ifstream f(path, std::ios::binary);
  if (!f) bad(path, "cannot be opened");
  f.seekg(std::streamoff(file.data_start + t.begin + offset));
  f.read(reinterpret_cast<char*>(out), std::streamsize(count));
  if (!f) bad(path, "reading " + std::to_string(count) + " bytes of tensor data failed");
}

StFile read_safetensors(const std::string& path) {
  StFile out = read_safetensors_header(path);
  for (auto& [name, t] : out.tensors) read_tensor_data(path, out, t);
  return out;
}

StFile parse_safetensors_buffer(const uint8_t* bytes, size_t size, const std::string& label,
                                bool with_data) {
  if (size < 8)
    bad(label, "is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  const uint64_t n = header_length(bytes, size, label);
  const std::string header(reinterpret_cast<const char*>(bytes) + 8, size_t(n));
  StFile out = parse_safetensors_header(header, size - 8 - n, label);
  out.data_start = 8 + n;
  if (with_data)
    for (auto& [name, t] : out.tensors) {
      const uint8_t* p = bytes + out.data_start + t.begin;
      t.data.assign(p, p + t.nbytes());
      t.loaded = true;
    }
  return out;
}

uint64_t write_safetensors(const std::string& path, const StFile& file) {
  std::ostringstream h;
  h << "{";
  bool first = true;
  if (!file.metadata.empty()) {
    h << "\"__metadata__\":{";
    bool f2 = true;
    for (auto& [k, v] : file.metadata) {
      h << (f2 ? "" : ",") << "\"" << json_escape(k) << "\":\"" << json_escape(v) << "\"";
      f2 = false;
    }
    h << "}";
    first = false;
  }
  uint64_t off = 0;
  for (auto& [name, t] : file.tensors) {
    if (t.data.size() != uint64_t(t.numel()) * st_dtype_bytes(t.dtype))
      throw Error(ErrorCode::kInvalidArgument,
                  "writing " + path + ": tensor '" + name + "' holds " +
                      std::to_string(t.data.size()) + " bytes, its shape " + shape_str(t.shape) +
                      " and dtype " + t.dtype + " need " +
                      std::to_string(uint64_t(t.numel()) * st_dtype_bytes(t.dtype)));
    h << (first ? "" : ",") << "\"" << json_escape(name) << "\":{\"dtype\":\"" << t.dtype
      << "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) h << (d ? "," : "") << t.shape[d];
    h << "],\"data_offsets\":[" << off << "," << off + t.data.size() << "]}";
    off += t.data.size();
    first = false;
  }
  h << "}";
  std::string header = h.str();
  while (header.size() % 8) header += ' ';
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f)
    throw Error(ErrorCode::kInvalidArgument, "cannot write " + path + ": " + std::strerror(errno));
  const uint64_t n = header.size();
  uint8_t len[8];
  for (int b = 0; b < 8; ++b) len[b] = uint8_t(n >> (8 * b));
  f.write(reinterpret_cast<const char*>(len), 8);
  f.write(header.data(), std::streamsize(n));
  for (auto& [name, t] : file.tensors)
    f.write(reinterpret_cast<const char*>(t.data.data()), std::streamsize(t.data.size()));
  f.close();
  if (!f) throw Error(ErrorCode::kBackend, "writing " + path + " failed (disk full?)");
  return 8 + n + off;
}

}  // namespace moe_ep::io
