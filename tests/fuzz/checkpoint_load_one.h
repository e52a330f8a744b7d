// The checkpoint fuzz target's work on one input, shared by the libFuzzer target
// (fuzz_checkpoint.cpp) and the unit test that replays its seeds (CheckpointFuzzReplay).
//
// A directory holds a valid tiny Qwen3-MoE checkpoint (E 4, H 64, I 64, two layers, two shards
// with an index). The input's first byte picks the file its other bytes replace: 0
// config.json, 1 model.safetensors.index.json, 2 hf_quant_config.json (added beside the valid
// config). Then the checkpoint is opened, every MoE layer loaded at W = 1 and W = 2 (rank 1)
// into the native recipe and nvfp4, and routed. Every rejection must be a moe_ep::Error;
// anything else (another exception, a sanitizer report) is a crash.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "moe_ep/checkpoint.h"
#include "moe_ep/status.h"

namespace moe_ep::fuzz {

inline const char* kFuzzConfig =
    R"({"model_type":"qwen3_moe","hidden_size":64,"moe_intermediate_size":64,"num_experts":4,)"
    R"("num_experts_per_tok":2,"num_hidden_layers":2,"norm_topk_prob":true})";

struct FuzzModelDir {
  std::string dir, index;
  FuzzModelDir() {
    const char* tmp = std::getenv("TMPDIR");
    dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/moe_ep_fuzz_ckpt_" + std::to_string(getpid());
    ::mkdir(dir.c_str(), 0700);
    io::StFile shards[2];
    std::string map;
    uint32_t state = 12345;
    auto add = [&](int s, const std::string& name, std::vector<int64_t> shape) {
      io::StTensor t;
      t.dtype = "BF16";
      t.shape = shape;
      t.data.resize(size_t(shape[0] * shape[1]) * 2);
      for (size_t i = 0; i < t.data.size(); i += 2) {
        state = state * 1664525u + 1013904223u;
        t.data[i] = uint8_t(state >> 24);
        t.data[i + 1] = uint8_t(0x3c + (state >> 30));  // small finite bf16 values
      }
      shards[s].tensors[name] = std::move(t);
      map += std::string(map.empty() ? "" : ",") + "\"" + name + "\":\"model-0000" +
             std::to_string(s + 1) + "-of-00002.safetensors\"";
    };
    for (int l = 0; l < 2; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
      add(l, p + "gate.weight", {4, 64});
      for (int e = 0; e < 4; ++e)
        for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
          add((l + e) % 2, p + "experts." + std::to_string(e) + "." + proj + ".weight", {64, 64});
    }
    for (int s = 0; s < 2; ++s)
      io::write_safetensors(dir + "/model-0000" + std::to_string(s + 1) + "-of-00002.safetensors",
                            shards[s]);
    index = "{\"metadata\":{\"total_size\":0},\"weight_map\":{" + map + "}}";
  }
  ~FuzzModelDir() { std::system(("rm -rf '" + dir + "'").c_str()); }
  void put(const std::string& name, const uint8_t* data, size_t size) const {
    std::ofstream(dir + "/" + name, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  void put(const std::string& name, const std::string& text) const {
    put(name, reinterpret_cast<const uint8_t*>(text.data()), text.size());
  }
};

// One input; returns true when the checkpoint opened and every layer loaded.
inline bool checkpoint_load_one(const uint8_t* data, size_t size) {
  static const FuzzModelDir base;
  const int mode = size ? data[0] % 3 : 0;
  const uint8_t* body = size ? data + 1 : data;
  const size_t n = size ? size - 1 : 0;
  base.put("config.json", mode == 0 ? std::string(reinterpret_cast<const char*>(body), n)
                                    : std::string(kFuzzConfig));
  if (mode == 1)
    base.put("model.safetensors.index.json", body, n);
  else
    base.put("model.safetensors.index.json", base.index);
  if (mode == 2)
    base.put("hf_quant_config.json", body, n);
  else
    std::remove((base.dir + "/hf_quant_config.json").c_str());
  try {
    const Checkpoint c(base.dir);
    const CheckpointInfo& info = c.info();
    if (info.moe_layers.size() > 4 || info.num_experts > 64) return true;  // bounded work
    std::vector<float> x(size_t(info.hidden_size) * 2, 0.25f);
    std::vector<int32_t> ids(size_t(info.top_k) * 2);
    std::vector<float> w(size_t(info.top_k) * 2);
    for (int l : info.moe_layers) {
      c.load_layer(l);
      if (info.num_experts % 2 == 0) c.load_layer(l, std::nullopt, 2, 1);
      if (info.weight_format == "bf16" && info.hidden_size % 16 == 0 &&
          info.moe_intermediate_size % 16 == 0)
        c.load_layer(l, Recipe::kNvfp4);
      c.route(l, x.data(), 2, ids.data(), w.data());
    }
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace moe_ep::fuzz
