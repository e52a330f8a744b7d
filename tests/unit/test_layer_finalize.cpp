// Output forms, workspaces and determinism (docs/contract.md §4, §7): finalized == sum of
// unfinalized bitwise; the workspace view, the owned tensor and caller memory agree; workspaces of
// different capacity agree and the selection picks the smallest that fits; repeated calls and
// different thread counts give bitwise the same output; per-call epilogue vectors and num_tokens.
#include <gtest/gtest.h>

#include <limits>

#include "layer_test_util.h"

namespace moe_ep::test {
namespace {

constexpr int kH = 128, kI = 64, kE = 8, kK = 3, kCap = 24;

std::vector<std::vector<RankInputs>> some_calls(int W, uint64_t seed, std::vector<int> counts) {
  std::vector<std::vector<RankInputs>> calls;
  for (size_t c = 0; c < counts.size(); ++c) {
    calls.emplace_back();
    for (int r = 0; r < W; ++r)
      calls.back().push_back(random_inputs(std::max(0, counts[c] - 3 * r), kH, kK, kE,
                                           seed + 31 * c + r, Routing::kUniform, 0.15));
  }
  return calls;
}

void expect_same(const std::vector<std::vector<Bits>>& a, const std::vector<std::vector<Bits>>& b,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t c = 0; c < a.size(); ++c)
    for (size_t r = 0; r < a[c].size(); ++r)
      EXPECT_EQ(bitwise_diff(a[c][r], b[c][r], kH), "") << what << ", call " << c << " rank " << r;
}

struct FinalizeCase {
  Recipe recipe;
  bool topk_in_fc1;
  int world;
};

void PrintTo(const FinalizeCase& c, std::ostream* os) {
  *os << recipe_name(c.recipe) << (c.topk_in_fc1 ? " topk_in_fc1" : "") << " W=" << c.world;
}

class Finalize : public ::testing::TestWithParam<FinalizeCase> {};

TEST_P(Finalize, FinalizedEqualsSlotOrderSumOfUnfinalized) {
  const auto p = GetParam();
  const HostPack pack = random_pack(p.recipe, kE, kH, kI, 3 + int(p.recipe));
  LayerConfig cfg = make_config(p.recipe, kE, kCap, kH, kI, kK);
  cfg.recipe.apply_topk_in_fc1 = p.topk_in_fc1;
  const auto calls = some_calls(p.world, 77, {kCap, 5, 0, 17});
  FleetSetup s{p.world, cfg, &pack};
  const auto fin = run_calls(s, calls, OutMode::kCaller);
  const auto unfin = run_calls(s, calls, OutMode::kUnfinalized);
  expect_same(fin, unfin, "finalized vs sum of unfinalized");
  // And both are the recipe's math.
  for (size_t c = 0; c < calls.size(); ++c) {
    const Reference ref = reference_forward(cfg, pack, calls[c]);
    for (int r = 0; r < p.world; ++r)
      EXPECT_LE(rel_l2(fin[c][r], ref.out[r]), reference_tolerance(p.recipe))
          << "call " << c << " rank " << r;
  }
}

TEST_P(Finalize, UnfinalizedWeightsAreOnesWhenFc1AppliesThem) {
  const auto p = GetParam();
  const HostPack pack = random_pack(p.recipe, kE, kH, kI, 5);
  LayerConfig cfg = make_config(p.recipe, kE, kCap, kH, kI, kK);
  cfg.recipe.apply_topk_in_fc1 = p.topk_in_fc1;
  cfg.recipe.do_finalize = false;
  const bool in_fc1 = p.topk_in_fc1 || recipe_traits(p.recipe).topk_in_fc1_forced;
  const auto calls = some_calls(p.world, 5, {9});
  auto fleet = p.world > 1 ? make_cpu_fleet(p.world) : nullptr;
  const int El = kE / p.world;
  std::vector<std::string> bad(p.world);
  run_fleet(p.world, [&](int r) {
    Bootstrap b = cpu_boot(p.world, r, fleet);
    MegaLayer layer(b, cfg, pack.view(r * El, El), pack.epilogue_view(r * El, El));
    const RankInputs& in = calls[0][r];
    UnfinalizedOutput u = layer.forward_unfinalized(in.forward_inputs());
    const auto& wv = u.weights.view();
    const auto& iv = u.indices.view();
    if (wv.dtype != DType::kF32 || wv.ndim != 2 || wv.shape[0] != in.T || wv.shape[1] != kK)
      bad[r] = "weights is " + wv.describe();
    else if (iv.dtype != DType::kI32 || iv.ndim != 2 || iv.shape[0] != in.T || iv.shape[1] != kK)
      bad[r] = "indices is " + iv.describe();
    else
      for (int i = 0; i < in.T * kK && bad[r].empty(); ++i) {
        if (in.ids[i] < 0) continue;
        const float want = in_fc1 ? 1.0f : in.w[i];
        if (u.weights.ptr<float>()[i] != want)
          bad[r] = "weights[" + std::to_string(i) +
                   "] = " + std::to_string(u.weights.ptr<float>()[i]) + ", want " +
                   std::to_string(want);
      }
    layer.destroy();
  });
  for (int r = 0; r < p.world; ++r) EXPECT_EQ(bad[r], "") << "rank " << r;
}

// An empty slot (id -1) contributes nothing: whatever its top-k weight holds (here NaN) is
// never read, in fc1 or in the finalize.
TEST_P(Finalize, EmptySlotWeightsAreNeverRead) {
  const auto p = GetParam();
  const HostPack pack = random_pack(p.recipe, kE, kH, kI, 8);
  LayerConfig cfg = make_config(p.recipe, kE, kCap, kH, kI, kK);
  cfg.recipe.apply_topk_in_fc1 = p.topk_in_fc1;
  auto zero = some_calls(p.world, 808, {kCap, 6});
  auto nan = zero;
  for (auto& call : zero)
    for (auto& in : call)
      for (size_t i = 0; i < in.ids.size(); ++i)
        if (in.ids[i] < 0) in.w[i] = 0.0f;
  for (auto& call : nan)
    for (auto& in : call)
      for (size_t i = 0; i < in.ids.size(); ++i)
        if (in.ids[i] < 0) in.w[i] = std::numeric_limits<float>::quiet_NaN();
  FleetSetup s{p.world, cfg, &pack};
  for (OutMode mode : {OutMode::kCaller, OutMode::kUnfinalized}) {
    SCOPED_TRACE(out_mode_name(mode));
    const auto a = run_calls(s, zero, mode);
    const auto b = run_calls(s, nan, mode);
    expect_same(b, a, "NaN vs 0 weights in empty slots");
    for (const auto& call : b)
      for (const auto& out : call) EXPECT_EQ(count_nan(out), 0u);
  }
}

std::vector<FinalizeCase> finalize_cases() {
  std::vector<FinalizeCase> v;
  for (Recipe r : kAllRecipes)
    for (bool f : {false, true}) v.push_back({r, f, f ? 4 : 2});
  v.push_back({Recipe::kNvfp4, false, 1});
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, Finalize, ::testing::ValuesIn(finalize_cases()),
                         [](const auto& info) {
                           std::string s = recipe_name(info.param.recipe);
                           s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
                           return s + (info.param.topk_in_fc1 ? "_TopkInFc1" : "") + "_W" +
                                  std::to_string(info.param.world);
                         });

TEST(OutputForms, ViewOwnedAndCallerMemoryAgreeBitwise) {
  const int W = 2;
  const HostPack pack = random_pack(Recipe::kNvfp4, kE, kH, kI, 11);
  const LayerConfig cfg = make_config(Recipe::kNvfp4, kE, kCap, kH, kI, kK);
  const auto calls = some_calls(W, 900, {kCap, 3, kCap - 1, 0, 12});
  FleetSetup s{W, cfg, &pack};
  const auto caller = run_calls(s, calls, OutMode::kCaller);
  expect_same(run_calls(s, calls, OutMode::kOwned), caller, "owned vs caller memory");
  expect_same(run_calls(s, calls, OutMode::kView), caller, "workspace view vs caller memory");
}

TEST(Determinism, RepeatedCallsAreBitwiseIdentical) {
  const int W = 4;
  const HostPack pack = random_pack(Recipe::kMxfp4Mxfp8, kE, kH, kI, 12);
  const LayerConfig cfg = make_config(Recipe::kMxfp4Mxfp8, kE, kCap, kH, kI, kK);
  const auto base = some_calls(W, 1234, {kCap, 7});
  // The same two calls three times, with other calls in between.
  std::vector<std::vector<RankInputs>> calls;
  const auto other = some_calls(W, 555, {20, 1});
  for (int rep = 0; rep < 3; ++rep) {
    calls.push_back(base[0]);
    calls.push_back(other[rep % 2]);
    calls.push_back(base[1]);
  }
  FleetSetup s{W, cfg, &pack};
  const auto outs = run_calls(s, calls, OutMode::kCaller);
  for (int rep = 1; rep < 3; ++rep)
    for (int r = 0; r < W; ++r) {
      EXPECT_EQ(bitwise_diff(outs[3 * rep][r], outs[0][r], kH), "") << "rep " << rep;
      EXPECT_EQ(bitwise_diff(outs[3 * rep + 2][r], outs[2][r], kH), "") << "rep " << rep;
    }
  // A fresh layer gives the same bits too.
  expect_same(run_calls(s, base, OutMode::kCaller), {outs[0], outs[2]}, "fresh layer");
}

// The CPU backend may split each rank's work over omp_get_max_threads() / W threads (taken at
// construction); 1 vs 7 threads per process gives 1 vs 7 (W = 1) or 1 vs 3 (W = 2) per rank.
TEST(Determinism, ThreadCountDoesNotChangeBits) {
  for (int W : {1, 2})
    for (Recipe recipe : {Recipe::kNvfp4, Recipe::kMxfp4Bf16, Recipe::kBf16, Recipe::kNvfp4Bf16}) {
      SCOPED_TRACE(std::string(recipe_name(recipe)) + " W=" + std::to_string(W));
      // Big enough that a parallel backend splits the work.
      const int H = 512, I = 256, E = 4;
      const HostPack pack = random_pack(recipe, E, H, I, 21);
      const LayerConfig cfg = make_config(recipe, E, 64, H, I, 2);
      std::vector<std::vector<RankInputs>> calls(1);
      for (int r = 0; r < W; ++r) calls[0].push_back(random_inputs(64 - 9 * r, H, 2, E, 40 + r));
      FleetSetup s{W, cfg, &pack};
      s.omp_threads = 1;
      const auto one = run_calls(s, calls, OutMode::kCaller);
      s.omp_threads = 7;
      const auto many = run_calls(s, calls, OutMode::kCaller);
      for (int r = 0; r < W; ++r)
        EXPECT_EQ(bitwise_diff(many[0][r], one[0][r], H), "")
            << "1 vs 7 OpenMP threads, rank " << r;
    }
}

// Two extra workspaces (4 and 12 tokens) beside the default (24): the same tokens in each give
// the same bits; selection picks the smallest that fits; a workspace view survives calls that
// use another workspace.
TEST(Workspaces, DifferentCapacitiesGiveIdenticalOutputsAndSelectionPicksSmallest) {
  const int W = 2;
  const HostPack pack = random_pack(Recipe::kNvfp4, kE, kH, kI, 13);
  const LayerConfig cfg = make_config(Recipe::kNvfp4, kE, kCap, kH, kI, kK);
  auto fleet = make_cpu_fleet(W);
  const int El = kE / W;
  std::vector<RankInputs> small, big;
  for (int r = 0; r < W; ++r) {
    small.push_back(random_inputs(4 - 2 * r, kH, kK, kE, 60 + r));
    big.push_back(random_inputs(20 + r, kH, kK, kE, 70 + r));
  }
  std::vector<std::vector<std::string>> bad(W);
  std::vector<Bits> in_default(W), in_small(W), in_mid(W);
  run_fleet(W, [&](int r) {
    auto& b_ = bad[r];
    auto check = [&](bool ok, const std::string& what) {
      if (!ok) b_.push_back(what);
    };
    Bootstrap b = cpu_boot(W, r, fleet);
    MegaLayer layer(b, cfg, pack.view(r * El, El), pack.epilogue_view(r * El, El));
    const WorkspaceId ws4 = layer.create_workspace(4);
    const WorkspaceId ws12 = layer.create_workspace(12);
    const WorkspaceId def = layer.default_workspace();
    check(layer.workspace_capacity(def) == kCap, "default capacity");
    check(layer.workspace_capacity(ws4) == 4, "capacity of ws4");
    check(layer.workspace_capacity(ws12) == 12, "capacity of ws12");
    check(!(ws4 == ws12) && !(ws4 == def), "workspace ids distinct");
    check(layer.workspace_bytes(ws4) < layer.workspace_bytes(ws12) &&
              layer.workspace_bytes(ws12) < layer.workspace_bytes(def),
          "workspace bytes grow with capacity");
    check(layer.select_workspace(0) == ws4, "select(0) -> 4");
    check(layer.select_workspace(3) == ws4, "select(3) -> 4");
    check(layer.select_workspace(4) == ws4, "select(4) -> 4");
    check(layer.select_workspace(5) == ws12, "select(5) -> 12");
    check(layer.select_workspace(12) == ws12, "select(12) -> 12");
    check(layer.select_workspace(13) == def, "select(13) -> default");
    check(layer.select_workspace(kCap) == def, "select(cap) -> default");
    const Caught negative = catch_error([&] { layer.select_workspace(-5); });
    check(negative.thrown && negative.code == ErrorCode::kInvalidArgument &&
              contains(negative.what, "-5"),
          "select(-5) is refused, naming the value: " + negative.what);
    const Caught too_many = catch_error([&] { layer.select_workspace(kCap + 1); });
    check(too_many.thrown && too_many.code == ErrorCode::kCapacity &&
              contains(too_many.what, std::to_string(kCap + 1)) &&
              contains(too_many.what, std::to_string(kCap)),
          "select(cap+1) error names both numbers: " + too_many.what);
    // Collective selection: the largest T of any rank decides (rank 1 has 7, rank 0 has 2).
    check(layer.select_workspace_collective(r == 0 ? 2 : 7) == ws12, "collective select -> 12");
    check(layer.select_workspace_collective(r == 0 ? 3 : 0) == ws4, "collective select -> 4");
    // A workspace larger than the default: selection reaches it, and the error past it names it.
    const WorkspaceId ws_large = layer.create_workspace(2 * kCap);
    check(layer.select_workspace(kCap + 1) == ws_large, "select(cap+1) -> the larger workspace");
    const Caught beyond = catch_error([&] { layer.select_workspace(2 * kCap + 1); });
    check(beyond.thrown && contains(beyond.what, "largest capacity " + std::to_string(2 * kCap)),
          "select past every workspace names the largest capacity: " + beyond.what);
    layer.warmup();
    layer.warmup(ws4);

    auto run = [&](const RankInputs& in, WorkspaceId ws) {
      ForwardInputs fi = in.forward_inputs();
      fi.workspace = ws;
      Bits out(size_t(in.T) * kH, kPoison);
      layer.forward(fi, TensorView::contiguous(out.data(), DType::kBF16, {in.T, kH}));
      return out;
    };
    in_default[r] = run(small[r], def);
    in_small[r] = run(small[r], ws4);
    in_mid[r] = run(small[r], ws12);

    // A view of the default workspace is not touched by calls on the other workspaces.
    ForwardInputs fb = big[r].forward_inputs();
    TensorView view = layer.forward_view(fb);
    const Bits view_before(view.ptr<uint16_t>(), view.ptr<uint16_t>() + view.numel());
    run(small[r], ws4);
    run(small[r], ws12);
    const Bits view_after(view.ptr<uint16_t>(), view.ptr<uint16_t>() + view.numel());
    check(view_before == view_after, "default-workspace view changed by calls on other workspaces");

    // More tokens than the chosen workspace holds: an error naming both numbers, on every rank
    // (all ranks make the same mistake, so nobody waits).
    ForwardInputs over = big[r].forward_inputs();
    over.workspace = ws12;
    const Caught cap_err = catch_error([&] { layer.forward(over); });
    const std::string T = std::to_string(big[r].T);
    check(cap_err.thrown && cap_err.code == ErrorCode::kCapacity && contains(cap_err.what, T) &&
              contains(cap_err.what, "12"),
          "T > workspace capacity: " + cap_err.what);
    // And the layer still works afterwards, bitwise as before.
    check(run(small[r], ws4) == in_small[r], "ws4 output after the capacity error");
    layer.destroy();
  });
  for (int r = 0; r < W; ++r) {
    for (const auto& s : bad[r]) ADD_FAILURE() << "rank " << r << ": " << s;
    EXPECT_EQ(count_nan(in_default[r]), 0u);
    EXPECT_EQ(bitwise_diff(in_small[r], in_default[r], kH), "") << "ws4 vs default, rank " << r;
    EXPECT_EQ(bitwise_diff(in_mid[r], in_default[r], kH), "") << "ws12 vs default, rank " << r;
  }
}

// Per-call epilogue vectors (they alias the caller's parameters) replace the layer's own for
// that call only.
TEST(Epilogue, PerCallVectorsOverrideTheLayersForThatCallOnly) {
  const int W = 2, El = kE / W;
  HostPack pack = random_pack(Recipe::kNvfp4, kE, kH, kI, 14);
  const LayerConfig cfg = make_config(Recipe::kNvfp4, kE, kCap, kH, kI, kK);
  HostPack scaled = pack;  // the reference of the overridden call
  for (int e = 0; e < kE; ++e) {
    scaled.fc1_alpha[e] *= (e % 2 ? 2.0f : 0.5f);
    scaled.fc2_alpha[e] *= (e % 3 ? 0.25f : 4.0f);
    scaled.fc1_norm_const[e] = (e % 2 ? 2.0f : 4.0f);
  }
  std::vector<RankInputs> in;
  for (int r = 0; r < W; ++r) in.push_back(random_inputs(10, kH, kK, kE, 80 + r));
  auto fleet = make_cpu_fleet(W);
  std::vector<Bits> plain(W), over(W), plain_again(W);
  run_fleet(W, [&](int r) {
    Bootstrap b = cpu_boot(W, r, fleet);
    MegaLayer layer(b, cfg, pack.view(r * El, El), pack.epilogue_view(r * El, El));
    auto run = [&](const ForwardInputs& fi) {
      Tensor t = layer.forward(fi);
      return Bits(t.ptr<uint16_t>(), t.ptr<uint16_t>() + t.numel());
    };
    plain[r] = run(in[r].forward_inputs());
    ForwardInputs fi = in[r].forward_inputs();
    fi.epilogue = scaled.epilogue_view(r * El, El);
    over[r] = run(fi);
    plain_again[r] = run(in[r].forward_inputs());
    layer.destroy();
  });
  const Reference ref_plain = reference_forward(cfg, pack, in);
  const Reference ref_scaled = reference_forward(cfg, scaled, in);
  for (int r = 0; r < W; ++r) {
    EXPECT_LE(rel_l2(plain[r], ref_plain.out[r]), reference_tolerance(Recipe::kNvfp4))
        << "rank " << r;
    EXPECT_LE(rel_l2(over[r], ref_scaled.out[r]), reference_tolerance(Recipe::kNvfp4))
        << "per-call vectors, rank " << r;
    EXPECT_GT(rel_l2(over[r], plain[r]), 0.1) << "per-call vectors had no effect, rank " << r;
    EXPECT_EQ(bitwise_diff(plain_again[r], plain[r], kH), "") << "layer's own vectors changed";
  }
}

// num_tokens (a device-side count read when the forward runs): rows before it are the forward
// of those rows; rows at and past it are zeros.
TEST(NumTokens, RowsPastTheCountAreZerosAndTheRestMatchesTheShortCall) {
  const int W = 2, El = kE / W;
  const HostPack pack = random_pack(Recipe::kMxfp4Bf16, kE, kH, kI, 15);
  const LayerConfig cfg = make_config(Recipe::kMxfp4Bf16, kE, kCap, kH, kI, kK);
  std::vector<RankInputs> full;
  for (int r = 0; r < W; ++r) full.push_back(random_inputs(12, kH, kK, kE, 90 + r));
  const int counts[] = {5, 0};
  auto fleet = make_cpu_fleet(W);
  std::vector<Bits> counted(W), shortened(W);
  run_fleet(W, [&](int r) {
    Bootstrap b = cpu_boot(W, r, fleet);
    MegaLayer layer(b, cfg, pack.view(r * El, El), pack.epilogue_view(r * El, El));
    const int32_t n = counts[r];
    ForwardInputs fi = full[r].forward_inputs();
    fi.num_tokens = &n;
    counted[r].assign(size_t(full[r].T) * kH, kPoison);
    layer.forward(fi, TensorView::contiguous(counted[r].data(), DType::kBF16, {full[r].T, kH}));
    RankInputs s = full[r];
    s.T = n;
    s.x.resize(size_t(n) * kH);
    s.ids.resize(size_t(n) * kK);
    s.w.resize(size_t(n) * kK);
    Tensor t = layer.forward(s.forward_inputs());
    shortened[r].assign(t.ptr<uint16_t>(), t.ptr<uint16_t>() + t.numel());
    layer.destroy();
  });
  for (int r = 0; r < W; ++r) {
    const size_t n = size_t(counts[r]) * kH;
    EXPECT_EQ(bitwise_diff(Bits(counted[r].begin(), counted[r].begin() + n), shortened[r], kH), "")
        << "rank " << r;
    for (size_t i = n; i < counted[r].size(); ++i)
      if (counted[r][i] != 0) {
        ADD_FAILURE() << "rank " << r << " row " << i / kH << " past num_tokens = " << counts[r]
                      << " is 0x" << std::hex << counted[r][i] << ", want 0";
        break;
      }
  }
}

// hidden_states rows may have a stride larger than H (a slice of a wider buffer): the padding is
// never read, and the output is bitwise that of the contiguous rows. T = 0 may come with null
// pointers.
TEST(InputLayouts, PaddedRowsAndEmptyNullInputs) {
  const int W = 2, El = kE / W, pad = 64;
  const HostPack pack = random_pack(Recipe::kMxfp4Bf16, kE, kH, kI, 16);
  const LayerConfig cfg = make_config(Recipe::kMxfp4Bf16, kE, kCap, kH, kI, kK);
  std::vector<RankInputs> in;
  for (int r = 0; r < W; ++r) in.push_back(random_inputs(9 + r, kH, kK, kE, 95 + r));
  auto fleet = make_cpu_fleet(W);
  std::vector<Bits> plain(W), padded(W);
  std::vector<Caught> empty_err(W);
  run_fleet(W, [&](int r) {
    Bootstrap b = cpu_boot(W, r, fleet);
    MegaLayer layer(b, cfg, pack.view(r * El, El), pack.epilogue_view(r * El, El));
    const RankInputs& x = in[r];
    Tensor t = layer.forward(x.forward_inputs());
    plain[r].assign(t.ptr<uint16_t>(), t.ptr<uint16_t>() + t.numel());
    Bits wide(size_t(x.T) * (kH + pad), kPoison);  // NaN padding: reading it would show
    for (int i = 0; i < x.T; ++i)
      std::copy_n(x.x.data() + size_t(i) * kH, kH, wide.data() + size_t(i) * (kH + pad));
    ForwardInputs fi = x.forward_inputs();
    fi.hidden_states.data = wide.data();
    fi.hidden_states.strides[0] = kH + pad;
    Tensor t2 = layer.forward(fi);
    padded[r].assign(t2.ptr<uint16_t>(), t2.ptr<uint16_t>() + t2.numel());
    // T = 0 on rank 0 with null data pointers; rank 1 runs real tokens in the same call.
    ForwardInputs e = x.forward_inputs();
    if (r == 0) {
      e.hidden_states = TensorView::contiguous(nullptr, DType::kBF16, {0, kH});
      e.topk_ids = TensorView::contiguous(nullptr, DType::kI32, {0, kK});
      e.topk_weights = TensorView::contiguous(nullptr, DType::kF32, {0, kK});
    }
    empty_err[r] = catch_error([&] { layer.forward(e); });
    layer.destroy();
  });
  for (int r = 0; r < W; ++r) {
    EXPECT_EQ(bitwise_diff(padded[r], plain[r], kH), "") << "rank " << r;
    EXPECT_FALSE(empty_err[r].thrown) << "rank " << r << ": " << empty_err[r].what;
  }
}

// Several layers (the MoE layers of one model) share one fleet: interleaved calls on two layers
// give bitwise what each gives on a fleet of its own, also after the other is destroyed.
TEST(SharedFleet, TwoLayersInterleavedMatchTheirOwnFleets) {
  const int W = 4;
  const HostPack pa = random_pack(Recipe::kNvfp4, kE, kH, kI, 17);
  const HostPack pb = random_pack(Recipe::kBf16, 2 * kE, 2 * kH, kI, 18);
  const LayerConfig ca = make_config(Recipe::kNvfp4, kE, kCap, kH, kI, kK);
  const LayerConfig cb = make_config(Recipe::kBf16, 2 * kE, 8, 2 * kH, kI, 2);
  const auto calls_a = some_calls(W, 1500, {kCap, 9, 4});
  std::vector<std::vector<RankInputs>> calls_b;
  for (int c = 0; c < 3; ++c) {
    calls_b.emplace_back();
    for (int r = 0; r < W; ++r)
      calls_b.back().push_back(random_inputs(8 - c - r, 2 * kH, 2, 2 * kE, 1600 + 10 * c + r));
  }
  FleetSetup sa{W, ca, &pa}, sb{W, cb, &pb};
  const auto own_a = run_calls(sa, calls_a, OutMode::kCaller);
  const auto own_b = run_calls(sb, calls_b, OutMode::kCaller);

  auto fleet = make_cpu_fleet(W);
  std::vector<std::vector<Bits>> got_a(3, std::vector<Bits>(W)), got_b(3, std::vector<Bits>(W));
  run_fleet(W, [&](int r) {
    Bootstrap b = cpu_boot(W, r, fleet);
    const int ela = kE / W, elb = 2 * kE / W;
    auto la =
        std::make_unique<MegaLayer>(b, ca, pa.view(r * ela, ela), pa.epilogue_view(r * ela, ela));
    MegaLayer lb(b, cb, pb.view(r * elb, elb), pb.epilogue_view(r * elb, elb));
    auto take = [](const Tensor& t) {
      return Bits(t.ptr<uint16_t>(), t.ptr<uint16_t>() + t.numel());
    };
    for (int c = 0; c < 2; ++c) {
      got_a[c][r] = take(la->forward(calls_a[c][r].forward_inputs()));
      got_b[c][r] = take(lb.forward(calls_b[c][r].forward_inputs()));
    }
    la->destroy();
    la.reset();
    got_b[2][r] = take(lb.forward(calls_b[2][r].forward_inputs()));
    lb.destroy();
  });
  for (int c = 0; c < 3; ++c)
    for (int r = 0; r < W; ++r) {
      if (c < 2) EXPECT_EQ(bitwise_diff(got_a[c][r], own_a[c][r], kH), "") << "layer A call " << c;
      EXPECT_EQ(bitwise_diff(got_b[c][r], own_b[c][r], 2 * kH), "") << "layer B call " << c;
    }
}

}  // namespace
}  // namespace moe_ep::test
