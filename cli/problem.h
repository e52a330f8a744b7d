// Problems the `moe-ep` command runs: named model shapes, random weights quantized by the
// library's own packer, inputs and routing per rank, a float64 dense reference, and a runner
// that drives one layer per rank (a thread each) through the public API.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moe_ep/layer.h"
#include "moe_ep/weight_prep.h"

namespace moe_ep::cli {

struct ModelShape {
  std::string name;
  int H, I, E, K;
};
const std::vector<ModelShape>& model_shapes();
std::optional<ModelShape> find_shape(const std::string& name);

struct Problem {
  ModelShape shape;
  Recipe recipe = Recipe::kNvfp4;
  int world_size = 1;
  int capacity = 0;
  std::optional<float> swiglu_limit;
  bool apply_topk_in_fc1 = false;
  // Expert semantics of checkpoints (gpt-oss; contract §3.1): the activation's slope and offset,
  // nvfp4's layer input constant, and expert biases f32 [E * 2I] and [E * H] (empty: none).
  float swiglu_alpha = 1.0f, swiglu_beta = 0.0f;
  float input_norm_const = 1.0f;
  std::vector<float> fc1_bias, fc2_bias;
  std::vector<float> w13, w2;  // fp32 master weights (empty when loaded already packed)
  PackedExperts pack;
  std::vector<std::vector<uint16_t>> x;    // per rank: bf16 [T, H]
  std::vector<std::vector<int32_t>> ids;   // per rank: [T, K]
  std::vector<std::vector<float>> topk_w;  // per rank: [T, K]
  int tokens(int rank) const { return int(ids[rank].size()) / shape.K; }
  LayerConfig config() const;
};

// Uniform top-k without repeats, or Zipf(1.1) over experts ("zipf").
Problem make_random_problem(const ModelShape& shape, Recipe recipe, int world_size,
                            const std::vector<int>& tokens_per_rank, uint64_t seed,
                            const std::string& routing, bool verbose);

// Sets new inputs (same weights) with the given token counts.
void make_random_inputs(Problem& p, const std::vector<int>& tokens_per_rank, uint64_t seed,
                        const std::string& routing);

// The layer as float64 math on fp32 master weights, no quantization: what every recipe
// approximates. w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I]; biases null or [E * 2I]
// and [E * H]; the activation's clamp (none if unset), slope and offset as in LayerConfig.
struct DenseLayer {
  int H = 0, I = 0, K = 0;
  const float* w13 = nullptr;
  const float* w2 = nullptr;
  const float* fc1_bias = nullptr;
  const float* fc2_bias = nullptr;
  std::optional<float> swiglu_limit;
  float swiglu_alpha = 1.0f, swiglu_beta = 0.0f;
};
// out[t] = sum over the slots of topk_w[t, k] * expert ids[t, k] of bf16 x[t] ([T, H]; ids < 0
// skipped), in double.
std::vector<double> dense_reference(const DenseLayer& l, const std::vector<uint16_t>& x,
                                    const std::vector<int32_t>& ids,
                                    const std::vector<float>& topk_w);
// The problem's layer on rank `rank`'s inputs (needs its master weights).
std::vector<double> dense_reference(const Problem& p, int rank);

struct RunResult {
  std::vector<std::vector<uint16_t>> out;        // per rank: bf16 [T, H]
  double median_ms = 0, min_ms = 0, max_ms = 0;  // slowest rank per iteration
  Backend backend = Backend::kCPU;
  size_t workspace_bytes = 0;
  std::string plan;  // rank 0's launch plan of the last forward (ForwardPlan::to_string)
};
RunResult run_layers(const Problem& p, Backend backend, int iterations);

// `--gpus N`: run_layers starts one process per GPU (rank r on GPU r, NCCL unique id shared
// through an anonymous shared mapping) instead of threads, for the CUDA backend with W > 1.
// This process then never initializes CUDA itself (a forked child could not use it).
void set_gpu_processes(bool on);
bool gpu_processes();

double rel_l2(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b);
double rel_l2(const std::vector<uint16_t>& a, const std::vector<double>& ref);
// NaN or Inf among bf16 values.
bool has_nonfinite(const std::vector<uint16_t>& a);

}  // namespace moe_ep::cli
