// A Hugging Face model directory opened for reading: config.json, the optional
// hf_quant_config.json, and the safetensors shards (model.safetensors, or the shards that
// model.safetensors.index.json names), every header read and checked, no tensor data.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/json.h"
#include "checkpoint/safetensors.h"

namespace moe_ep::io {

struct TensorRef {
  int shard = 0;
  const StTensor* tensor = nullptr;
};

class ModelDir {
 public:
  explicit ModelDir(const std::string& dir);
  ModelDir(const ModelDir&) = delete;
  ModelDir& operator=(const ModelDir&) = delete;

  const std::string& dir() const { return dir_; }
  const JsonValue& config() const { return config_; }
  const std::optional<JsonValue>& quant_config() const { return quant_config_; }
  std::string config_path() const { return dir_ + "/config.json"; }
  std::string quant_config_path() const { return dir_ + "/hf_quant_config.json"; }

  // null when the checkpoint has no tensor of that name
  const TensorRef* find(const std::string& name) const;
  // every tensor name that starts with `prefix`, sorted
  std::vector<std::string> names_with_prefix(const std::string& prefix) const;
  const std::string& shard_path(int shard) const { return shard_paths_[size_t(shard)]; }

  // The tensor `name` must exist with one of `dtypes` and the shape `shape` (a scalar accepts
  // [] and [1]); otherwise an error naming the file, the tensor, the field, the value found and
  // what `why` says is expected.
  const TensorRef& require(const std::string& name, std::initializer_list<const char*> dtypes,
                           const std::vector<int64_t>& shape, const std::string& why) const;

  // Bytes [offset, offset + count) of a tensor's data.
  void read(const TensorRef& r, uint64_t offset, uint64_t count, uint8_t* out) const;
  template <class T>
  std::vector<T> read_all(const TensorRef& r) const {
    std::vector<T> v(r.tensor->nbytes() / sizeof(T));
    read(r, 0, v.size() * sizeof(T), reinterpret_cast<uint8_t*>(v.data()));
    return v;
  }
  // One fp32 value of a tensor of dtype F32 or BF16 (element `index`).
  float read_float(const TensorRef& r, int64_t index) const;
  // Every element of a F32 or BF16 tensor as fp32.
  std::vector<float> read_floats(const TensorRef& r) const;
  uint64_t bytes_read() const { return bytes_read_.load(); }

 private:
  std::string dir_;
  JsonValue config_;
  std::optional<JsonValue> quant_config_;
  std::vector<std::string> shard_paths_;
  std::vector<StFile> shards_;
  std::map<std::string, TensorRef> tensors_;
  mutable std::atomic<uint64_t> bytes_read_{0};
};

std::string shape_string(const std::vector<int64_t>& s);

}  // namespace moe_ep::io
