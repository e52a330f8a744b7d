// Every recipe against the independent float64 computation of docs/contract.md §3.1
// (layer_test_util.h) on the shapes of docs/contract.md §7 with their real H and I (E reduced so
// the weights fit in memory, a handful of tokens). The options rotate as a Latin square over
// (shape, recipe), so every recipe and every shape meets each of: swiglu_limit unset/set x
// apply_topk_in_fc1 off/on.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <iterator>

#include "layer_test_util.h"
#include "moe_ep/weight_prep.h"

namespace moe_ep::test {
namespace {

struct Shape {
  const char* name;
  int H, I, E_real, K_real;
  int E_4bit, E_bf16;  // reduced E: 4-bit weights / bf16 weights (4x the bytes)
};

constexpr Shape kShapes[] = {
    {"DeepSeekV3", 7168, 2048, 256, 8, 8, 4},
    {"Qwen3_30B_A3B", 2048, 768, 128, 8, 8, 8},
    {"GptOss120b", 2880, 2880, 128, 4, 8, 4},
    {"Mixtral8x7B", 4096, 14336, 8, 2, 4, 2},
};

constexpr Recipe kRecipes[] = {Recipe::kNvfp4, Recipe::kMxfp4Mxfp8, Recipe::kMxfp4Bf16,
                               Recipe::kBf16, Recipe::kNvfp4Bf16};

// The tolerance is reference_tolerance (layer_test_util.h); besides, most elements must agree
// bitwise: a missing or extra rounding step (e.g. of g and u to bf16) changes most of them.
constexpr double kMinBitwiseFraction = 0.95;

struct RecipeCase {
  int shape;
  int recipe;
};

void PrintTo(const RecipeCase& c, std::ostream* os) {
  *os << kShapes[c.shape].name << " " << recipe_name(kRecipes[c.recipe]);
}

class RecipeVsFloat64 : public ::testing::TestWithParam<RecipeCase> {};

TEST_P(RecipeVsFloat64, RelativeL2WithinTolerance) {
  const Shape& sh = kShapes[GetParam().shape];
  const Recipe recipe = kRecipes[GetParam().recipe];
  const int combo = (GetParam().shape + GetParam().recipe) % 4;
  const bool limit = combo & 1, in_fc1 = combo & 2;
  const int W = 2;
  const int E = recipe_traits(recipe).weights_4bit ? sh.E_4bit : sh.E_bf16;
  const int K = std::min(sh.K_real, E);
  const int El = E / W;
  const float input_nc = (recipe == Recipe::kNvfp4 && !limit) ? 2.0f : 1.0f;

  LayerConfig cfg = make_config(recipe, E, 4, sh.H, sh.I, K);
  if (limit) cfg.recipe.swiglu_limit = 7.0f;
  cfg.recipe.apply_topk_in_fc1 = in_fc1;
  cfg.recipe.input_norm_const = input_nc;

  const auto t0 = std::chrono::steady_clock::now();
  const HostPack pack = random_pack(recipe, E, sh.H, sh.I,
                                    1000 + 10 * GetParam().shape + GetParam().recipe, input_nc);
  std::vector<RankInputs> in;
  in.push_back(random_inputs(2, sh.H, K, E, 71));
  in.push_back(random_inputs(1, sh.H, K, E, 72, Routing::kUniform, 0.2));
  const auto t1 = std::chrono::steady_clock::now();

  auto fleet = make_cpu_fleet(W);
  std::vector<Bits> out(W);
  run_fleet(W, [&](int r) {
    Bootstrap b = cpu_boot(W, r, fleet);
    MegaLayer layer(b, cfg, pack.view(r * El, El), pack.epilogue_view(r * El, El));
    out[r].assign(size_t(in[r].T) * sh.H, kPoison);
    layer.forward(in[r].forward_inputs(),
                  TensorView::contiguous(out[r].data(), DType::kBF16, {in[r].T, sh.H}));
    layer.destroy();
  });
  const auto t2 = std::chrono::steady_clock::now();
  const Reference ref = reference_forward(cfg, pack, in);
  const auto t3 = std::chrono::steady_clock::now();

  Bits got, want;
  for (int r = 0; r < W; ++r) {
    EXPECT_EQ(count_nan(out[r]), 0u) << "rank " << r << ": NaN or unwritten (poisoned) elements";
    EXPECT_EQ(count_nan(ref.out[r]), 0u) << "reference has NaN";
    got.insert(got.end(), out[r].begin(), out[r].end());
    want.insert(want.end(), ref.out[r].begin(), ref.out[r].end());
  }
  const double err = rel_l2(got, want);
  size_t exact = 0;
  for (size_t i = 0; i < got.size(); ++i) exact += got[i] == want[i];
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  std::printf(
      "[recipe] %-14s %-12s E=%d K=%d limit=%s topk_in_fc1=%d: rel_l2 %.2e, %.1f%% bitwise; "
      "make %.0f ms, layer %.0f ms, float64 %.0f ms\n",
      sh.name, recipe_name(recipe), E, K, limit ? "7" : "-", int(in_fc1), err,
      100.0 * double(exact) / double(std::max<size_t>(1, got.size())), ms(t0, t1), ms(t1, t2),
      ms(t2, t3));
  EXPECT_LE(err, reference_tolerance(recipe));
  EXPECT_GE(double(exact) / double(std::max<size_t>(1, got.size())), kMinBitwiseFraction);
  // The reference must not be trivially small (weights scaled so outputs are O(1)).
  double norm = 0;
  for (auto v : want) norm += double(fmt::bf16_to_float(v)) * fmt::bf16_to_float(v);
  EXPECT_GT(norm, 0.01 * double(want.size()));
}

std::vector<RecipeCase> recipe_cases() {
  std::vector<RecipeCase> v;
  for (int s = 0; s < 4; ++s)
    for (int r = 0; r < int(std::size(kRecipes)); ++r) v.push_back({s, r});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Spec7Shapes, RecipeVsFloat64, ::testing::ValuesIn(recipe_cases()),
                         [](const auto& info) {
                           std::string s = recipe_name(kRecipes[info.param.recipe]);
                           s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
                           return std::string(kShapes[info.param.shape].name) + "_" + s;
                         });

// gpt-oss's expert semantics on the CPU backend (contract §3.1): the activation with slope 1.702,
// offset 1 and clamp 7, expert biases on fc1 (after the alpha, before the clamp) and on fc2
// (before the bf16 rounding; times the top-k weight where the recipe applies it in fc1), for every
// recipe at gpt-oss-120b's H = I = 2880, against the float64 computation; W = 2 bitwise equal to
// W = 1 (the owner adds its experts' biases); and the default slope / offset leave the plain
// SwiGLU's bits.
TEST(RecipeVsFloat64Semantics, GptOssActivationAndBiases) {
  const Shape& sh = kShapes[2];
  for (const Recipe recipe : kRecipes) {
    for (const bool in_fc1 : {false, true}) {
      SCOPED_TRACE(std::string(recipe_name(recipe)) + (in_fc1 ? " topk_in_fc1" : ""));
      const int E = recipe_traits(recipe).weights_4bit ? sh.E_4bit : sh.E_bf16;
      const int K = std::min(sh.K_real, E), W = 2;
      LayerConfig cfg = make_config(recipe, E, 8, sh.H, sh.I, K);
      cfg.recipe.swiglu_limit = 7.0f;
      cfg.recipe.swiglu_alpha = 1.702f;
      cfg.recipe.swiglu_beta = 1.0f;
      cfg.recipe.apply_topk_in_fc1 = in_fc1;
      cfg.recipe.has_expert_bias = true;
      HostPack pack = random_pack(recipe, E, sh.H, sh.I, 2100 + int(recipe), 1.0f);
      Rng rng(2200 + int(recipe));
      pack.fc1_bias.resize(size_t(E) * 2 * sh.I);
      pack.fc2_bias.resize(size_t(E) * sh.H);
      for (float& b : pack.fc1_bias) b = float(0.5 * rng.normal());
      for (float& b : pack.fc2_bias) b = float(0.05 * rng.normal());
      std::vector<RankInputs> in;
      in.push_back(random_inputs(3, sh.H, K, E, 2301));
      in.push_back(random_inputs(2, sh.H, K, E, 2302, Routing::kUniform, 0.2));
      const std::vector<Bits> out = run_calls({W, cfg, &pack}, {in}, OutMode::kCaller)[0];
      const Reference ref = reference_forward(cfg, pack, in);
      Bits got, want;
      for (int r = 0; r < W; ++r) {
        EXPECT_EQ(count_nan(out[r]), 0u) << "rank " << r;
        got.insert(got.end(), out[r].begin(), out[r].end());
        want.insert(want.end(), ref.out[r].begin(), ref.out[r].end());
      }
      const double err = rel_l2(got, want);
      const double exact = bitwise_fraction(got, want);
      std::printf("[gpt-oss semantics] %-12s topk_in_fc1=%d: rel_l2 %.2e, %.1f%% bitwise\n",
                  recipe_name(recipe), int(in_fc1), err, 100.0 * exact);
      EXPECT_LE(err, reference_tolerance(recipe));
      EXPECT_GE(exact, kMinBitwiseFraction);
      // One rank holding every expert gives the same bits as the two ranks.
      const std::vector<RankInputs> all = {concat_ranks(in)};
      const Bits one = run_calls({1, cfg, &pack}, {all}, OutMode::kCaller)[0][0];
      EXPECT_TRUE(one == got) << "W = 1 differs from W = 2";
      // The semantics change the result (the test would not see a backend that ignored them).
      LayerConfig plain = cfg;
      plain.recipe.swiglu_alpha = 1.0f;
      plain.recipe.swiglu_beta = 0.0f;
      HostPack unbiased = pack;
      unbiased.fc1_bias.clear();
      unbiased.fc2_bias.clear();
      const Bits base = run_calls({1, plain, &unbiased}, {all}, OutMode::kCaller)[0][0];
      EXPECT_GT(rel_l2(base, one), 0.05) << "alpha, beta and the biases changed nothing";
    }
  }
}

// docs/contract.md §7's token counts (0, 1, 7, 128) at a real shape (Qwen3-30B-A3B: H 2048, I 768,
// K 8) on W = 4 ranks with 16 experts: many tokens per expert, so the backend's blocking over
// tokens and rows is exercised at full size.
TEST(RecipeVsFloat64Tokens, Qwen3AtW4WithTokenCounts0To128) {
  const Shape& sh = kShapes[1];
  const int W = 4, E = 16, K = 8, El = E / W;
  const int counts[W] = {0, 1, 7, 128};
  for (Recipe recipe : {Recipe::kNvfp4, Recipe::kMxfp4Bf16, Recipe::kNvfp4Bf16}) {
    SCOPED_TRACE(recipe_name(recipe));
    LayerConfig cfg = make_config(recipe, E, 128, sh.H, sh.I, K);
    cfg.recipe.swiglu_limit = 7.0f;
    const HostPack pack = random_pack(recipe, E, sh.H, sh.I, 2000 + int(recipe));
    std::vector<RankInputs> in;
    for (int r = 0; r < W; ++r)
      in.push_back(random_inputs(counts[r], sh.H, K, E, 2100 + r, Routing::kZipf, 0.1));
    auto fleet = make_cpu_fleet(W);
    std::vector<Bits> out(W);
    run_fleet(W, [&](int r) {
      Bootstrap b = cpu_boot(W, r, fleet);
      MegaLayer layer(b, cfg, pack.view(r * El, El), pack.epilogue_view(r * El, El));
      out[r].assign(size_t(in[r].T) * sh.H, kPoison);
      layer.forward(in[r].forward_inputs(),
                    TensorView::contiguous(out[r].data(), DType::kBF16, {in[r].T, sh.H}));
      layer.destroy();
    });
    const Reference ref = reference_forward(cfg, pack, in);
    Bits got, want;
    for (int r = 0; r < W; ++r) {
      EXPECT_EQ(count_nan(out[r]), 0u) << "rank " << r;
      if (in[r].T > 0) EXPECT_LE(rel_l2(out[r], ref.out[r]), reference_tolerance(recipe)) << r;
      got.insert(got.end(), out[r].begin(), out[r].end());
      want.insert(want.end(), ref.out[r].begin(), ref.out[r].end());
    }
    EXPECT_GE(bitwise_fraction(got, want), kMinBitwiseFraction);
  }
}

// The same comparison with weights made by the library's own packer (weight_prep.h) from fp32
// masters: the packed checkpoint tensors and nvfp4 alphas it produces run through the layer as
// the reference reads them.
TEST(RecipeVsFloat64Packed, PackExpertWeightsOutputRunsAsTheReferenceSays) {
  const int E = 4, H = 256, I = 128, K = 2, W = 2, El = E / W;
  for (Recipe recipe : kRecipes) {
    SCOPED_TRACE(recipe_name(recipe));
    Rng rng(5 + int(recipe));
    std::vector<float> w13(size_t(E) * 2 * I * H), w2(size_t(E) * H * I);
    for (auto& v : w13) v = float(rng.normal() * 3.0 / std::sqrt(double(H)));
    for (auto& v : w2) v = float(rng.normal() / (6.0 * std::sqrt(double(I))));
    const std::vector<float> nc = {1.0f, 2.0f, 0.5f, 1.0f};
    const float input_nc = recipe == Recipe::kNvfp4 ? 2.0f : 1.0f;
    const PackedExperts pe =
        pack_expert_weights(recipe, w13.data(), w2.data(), E, H, I, input_nc, nc.data());
    HostPack pack;
    pack.recipe = recipe;
    pack.E = E;
    pack.H = H;
    pack.I = I;
    pack.w13 = pe.w13;
    pack.w2 = pe.w2;
    pack.w13_scale = pe.w13_scale;
    pack.w2_scale = pe.w2_scale;
    pack.fc1_alpha = pe.fc1_alpha;
    pack.fc2_alpha = pe.fc2_alpha;
    pack.fc1_norm_const = pe.fc1_norm_const;
    ASSERT_EQ(pack.w13.size(), pack.w13_bytes() * E);
    ASSERT_EQ(pack.w2.size(), pack.w2_bytes() * E);
    ASSERT_EQ(pack.w13_scale.size(), pack.w13_scale_bytes() * E);
    ASSERT_EQ(pack.w2_scale.size(), pack.w2_scale_bytes() * E);
    ASSERT_EQ(pack.fc1_alpha.size(), size_t(E));

    LayerConfig cfg = make_config(recipe, E, 8, H, I, K);
    cfg.recipe.input_norm_const = input_nc;
    std::vector<RankInputs> in = {random_inputs(8, H, K, E, 1), random_inputs(5, H, K, E, 2)};
    auto fleet = make_cpu_fleet(W);
    std::vector<Bits> out(W);
    run_fleet(W, [&](int r) {
      Bootstrap b = cpu_boot(W, r, fleet);
      // The library's own views of the pack.
      MegaLayer layer(b, cfg, pe.view(r * El, El), pe.epilogue_view(r * El, El));
      Tensor t = layer.forward(in[r].forward_inputs());
      out[r].assign(t.ptr<uint16_t>(), t.ptr<uint16_t>() + t.numel());
      layer.destroy();
    });
    const Reference ref = reference_forward(cfg, pack, in);
    for (int r = 0; r < W; ++r)
      EXPECT_LE(rel_l2(out[r], ref.out[r]), reference_tolerance(recipe)) << "rank " << r;
    Bits got, want;
    for (int r = 0; r < W; ++r) {
      got.insert(got.end(), out[r].begin(), out[r].end());
      want.insert(want.end(), ref.out[r].begin(), ref.out[r].end());
    }
    EXPECT_GE(bitwise_fraction(got, want), kMinBitwiseFraction);
  }
}

}  // namespace
}  // namespace moe_ep::test
