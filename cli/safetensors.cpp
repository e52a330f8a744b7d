#include "safetensors.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "moe_ep/status.h"

namespace moe_ep::cli {
namespace {

[[noreturn]] void bad(const std::string& path, const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, "safetensors file " + path + ": " + why);
}

// A JSON reader for the header's subset: objects, arrays, strings, integers.
struct Json {
  const std::string& s;
  const std::string& path;
  size_t i = 0;
  void ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  void expect(char c) {
    ws();
    if (i >= s.size() || s[i] != c)
      bad(path, std::string("malformed header: expected '") + c + "'");
    ++i;
  }
  bool peek(char c) {
    ws();
    return i < s.size() && s[i] == c;
  }
  std::string str() {
    expect('"');
    std::string out;
    while (i < s.size() && s[i] != '"') {
      if (s[i] == '\\' && i + 1 < s.size()) ++i;
      out += s[i++];
    }
    expect('"');
    return out;
  }
  int64_t integer() {
    ws();
    size_t end = i;
    while (end < s.size() && (std::isdigit(static_cast<unsigned char>(s[end])) || s[end] == '-'))
      ++end;
    if (end == i) bad(path, "malformed header: expected an integer");
    const int64_t v = std::stoll(s.substr(i, end - i));
    i = end;
    return v;
  }
  std::vector<int64_t> int_array() {
    std::vector<int64_t> v;
    expect('[');
    if (peek(']')) {
      ++i;
      return v;
    }
    for (;;) {
      v.push_back(integer());
      if (peek(',')) {
        ++i;
        continue;
      }
      expect(']');
      return v;
    }
  }
};

std::string json_escape(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

size_t dtype_bytes(const std::string& d) {
  if (d == "F64" || d == "I64") return 8;
  if (d == "F32" || d == "I32") return 4;
  if (d == "BF16" || d == "F16" || d == "I16") return 2;
  return 1;
}

}  // namespace

StFile read_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) bad(path, "cannot be opened");
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  if (!f || n > (1u << 30)) bad(path, "no valid header length");
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  if (!f) bad(path, "header is truncated");
  const std::streampos data_start = f.tellg();

  StFile out;
  Json j{header, path};
  j.expect('{');
  bool first = true;
  while (!j.peek('}')) {
    if (!first) j.expect(',');
    first = false;
    const std::string name = j.str();
    j.expect(':');
    j.expect('{');
    if (name == "__metadata__") {
      bool f2 = true;
      while (!j.peek('}')) {
        if (!f2) j.expect(',');
        f2 = false;
        std::string k = j.str();
        j.expect(':');
        out.metadata[k] = j.str();
      }
      j.expect('}');
      continue;
    }
    StTensor t;
    std::vector<int64_t> offsets;
    bool f2 = true;
    while (!j.peek('}')) {
      if (!f2) j.expect(',');
      f2 = false;
      const std::string key = j.str();
      j.expect(':');
      if (key == "dtype")
        t.dtype = j.str();
      else if (key == "shape")
        t.shape = j.int_array();
      else if (key == "data_offsets")
        offsets = j.int_array();
      else
        bad(path, "unknown field '" + key + "' of tensor " + name);
    }
    j.expect('}');
    if (offsets.size() != 2 || offsets[1] < offsets[0])
      bad(path, "tensor " + name + " has bad data_offsets");
    const size_t bytes = size_t(offsets[1] - offsets[0]);
    if (bytes != size_t(t.numel()) * dtype_bytes(t.dtype))
      bad(path, "tensor " + name + " has " + std::to_string(bytes) +
                    " bytes, its shape and dtype " + t.dtype + " need " +
                    std::to_string(size_t(t.numel()) * dtype_bytes(t.dtype)));
    t.data.resize(bytes);
    f.seekg(data_start + std::streamoff(offsets[0]));
    f.read(reinterpret_cast<char*>(t.data.data()), std::streamsize(bytes));
    if (!f) bad(path, "data of tensor " + name + " is truncated");
    out.tensors[name] = std::move(t);
  }
  return out;
}

void write_safetensors(const std::string& path, const StFile& file) {
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
  size_t off = 0;
  for (auto& [name, t] : file.tensors) {
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
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorCode::kInvalidArgument, "cannot write " + path);
  const uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(header.data(), std::streamsize(n));
  for (auto& [name, t] : file.tensors)
    f.write(reinterpret_cast<const char*>(t.data.data()), std::streamsize(t.data.size()));
  if (!f) throw Error(ErrorCode::kBackend, "writing " + path + " failed");
}

}  // namespace moe_ep::cli
