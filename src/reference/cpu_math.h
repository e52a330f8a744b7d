// The expert math of the CPU reference (docs/contract.md §3.1), shared by the CPU backend and the
// benchmarks. Every dot product is accumulated in 8 fp32 lanes over i (lane = i mod 8) and the
// lanes are summed in one fixed tree, whatever the blocking or the thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "moe_ep/config.h"

namespace moe_ep {

struct ExpertShape {
  int H = 0, I = 0, K = 0, El = 0;
  static ExpertShape of(const LayerConfig& c, int world_size) {
    return {c.fleet.hidden_size, c.recipe.intermediate_size, c.recipe.top_k,
            c.fleet.num_experts / world_size};
  }
};

// A token row in the recipe's activation format: data bytes, then scale bytes.
struct ActFormat {
  int data_bytes = 0, scale_bytes = 0;
};
ActFormat act_format(Recipe r, int hidden);

// Quantizes one bf16 row (H elements) into the activation format (input_norm_const for nvfp4).
void encode_activation(const RecipeConfig& rc, const ActFormat& f, const uint16_t* x, int H,
                       uint8_t* row);
// The activation row's values as the GEMM sees them (q * s), as fp32.
void decode_activation(Recipe r, const ActFormat& f, const uint8_t* row, int hidden, float* out);

bool applies_weight_in_fc1(const RecipeConfig& rc);

struct EpilogueParams {
  const float* fc1_alpha = nullptr;  // [E_local]
  const float* fc2_alpha = nullptr;
  const float* fc1_norm_const = nullptr;
  const float* fc1_bias = nullptr;  // [E_local][2I] or null
  const float* fc2_bias = nullptr;  // [E_local][H] or null
};

// Checkpoint-layout weights of the local experts (docs/contract.md §3.1).
struct ExpertWeights {
  const uint8_t* w13;
  const uint8_t* w2;
  const uint8_t* w13_scale;
  const uint8_t* w2_scale;
};

// One routed (token, slot) on its owner: where its activation row is, and the top-k weight.
struct Pair {
  int src;    // source rank
  int token;  // token index on the source
  int slot;   // k
  const uint8_t* act;
  float topk_weight;
};

// Runs every local expert over its pairs and writes y (bf16, H elements) to out_row(pair).
void run_experts(const LayerConfig& cfg, const ExpertShape& shape, const ExpertWeights& w,
                 const EpilogueParams& ep, const std::vector<std::vector<Pair>>& pairs,
                 bool weight_in_fc1, int threads,
                 const std::function<uint16_t*(const Pair&)>& out_row);

// out = bf16(sum_k c[k] * float(y[k])) over slots with ids >= 0, in slot order, with separately
// rounded multiply and add (docs/contract.md §3).
void finalize_token(const uint16_t* rows, const int32_t* ids, const float* weights, int K, int H,
                    bool weight_in_fc1, uint16_t* out);

// Dequantized weight row j of local expert e (fc1: j in [0, 2I), length H; fc2: j in [0, H),
// length I) as fp32.
void dequant_fc1_row(Recipe r, const ExpertShape& s, const ExpertWeights& w, int e, int j,
                     float* out);
void dequant_fc2_row(Recipe r, const ExpertShape& s, const ExpertWeights& w, int e, int j,
                     float* out);

// The fixed-order dot product every GEMM of the reference uses (n a multiple of 8).
float dot_fixed(const float* a, const float* b, int n);

}  // namespace moe_ep
