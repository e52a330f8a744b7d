// Tiny Hugging Face model directories written by the tests themselves (config.json, safetensors
// shards with or without an index, hf_quant_config.json), for the checkpoint loaders' tests.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "moe_ep/formats.h"

namespace moe_ep::test {

struct ModelDirWriter {
  std::string dir;
  std::map<std::string, io::StTensor> tensors;
  std::mt19937_64 rng{1234};

  ModelDirWriter() {
    char tmpl[] = "/tmp/moe_ep_ckpt_test_XXXXXX";
    const char* p = mkdtemp(tmpl);
    if (!p) throw std::runtime_error("mkdtemp failed");
    dir = p;
  }
  ~ModelDirWriter() { std::system(("rm -rf '" + dir + "'").c_str()); }
  std::string file(const std::string& name) const { return dir + "/" + name; }

  const std::vector<uint8_t>& add(const std::string& name, const std::string& dtype,
                                  std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
    io::StTensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.data = std::move(bytes);
    t.loaded = true;
    return tensors[name] = std::move(t), tensors[name].data;
  }
  static int64_t numel(const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (auto d : s) n *= d;
    return n;
  }
  // bf16 values of N(0, scale^2).
  const std::vector<uint8_t>& add_bf16(const std::string& name, std::vector<int64_t> shape,
                                       float scale = 0.1f) {
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<uint8_t> b(size_t(numel(shape)) * 2);
    for (size_t i = 0; i < b.size() / 2; ++i) {
      const uint16_t v = fmt::float_to_bf16(nd(rng));
      std::memcpy(b.data() + 2 * i, &v, 2);
    }
    return add(name, "BF16", std::move(shape), std::move(b));
  }
  // Bytes uniform in [lo, hi].
  const std::vector<uint8_t>& add_bytes(const std::string& name, const std::string& dtype,
                                        std::vector<int64_t> shape, int lo = 0, int hi = 255) {
    std::uniform_int_distribution<int> d(lo, hi);
    std::vector<uint8_t> b(size_t(numel(shape)));
    for (auto& x : b) x = uint8_t(d(rng));
    return add(name, dtype, std::move(shape), std::move(b));
  }
  const std::vector<uint8_t>& add_f32(const std::string& name, std::vector<int64_t> shape,
                                      const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return add(name, "F32", std::move(shape), std::move(b));
  }
  const std::vector<uint8_t>& bytes(const std::string& name) const { return tensors.at(name).data; }

  void write_text(const std::string& name, const std::string& text) const {
    std::ofstream(file(name), std::ios::binary | std::ios::trunc) << text;
  }
  // The tensors as model.safetensors, or as `shards` files with model.safetensors.index.json.
  void write(const std::string& config_json, int shards = 1) const {
    write_text("config.json", config_json);
    if (shards <= 1) {
      io::StFile f;
      f.tensors = tensors;
      io::write_safetensors(file("model.safetensors"), f);
      return;
    }
    std::vector<io::StFile> parts(static_cast<size_t>(shards));
    std::string map;
    int i = 0;
    for (auto& [name, t] : tensors) {
      const int s = i++ % shards;
      parts[size_t(s)].tensors[name] = t;
      map += std::string(map.empty() ? "" : ",") + "\"" + name + "\":\"" + shard_name(s, shards) +
             "\"";
    }
    for (int s = 0; s < shards; ++s)
      io::write_safetensors(file(shard_name(s, shards)), parts[size_t(s)]);
    write_text("model.safetensors.index.json",
               "{\"metadata\":{\"total_size\":0},\"weight_map\":{" + map + "}}");
  }
  static std::string shard_name(int s, int n) {
    char b[64];
    std::snprintf(b, sizeof b, "model-%05d-of-%05d.safetensors", s + 1, n);
    return b;
  }
};

}  // namespace moe_ep::test
