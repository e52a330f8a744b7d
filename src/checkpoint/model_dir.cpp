#include "checkpoint/model_dir.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "moe_ep/formats.h"
#include "moe_ep/status.h"

namespace moe_ep::io {
namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, what); }

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::string shape_string(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t d = 0; d < s.size(); ++d) o += (d ? ", " : "") + std::to_string(s[d]);
  return o + "]";
}

ModelDir::ModelDir(const std::string& dir) : dir_(dir) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  if (!is_dir(dir_)) bad("checkpoint " + dir + ": not a directory");
  if (!is_file(config_path()))
    bad("checkpoint " + dir_ + ": config.json is missing (a Hugging Face model directory has one)");
  config_ = read_json_file(config_path());
  if (!config_.is_object())
    bad(config_path() + ": expected a JSON object, found " + JsonValue::kind_name(config_.kind()));
  if (is_file(quant_config_path())) {
    quant_config_ = read_json_file(quant_config_path());
    if (!quant_config_->is_object())
      bad(quant_config_path() + ": expected a JSON object, found " +
          JsonValue::kind_name(quant_config_->kind()));
  }

  // The shards: the index's weight_map names them, or model.safetensors alone.
  const std::string index_path = dir_ + "/model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  if (is_file(index_path)) {
    const JsonValue index = read_json_file(index_path);
    if (!index.is_object())
      bad(index_path + ": expected a JSON object, found " + JsonValue::kind_name(index.kind()));
    const JsonValue* wm = index.find("weight_map");
    if (!wm || !wm->is_object())
      bad(index_path + " field 'weight_map': " +
          (wm ? std::string("expected an object, found ") + JsonValue::kind_name(wm->kind())
              : std::string("missing (an object {tensor name: shard file})")));
    for (auto& [name, file] : wm->members()) {
      if (!file.is_string())
        bad(index_path + " field 'weight_map' entry '" + name + "': expected a file name, found " +
            JsonValue::kind_name(file.kind()));
      const std::string& f = file.text();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        bad(index_path + " field 'weight_map' entry '" + name + "': shard '" + f +
            "' is not a file name in the checkpoint directory");
      weight_map.emplace(name, f);
      if (std::find(shard_paths_.begin(), shard_paths_.end(), dir_ + "/" + f) ==
          shard_paths_.end()) {
        if (!is_file(dir_ + "/" + f))
          bad(index_path + " field 'weight_map' entry '" + name + "': shard file " + dir_ + "/" +
              f + " does not exist");
        shard_paths_.push_back(dir_ + "/" + f);
      }
    }
    if (shard_paths_.empty()) bad(index_path + " field 'weight_map': names no tensor");
  } else if (is_file(dir_ + "/model.safetensors")) {
    shard_paths_.push_back(dir_ + "/model.safetensors");
  } else {
    bad("checkpoint " + dir_ +
        ": neither model.safetensors nor model.safetensors.index.json is present");
  }
  shards_.reserve(shard_paths_.size());
  for (const std::string& p : shard_paths_) shards_.push_back(read_safetensors_header(p));
  for (size_t s = 0; s < shards_.size(); ++s) {
    for (auto& [name, t] : shards_[s].tensors) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(name);
        // A tensor the index does not place in this shard is not the checkpoint's.
        if (it == weight_map.end() || dir_ + "/" + it->second != shard_paths_[s]) continue;
      }
      tensors_.emplace(name, TensorRef{int(s), &t});
    }
  }
  for (auto& [name, file] : weight_map)
    if (!tensors_.count(name))
      bad(index_path + ": tensor '" + name + "' is placed in " + file +
          ", whose header does not have it");
}

const TensorRef* ModelDir::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> ModelDir::names_with_prefix(const std::string& prefix) const {
  std::vector<std::string> out;
  for (auto it = tensors_.lower_bound(prefix);
       it != tensors_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    out.push_back(it->first);
  return out;
}

const TensorRef& ModelDir::require(const std::string& name,
                                   std::initializer_list<const char*> dtypes,
                                   const std::vector<int64_t>& shape,
                                   const std::string& why) const {
  std::string dtype_list;
  for (const char* d : dtypes) dtype_list += (dtype_list.empty() ? "" : " or ") + std::string(d);
  const TensorRef* r = find(name);
  if (!r)
    bad("checkpoint " + dir_ + ": tensor '" + name + "' is missing (expected " + dtype_list + " " +
        shape_string(shape) + ": " + why + ")");
  const StTensor& t = *r->tensor;
  const std::string where =
      "checkpoint file " + shard_path(r->shard) + ": tensor '" + name + "' field ";
  bool dtype_ok = false;
  for (const char* d : dtypes) dtype_ok = dtype_ok || t.dtype == d;
  if (!dtype_ok) bad(where + "dtype: '" + t.dtype + "', expected " + dtype_list + " (" + why + ")");
  const bool scalar_ok = shape.empty() && t.numel() == 1 && t.shape.size() <= 1;
  if (t.shape != shape && !scalar_ok)
    bad(where + "shape: " + shape_string(t.shape) + ", expected " + shape_string(shape) + " (" +
        why + ")");
  return *r;
}

void ModelDir::read(const TensorRef& r, uint64_t offset, uint64_t count, uint8_t* out) const {
  read_tensor_range(shard_path(r.shard), shards_[size_t(r.shard)], *r.tensor, offset, count, out);
  bytes_read_ += count;
}

float ModelDir::read_float(const TensorRef& r, int64_t index) const {
  const std::string& d = r.tensor->dtype;
  if (d == "F32") {
    float v;
    read(r, uint64_t(index) * 4, 4, reinterpret_cast<uint8_t*>(&v));
    return v;
  }
  uint16_t b;
  read(r, uint64_t(index) * 2, 2, reinterpret_cast<uint8_t*>(&b));
  if (d == "BF16") return fmt::bf16_to_float(b);
  bad("checkpoint file " + shard_path(r.shard) + ": a tensor of dtype " + d +
      " read as floating point");
}

std::vector<float> ModelDir::read_floats(const TensorRef& r) const {
  const std::string& d = r.tensor->dtype;
  const size_t n = size_t(r.tensor->numel());
  std::vector<float> out(n);
  if (d == "F32") {
    read(r, 0, n * 4, reinterpret_cast<uint8_t*>(out.data()));
    return out;
  }
  if (d != "BF16")
    bad("checkpoint file " + shard_path(r.shard) + ": a tensor of dtype " + d +
        " read as floating point");
  std::vector<uint16_t> b(n);
  read(r, 0, n * 2, reinterpret_cast<uint8_t*>(b.data()));
  for (size_t i = 0; i < n; ++i) out[i] = fmt::bf16_to_float(b[i]);
  return out;
}

}  // namespace moe_ep::io
