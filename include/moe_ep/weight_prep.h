// Weight preparation: fp32 master weights -> the packed per-expert checkpoint tensors of a
// recipe (docs/contract.md §3.1 layout), with the nvfp4 epilogue alphas that undo the per-expert
// global scales. Tests, the CLI and the benchmarks build their layers with this.
#pragma once

#include <cstdint>
#include <vector>

#include "moe_ep/config.h"
#include "moe_ep/layer.h"

namespace moe_ep {

struct PackedExperts {
  Recipe recipe = Recipe::kBf16;
  int num_experts = 0, hidden = 0, inter = 0;
  // 4-bit recipes: packed E2M1 and scale bytes. bf16: w13/w2 hold bf16 bits (2 bytes each),
  // scales are empty.
  std::vector<uint8_t> w13, w2, w13_scale, w2_scale;
  std::vector<float> fc1_alpha, fc2_alpha, fc1_norm_const;  // [num_experts]; 1 unless NVFP4

  // Views of the whole pack, or of experts [first, first + count) (one rank's share).
  WeightPack view(int first = 0, int count = -1) const;
  EpilogueVectors epilogue_view(int first = 0, int count = -1) const;
};

// w13: fp32 [E, 2I, H] (rows [0, I) gate, [I, 2I) up); w2: fp32 [E, H, I].
// nvfp4 and nvfp4_bf16: each expert's tensor gets a global scale gs = amax / (6 * 448) so its
// block scales use the E4M3 range. nvfp4: fc1_alpha = gs13 / input_norm_const and fc2_alpha =
// gs2 / fc1_norm_const; nvfp4_bf16 (x and h not quantized): fc1_alpha = gs13, fc2_alpha = gs2;
// either way alpha * acc is the true dot product. fc1_norm_const (per expert, nvfp4 only) may be
// null (all 1).
PackedExperts pack_expert_weights(Recipe recipe, const float* w13, const float* w2, int num_experts,
                                  int hidden, int inter, float input_norm_const = 1.0f,
                                  const float* fc1_norm_const = nullptr);

// The fp32 weights of expert `expert` of a pack, as the recipe's kernels see them (each packed
// value times its block scale; the NVFP4 recipes' alphas are not applied): w13 [2I, H], w2 [H, I].
void dequantize_expert(const PackedExperts& pack, int expert, float* w13, float* w2);

// Bytes of one expert's packed weights and scales in the checkpoint layout of `config`'s recipe.
struct ExpertBytes {
  size_t w13, w2, w13_scale, w2_scale;
};
ExpertBytes expert_bytes(const LayerConfig& config);

}  // namespace moe_ep
