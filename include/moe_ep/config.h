// Configuration of a layer: the fleet (EP group and capacity), the recipe (numerics contract of
// docs/contract.md §3.1), and how ranks find each other. Validation is pure: unsupported_reasons()
// lists every reason a configuration cannot run, and nothing is allocated before it comes back
// empty.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moe_ep/plan_options.h"
#include "moe_ep/tensor.h"

namespace moe_ep {

enum class Recipe : uint8_t {
  kNvfp4,       // NVFP4 weights and activations (E2M1 + E4M3 per 16), fp32 alphas
  kMxfp4Mxfp8,  // MXFP4 weights, MXFP8 activations (UE8M0 per 32), weight applied in fc1
  kMxfp4Bf16,   // MXFP4 weights, bf16 activations
  kBf16,        // bf16 weights and activations
  kNvfp4Bf16,   // NVFP4 weights with their fp32 alphas, bf16 activations (W4A16)
};

const char* recipe_name(Recipe r);
std::optional<Recipe> parse_recipe(const std::string& name);  // "nvfp4", "mxfp4_mxfp8", ...

// Every recipe, in the order of the enum (CLI, benchmarks and tests iterate over it).
inline constexpr Recipe kAllRecipes[] = {Recipe::kNvfp4, Recipe::kMxfp4Mxfp8, Recipe::kMxfp4Bf16,
                                         Recipe::kBf16, Recipe::kNvfp4Bf16};

// Per-recipe storage facts (docs/contract.md §3.1 checkpoint layout).
struct RecipeTraits {
  bool weights_4bit;        // w13/w2 are packed E2M1 bytes (else bf16 elements)
  int weight_block;         // elements per weight scale (16 or 32; 0 for bf16)
  bool e4m3_scales;         // scale bytes are E4M3 (else UE8M0)
  bool topk_in_fc1_forced;  // the recipe always applies the top-k weight in fc1
  bool alphas;              // fc1_alpha / fc2_alpha scale the GEMM results (NVFP4 weights)
};
RecipeTraits recipe_traits(Recipe r);

enum class Backend : uint8_t { kAuto, kCPU, kCUDA };
const char* backend_name(Backend b);

struct FleetParams {
  int num_experts = 0;          // E, all ranks together (EPLB copies included)
  int max_tokens_per_rank = 0;  // capacity of the default workspace
  int hidden_size = 0;          // H
};

struct RecipeConfig {
  Recipe recipe = Recipe::kBf16;
  int intermediate_size = 0;  // I
  int top_k = 0;              // K
  std::optional<float> swiglu_limit;
  // The activation's slope and offset: h = (u + swiglu_beta) * g * sigmoid(swiglu_alpha * g)
  // after the clamp (gpt-oss: 1.702 and 1; the default 1 and 0 is the plain SwiGLU). The CPU
  // backend runs any finite values; the CUDA backend only the defaults so far.
  float swiglu_alpha = 1.0f;
  float swiglu_beta = 0.0f;
  bool apply_topk_in_fc1 = false;
  bool do_finalize = true;
  float input_norm_const = 1.0f;  // nvfp4 only (not nvfp4_bf16: x is not quantized)
  DType activation_dtype = DType::kBF16;
  DType combine_dtype = DType::kBF16;
  // mxfp4_mxfp8 on the CUDA backend: run the expert GEMMs on fp8 tensor cores (weights kept in an
  // fp8-ready layout, activations folded to one power of two per row). For prefill: faster than
  // the default path from 512 tokens per step on DeepSeek-V3 and at 2048 and 4096 on Qwen3,
  // slower at decode sizes; not bitwise equal to the CPU reference as the default path is, and
  // not always within the 5e-3 tolerance: up to 3.8e-3 on the tests' routed inputs, 6.2e-3 where
  // each token has one slot. Needs W = 1 and H, I multiples of 128. The CPU backend computes the
  // recipe exactly either way. docs/kernels.md.
  bool fp8_mma = false;
  // Features of some checkpoints that this library does not run; listed so that
  // unsupported_reasons() can say so instead of computing something else.
  bool has_expert_bias = false;
  bool has_custom_swiglu_alpha_beta = false;
  // What an engine may ask of a MoE layer that this library does not do (FlashInfer's MoE-EP
  // layer refuses the same), listed by unsupported_reasons() instead of being ignored:
  // the checkpoint's weight quantization scheme, when the engine names one (empty: the recipe's
  // own; a recipe name is accepted); skipping the final all-reduce (the output is reduced
  // already); weights replaced at run time by another process; two micro-batches of one layer
  // in flight at once (dual batch overlap).
  std::string weight_scheme;
  bool skip_final_all_reduce = false;
  bool runtime_weight_transfer = false;
  bool dual_batch_overlap = false;
};

class CpuFleet;  // in-process fleet of W CPU ranks (src/reference/cpu_fleet.h)

// Makes a fleet for `world_size` CPU ranks in this process; every rank's layer shares it.
std::shared_ptr<CpuFleet> make_cpu_fleet(int world_size);

struct Bootstrap {
  int world_size = 1;  // W
  int rank = 0;
  Backend backend = Backend::kAuto;  // kAuto: CUDA when a GPU and the CUDA backend are present
  int device = 0;                    // CUDA ordinal of this rank
  void* nccl_comm = nullptr;         // a caller's ncclComm_t, or
  std::optional<std::array<char, 128>> nccl_unique_id;  // an ncclUniqueId shared by all ranks
  std::shared_ptr<CpuFleet> cpu_fleet;                  // CPU backend with W > 1
  int64_t timeout_ms = 30000;                           // every wait on a peer gives up after this
  int64_t warmup_timeout_ms = 120000;  // the same for construction, warmup and destroy
};

struct LayerConfig {
  FleetParams fleet;
  RecipeConfig recipe;
  // The CUDA backend's kernel choices: the defaults leave every choice to the launch plan's
  // policy (include/moe_ep/plan.h); tests and benchmarks force variants here.
  PlanOptions plan_options;
};

// Every reason this configuration cannot run on `backend` (empty when it can).
std::vector<std::string> unsupported_reasons(const LayerConfig& config, int world_size,
                                             Backend backend = Backend::kCPU);

// Backend that kAuto resolves to in this process.
Backend resolve_backend(Backend requested);

}  // namespace moe_ep
