#include "moe_ep/config.h"

#include <cmath>
#include <string>

#include "kernels/common/forward_args.h"
#include "layer/backend.h"
#include "moe_ep/plan.h"

namespace moe_ep {

const char* recipe_name(Recipe r) {
  switch (r) {
    case Recipe::kNvfp4:
      return "nvfp4";
    case Recipe::kMxfp4Mxfp8:
      return "mxfp4_mxfp8";
    case Recipe::kMxfp4Bf16:
      return "mxfp4_bf16";
    case Recipe::kBf16:
      return "bf16";
    case Recipe::kNvfp4Bf16:
      return "nvfp4_bf16";
  }
  return "?";
}

std::optional<Recipe> parse_recipe(const std::string& name) {
  for (Recipe r : kAllRecipes)
    if (name == recipe_name(r)) return r;
  return std::nullopt;
}

RecipeTraits recipe_traits(Recipe r) {
  switch (r) {
    case Recipe::kNvfp4:
      return {true, 16, true, false, true};
    case Recipe::kMxfp4Mxfp8:
      return {true, 32, false, true, false};
    case Recipe::kMxfp4Bf16:
      return {true, 32, false, false, false};
    case Recipe::kBf16:
      return {false, 0, false, false, false};
    case Recipe::kNvfp4Bf16:
      return {true, 16, true, false, true};
  }
  return {};
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kAuto:
      return "auto";
    case Backend::kCPU:
      return "cpu";
    case Backend::kCUDA:
      return "cuda";
  }
  return "?";
}

bool cuda_runs_extended_epilogue(const LayerConfig& c) {
  return kern::has_extended_epilogue(c.recipe.recipe) && !c.recipe.fp8_mma;
}

std::string extended_epilogue_reason(const LayerConfig& c, const std::string& what) {
  return what + " is not supported on the CUDA backend with recipe " +
         recipe_name(c.recipe.recipe) + (c.recipe.fp8_mma ? " on fp8 tensor cores" : "") +
         " (it runs with mxfp4_bf16, nvfp4_bf16 and bf16; the CPU backend runs it with every "
         "recipe)";
}

std::vector<std::string> unsupported_reasons(const LayerConfig& c, int world_size,
                                             Backend backend) {
  std::vector<std::string> r;
  const auto& f = c.fleet;
  const auto& rc = c.recipe;
  auto s = [](auto v) { return std::to_string(v); };
  if (world_size < 1) r.push_back("world size W = " + s(world_size) + " must be >= 1");
  if (f.num_experts < 1) r.push_back("num_experts E = " + s(f.num_experts) + " must be >= 1");
  if (world_size >= 1 && f.num_experts >= 1 && f.num_experts % world_size != 0)
    r.push_back("num_experts E = " + s(f.num_experts) +
                " is not divisible by the EP world size W = " + s(world_size));
  if (f.max_tokens_per_rank < 1)
    r.push_back("max_tokens_per_rank = " + s(f.max_tokens_per_rank) + " must be >= 1");
  if (f.hidden_size < 64 || f.hidden_size % 64 != 0)
    r.push_back("hidden size H = " + s(f.hidden_size) + " is not a positive multiple of 64");
  if (rc.intermediate_size < 64 || rc.intermediate_size % 64 != 0)
    r.push_back("intermediate size I = " + s(rc.intermediate_size) +
                " is not a positive multiple of 64");
  if (rc.top_k < 1 || (f.num_experts >= 1 && rc.top_k > f.num_experts))
    r.push_back("top_k K = " + s(rc.top_k) + " must be in [1, E = " + s(f.num_experts) + "]");
  if (rc.top_k > kMaxTopK)
    r.push_back("top_k K = " + s(rc.top_k) + " exceeds the supported maximum " + s(kMaxTopK));
  if (rc.swiglu_limit && !(*rc.swiglu_limit > 0.0f && std::isfinite(*rc.swiglu_limit)))
    r.push_back("swiglu_limit = " + std::to_string(*rc.swiglu_limit) + " must be finite and > 0");
  if (!(rc.input_norm_const > 0.0f && std::isfinite(rc.input_norm_const)))
    r.push_back("input_norm_const = " + std::to_string(rc.input_norm_const) +
                " must be finite and > 0");
  if (rc.activation_dtype != DType::kBF16)
    r.push_back(std::string("activation dtype ") + dtype_name(rc.activation_dtype) +
                " is not supported (only bfloat16)");
  if (rc.combine_dtype != DType::kBF16)
    r.push_back(std::string("combine dtype ") + dtype_name(rc.combine_dtype) +
                " is not supported (only bfloat16)");
  if (!std::isfinite(rc.swiglu_alpha) || !std::isfinite(rc.swiglu_beta))
    r.push_back("swiglu_alpha = " + std::to_string(rc.swiglu_alpha) +
                " and swiglu_beta = " + std::to_string(rc.swiglu_beta) + " must be finite");
  // The CPU backend runs expert biases and any slope / offset of the activation; the CUDA
  // backend runs them with the recipes whose kernels have the extended epilogue.
  if (backend == Backend::kCUDA && !cuda_runs_extended_epilogue(c)) {
    if (rc.has_expert_bias) r.push_back(extended_epilogue_reason(c, "expert bias"));
    if (rc.has_custom_swiglu_alpha_beta || rc.swiglu_alpha != 1.0f || rc.swiglu_beta != 0.0f)
      r.push_back(extended_epilogue_reason(
          c, "a SwiGLU with alpha / beta other than 1 / 0 (swiglu_alpha = " +
                 std::to_string(rc.swiglu_alpha) +
                 ", swiglu_beta = " + std::to_string(rc.swiglu_beta) + ")"));
  }
  for (auto& why : plan_options_reasons(c.plan_options, rc.recipe)) r.push_back(std::move(why));
  if (!rc.weight_scheme.empty() && !parse_recipe(rc.weight_scheme))
    r.push_back("weight scheme '" + rc.weight_scheme +
                "' is not supported (only nvfp4, mxfp4_mxfp8, mxfp4_bf16, bf16, nvfp4_bf16)");
  if (rc.skip_final_all_reduce)
    r.push_back(
        "skip_final_all_reduce is not supported: the layer returns each token's full sum "
        "to its own rank (output_is_reduced), there is no all-reduce to skip or defer");
  if (rc.runtime_weight_transfer)
    r.push_back(
        "runtime weight transfer is not supported: weights are copied at construction; "
        "move experts in place through kernel_weights() (EPLB)");
  if (rc.dual_batch_overlap)
    r.push_back(
        "dual batch overlap is not supported: the calls of one layer (and of a "
        "workspace) run one after another in stream order");
  if (rc.fp8_mma && rc.recipe != Recipe::kMxfp4Mxfp8)
    r.push_back(std::string("fp8_mma is for the mxfp4_mxfp8 recipe, not ") +
                recipe_name(rc.recipe));
  const RecipeTraits t = recipe_traits(rc.recipe);
  if (t.weight_block && f.hidden_size % t.weight_block == 0 &&
      rc.intermediate_size % t.weight_block != 0)
    r.push_back("intermediate size I is not a multiple of the scale block " + s(t.weight_block));
  if (backend == Backend::kCUDA) {
    for (auto& why : cuda_backend_unsupported_reasons(c, world_size)) r.push_back(why);
  }
  return r;
}

Backend resolve_backend(Backend requested) {
  if (requested != Backend::kAuto) return requested;
  return cuda_backend_usable() ? Backend::kCUDA : Backend::kCPU;
}

}  // namespace moe_ep
