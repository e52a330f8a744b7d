// gpt-oss MXFP4 experts (docs/checkpoints.md §mxfp4), as transformers' mxfp4 integration reads
// them (convert_moe_packed_tensors): {prefix}gate_up_proj_blocks u8 [E, 2I, H/32, 16] (E2M1
// pairs, the even element in the low nibble), gate_up_proj_scales u8 [E, 2I, H/32] (UE8M0,
// 2^(b - 127)), gate_up_proj_bias [E, 2I]; down_proj_blocks [E, H, I/32, 16], down_proj_scales
// [E, H, I/32], down_proj_bias [E, H]. Rows of gate_up are interleaved: gate = rows 0::2,
// up = rows 1::2. The bytes are contract §3.1's MXFP4 layout already; only the rows move.
#include <cstring>

#include "checkpoint/expert_loaders.h"
#include "moe_ep/formats.h"

namespace moe_ep::io {
namespace {

// A UE8M0 byte of 255 is NaN (OCP MX spec); a checkpoint holding one has no meaning.
void check_scales(const ModelDir& dir, const TensorRef& r, const std::string& name,
                  const uint8_t* bytes, size_t n, int first_expert, int64_t per_expert) {
  for (size_t i = 0; i < n; ++i)
    if (bytes[i] == 0xff)
      checkpoint_error("checkpoint file " + dir.shard_path(r.shard) + ": tensor '" + name +
                       "' expert " + std::to_string(first_expert + int64_t(i) / per_expert) +
                       " scale byte " + std::to_string(int64_t(i) % per_expert) +
                       " is 0xff, the NaN of UE8M0; expected a finite scale");
}

}  // namespace

LoadedExperts load_mxfp4_experts(const ModelDir& dir, const CheckpointInfo& info,
                                 const ExpertRange& range) {
  const ExpertNames n = expert_names(info, range.layer);
  const int64_t E = info.num_experts, H = info.hidden_size, I = info.moe_intermediate_size;
  const std::string why = "gpt-oss MXFP4 experts, E = " + std::to_string(E) + ", H = hidden_size " +
                          std::to_string(H) + ", I = intermediate_size " + std::to_string(I) +
                          " of config.json, blocks of 32";
  if (H % 32 || I % 32)
    checkpoint_error("checkpoint " + dir.config_path() + ": hidden_size " + std::to_string(H) +
                     " and intermediate_size " + std::to_string(I) +
                     " must be multiples of the MXFP4 block 32");
  const std::string p = n.fused;
  const TensorRef& gub =
      dir.require(p + "gate_up_proj_blocks", {"U8"}, {E, 2 * I, H / 32, 16}, why);
  const TensorRef& gus =
      dir.require(p + "gate_up_proj_scales", {"U8", "F8_E8M0"}, {E, 2 * I, H / 32}, why);
  const TensorRef& gubias = dir.require(p + "gate_up_proj_bias", {"BF16", "F32"}, {E, 2 * I}, why);
  const TensorRef& dnb = dir.require(p + "down_proj_blocks", {"U8"}, {E, H, I / 32, 16}, why);
  const TensorRef& dns =
      dir.require(p + "down_proj_scales", {"U8", "F8_E8M0"}, {E, H, I / 32}, why);
  const TensorRef& dnbias = dir.require(p + "down_proj_bias", {"BF16", "F32"}, {E, H}, why);
  reject_unexpected(dir, {p},
                    {p + "gate_up_proj_blocks", p + "gate_up_proj_scales", p + "gate_up_proj_bias",
                     p + "down_proj_blocks", p + "down_proj_scales", p + "down_proj_bias"},
                    "a gpt-oss MXFP4 layer");

  const int C = range.count;
  LoadedExperts out;
  PackedExperts& pk = out.pack;
  pk.recipe = Recipe::kMxfp4Bf16;
  pk.num_experts = C;
  pk.hidden = int(H);
  pk.inter = int(I);
  pk.fc1_alpha.assign(size_t(C), 1.0f);
  pk.fc2_alpha.assign(size_t(C), 1.0f);
  pk.fc1_norm_const.assign(size_t(C), 1.0f);

  // fc1: rows de-interleaved (checkpoint row 2j -> gate row j, 2j + 1 -> up row I + j).
  const size_t row13 = size_t(H / 2), srow13 = size_t(H / 32);
  std::vector<uint8_t> blocks(size_t(C) * 2 * I * row13), scales(size_t(C) * 2 * I * srow13);
  dir.read(gub, uint64_t(range.first) * 2 * I * row13, blocks.size(), blocks.data());
  dir.read(gus, uint64_t(range.first) * 2 * I * srow13, scales.size(), scales.data());
  check_scales(dir, gus, p + "gate_up_proj_scales", scales.data(), scales.size(), range.first,
               2 * I * int64_t(srow13));
  pk.w13.resize(blocks.size());
  pk.w13_scale.resize(scales.size());
  for (int k = 0; k < C; ++k)
    for (int64_t r = 0; r < 2 * I; ++r) {
      const int64_t dst = r % 2 == 0 ? r / 2 : I + r / 2;
      const size_t e13 = size_t(k) * 2 * size_t(I);
      std::memcpy(pk.w13.data() + (e13 + size_t(dst)) * row13,
                  blocks.data() + (e13 + size_t(r)) * row13, row13);
      std::memcpy(pk.w13_scale.data() + (e13 + size_t(dst)) * srow13,
                  scales.data() + (e13 + size_t(r)) * srow13, srow13);
    }
  // fc2: the layout as stored.
  const size_t row2 = size_t(I / 2), srow2 = size_t(I / 32);
  pk.w2.resize(size_t(C) * H * row2);
  pk.w2_scale.resize(size_t(C) * H * srow2);
  dir.read(dnb, uint64_t(range.first) * H * row2, pk.w2.size(), pk.w2.data());
  dir.read(dns, uint64_t(range.first) * H * srow2, pk.w2_scale.size(), pk.w2_scale.data());
  check_scales(dir, dns, p + "down_proj_scales", pk.w2_scale.data(), pk.w2_scale.size(),
               range.first, H * int64_t(srow2));

  // Biases: f32, fc1's de-interleaved like its rows.
  auto read_bias = [&](const TensorRef& r, int64_t width) {
    std::vector<float> v(size_t(C) * size_t(width));
    if (r.tensor->dtype == "F32") {
      dir.read(r, uint64_t(range.first) * width * 4, v.size() * 4,
               reinterpret_cast<uint8_t*>(v.data()));
    } else {
      std::vector<uint16_t> b(v.size());
      dir.read(r, uint64_t(range.first) * width * 2, b.size() * 2,
               reinterpret_cast<uint8_t*>(b.data()));
      for (size_t i = 0; i < b.size(); ++i) v[i] = fmt::bf16_to_float(b[i]);
    }
    return v;
  };
  const std::vector<float> b13 = read_bias(gubias, 2 * I);
  out.fc1_bias.resize(b13.size());
  for (int k = 0; k < C; ++k)
    for (int64_t j = 0; j < I; ++j) {
      const size_t base = size_t(k) * 2 * size_t(I);
      out.fc1_bias[base + size_t(j)] = b13[base + size_t(2 * j)];
      out.fc1_bias[base + size_t(I + j)] = b13[base + size_t(2 * j + 1)];
    }
  out.fc2_bias = read_bias(dnbias, H);
  return out;
}

}  // namespace moe_ep::io
