// Weight preparation (include/moe_ep/weight_prep.h): fp32 master weights -> packed checkpoint
// tensors, row by row with the block quantizers of formats.h, so the packs equal what the
// CPU reference and the GPU kernels compute from the same formulas.
#include "moe_ep/weight_prep.h"

#include <cmath>
#include <cstring>
#include <string>

#include "moe_ep/formats.h"
#include "moe_ep/status.h"

namespace moe_ep {
namespace {

[[noreturn]] void fail(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, what); }

// Largest |w| of one expert's tensor; rejects Inf/NaN (a checkpoint with them has no meaning
// under any recipe, and a global scale computed from them would poison every block).
float tensor_amax(const float* w, int64_t n, const char* name, int expert) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(w[i]);
    if (!std::isfinite(a))
      fail(std::string("pack_expert_weights: ") + name + " of expert " + std::to_string(expert) +
           " has a non-finite element at " + std::to_string(i) + " (" + std::to_string(w[i]) +
           "); master weights must be finite");
    amax = a > amax ? a : amax;
  }
  return amax;
}

// Per-expert global scale of an nvfp4 tensor: gs = amax / (6 * 448), so the largest block scale
// lands on the top of the E4M3 range. gs = 1 for an all-zero tensor; gs is floored at 2^-126 so
// that the row norm constant 1/gs stays finite for vanishingly small tensors.
float nvfp4_global_scale(float amax) {
  if (amax == 0.0f) return 1.0f;
  const float gs = amax / (fmt::kE2M1Max * fmt::kE4M3Max);
  const float kMinGs = 0x1p-126f;
  return gs < kMinGs ? kMinGs : gs;
}

// Quantizes `rows` rows of `cols` fp32 elements of one expert into packed 4-bit data and scales.
void quantize_rows_4bit(Recipe recipe, const float* w, int rows, int cols, float norm_const,
                        uint8_t* packed, uint8_t* scales) {
  const bool nv = recipe_traits(recipe).e4m3_scales;
  const int block = nv ? fmt::kNvfp4Block : fmt::kMxBlock;
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const float* x = w + int64_t(r) * cols;
    uint8_t* p = packed + int64_t(r) * (cols / 2);
    uint8_t* s = scales + int64_t(r) * (cols / block);
    if (nv)
      fmt::quantize_row_nvfp4(x, cols, norm_const, p, s);
    else
      fmt::quantize_row_mxfp4(x, cols, p, s);
  }
}

void to_bf16_bytes(const float* w, int64_t n, uint8_t* out) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t b = fmt::float_to_bf16(w[i]);
    std::memcpy(out + 2 * i, &b, 2);
  }
}

void check_range(const PackedExperts& p, int first, int& count, const char* what) {
  if (count < 0) count = p.num_experts - first;
  if (first < 0 || count < 0 || first + count > p.num_experts)
    fail(std::string("PackedExperts::") + what + ": experts [" + std::to_string(first) + ", " +
         std::to_string(first + count) + ") are outside [0, " + std::to_string(p.num_experts) +
         ")");
}

}  // namespace

PackedExperts pack_expert_weights(Recipe recipe, const float* w13, const float* w2, int num_experts,
                                  int hidden, int inter, float input_norm_const,
                                  const float* fc1_norm_const) {
  const std::string where = "pack_expert_weights(" + std::string(recipe_name(recipe)) + "): ";
  if (num_experts < 1) fail(where + "num_experts = " + std::to_string(num_experts) + " < 1");
  if (hidden < 1) fail(where + "hidden = " + std::to_string(hidden) + " < 1");
  if (inter < 1) fail(where + "inter = " + std::to_string(inter) + " < 1");
  if (!w13 || !w2) fail(where + "w13 and w2 must not be null");
  const RecipeTraits t = recipe_traits(recipe);
  if (t.weights_4bit) {
    if (hidden % t.weight_block)
      fail(where + "hidden = " + std::to_string(hidden) + " is not a multiple of the block " +
           std::to_string(t.weight_block));
    if (inter % t.weight_block)
      fail(where + "inter = " + std::to_string(inter) + " is not a multiple of the block " +
           std::to_string(t.weight_block));
  }
  if (recipe == Recipe::kNvfp4 && !(std::isfinite(input_norm_const) && input_norm_const > 0.0f))
    fail(where + "input_norm_const = " + std::to_string(input_norm_const) +
         " must be finite and > 0");

  PackedExperts p;
  p.recipe = recipe;
  p.num_experts = num_experts;
  p.hidden = hidden;
  p.inter = inter;
  const int E = num_experts, H = hidden, I = inter;
  const int64_t n13 = int64_t(2) * I * H, n2 = int64_t(H) * I;  // elements per expert
  p.fc1_alpha.assign(E, 1.0f);
  p.fc2_alpha.assign(E, 1.0f);
  p.fc1_norm_const.assign(E, 1.0f);

  if (!t.weights_4bit) {
    p.w13.resize(size_t(E * n13 * 2));
    p.w2.resize(size_t(E * n2 * 2));
    for (int e = 0; e < E; ++e) {
      tensor_amax(w13 + e * n13, n13, "w13", e);
      tensor_amax(w2 + e * n2, n2, "w2", e);
    }
    to_bf16_bytes(w13, E * n13, p.w13.data());
    to_bf16_bytes(w2, E * n2, p.w2.data());
    return p;
  }

  const int g = t.weight_block;
  p.w13.resize(size_t(E * n13 / 2));
  p.w2.resize(size_t(E * n2 / 2));
  p.w13_scale.resize(size_t(E * n13 / g));
  p.w2_scale.resize(size_t(E * n2 / g));
  for (int e = 0; e < E; ++e) {
    const float* a13 = w13 + e * n13;
    const float* a2 = w2 + e * n2;
    const float amax13 = tensor_amax(a13, n13, "w13", e);
    const float amax2 = tensor_amax(a2, n2, "w2", e);
    float nc13 = 1.0f, nc2 = 1.0f;
    if (recipe == Recipe::kNvfp4) {
      const float fc1_nc = fc1_norm_const ? fc1_norm_const[e] : 1.0f;
      if (!(std::isfinite(fc1_nc) && fc1_nc > 0.0f))
        fail(where + "fc1_norm_const[" + std::to_string(e) + "] = " + std::to_string(fc1_nc) +
             " must be finite and > 0");
      const float gs13 = nvfp4_global_scale(amax13), gs2 = nvfp4_global_scale(amax2);
      nc13 = 1.0f / gs13;
      nc2 = 1.0f / gs2;
      p.fc1_alpha[e] = gs13 / input_norm_const;
      p.fc2_alpha[e] = gs2 / fc1_nc;
      p.fc1_norm_const[e] = fc1_nc;
    } else if (recipe == Recipe::kNvfp4Bf16) {
      // Neither x nor h is quantized: the alphas are the global scales themselves.
      const float gs13 = nvfp4_global_scale(amax13), gs2 = nvfp4_global_scale(amax2);
      nc13 = 1.0f / gs13;
      nc2 = 1.0f / gs2;
      p.fc1_alpha[e] = gs13;
      p.fc2_alpha[e] = gs2;
    }
    quantize_rows_4bit(recipe, a13, 2 * I, H, nc13, p.w13.data() + e * n13 / 2,
                       p.w13_scale.data() + e * n13 / g);
    quantize_rows_4bit(recipe, a2, H, I, nc2, p.w2.data() + e * n2 / 2,
                       p.w2_scale.data() + e * n2 / g);
  }
  return p;
}

WeightPack PackedExperts::view(int first, int count) const {
  check_range(*this, first, count, "view");
  const RecipeTraits t = recipe_traits(recipe);
  const int64_t H = hidden, I = inter, n = count;
  const int64_t n13 = 2 * I * H, n2 = H * I;  // elements per expert
  auto bytes = [](const std::vector<uint8_t>& v, int64_t offset) {
    return const_cast<uint8_t*>(v.data()) + offset;
  };
  WeightPack w;
  if (!t.weights_4bit) {
    w.w13 = TensorView::contiguous(bytes(w13, first * n13 * 2), DType::kBF16, {n, 2 * I, H});
    w.w2 = TensorView::contiguous(bytes(w2, first * n2 * 2), DType::kBF16, {n, H, I});
    return w;
  }
  const int64_t g = t.weight_block;
  w.w13 = TensorView::contiguous(bytes(w13, first * n13 / 2), DType::kU8, {n, 2 * I, H / 2});
  w.w2 = TensorView::contiguous(bytes(w2, first * n2 / 2), DType::kU8, {n, H, I / 2});
  w.w13_scale =
      TensorView::contiguous(bytes(w13_scale, first * n13 / g), DType::kU8, {n, 2 * I, H / g});
  w.w2_scale = TensorView::contiguous(bytes(w2_scale, first * n2 / g), DType::kU8, {n, H, I / g});
  return w;
}

EpilogueVectors PackedExperts::epilogue_view(int first, int count) const {
  check_range(*this, first, count, "epilogue_view");
  auto vec = [&](const std::vector<float>& v) {
    return TensorView::contiguous(const_cast<float*>(v.data()) + first, DType::kF32,
                                  {int64_t(count)});
  };
  return {vec(fc1_alpha), vec(fc2_alpha), vec(fc1_norm_const)};
}

}  // namespace moe_ep
