// The checkpoint loaders (include/moe_ep/checkpoint.h) on tiny model directories written here:
// every format and layout, one file and sharded with an index, rank slicing at W = 1, 2, 4
// (bitwise against the written bytes, and only the rank's bytes read), the epilogue constants,
// the routers, and every rejection.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/json.h"
#include "checkpoint_test_util.h"
#include "expect_mentions.h"
#include "moe_ep/checkpoint.h"
#include "moe_ep/formats.h"
#include "moe_ep/status.h"

namespace moe_ep::test {
namespace {

constexpr int kE = 4, kH = 64, kI = 64, kK = 2, kL = 2;

std::string qwen3_config(const std::string& extra = "") {
  return R"({"model_type":"qwen3_moe","hidden_size":64,"moe_intermediate_size":64,)"
         R"("num_experts":4,"num_experts_per_tok":2,"num_hidden_layers":2,"norm_topk_prob":true)" +
         extra + "}";
}
std::string mixtral_config() {
  return R"({"model_type":"mixtral","hidden_size":64,"intermediate_size":64,)"
         R"("num_local_experts":4,"num_experts_per_tok":2,"num_hidden_layers":2})";
}
std::string gpt_oss_config(bool mxfp4) {
  return std::string(R"({"model_type":"gpt_oss","hidden_size":64,"intermediate_size":64,)"
                     R"("num_local_experts":4,"num_experts_per_tok":2,"num_hidden_layers":2,)"
                     R"("swiglu_limit":7.0)") +
         (mxfp4 ? R"(,"quantization_config":{"quant_method":"mxfp4"}})" : "}");
}
std::string dsv3_config() {
  return R"({"model_type":"deepseek_v3","hidden_size":64,"moe_intermediate_size":64,)"
         R"("n_routed_experts":4,"num_experts_per_tok":2,"num_hidden_layers":3,)"
         R"("first_k_dense_replace":1,"n_group":2,"topk_group":1,"norm_topk_prob":true,)"
         R"("routed_scaling_factor":2.5,"scoring_func":"sigmoid"})";
}
const char* kModelOptQuant =
    R"({"producer":{"name":"modelopt","version":"0.31.0"},)"
    R"("quantization":{"quant_algo":"NVFP4","kv_cache_quant_algo":null,"group_size":16,)"
    R"("exclude_modules":["lm_head"]}})";

std::string layer_prefix(int l) { return "model.layers." + std::to_string(l) + "."; }

// Per-expert bf16 experts of every layer under `experts` ("mlp.experts." or
// "block_sparse_moe.experts.") with projection names g / u / d.
void add_per_expert_bf16(ModelDirWriter& w, const std::string& experts, const char* g,
                         const char* u, const char* d, int layers = kL, int first = 0) {
  for (int l = first; l < layers; ++l)
    for (int e = 0; e < kE; ++e) {
      const std::string p = layer_prefix(l) + experts + std::to_string(e) + ".";
      w.add_bf16(p + g + ".weight", {kI, kH});
      w.add_bf16(p + u + ".weight", {kI, kH});
      w.add_bf16(p + d + ".weight", {kH, kI});
    }
}

std::vector<uint8_t> cat(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  std::vector<uint8_t> o = a;
  o.insert(o.end(), b.begin(), b.end());
  return o;
}

std::vector<uint8_t> slice(const std::vector<uint8_t>& v, size_t begin, size_t n) {
  return std::vector<uint8_t>(v.begin() + long(begin), v.begin() + long(begin + n));
}

std::string load_error(const std::string& dir, int layer = 0,
                       std::optional<Recipe> recipe = std::nullopt, int W = 1, int rank = 0) {
  try {
    Checkpoint c(dir);
    c.load_layer(layer, recipe, W, rank);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return e.what();
  }
  return "";
}

// --- bf16 ------------------------------------------------------------------------------------

TEST(Checkpoint, Qwen3PerExpertBf16LoadsBitwiseAndReadsOnlyTheRanksExperts) {
  for (int shards : {1, 3}) {
    SCOPED_TRACE("shards " + std::to_string(shards));
    ModelDirWriter w;
    add_per_expert_bf16(w, "mlp.experts.", "gate_proj", "up_proj", "down_proj");
    w.add_bf16("model.embed_tokens.weight", {16, kH});
    w.write(qwen3_config(), shards);
    Checkpoint c(w.dir);
    const CheckpointInfo& info = c.info();
    EXPECT_EQ(info.model_type, "qwen3_moe");
    EXPECT_EQ(info.weight_format, "bf16");
    EXPECT_EQ(info.native_recipe, Recipe::kBf16);
    EXPECT_EQ(info.moe_layers, (std::vector<int>{0, 1}));
    EXPECT_EQ(info.num_experts, kE);
    EXPECT_EQ(info.top_k, kK);
    EXPECT_EQ(c.bytes_read(), 0u);  // the constructor reads headers only
    for (int W : {1, 2, 4}) {
      for (int r = 0; r < W; ++r) {
        const uint64_t before = c.bytes_read();
        const LayerCheckpoint lc = c.load_layer(1, std::nullopt, W, r);
        const int El = kE / W;
        EXPECT_EQ(c.bytes_read() - before, uint64_t(El) * 3 * kI * kH * 2) << "W " << W;
        EXPECT_EQ(lc.config.fleet.num_experts, kE);
        EXPECT_EQ(lc.config.recipe.intermediate_size, kI);
        EXPECT_EQ(lc.experts.num_experts, El);
        for (int k = 0; k < El; ++k) {
          const std::string p = layer_prefix(1) + "mlp.experts." + std::to_string(r * El + k) + ".";
          const size_t b13 = size_t(2) * kI * kH * 2, b2 = size_t(kH) * kI * 2;
          EXPECT_EQ(slice(lc.experts.w13, k * b13, b13),
                    cat(w.bytes(p + "gate_proj.weight"), w.bytes(p + "up_proj.weight")))
              << "W " << W << " rank " << r << " expert " << k;
          EXPECT_EQ(slice(lc.experts.w2, k * b2, b2), w.bytes(p + "down_proj.weight"));
        }
        EXPECT_TRUE(lc.fc1_bias.empty());
        const WeightPack wp = lc.weights();
        EXPECT_EQ(wp.w13.dtype, DType::kBF16);
        EXPECT_EQ(wp.w13.shape[0], El);
      }
    }
  }
}

TEST(Checkpoint, Qwen3ExpertCountUnderEitherName) {
  // transformers 5 may write Qwen3-MoE's num_experts as num_local_experts.
  ModelDirWriter w;
  add_per_expert_bf16(w, "mlp.experts.", "gate_proj", "up_proj", "down_proj");
  std::string cfg = qwen3_config();
  cfg.replace(cfg.find("\"num_experts\""), 13, "\"num_local_experts\"");
  w.write(cfg);
  Checkpoint c(w.dir);
  EXPECT_EQ(c.info().num_experts, kE);
  EXPECT_EQ(c.load_layer(0, std::nullopt, 2, 1).experts.num_experts, 2);
  w.write(R"({"model_type":"qwen3_moe","hidden_size":64,"moe_intermediate_size":64,)"
          R"("num_experts_per_tok":2,"num_hidden_layers":2})");
  EXPECT_MENTIONS(load_error(w.dir), "num_experts or num_local_experts is required");
}

TEST(Checkpoint, MixtralW1IsGateW3IsUpW2IsDown) {
  ModelDirWriter w;
  add_per_expert_bf16(w, "block_sparse_moe.experts.", "w1", "w3", "w2");
  w.write(mixtral_config());
  Checkpoint c(w.dir);
  EXPECT_TRUE(c.info().norm_topk_prob);
  const LayerCheckpoint lc = c.load_layer(0, std::nullopt, 2, 1);
  const std::string p = layer_prefix(0) + "block_sparse_moe.experts.2.";
  EXPECT_EQ(slice(lc.experts.w13, 0, size_t(2) * kI * kH * 2),
            cat(w.bytes(p + "w1.weight"), w.bytes(p + "w3.weight")));
  EXPECT_EQ(slice(lc.experts.w2, 0, size_t(kH) * kI * 2), w.bytes(p + "w2.weight"));
}

TEST(Checkpoint, FusedExpertsLoadTheirRowRangeOnly) {
  ModelDirWriter w;
  for (int l = 0; l < kL; ++l) {
    w.add_bf16(layer_prefix(l) + "mlp.experts.gate_up_proj", {kE, 2 * kI, kH});
    w.add_bf16(layer_prefix(l) + "mlp.experts.down_proj", {kE, kH, kI});
  }
  w.write(qwen3_config(), 2);
  Checkpoint c(w.dir);
  for (int r = 0; r < 4; ++r) {
    const uint64_t before = c.bytes_read();
    const LayerCheckpoint lc = c.load_layer(0, std::nullopt, 4, r);
    EXPECT_EQ(c.bytes_read() - before, uint64_t(3) * kI * kH * 2);
    const size_t b13 = size_t(2) * kI * kH * 2, b2 = size_t(kH) * kI * 2;
    EXPECT_EQ(lc.experts.w13,
              slice(w.bytes(layer_prefix(0) + "mlp.experts.gate_up_proj"), r * b13, b13));
    EXPECT_EQ(lc.experts.w2, slice(w.bytes(layer_prefix(0) + "mlp.experts.down_proj"), r * b2, b2));
  }
}

TEST(Checkpoint, DeepSeekV3FirstDenseLayersHaveNoExperts) {
  ModelDirWriter w;
  add_per_expert_bf16(w, "mlp.experts.", "gate_proj", "up_proj", "down_proj", 3, 1);
  w.write(dsv3_config());
  Checkpoint c(w.dir);
  EXPECT_EQ(c.info().moe_layers, (std::vector<int>{1, 2}));
  EXPECT_EQ(c.info().router, "sigmoid_group_topk");
  EXPECT_FLOAT_EQ(c.info().routed_scaling_factor, 2.5f);
  EXPECT_MENTIONS(load_error(w.dir, 0), "layer 0 has no routed experts", "1, 2");
  EXPECT_EQ(load_error(w.dir, 2), "");
}

TEST(Checkpoint, Bf16PacksIntoEveryRecipeAsThePackerDoes) {
  ModelDirWriter w;
  add_per_expert_bf16(w, "mlp.experts.", "gate_proj", "up_proj", "down_proj");
  w.write(qwen3_config());
  Checkpoint c(w.dir);
  const LayerCheckpoint bf = c.load_layer(0, Recipe::kBf16, 2, 1);
  std::vector<float> w13(bf.experts.w13.size() / 2), w2(bf.experts.w2.size() / 2);
  for (size_t i = 0; i < w13.size(); ++i) {
    uint16_t v;
    std::memcpy(&v, bf.experts.w13.data() + 2 * i, 2);
    w13[i] = fmt::bf16_to_float(v);
  }
  for (size_t i = 0; i < w2.size(); ++i) {
    uint16_t v;
    std::memcpy(&v, bf.experts.w2.data() + 2 * i, 2);
    w2[i] = fmt::bf16_to_float(v);
  }
  for (Recipe r : {Recipe::kNvfp4, Recipe::kMxfp4Mxfp8, Recipe::kMxfp4Bf16}) {
    SCOPED_TRACE(recipe_name(r));
    const LayerCheckpoint lc = c.load_layer(0, r, 2, 1);
    const PackedExperts ref = pack_expert_weights(r, w13.data(), w2.data(), 2, kH, kI);
    EXPECT_EQ(lc.config.recipe.recipe, r);
    EXPECT_EQ(lc.experts.w13, ref.w13);
    EXPECT_EQ(lc.experts.w13_scale, ref.w13_scale);
    EXPECT_EQ(lc.experts.w2, ref.w2);
    EXPECT_EQ(lc.experts.w2_scale, ref.w2_scale);
    EXPECT_EQ(lc.experts.fc1_alpha, ref.fc1_alpha);
    EXPECT_EQ(lc.experts.fc2_alpha, ref.fc2_alpha);
  }
}

// --- gpt-oss ---------------------------------------------------------------------------------

void add_gpt_oss_mxfp4(ModelDirWriter& w) {
  for (int l = 0; l < kL; ++l) {
    const std::string p = layer_prefix(l) + "mlp.experts.";
    w.add_bytes(p + "gate_up_proj_blocks", "U8", {kE, 2 * kI, kH / 32, 16});
    w.add_bytes(p + "gate_up_proj_scales", "U8", {kE, 2 * kI, kH / 32}, 118, 126);
    w.add_bf16(p + "gate_up_proj_bias", {kE, 2 * kI});
    w.add_bytes(p + "down_proj_blocks", "U8", {kE, kH, kI / 32, 16});
    w.add_bytes(p + "down_proj_scales", "U8", {kE, kH, kI / 32}, 118, 126);
    w.add_bf16(p + "down_proj_bias", {kE, kH});
    w.add_bf16(layer_prefix(l) + "mlp.router.weight", {kE, kH});
    w.add_bf16(layer_prefix(l) + "mlp.router.bias", {kE});
  }
}

float bf16_at(const std::vector<uint8_t>& b, size_t i) {
  uint16_t v;
  std::memcpy(&v, b.data() + 2 * i, 2);
  return fmt::bf16_to_float(v);
}

TEST(Checkpoint, GptOssMxfp4DeinterleavesGateAndUpRowsScalesAndBiases) {
  ModelDirWriter w;
  add_gpt_oss_mxfp4(w);
  w.write(gpt_oss_config(true), 2);
  Checkpoint c(w.dir);
  const CheckpointInfo& info = c.info();
  EXPECT_EQ(info.weight_format, "mxfp4");
  EXPECT_EQ(info.native_recipe, Recipe::kMxfp4Bf16);
  EXPECT_EQ(info.swiglu_limit, 7.0f);
  EXPECT_FLOAT_EQ(info.swiglu_alpha, 1.702f);
  EXPECT_EQ(info.swiglu_beta, 1.0f);
  EXPECT_TRUE(info.has_expert_bias);
  const std::string p = layer_prefix(1) + "mlp.experts.";
  for (int W : {1, 2, 4}) {
    for (int r = 0; r < W; ++r) {
      const int El = kE / W;
      const uint64_t before = c.bytes_read();
      const LayerCheckpoint lc = c.load_layer(1, Recipe::kMxfp4Mxfp8, W, r);
      const uint64_t per_expert =
          uint64_t(2 * kI) * (kH / 2 + kH / 32 + 2) + uint64_t(kH) * (kI / 2 + kI / 32 + 2);
      EXPECT_EQ(c.bytes_read() - before, per_expert * El);
      EXPECT_EQ(lc.config.recipe.recipe, Recipe::kMxfp4Mxfp8);
      EXPECT_EQ(lc.config.recipe.swiglu_limit, 7.0f);
      EXPECT_TRUE(lc.config.recipe.has_expert_bias);
      const auto& blocks = w.bytes(p + "gate_up_proj_blocks");
      const auto& scales = w.bytes(p + "gate_up_proj_scales");
      const auto& bias = w.bytes(p + "gate_up_proj_bias");
      for (int k = 0; k < El; ++k) {
        const int e = r * El + k;
        for (int j = 0; j < kI; ++j) {
          const size_t row = kH / 2, srow = kH / 32;
          const size_t src_g = (size_t(e) * 2 * kI + 2 * j), src_u = src_g + 1;
          const size_t dst_g = size_t(k) * 2 * kI + j, dst_u = dst_g + kI;
          ASSERT_EQ(slice(lc.experts.w13, dst_g * row, row), slice(blocks, src_g * row, row));
          ASSERT_EQ(slice(lc.experts.w13, dst_u * row, row), slice(blocks, src_u * row, row));
          ASSERT_EQ(slice(lc.experts.w13_scale, dst_g * srow, srow),
                    slice(scales, src_g * srow, srow));
          ASSERT_EQ(slice(lc.experts.w13_scale, dst_u * srow, srow),
                    slice(scales, src_u * srow, srow));
          ASSERT_EQ(lc.fc1_bias[dst_g], bf16_at(bias, src_g));
          ASSERT_EQ(lc.fc1_bias[dst_u], bf16_at(bias, src_u));
        }
        const size_t b2 = size_t(kH) * kI / 2, s2 = size_t(kH) * kI / 32;
        EXPECT_EQ(slice(lc.experts.w2, k * b2, b2),
                  slice(w.bytes(p + "down_proj_blocks"), e * b2, b2));
        EXPECT_EQ(slice(lc.experts.w2_scale, k * s2, s2),
                  slice(w.bytes(p + "down_proj_scales"), e * s2, s2));
        for (int h = 0; h < kH; ++h)
          ASSERT_EQ(lc.fc2_bias[size_t(k) * kH + h],
                    bf16_at(w.bytes(p + "down_proj_bias"), size_t(e) * kH + h));
      }
      const EpilogueVectors ep = lc.epilogue();
      EXPECT_EQ(ep.fc1_bias.shape[0], El);
      EXPECT_EQ(ep.fc1_bias.shape[1], 2 * kI);
      EXPECT_EQ(ep.fc2_bias.shape[1], kH);
    }
  }
  EXPECT_MENTIONS(load_error(w.dir, 0, Recipe::kBf16), "mxfp4 checkpoint", "bf16 recipe");
  EXPECT_MENTIONS(load_error(w.dir, 0, Recipe::kNvfp4), "nvfp4 recipe");
}

TEST(Checkpoint, GptOssBf16TransposesAndDeinterleaves) {
  ModelDirWriter w;
  for (int l = 0; l < kL; ++l) {
    const std::string p = layer_prefix(l) + "mlp.experts.";
    w.add_bf16(p + "gate_up_proj", {kE, kH, 2 * kI});
    w.add_bf16(p + "gate_up_proj_bias", {kE, 2 * kI});
    w.add_bf16(p + "down_proj", {kE, kI, kH});
    w.add_bf16(p + "down_proj_bias", {kE, kH});
  }
  w.write(gpt_oss_config(false));
  Checkpoint c(w.dir);
  EXPECT_EQ(c.info().weight_format, "bf16");
  const LayerCheckpoint lc = c.load_layer(0, std::nullopt, 2, 1);
  const std::string p = layer_prefix(0) + "mlp.experts.";
  const auto& gu = w.bytes(p + "gate_up_proj");
  const auto& dn = w.bytes(p + "down_proj");
  for (int k = 0; k < 2; ++k) {
    const size_t e = size_t(2 + k);
    for (int j = 0; j < kI; ++j)
      for (int h = 0; h < kH; ++h) {
        ASSERT_EQ(bf16_at(lc.experts.w13, (size_t(k) * 2 * kI + j) * kH + h),
                  bf16_at(gu, (e * kH + h) * 2 * kI + 2 * j));
        ASSERT_EQ(bf16_at(lc.experts.w13, (size_t(k) * 2 * kI + kI + j) * kH + h),
                  bf16_at(gu, (e * kH + h) * 2 * kI + 2 * j + 1));
        ASSERT_EQ(bf16_at(lc.experts.w2, (size_t(k) * kH + h) * kI + j),
                  bf16_at(dn, (e * kI + j) * kH + h));
      }
    for (int j = 0; j < kI; ++j)
      ASSERT_EQ(lc.fc1_bias[size_t(k) * 2 * kI + kI + j],
                bf16_at(w.bytes(p + "gate_up_proj_bias"), e * 2 * kI + 2 * j + 1));
  }
}

// --- ModelOpt NVFP4 --------------------------------------------------------------------------

// E4M3 scale bytes in [0x20, 0x50] (finite, positive), u8 weights.
void add_modelopt(ModelDirWriter& w, const std::vector<float>& in_gate,
                  const std::vector<float>& in_down, float ws2_gate = 0.01f, float ws2_up = 0.01f) {
  for (int l = 0; l < kL; ++l)
    for (int e = 0; e < kE; ++e) {
      const std::string p = layer_prefix(l) + "mlp.experts." + std::to_string(e) + ".";
      for (auto [proj, rows, cols] :
           {std::tuple{"gate_proj", kI, kH}, std::tuple{"up_proj", kI, kH},
            std::tuple{"down_proj", kH, kI}}) {
        const std::string b = p + proj;
        w.add_bytes(b + ".weight", "U8", {rows, cols / 2});
        w.add_bytes(b + ".weight_scale", "F8_E4M3", {rows, cols / 16}, 0x20, 0x50);
        const bool down = std::string(proj) == "down_proj";
        const float ws2 = down                             ? 0.02f * float(e + 1)
                          : std::string(proj) == "up_proj" ? ws2_up
                                                           : ws2_gate;
        w.add_f32(b + ".weight_scale_2", {}, {ws2});
        w.add_f32(b + ".input_scale", {}, {down ? in_down[size_t(e)] : in_gate[size_t(e)]});
      }
    }
}

TEST(Checkpoint, ModelOptNvfp4BytesAlphasAndNormConstants) {
  ModelDirWriter w;
  const std::vector<float> in_gate = {0.5f, 2.0f, 0.25f, 1.5f}, in_down = {0.1f, 0.2f, 0.3f, 0.4f};
  add_modelopt(w, in_gate, in_down);
  w.write(qwen3_config(), 2);
  w.write_text("hf_quant_config.json", kModelOptQuant);
  Checkpoint c(w.dir);
  EXPECT_EQ(c.info().weight_format, "nvfp4");
  EXPECT_EQ(c.info().native_recipe, Recipe::kNvfp4Bf16);
  // nvfp4_bf16 (the native recipe: bf16 activations): the alphas are the weights' global
  // scales, no activation scale.
  for (int W : {1, 2}) {
    const int El = kE / W;
    const LayerCheckpoint lc = c.load_layer(1, std::nullopt, W, W - 1);
    EXPECT_EQ(lc.config.recipe.recipe, Recipe::kNvfp4Bf16);
    EXPECT_EQ(lc.config.recipe.input_norm_const, 1.0f);
    for (int k = 0; k < El; ++k) {
      const int e = (W - 1) * El + k;
      EXPECT_EQ(lc.experts.fc1_alpha[size_t(k)], 0.01f);
      EXPECT_EQ(lc.experts.fc1_norm_const[size_t(k)], 1.0f);
      EXPECT_EQ(lc.experts.fc2_alpha[size_t(k)], 0.02f * float(e + 1));
    }
  }
  // nvfp4 (activations quantized with the checkpoint's input scales).
  for (int W : {1, 2, 4})
    for (int r = 0; r < W; ++r) {
      const int El = kE / W;
      const LayerCheckpoint lc = c.load_layer(1, Recipe::kNvfp4, W, r);
      // One input scale for the layer: the largest over every expert (2.0, expert 1).
      EXPECT_EQ(lc.config.recipe.input_norm_const, 1.0f / 2.0f);
      for (int k = 0; k < El; ++k) {
        const int e = r * El + k;
        EXPECT_EQ(lc.experts.fc1_alpha[size_t(k)], 2.0f * 0.01f);
        EXPECT_EQ(lc.experts.fc1_norm_const[size_t(k)], 1.0f / in_down[size_t(e)]);
        EXPECT_EQ(lc.experts.fc2_alpha[size_t(k)], in_down[size_t(e)] * (0.02f * float(e + 1)));
        const std::string p = layer_prefix(1) + "mlp.experts." + std::to_string(e) + ".";
        const size_t half = size_t(kI) * kH / 2, sh = size_t(kI) * kH / 16;
        EXPECT_EQ(slice(lc.experts.w13, k * 2 * half, 2 * half),
                  cat(w.bytes(p + "gate_proj.weight"), w.bytes(p + "up_proj.weight")));
        EXPECT_EQ(slice(lc.experts.w13_scale, k * 2 * sh, 2 * sh),
                  cat(w.bytes(p + "gate_proj.weight_scale"), w.bytes(p + "up_proj.weight_scale")));
        EXPECT_EQ(slice(lc.experts.w2, k * half, half), w.bytes(p + "down_proj.weight"));
        EXPECT_EQ(slice(lc.experts.w2_scale, k * sh, sh), w.bytes(p + "down_proj.weight_scale"));
      }
    }
  EXPECT_MENTIONS(load_error(w.dir, 0, Recipe::kBf16), "nvfp4 checkpoint", "bf16 recipe");
}

TEST(Checkpoint, ModelOptNvfp4GateUpScalesFoldWhenExactElseRefused) {
  const std::vector<float> ones(kE, 1.0f);
  {
    ModelDirWriter w;  // up = 2 x gate: up's block scales doubled (exact for bytes <= 0x50)
    add_modelopt(w, ones, ones, 0.01f, 0.02f);
    w.write(qwen3_config());
    w.write_text("hf_quant_config.json", kModelOptQuant);
    Checkpoint c(w.dir);
    const LayerCheckpoint lc = c.load_layer(0);
    const size_t sh = size_t(kI) * kH / 16;
    for (int e = 0; e < kE; ++e) {
      const std::string p = layer_prefix(0) + "mlp.experts." + std::to_string(e) + ".";
      EXPECT_EQ(lc.experts.fc1_alpha[size_t(e)], 0.01f);
      const auto& up = w.bytes(p + "up_proj.weight_scale");
      for (size_t i = 0; i < sh; ++i)
        ASSERT_EQ(fmt::e4m3_to_float(lc.experts.w13_scale[e * 2 * sh + sh + i]),
                  2.0f * fmt::e4m3_to_float(up[i]));
      EXPECT_EQ(slice(lc.experts.w13_scale, e * 2 * sh, sh), w.bytes(p + "gate_proj.weight_scale"));
    }
  }
  {
    ModelDirWriter w;  // up = 3 x gate: no exact fold
    add_modelopt(w, ones, ones, 0.01f, 0.03f);
    w.write(qwen3_config());
    w.write_text("hf_quant_config.json", kModelOptQuant);
    EXPECT_MENTIONS(load_error(w.dir), "gate weight_scale_2 0.00999999",
                    "up weight_scale_2 0.0299999", "not a power of two", "expert 0");
  }
}

// --- routers ---------------------------------------------------------------------------------

// x = e_0, so the logits are the router weight's column 0.
std::vector<float> unit_x() {
  std::vector<float> x(kH, 0.0f);
  x[0] = 1.0f;
  return x;
}
void add_router_column(ModelDirWriter& w, const std::string& name, const std::vector<float>& col) {
  std::vector<float> m(size_t(kE) * kH, 0.0f);
  for (int e = 0; e < kE; ++e) m[size_t(e) * kH] = col[size_t(e)];
  w.add_f32(name, {kE, kH}, m);
}

TEST(Checkpoint, RoutersOfTheFourFamilies) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, -1.0f};
  const std::vector<float> x = unit_x();
  int32_t ids[kK];
  float wt[kK];
  {  // Qwen3-MoE: softmax over all, top-2, renormalized
    ModelDirWriter w;
    add_per_expert_bf16(w, "mlp.experts.", "gate_proj", "up_proj", "down_proj");
    for (int l = 0; l < kL; ++l) add_router_column(w, layer_prefix(l) + "mlp.gate.weight", logits);
    w.write(qwen3_config());
    Checkpoint(w.dir).route(1, x.data(), 1, ids, wt);
    EXPECT_EQ(ids[0], 1);
    EXPECT_EQ(ids[1], 2);
    EXPECT_NEAR(wt[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
    EXPECT_NEAR(wt[0] + wt[1], 1.0, 1e-6);
  }
  {  // gpt-oss: top-2 of logits + bias, softmax over those two
    ModelDirWriter w;
    add_gpt_oss_mxfp4(w);
    for (int l = 0; l < kL; ++l) {
      add_router_column(w, layer_prefix(l) + "mlp.router.weight", logits);
      w.add_f32(layer_prefix(l) + "mlp.router.bias", {kE}, {0.0f, 0.0f, 0.0f, 5.0f});
    }
    w.write(gpt_oss_config(true));
    Checkpoint(w.dir).route(0, x.data(), 1, ids, wt);
    EXPECT_EQ(ids[0], 3);  // -1 + 5
    EXPECT_EQ(ids[1], 1);
    EXPECT_NEAR(wt[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  }
  {  // DeepSeek-V3: groups {0, 1}, {2, 3}; one group chosen by its two best corrected scores
    ModelDirWriter w;
    add_per_expert_bf16(w, "mlp.experts.", "gate_proj", "up_proj", "down_proj", 3, 1);
    for (int l = 1; l < 3; ++l) {
      add_router_column(w, layer_prefix(l) + "mlp.gate.weight", logits);
      // The correction lifts group {2, 3} above {0, 1}; the weights stay the uncorrected scores.
      w.add_f32(layer_prefix(l) + "mlp.gate.e_score_correction_bias", {kE}, {0, 0, 0.5f, 0.5f});
    }
    w.write(dsv3_config());
    Checkpoint(w.dir).route(2, x.data(), 1, ids, wt);
    EXPECT_EQ(ids[0], 2);
    EXPECT_EQ(ids[1], 3);
    const double s2 = 1 / (1 + std::exp(-2.0)), s3 = 1 / (1 + std::exp(1.0));
    EXPECT_NEAR(wt[0], 2.5 * s2 / (s2 + s3), 1e-5);
    EXPECT_NEAR(wt[1], 2.5 * s3 / (s2 + s3), 1e-5);
  }
}

// --- rejections ------------------------------------------------------------------------------

TEST(Checkpoint, RejectsEveryInconsistency) {
  auto qwen = [](ModelDirWriter& w) {
    add_per_expert_bf16(w, "mlp.experts.", "gate_proj", "up_proj", "down_proj");
  };
  const std::string up1 = layer_prefix(0) + "mlp.experts.1.up_proj.weight";
  {
    ModelDirWriter w;
    qwen(w);
    w.tensors.erase(up1);
    w.write(qwen3_config());
    EXPECT_MENTIONS(load_error(w.dir),
                    "tensor 'model.layers.0.mlp.experts.1.up_proj.weight' is missing",
                    "BF16 [64, 64]");
  }
  {
    ModelDirWriter w;
    qwen(w);
    w.add_bf16(up1, {kI, kH / 2});
    w.write(qwen3_config());
    EXPECT_MENTIONS(load_error(w.dir), "model.safetensors", up1.c_str(), "field shape: [64, 32]",
                    "expected [64, 64]", "hidden_size 64");
  }
  {
    ModelDirWriter w;
    qwen(w);
    w.add_bytes(up1, "F16", {kI, kH * 2});
    w.tensors[up1].shape = {kI, kH};
    w.tensors[up1].data.resize(size_t(kI) * kH * 2);
    w.write(qwen3_config());
    EXPECT_MENTIONS(load_error(w.dir), up1.c_str(), "field dtype: 'F16'", "expected BF16");
  }
  {
    ModelDirWriter w;
    qwen(w);
    w.add_bf16(layer_prefix(0) + "mlp.experts.1.up_proj.weight_scale", {kI, kH / 16});
    w.write(qwen3_config());
    EXPECT_MENTIONS(load_error(w.dir), "unexpected tensor", "up_proj.weight_scale");
  }
  {
    ModelDirWriter w;
    qwen(w);
    w.write(qwen3_config());
    EXPECT_MENTIONS(load_error(w.dir, 0, std::nullopt, 3, 0), "E = 4", "world_size 3");
    EXPECT_MENTIONS(load_error(w.dir, 0, std::nullopt, 2, 2), "rank 2", "[0, 2)");
    EXPECT_MENTIONS(load_error(w.dir, 5), "layer 5 has no routed experts");
  }
  {
    ModelDirWriter w;  // truncated shard
    qwen(w);
    w.write(qwen3_config());
    std::ifstream in(w.file("model.safetensors"), std::ios::binary);
    std::vector<char> b((std::istreambuf_iterator<char>(in)), {});
    b.resize(b.size() - 100);
    std::ofstream(w.file("model.safetensors"), std::ios::binary | std::ios::trunc)
        .write(b.data(), std::streamsize(b.size()));
    EXPECT_MENTIONS(load_error(w.dir), "model.safetensors", "past the end of the data section");
  }
  {
    ModelDirWriter w;  // the index names a shard that is not there
    qwen(w);
    w.write(qwen3_config(), 2);
    std::remove(w.file(ModelDirWriter::shard_name(1, 2)).c_str());
    EXPECT_MENTIONS(load_error(w.dir), "model.safetensors.index.json",
                    "model-00002-of-00002.safetensors does not exist");
  }
  {
    ModelDirWriter w;  // the index places a tensor in a shard without it
    qwen(w);
    w.write(qwen3_config(), 2);
    w.write_text("model.safetensors.index.json",
                 R"({"weight_map":{"x.weight":"model-00001-of-00002.safetensors"}})");
    EXPECT_MENTIONS(load_error(w.dir), "tensor 'x.weight'", "whose header does not have it");
  }
  {
    ModelDirWriter w;  // NaN scale bytes
    add_gpt_oss_mxfp4(w);
    w.tensors[layer_prefix(0) + "mlp.experts.down_proj_scales"].data[5] = 0xff;
    w.write(gpt_oss_config(true));
    EXPECT_MENTIONS(load_error(w.dir, 0), "down_proj_scales", "expert 0", "0xff", "NaN of UE8M0");
    EXPECT_EQ(load_error(w.dir, 0, std::nullopt, 2, 1), "");  // another rank never reads it
  }
  {
    ModelDirWriter w;
    const std::vector<float> ones(kE, 1.0f);
    add_modelopt(w, ones, ones);
    w.tensors[layer_prefix(0) + "mlp.experts.3.down_proj.weight_scale"].data[7] = 0x7f;
    w.write(qwen3_config());
    w.write_text("hf_quant_config.json", kModelOptQuant);
    EXPECT_MENTIONS(load_error(w.dir), "experts.3.down_proj.weight_scale", "byte 7", "NaN of E4M3");
    w.add_f32(layer_prefix(0) + "mlp.experts.2.up_proj.input_scale", {}, {0.0f});
    w.write(qwen3_config());
    EXPECT_MENTIONS(load_error(w.dir, 0, std::nullopt, 2, 0), "experts.2.up_proj.input_scale",
                    "expected a finite scale > 0");
    w.write_text("hf_quant_config.json", R"({"quantization":{"quant_algo":"FP8"}})");
    EXPECT_MENTIONS(load_error(w.dir), "hf_quant_config.json", "quant_algo", "'FP8'");
  }
  {
    ModelDirWriter w;  // config.json problems
    qwen(w);
    w.write(R"({"model_type":"llama","hidden_size":64,"num_hidden_layers":2})");
    EXPECT_MENTIONS(load_error(w.dir), "config.json", "model_type", "'llama'");
    w.write(qwen3_config().substr(0, 40));
    EXPECT_MENTIONS(load_error(w.dir), "config.json: malformed JSON at byte");
    w.write(R"({"model_type":"qwen3_moe","hidden_size":64.5,"num_hidden_layers":2})");
    EXPECT_MENTIONS(load_error(w.dir), "config.json field 'hidden_size'", "'64.5'");
    w.write(R"({"model_type":"qwen3_moe","hidden_size":64,"num_hidden_layers":2,)"
            R"("moe_intermediate_size":64,"num_experts":4,"num_experts_per_tok":9})");
    EXPECT_MENTIONS(load_error(w.dir), "num_experts_per_tok", "9 is outside [1, 4]");
    w.write(qwen3_config(R"(,"quantization_config":{"quant_method":"fp8"})"));
    EXPECT_MENTIONS(load_error(w.dir), "quant_method", "'fp8' is not supported");
  }
  EXPECT_MENTIONS(load_error("/nonexistent/dir"), "not a directory");
}

TEST(Checkpoint, JsonReaderIsStrict) {
  EXPECT_EQ(io::parse_json(R"({"a":[1,2.5,-3e2,true,false,null,"x\u00e9"]})", "t")
                .find("a")
                ->items()
                .size(),
            7u);
  for (const char* bad :
       {"{\"a\":1,\"a\":2}", "{\"a\":NaN}", "[1,]", "{\"a\":01}", "[1] 2", "\"abc", "{\"a\" 1}"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(io::parse_json(bad, "t"), Error);
  }
  std::string deep(100, '[');
  deep += std::string(100, ']');
  try {
    io::parse_json(deep, "t");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_MENTIONS(e.what(), "deeper than 64");
  }
}

}  // namespace
}  // namespace moe_ep::test
