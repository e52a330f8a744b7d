// Hugging Face model directories as the source of a layer's weights (docs/checkpoints.md):
// config.json, *.safetensors with or without model.safetensors.index.json, and
// hf_quant_config.json for NVIDIA ModelOpt checkpoints. Formats:
//   bf16   per-expert tensors (Qwen3-MoE, Mixtral, DeepSeek-V3 names) or fused expert tensors
//          (transformers' gate_up_proj / down_proj; gpt-oss's interleaved [E, H, 2I] layout)
//   mxfp4  gpt-oss (gate_up_proj_blocks / _scales / _bias, down_proj_*)
//   nvfp4  ModelOpt NVFP4 (weight, weight_scale, weight_scale_2, input_scale per linear)
//
// The constructor reads and checks config.json, the index and every shard's header; no tensor
// data. load_layer() checks every tensor of the layer's experts (names, dtypes, shapes against
// config.json, scale bytes) and then reads only the byte ranges of one rank's experts. Every
// error is a moe_ep::Error (kInvalidArgument) naming the file, tensor, field, value and
// expectation.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moe_ep/config.h"
#include "moe_ep/layer.h"
#include "moe_ep/weight_prep.h"

namespace moe_ep {

struct CheckpointInfo {
  std::string dir;
  std::string model_type;     // config.json "model_type": qwen3_moe, mixtral, gpt_oss, deepseek_v3
  std::string weight_format;  // "bf16", "mxfp4" (gpt-oss), "nvfp4" (ModelOpt)
  int hidden_size = 0, moe_intermediate_size = 0, num_experts = 0, top_k = 0;
  int num_hidden_layers = 0;
  std::vector<int> moe_layers;  // decoder layers with routed experts, ascending
  std::optional<float> swiglu_limit;
  float swiglu_alpha = 1.0f, swiglu_beta = 0.0f;
  bool has_expert_bias = false;
  Recipe native_recipe = Recipe::kBf16;  // bf16 -> kBf16, mxfp4 -> kMxfp4Bf16, nvfp4 -> kNvfp4Bf16
  // The router (Checkpoint::route): "softmax_topk" (Qwen3-MoE, Mixtral: softmax over all
  // experts, top-k, renormalized when norm_topk_prob), "topk_softmax" (gpt-oss: top-k of the
  // logits with the router bias, softmax over those k), "sigmoid_group_topk" (DeepSeek-V3).
  std::string router;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;  // DeepSeek-V3
  int n_group = 1, topk_group = 1;     // DeepSeek-V3
};

// One rank's share of one MoE layer, in the checkpoint layout of a recipe (docs/contract.md
// §3.1): experts [rank * E_local, (rank + 1) * E_local).
struct LayerCheckpoint {
  int layer = 0, rank = 0, world_size = 1;
  // fleet.num_experts and fleet.hidden_size; the recipe fields (recipe, I, K, swiglu_limit,
  // swiglu_alpha / beta, input_norm_const, has_expert_bias). fleet.max_tokens_per_rank is the
  // caller's (0 here).
  LayerConfig config;
  PackedExperts experts;                  // this rank's E_local experts
  std::vector<float> fc1_bias, fc2_bias;  // f32 [E_local * 2I] (gate rows, then up), [E_local * H]
  WeightPack weights() const;             // views of `experts`
  EpilogueVectors epilogue() const;       // alphas, norm constants and biases (views)
};

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);
  ~Checkpoint();
  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;

  const CheckpointInfo& info() const;

  // Decoder layer `layer` (one of info().moe_layers), the experts of `rank` of `world_size`, in
  // the layout of `recipe` (default: info().native_recipe). bf16 checkpoints load into any
  // recipe (quantized by pack_expert_weights from their fp32 values); quantized checkpoints
  // only into recipes of their own format (mxfp4: mxfp4_bf16, mxfp4_mxfp8; nvfp4: nvfp4_bf16,
  // nvfp4).
  LayerCheckpoint load_layer(int layer, std::optional<Recipe> recipe = std::nullopt,
                             int world_size = 1, int rank = 0) const;

  // The model's router of `layer` on fp32 hidden states [tokens, H]: ids i32 [tokens, K] and
  // weights f32 [tokens, K], as transformers computes them (in fp32).
  void route(int layer, const float* hidden, int tokens, int32_t* ids, float* weights) const;

  // Tensor bytes read from the shards so far (headers not counted): a rank's load reads its own
  // experts' bytes (plus, for nvfp4, every expert's 4-byte input_scale, whose maximum is the
  // layer's input_norm_const).
  uint64_t bytes_read() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moe_ep
