// The token-count matrix (docs/contract.md §7) at W = 1, 2, 4, 8 for every recipe, at a small H and
// I: T of 0, 1, 7, capacity-1 and capacity, equal and unequal across ranks, shrinking and growing
// on one layer, all slots empty on a rank, all tokens to one expert, Zipf-skewed routing. Each call
// is checked against the float64 reference and bitwise against the same tokens run at W = 1
// (data movement must not change the math).
#include <gtest/gtest.h>

#include "layer_test_util.h"

namespace moe_ep::test {
namespace {

constexpr int kH = 128, kI = 128, kE = 16, kK = 4, kCap = 16;

// Most elements agree bitwise with the reference (see reference_tolerance).
constexpr double kMinBitwiseFraction = 0.9;

struct Scenario {
  std::string name;
  OutMode mode;
  std::vector<std::vector<RankInputs>> calls;  // [call][rank]
};

std::vector<Scenario> scenarios(int W) {
  std::vector<Scenario> out;
  uint64_t seed = 100 * W;
  auto inputs = [&](int T, Routing routing = Routing::kUniform, double empty = 0.0,
                    int one_expert = 0) {
    return random_inputs(T, kH, kK, kE, ++seed, routing, empty, one_expert);
  };
  {  // equal T on every rank, shrinking and growing on one layer, into poisoned caller memory
    Scenario s{"EqualCountsShrinkGrow", OutMode::kCaller, {}};
    for (int T : {0, 1, 7, kCap - 1, kCap, 1, kCap, 0, 7}) {
      s.calls.emplace_back();
      for (int r = 0; r < W; ++r) s.calls.back().push_back(inputs(T, Routing::kUniform, 0.1));
    }
    out.push_back(std::move(s));
  }
  {  // unequal T across ranks; the previous call's workspace view is poisoned first
    Scenario s{"UnequalCountsView", OutMode::kView, {}};
    const int counts[] = {0, 1, 7, kCap - 1, kCap};
    for (int c = 0; c < 5; ++c) {
      s.calls.emplace_back();
      for (int r = 0; r < W; ++r) s.calls.back().push_back(inputs(counts[(r + c) % 5]));
    }
    out.push_back(std::move(s));
  }
  {  // every slot of rank 0 empty; others with many empty slots
    Scenario s{"EmptySlotsOwned", OutMode::kOwned, {}};
    for (int c = 0; c < 2; ++c) {
      s.calls.emplace_back();
      for (int r = 0; r < W; ++r)
        s.calls.back().push_back(r == 0 ? inputs(7 + c, Routing::kAllEmpty)
                                        : inputs(kCap - c, Routing::kUniform, 0.3));
    }
    out.push_back(std::move(s));
  }
  {  // slot 0 of every token of every rank goes to the last expert (on the last rank)
    Scenario s{"OneExpert", OutMode::kCaller, {}};
    s.calls.emplace_back();
    for (int r = 0; r < W; ++r)
      s.calls.back().push_back(inputs(kCap, Routing::kOneExpert, 0.0, kE - 1));
    out.push_back(std::move(s));
  }
  {  // Zipf-skewed routing at full capacity
    Scenario s{"Zipf", OutMode::kView, {}};
    for (int c = 0; c < 2; ++c) {
      s.calls.emplace_back();
      for (int r = 0; r < W; ++r) s.calls.back().push_back(inputs(kCap - r % 2, Routing::kZipf));
    }
    out.push_back(std::move(s));
  }
  return out;
}

struct MatrixCase {
  int world;
  Recipe recipe;
};

void PrintTo(const MatrixCase& c, std::ostream* os) {
  *os << "W=" << c.world << " " << recipe_name(c.recipe);
}

class TokenMatrix : public ::testing::TestWithParam<MatrixCase> {};

TEST_P(TokenMatrix, MatchesReferenceAndSingleRankBitwise) {
  const int W = GetParam().world;
  const Recipe recipe = GetParam().recipe;
  const HostPack pack = random_pack(recipe, kE, kH, kI, 7 + int(recipe));
  LayerConfig cfg = make_config(recipe, kE, kCap, kH, kI, kK);
  cfg.recipe.swiglu_limit = 7.0f;
  for (auto& sc : scenarios(W)) {
    SCOPED_TRACE(sc.name + " (" + out_mode_name(sc.mode) + " output)");
    FleetSetup s{W, cfg, &pack};
    const auto outs = run_calls(s, sc.calls, sc.mode);

    // The same tokens at W = 1, all experts on one rank, capacity for everything.
    std::vector<std::vector<Bits>> single;
    if (W > 1) {
      std::vector<std::vector<RankInputs>> one(sc.calls.size());
      for (size_t c = 0; c < sc.calls.size(); ++c) one[c] = {concat_ranks(sc.calls[c])};
      LayerConfig c1 = cfg;
      c1.fleet.max_tokens_per_rank = W * kCap;
      FleetSetup s1{1, c1, &pack};
      single = run_calls(s1, one, OutMode::kCaller);
    }
    Bits all_got, all_want;
    for (size_t c = 0; c < sc.calls.size(); ++c) {
      const Reference ref = reference_forward(cfg, pack, sc.calls[c]);
      for (int r = 0; r < W; ++r) {
        all_got.insert(all_got.end(), outs[c][r].begin(), outs[c][r].end());
        all_want.insert(all_want.end(), ref.out[r].begin(), ref.out[r].end());
      }
      const auto single_split = W > 1 ? split_rows(single[c][0], sc.calls[c]) : std::vector<Bits>{};
      for (int r = 0; r < W; ++r) {
        const RankInputs& in = sc.calls[c][r];
        const Bits& got = outs[c][r];
        ASSERT_EQ(got.size(), size_t(in.T) * kH) << "call " << c << " rank " << r;
        EXPECT_EQ(count_nan(got), 0u) << "call " << c << " rank " << r << " T=" << in.T
                                      << ": NaN or unwritten (poisoned) elements";
        const double err = rel_l2(got, ref.out[r]);
        EXPECT_LE(err, reference_tolerance(recipe))
            << "call " << c << " rank " << r << " T=" << in.T;
        if (W > 1)
          EXPECT_EQ(bitwise_diff(got, single_split[r], kH), "")
              << "W=" << W << " vs W=1, call " << c << " rank " << r << " T=" << in.T;
        // A token with every slot empty gets exactly zero.
        for (int t = 0; t < in.T; ++t) {
          bool empty = true;
          for (int k = 0; k < kK; ++k) empty = empty && in.ids[t * kK + k] < 0;
          if (!empty) continue;
          for (int o = 0; o < kH; ++o)
            if (fmt::bf16_to_float(got[size_t(t) * kH + o]) != 0.0f) {
              ADD_FAILURE() << "call " << c << " rank " << r << " token " << t
                            << " has no expert but output column " << o << " is 0x" << std::hex
                            << got[size_t(t) * kH + o];
              break;
            }
        }
      }
    }
    EXPECT_GE(bitwise_fraction(all_got, all_want), kMinBitwiseFraction);
  }
}

std::string recipe_tag(Recipe r) {
  std::string s = recipe_name(r);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  return s;
}

std::vector<MatrixCase> matrix_cases() {
  std::vector<MatrixCase> v;
  for (int W : {1, 2, 4, 8})
    for (Recipe r : kAllRecipes) v.push_back({W, r});
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, TokenMatrix, ::testing::ValuesIn(matrix_cases()),
                         [](const auto& info) {
                           return "W" + std::to_string(info.param.world) + "_" +
                                  recipe_tag(info.param.recipe);
                         });

// Every slot of every token of every rank to the same expert (duplicate ids in one row are
// legal input: each slot is its own term of the sum).
TEST(TokenMatrixEdge, AllSlotsOfAllTokensToOneExpert) {
  const int W = 4;
  const HostPack pack = random_pack(Recipe::kNvfp4, kE, kH, kI, 99);
  const LayerConfig cfg = make_config(Recipe::kNvfp4, kE, kCap, kH, kI, kK);
  std::vector<std::vector<RankInputs>> calls(1);
  for (int r = 0; r < W; ++r) {
    RankInputs in = random_inputs(kCap, kH, kK, kE, 500 + r);
    std::fill(in.ids.begin(), in.ids.end(), 5);
    calls[0].push_back(in);
  }
  FleetSetup s{W, cfg, &pack};
  const auto outs = run_calls(s, calls, OutMode::kCaller);
  const Reference ref = reference_forward(cfg, pack, calls[0]);
  for (int r = 0; r < W; ++r) {
    EXPECT_EQ(count_nan(outs[0][r]), 0u) << "rank " << r;
    EXPECT_LE(rel_l2(outs[0][r], ref.out[r]), reference_tolerance(Recipe::kNvfp4)) << "rank " << r;
  }
}

// The expert counts and top-k of docs/contract.md §7's models (E 256/128/128/8, K 8/8/4/2) at W = 8
// with T up to 136 per rank (128, capacity-1 and capacity among them), at a small H and I: routing
// over many experts per rank, checked against the reference and bitwise against W = 1.
TEST(TokenMatrixEdge, Spec7ExpertCountsAtW8WithLargeT) {
  const int W = 8, H = 128, I = 64, cap = 136;
  const int counts[W] = {128, cap - 1, cap, 0, 1, 7, 64, 100};
  struct Model {
    int E, K;
    Recipe recipe;
  };
  const Model models[] = {{256, 8, Recipe::kNvfp4},
                          {128, 8, Recipe::kMxfp4Mxfp8},
                          {128, 4, Recipe::kMxfp4Bf16},
                          {8, 2, Recipe::kBf16}};
  for (const auto& m : models) {
    SCOPED_TRACE("E=" + std::to_string(m.E) + " K=" + std::to_string(m.K) + " " +
                 recipe_name(m.recipe));
    const HostPack pack = random_pack(m.recipe, m.E, H, I, 700 + m.E + m.K);
    const LayerConfig cfg = make_config(m.recipe, m.E, cap, H, I, m.K);
    std::vector<std::vector<RankInputs>> calls(1);
    for (int r = 0; r < W; ++r)
      calls[0].push_back(random_inputs(counts[r], H, m.K, m.E, 800 + r,
                                       r % 2 ? Routing::kZipf : Routing::kUniform, 0.05));
    FleetSetup s{W, cfg, &pack};
    const auto outs = run_calls(s, calls, OutMode::kCaller);
    LayerConfig c1 = cfg;
    c1.fleet.max_tokens_per_rank = W * cap;
    FleetSetup s1{1, c1, &pack};
    const auto single = run_calls(s1, {{concat_ranks(calls[0])}}, OutMode::kCaller);
    const auto split = split_rows(single[0][0], calls[0]);
    const Reference ref = reference_forward(cfg, pack, calls[0]);
    Bits got, want;
    for (int r = 0; r < W; ++r) {
      EXPECT_EQ(count_nan(outs[0][r]), 0u) << "rank " << r;
      EXPECT_EQ(bitwise_diff(outs[0][r], split[r], H), "") << "W=8 vs W=1, rank " << r;
      EXPECT_LE(rel_l2(outs[0][r], ref.out[r]), reference_tolerance(m.recipe)) << "rank " << r;
      got.insert(got.end(), outs[0][r].begin(), outs[0][r].end());
      want.insert(want.end(), ref.out[r].begin(), ref.out[r].end());
    }
    EXPECT_GE(bitwise_fraction(got, want), kMinBitwiseFraction);
  }
}

}  // namespace
}  // namespace moe_ep::test
