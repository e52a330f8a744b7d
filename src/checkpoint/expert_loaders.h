// The per-format expert loaders behind moe_ep::Checkpoint (include/moe_ep/checkpoint.h), each
// written from its format's public definition (docs/checkpoints.md). Each checks every tensor of
// the layer's experts (all E of them, from the headers) before it reads the bytes of experts
// [first, first + count) only.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "checkpoint/model_dir.h"
#include "moe_ep/checkpoint.h"
#include "moe_ep/weight_prep.h"

namespace moe_ep::io {

// Tensor names of one layer's experts.
struct ExpertNames {
  std::string per_expert;      // "model.layers.3.mlp.experts." (then "{e}.gate_proj.weight", ...)
  std::string gate, up, down;  // "gate_proj", "up_proj", "down_proj" (Mixtral: w1, w3, w2)
  std::string fused;  // "model.layers.3.mlp.experts." (then "gate_up_proj", "down_proj", ...)
  std::string expert(int e, const std::string& proj) const {
    return per_expert + std::to_string(e) + "." + proj;
  }
};
ExpertNames expert_names(const CheckpointInfo& info, int layer);

struct ExpertRange {
  int layer = 0;
  int first = 0, count = 0;  // experts [first, first + count)
};

// What a loader hands back: the experts in the checkpoint layout of contract §3.1 (bf16 bits for
// the bf16 format; E2M1 bytes and scale bytes for mxfp4 / nvfp4), biases, and for nvfp4 the
// layer's input_norm_const.
struct LoadedExperts {
  PackedExperts pack;
  std::vector<float> fc1_bias, fc2_bias;  // [count * 2I] gate then up rows, [count * H]
  float input_norm_const = 1.0f;
};

LoadedExperts load_bf16_experts(const ModelDir& dir, const CheckpointInfo& info,
                                const ExpertRange& range);
LoadedExperts load_mxfp4_experts(const ModelDir& dir, const CheckpointInfo& info,
                                 const ExpertRange& range);
// `recipe` is nvfp4_bf16 or nvfp4 (the epilogue constants depend on it; nvfp4_epilogue()).
LoadedExperts load_nvfp4_experts(const ModelDir& dir, const CheckpointInfo& info,
                                 const ExpertRange& range, Recipe recipe);

// Tensors under `prefixes` that are not in `expected`: an error naming them (a checkpoint with
// tensors this loader does not understand is refused rather than half read).
void reject_unexpected(const ModelDir& dir, const std::vector<std::string>& prefixes,
                       const std::set<std::string>& expected, const std::string& what);

[[noreturn]] void checkpoint_error(const std::string& what);

// The model's router of `layer` (router.cpp): ids / weights [tokens, K] from fp32 x [tokens, H].
void route_tokens(const ModelDir& dir, const CheckpointInfo& info, int layer, const float* x,
                  int tokens, int32_t* ids, float* weights);

}  // namespace moe_ep::io
