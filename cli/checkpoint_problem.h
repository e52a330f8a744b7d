// Problems from a Hugging Face checkpoint directory (`moe-ep run --model DIR`): one MoE layer's
// experts loaded rank by rank through moe_ep::Checkpoint, inputs routed by the model's own
// router, and the golden inputs and outputs of transformers where the directory has them
// (goldens.safetensors: layer{L}.hidden_states, .topk_ids, .topk_weights, .routed_output).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "moe_ep/checkpoint.h"
#include "problem.h"

namespace moe_ep::cli {

// Layer `layer` in `recipe`, every rank's experts loaded as that rank would load them and
// placed side by side (Problem::pack holds all E experts, rank-major). No inputs yet.
Problem problem_from_checkpoint(const Checkpoint& ckpt, int layer, Recipe recipe, int world_size);

// The fp32 master weights of the problem's layer (Problem::w13 / w2, for dense_reference): a
// bf16 checkpoint's own values, or a quantized checkpoint's weights dequantized with their
// global scales (what its format defines the weights to be).
void set_checkpoint_master_weights(const Checkpoint& ckpt, int layer, Problem& p);

// Random bf16 hidden states N(0, 1) (seeded), `tokens_per_rank` on every rank, routed by the
// model's router; where the checkpoint has no router tensors, uniform random top-k and `note`
// says why.
void make_checkpoint_inputs(const Checkpoint& ckpt, int layer, Problem& p, int tokens_per_rank,
                            uint64_t seed, std::string* note);

struct GoldenLayer {
  int tokens = 0;
  std::vector<uint16_t> x;            // bf16 [T, H] (the goldens' f32, bf16-representable)
  std::vector<int32_t> ids;           // [T, K]
  std::vector<float> weights;         // [T, K]
  std::vector<double> routed_output;  // [T, H], transformers' routed experts' output
};

// The goldens of `layer` from `path` (every tensor checked against H and K first); nullopt
// when the file has none for this layer.
std::optional<GoldenLayer> read_golden_layer(const std::string& path, int layer, int H, int K);

// The golden tokens split over the problem's ranks in contiguous runs (rank r gets tokens
// [r*T/W, (r+1)*T/W)).
void set_golden_inputs(Problem& p, const GoldenLayer& g);

}  // namespace moe_ep::cli
