// NVIDIA ModelOpt NVFP4 experts (docs/checkpoints.md §nvfp4): per expert and linear
// (gate_proj / up_proj / down_proj, Mixtral w1 / w3 / w2): weight u8 [out, in/2] (E2M1 pairs, the
// even element in the low nibble), weight_scale F8_E4M3 [out, in/16], weight_scale_2 f32 (the
// per-tensor global scale: w = e2m1 * weight_scale * weight_scale_2) and input_scale f32 (the
// activation's global scale: x is quantized as x / input_scale).
//
// The epilogue constants (vLLM's ModelOpt NVFP4 MoE method, process_weights_after_loading):
//   input_scale13   = max over every expert of the layer of its gate / up input_scale (one
//                     value for the layer, because every expert sees the same quantized x)
//   input_norm_const = 1 / input_scale13,  fc1_alpha[e] = input_scale13 * weight_scale_2_13[e]
//   fc1_norm_const[e] = 1 / down.input_scale[e],  fc2_alpha[e] = down.input_scale[e] *
//                       down.weight_scale_2[e]
// Gate and up of one expert share fc1_alpha: when their weight_scale_2 differ by a power of two,
// one half's E4M3 block scales are rescaled by it where that is exact for every byte; otherwise
// the expert is refused naming both values.
#include <cmath>
#include <cstring>
#include <sstream>

#include "checkpoint/expert_loaders.h"
#include "moe_ep/formats.h"

namespace moe_ep::io {
namespace {

std::string num(double v) {
  std::ostringstream o;
  o.precision(9);
  o << v;
  return o.str();
}

// The global scales of this rank's experts, gate and up folded to one value each.
struct Nvfp4GlobalScales {
  float input_scale13 = 1.0f;  // max over every expert of the layer
  std::vector<float> weight_scale2_13, weight_scale2_2, input_scale2;  // [count]
};

// The epilogue constants of the target recipe. nvfp4 quantizes the activations with the
// checkpoint's input scales; a recipe with bf16 activations (nvfp4_bf16) takes the weight
// scales alone: fc1_alpha = weight_scale2_13, fc2_alpha = weight_scale2_2, norm constants 1.
void nvfp4_epilogue(const Nvfp4GlobalScales& s, Recipe recipe, LoadedExperts& out) {
  PackedExperts& p = out.pack;
  const size_t C = s.weight_scale2_13.size();
  p.fc1_alpha.assign(C, 1.0f);
  p.fc2_alpha.assign(C, 1.0f);
  p.fc1_norm_const.assign(C, 1.0f);
  switch (recipe) {
    case Recipe::kNvfp4:
      out.input_norm_const = 1.0f / s.input_scale13;
      for (size_t k = 0; k < C; ++k) {
        p.fc1_alpha[k] = s.input_scale13 * s.weight_scale2_13[k];
        p.fc1_norm_const[k] = 1.0f / s.input_scale2[k];
        p.fc2_alpha[k] = s.input_scale2[k] * s.weight_scale2_2[k];
      }
      return;
    case Recipe::kNvfp4Bf16:
      out.input_norm_const = 1.0f;
      for (size_t k = 0; k < C; ++k) {
        p.fc1_alpha[k] = s.weight_scale2_13[k];
        p.fc2_alpha[k] = s.weight_scale2_2[k];
      }
      return;
    default:
      checkpoint_error(std::string("an NVFP4 checkpoint loads into the nvfp4_bf16 or nvfp4 ") +
                       "recipe, not " + recipe_name(recipe));
  }
}

// Multiplies every E4M3 scale byte by 2^shift when every result is exact; false (and `bytes`
// unchanged) otherwise.
bool rescale_e4m3_exactly(std::vector<uint8_t>& bytes, size_t begin, size_t n, int shift) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = fmt::e4m3_to_float(bytes[begin + i]);
    const float w = std::ldexp(v, shift);
    const uint8_t b = fmt::float_to_e4m3(w);
    if (!(fmt::e4m3_to_float(b) == w)) return false;
    out[i] = b;
  }
  std::memcpy(bytes.data() + begin, out.data(), n);
  return true;
}

// k with ldexp(a, k) == b exactly, if there is one.
bool power_of_two_ratio(float a, float b, int& k) {
  int ea = 0, eb = 0;
  const float ma = std::frexp(a, &ea), mb = std::frexp(b, &eb);
  if (ma != mb) return false;
  k = eb - ea;
  return std::ldexp(a, k) == b;
}

}  // namespace

LoadedExperts load_nvfp4_experts(const ModelDir& dir, const CheckpointInfo& info,
                                 const ExpertRange& range, Recipe recipe) {
  const ExpertNames n = expert_names(info, range.layer);
  const int64_t E = info.num_experts, H = info.hidden_size, I = info.moe_intermediate_size;
  if (H % 16 || I % 16)
    checkpoint_error("checkpoint " + dir.config_path() + ": hidden_size " + std::to_string(H) +
                     " and the experts' intermediate size " + std::to_string(I) +
                     " must be multiples of the NVFP4 group 16");
  const std::string why = "ModelOpt NVFP4 expert linear, E = " + std::to_string(E) +
                          ", H = hidden_size " + std::to_string(H) + ", I = " + std::to_string(I) +
                          " of config.json, group 16";
  struct Linear {
    const TensorRef *weight, *scale, *scale2, *input_scale;
  };
  std::vector<Linear> gate(E), up(E), down(E);
  std::set<std::string> expected;
  for (int e = 0; e < E; ++e) {
    for (auto [proj, out, rows, cols] :
         {std::tuple{&n.gate, &gate, I, H}, std::tuple{&n.up, &up, I, H},
          std::tuple{&n.down, &down, H, I}}) {
      const std::string base = n.expert(e, *proj);
      Linear& l = (*out)[size_t(e)];
      l.weight = &dir.require(base + ".weight", {"U8"}, {rows, cols / 2}, why);
      l.scale = &dir.require(base + ".weight_scale", {"F8_E4M3", "U8"}, {rows, cols / 16}, why);
      l.scale2 = &dir.require(base + ".weight_scale_2", {"F32"}, {}, why + ", a scalar");
      l.input_scale = &dir.require(base + ".input_scale", {"F32"}, {}, why + ", a scalar");
      for (const char* s : {".weight", ".weight_scale", ".weight_scale_2", ".input_scale"})
        expected.insert(base + s);
    }
  }
  reject_unexpected(dir, {n.per_expert, n.fused}, expected,
                    "a ModelOpt NVFP4 layer (weight, weight_scale, weight_scale_2, input_scale per "
                    "expert linear)");

  auto scalar = [&](const TensorRef& r, const std::string& name) {
    const float v = dir.read_float(r, 0);
    if (!(std::isfinite(v) && v > 0.0f))
      checkpoint_error("checkpoint file " + dir.shard_path(r.shard) + ": tensor '" + name +
                       "' value " + num(v) + ", expected a finite scale > 0");
    return v;
  };
  Nvfp4GlobalScales gs;
  gs.input_scale13 = 0.0f;
  for (int e = 0; e < E; ++e)
    for (auto [proj, l] : {std::pair{&n.gate, &gate}, std::pair{&n.up, &up}})
      gs.input_scale13 = std::max(gs.input_scale13, scalar(*(*l)[size_t(e)].input_scale,
                                                           n.expert(e, *proj + ".input_scale")));

  const int C = range.count;
  LoadedExperts out;
  PackedExperts& pk = out.pack;
  pk.recipe = recipe;
  pk.num_experts = C;
  pk.hidden = int(H);
  pk.inter = int(I);
  const size_t half = size_t(I) * size_t(H / 2), shalf = size_t(I) * size_t(H / 16);
  const size_t b2 = size_t(H) * size_t(I / 2), s2 = size_t(H) * size_t(I / 16);
  pk.w13.resize(size_t(C) * 2 * half);
  pk.w13_scale.resize(size_t(C) * 2 * shalf);
  pk.w2.resize(size_t(C) * b2);
  pk.w2_scale.resize(size_t(C) * s2);
  auto check_scale_bytes = [&](const TensorRef& r, const std::string& name, const uint8_t* b,
                               size_t count) {
    for (size_t i = 0; i < count; ++i)
      if ((b[i] & 0x7f) == 0x7f)
        checkpoint_error("checkpoint file " + dir.shard_path(r.shard) + ": tensor '" + name +
                         "' byte " + std::to_string(i) + " is " + std::to_string(b[i]) +
                         ", the NaN of E4M3; expected a finite block scale");
  };
  for (int k = 0; k < C; ++k) {
    const int e = range.first + k;
    const Linear &g = gate[size_t(e)], &u = up[size_t(e)], &d = down[size_t(e)];
    uint8_t* w13 = pk.w13.data() + size_t(k) * 2 * half;
    dir.read(*g.weight, 0, half, w13);
    dir.read(*u.weight, 0, half, w13 + half);
    const size_t s13 = size_t(k) * 2 * shalf;
    dir.read(*g.scale, 0, shalf, pk.w13_scale.data() + s13);
    dir.read(*u.scale, 0, shalf, pk.w13_scale.data() + s13 + shalf);
    check_scale_bytes(*g.scale, n.expert(e, n.gate + ".weight_scale"), pk.w13_scale.data() + s13,
                      shalf);
    check_scale_bytes(*u.scale, n.expert(e, n.up + ".weight_scale"),
                      pk.w13_scale.data() + s13 + shalf, shalf);
    dir.read(*d.weight, 0, b2, pk.w2.data() + size_t(k) * b2);
    dir.read(*d.scale, 0, s2, pk.w2_scale.data() + size_t(k) * s2);
    check_scale_bytes(*d.scale, n.expert(e, n.down + ".weight_scale"),
                      pk.w2_scale.data() + size_t(k) * s2, s2);

    const float wg = scalar(*g.scale2, n.expert(e, n.gate + ".weight_scale_2"));
    const float wu = scalar(*u.scale2, n.expert(e, n.up + ".weight_scale_2"));
    float w13_scale2 = wg;
    if (wg != wu) {
      int shift = 0;
      bool folded = false;
      if (power_of_two_ratio(wg, wu, shift)) {
        // up = e2m1 * s * wu = e2m1 * (s * 2^shift) * wg: fold into up's block scales, or the
        // other way round into gate's.
        if (rescale_e4m3_exactly(pk.w13_scale, s13 + shalf, shalf, shift)) {
          folded = true;
        } else if (rescale_e4m3_exactly(pk.w13_scale, s13, shalf, -shift)) {
          w13_scale2 = wu;
          folded = true;
        }
      }
      if (!folded)
        checkpoint_error(
            "checkpoint " + dir.dir() + ": layer " + std::to_string(range.layer) + " expert " +
            std::to_string(e) + ": gate weight_scale_2 " + num(wg) + " ('" +
            n.expert(e, n.gate + ".weight_scale_2") + "') and up weight_scale_2 " + num(wu) +
            " differ, and " +
            (power_of_two_ratio(wg, wu, shift)
                 ? "rescaling either half's E4M3 block scales by their ratio 2^" +
                       std::to_string(shift) + " is not exact for every byte"
                 : std::string("their ratio is not a power of two")) +
            "; fc1 has one alpha per expert, so this checkpoint cannot be loaded exactly");
    }
    gs.weight_scale2_13.push_back(w13_scale2);
    gs.weight_scale2_2.push_back(scalar(*d.scale2, n.expert(e, n.down + ".weight_scale_2")));
    gs.input_scale2.push_back(scalar(*d.input_scale, n.expert(e, n.down + ".input_scale")));
  }
  nvfp4_epilogue(gs, recipe, out);
  return out;
}

}  // namespace moe_ep::io
