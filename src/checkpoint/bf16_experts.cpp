// bf16 expert weights in the three layouts transformers writes (docs/checkpoints.md §bf16):
//   per expert  {prefix}{e}.gate_proj.weight [I, H], up_proj [I, H], down_proj [H, I]
//               (Mixtral: w1 gate, w3 up, w2 down)
//   fused       {prefix}gate_up_proj [E, 2I, H] (gate rows, then up rows), down_proj [E, H, I]
//   gpt-oss     {prefix}gate_up_proj [E, H, 2I] (gate = columns 0::2, up = 1::2) with
//               gate_up_proj_bias [E, 2I], down_proj [E, I, H] with down_proj_bias [E, H]
#include <cstring>

#include "checkpoint/expert_loaders.h"
#include "moe_ep/formats.h"

namespace moe_ep::io {
namespace {

PackedExperts empty_bf16_pack(int count, int H, int I) {
  PackedExperts p;
  p.recipe = Recipe::kBf16;
  p.num_experts = count;
  p.hidden = H;
  p.inter = I;
  p.w13.resize(size_t(count) * 2 * I * H * 2);
  p.w2.resize(size_t(count) * H * I * 2);
  p.fc1_alpha.assign(size_t(count), 1.0f);
  p.fc2_alpha.assign(size_t(count), 1.0f);
  p.fc1_norm_const.assign(size_t(count), 1.0f);
  return p;
}

std::string dims(const CheckpointInfo& info) {
  return "E = " + std::to_string(info.num_experts) + ", H = hidden_size " +
         std::to_string(info.hidden_size) + ", I = " + std::to_string(info.moe_intermediate_size) +
         " of config.json";
}

LoadedExperts per_expert(const ModelDir& dir, const CheckpointInfo& info, const ExpertNames& n,
                         const ExpertRange& range) {
  const int64_t E = info.num_experts, H = info.hidden_size, I = info.moe_intermediate_size;
  const std::string why = "bf16 expert weight, " + dims(info);
  std::set<std::string> expected;
  std::vector<const TensorRef*> gate(E), up(E), down(E);
  for (int e = 0; e < E; ++e) {
    for (auto [proj, shape, out] : {std::tuple{&n.gate, std::vector<int64_t>{I, H}, &gate},
                                    std::tuple{&n.up, std::vector<int64_t>{I, H}, &up},
                                    std::tuple{&n.down, std::vector<int64_t>{H, I}, &down}}) {
      const std::string name = n.expert(e, *proj + ".weight");
      (*out)[size_t(e)] = &dir.require(name, {"BF16"}, shape, why);
      expected.insert(name);
    }
  }
  reject_unexpected(dir, {n.per_expert, n.fused}, expected,
                    "a bf16 per-expert layer (gate, up, down .weight per expert)");
  LoadedExperts out;
  out.pack = empty_bf16_pack(range.count, int(H), int(I));
  const uint64_t bytes = uint64_t(I * H * 2);
  for (int k = 0; k < range.count; ++k) {
    const int e = range.first + k;
    uint8_t* w13 = out.pack.w13.data() + size_t(k) * 2 * bytes;
    dir.read(*gate[size_t(e)], 0, bytes, w13);
    dir.read(*up[size_t(e)], 0, bytes, w13 + bytes);
    dir.read(*down[size_t(e)], 0, bytes, out.pack.w2.data() + size_t(k) * bytes);
  }
  return out;
}

LoadedExperts fused(const ModelDir& dir, const CheckpointInfo& info, const ExpertNames& n,
                    const ExpertRange& range) {
  const int64_t E = info.num_experts, H = info.hidden_size, I = info.moe_intermediate_size;
  const std::string why = "fused bf16 experts, " + dims(info);
  const TensorRef& gu = dir.require(n.fused + "gate_up_proj", {"BF16"}, {E, 2 * I, H}, why);
  const TensorRef& dn = dir.require(n.fused + "down_proj", {"BF16"}, {E, H, I}, why);
  reject_unexpected(dir, {n.per_expert, n.fused}, {n.fused + "gate_up_proj", n.fused + "down_proj"},
                    "a fused bf16 layer (gate_up_proj, down_proj)");
  LoadedExperts out;
  out.pack = empty_bf16_pack(range.count, int(H), int(I));
  const uint64_t b13 = uint64_t(2 * I * H * 2), b2 = uint64_t(H * I * 2);
  dir.read(gu, b13 * uint64_t(range.first), b13 * uint64_t(range.count), out.pack.w13.data());
  dir.read(dn, b2 * uint64_t(range.first), b2 * uint64_t(range.count), out.pack.w2.data());
  return out;
}

// A bias tensor of `count` experts x `n` values, from F32 or BF16.
std::vector<float> read_bias_rows(const ModelDir& dir, const TensorRef& r, int first, int count,
                                  int64_t n) {
  std::vector<float> out(size_t(count) * size_t(n));
  if (r.tensor->dtype == "F32") {
    dir.read(r, uint64_t(first) * n * 4, uint64_t(count) * n * 4,
             reinterpret_cast<uint8_t*>(out.data()));
  } else {
    std::vector<uint16_t> b(out.size());
    dir.read(r, uint64_t(first) * n * 2, uint64_t(count) * n * 2,
             reinterpret_cast<uint8_t*>(b.data()));
    for (size_t i = 0; i < b.size(); ++i) out[i] = fmt::bf16_to_float(b[i]);
  }
  return out;
}

LoadedExperts gpt_oss_bf16(const ModelDir& dir, const CheckpointInfo& info, const ExpertNames& n,
                           const ExpertRange& range) {
  const int64_t E = info.num_experts, H = info.hidden_size, I = info.moe_intermediate_size;
  const std::string why = "gpt-oss bf16 experts, " + dims(info);
  const TensorRef& gu = dir.require(n.fused + "gate_up_proj", {"BF16"}, {E, H, 2 * I}, why);
  const TensorRef& gub =
      dir.require(n.fused + "gate_up_proj_bias", {"BF16", "F32"}, {E, 2 * I}, why);
  const TensorRef& dn = dir.require(n.fused + "down_proj", {"BF16"}, {E, I, H}, why);
  const TensorRef& dnb = dir.require(n.fused + "down_proj_bias", {"BF16", "F32"}, {E, H}, why);
  reject_unexpected(dir, {n.fused},
                    {n.fused + "gate_up_proj", n.fused + "gate_up_proj_bias", n.fused + "down_proj",
                     n.fused + "down_proj_bias"},
                    "a gpt-oss bf16 layer");
  LoadedExperts out;
  out.pack = empty_bf16_pack(range.count, int(H), int(I));
  const int C = range.count;
  std::vector<uint16_t> src(size_t(C) * H * 2 * I);
  dir.read(gu, uint64_t(range.first) * H * 2 * I * 2, src.size() * 2,
           reinterpret_cast<uint8_t*>(src.data()));
  // w13[k][r][h]: gate row j is column 2j of [H, 2I], up row j column 2j + 1.
  auto* w13 = reinterpret_cast<uint16_t*>(out.pack.w13.data());
  for (int k = 0; k < C; ++k)
    for (int64_t j = 0; j < I; ++j)
      for (int64_t h = 0; h < H; ++h) {
        const uint16_t* s = src.data() + (size_t(k) * H + size_t(h)) * 2 * I;
        w13[(size_t(k) * 2 * I + size_t(j)) * H + size_t(h)] = s[2 * j];
        w13[(size_t(k) * 2 * I + size_t(I + j)) * H + size_t(h)] = s[2 * j + 1];
      }
  src.assign(size_t(C) * I * H, 0);
  dir.read(dn, uint64_t(range.first) * I * H * 2, src.size() * 2,
           reinterpret_cast<uint8_t*>(src.data()));
  auto* w2 = reinterpret_cast<uint16_t*>(out.pack.w2.data());
  for (int k = 0; k < C; ++k)  // w2[k][h][i] = down_proj[k][i][h]
    for (int64_t i = 0; i < I; ++i)
      for (int64_t h = 0; h < H; ++h)
        w2[(size_t(k) * H + size_t(h)) * I + size_t(i)] =
            src[(size_t(k) * I + size_t(i)) * H + size_t(h)];
  const std::vector<float> b13 = read_bias_rows(dir, gub, range.first, C, 2 * I);
  out.fc1_bias.resize(b13.size());
  for (int k = 0; k < C; ++k)
    for (int64_t j = 0; j < I; ++j) {
      out.fc1_bias[size_t(k) * 2 * I + size_t(j)] = b13[size_t(k) * 2 * I + size_t(2 * j)];
      out.fc1_bias[size_t(k) * 2 * I + size_t(I + j)] = b13[size_t(k) * 2 * I + size_t(2 * j + 1)];
    }
  out.fc2_bias = read_bias_rows(dir, dnb, range.first, C, H);
  return out;
}

}  // namespace

LoadedExperts load_bf16_experts(const ModelDir& dir, const CheckpointInfo& info,
                                const ExpertRange& range) {
  const ExpertNames n = expert_names(info, range.layer);
  if (info.model_type == "gpt_oss") return gpt_oss_bf16(dir, info, n, range);
  if (dir.find(n.expert(0, n.gate + ".weight"))) return per_expert(dir, info, n, range);
  if (dir.find(n.fused + "gate_up_proj")) return fused(dir, info, n, range);
  checkpoint_error("checkpoint " + dir.dir() + ": layer " + std::to_string(range.layer) +
                   " has no expert weights: neither '" + n.expert(0, n.gate + ".weight") +
                   "' (one tensor per expert) nor '" + n.fused +
                   "gate_up_proj' (fused experts) is present");
}

}  // namespace moe_ep::io
