// Errors and bad input (docs/contract.md §6): every rejection names the offending value and the
// limit, and changes nothing (a following valid call gives bitwise the output of before; the
// caller's buffers are untouched). Faults across ranks end in errors that name the rank, not in
// hangs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>

#include "layer_test_util.h"

namespace moe_ep::test {
namespace {

constexpr int kH = 128, kI = 64, kE = 4, kK = 2, kCap = 8;

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

Bits run_into(MegaLayer& layer, const ForwardInputs& fi, int T) {
  Bits out(size_t(T) * kH, kPoison);
  layer.forward(fi, TensorView::contiguous(out.data(), DType::kBF16, {T, kH}));
  return out;
}

struct BadInput {
  std::string name;
  std::function<void(ForwardInputs&, RankInputs&, std::vector<uint8_t>& scratch)> mutate;
  ErrorCode code;
  std::vector<std::string> mentions;  // each must appear in the message
};

std::vector<BadInput> bad_inputs() {
  using F = ForwardInputs;
  using R = RankInputs;
  using S = std::vector<uint8_t>;
  const auto inv = ErrorCode::kInvalidArgument;
  std::vector<BadInput> v;
  v.push_back({"HiddenDtype",
               [](F& f, R&, S& s) {
                 s.resize(size_t(f.hidden_states.numel()) * 4);
                 f.hidden_states =
                     TensorView::contiguous(s.data(), DType::kF32, {f.hidden_states.shape[0], kH});
               },
               inv,
               {"hidden_states", "float32", "bfloat16"}});
  v.push_back({"HiddenWidth",
               [](F& f, R&, S& s) {
                 s.resize(size_t(f.hidden_states.shape[0]) * (kH + 64) * 2);
                 f.hidden_states = TensorView::contiguous(s.data(), DType::kBF16,
                                                          {f.hidden_states.shape[0], kH + 64});
               },
               inv,
               {"hidden_states", std::to_string(kH + 64), std::to_string(kH)}});
  v.push_back({"HiddenRank3",
               [](F& f, R&, S&) {
                 f.hidden_states = TensorView::contiguous(f.hidden_states.data, DType::kBF16,
                                                          {1, f.hidden_states.shape[0], kH});
               },
               inv,
               {"hidden_states"}});
  v.push_back({"HiddenInnerStride",
               [](F& f, R&, S&) { f.hidden_states.strides[1] = 2; },
               inv,
               {"hidden_states", "stride"}});
  v.push_back({"HiddenRowStrideBelowH",
               [](F& f, R&, S&) { f.hidden_states.strides[0] = kH / 2; },
               inv,
               {"hidden_states", "stride", std::to_string(kH / 2)}});
  v.push_back({"HiddenMissing",
               [](F& f, R&, S&) { f.hidden_states = TensorView{}; },
               inv,
               {"hidden_states"}});
  v.push_back({"HiddenNullData",
               [](F& f, R&, S&) { f.hidden_states.data = nullptr; },
               inv,
               {"hidden_states"}});
  v.push_back({"HiddenOnCuda",
               [](F& f, R&, S&) {
                 f.hidden_states.device = Device{DeviceKind::kCUDA, 0};
               },
               inv,
               {"hidden_states", "cuda"}});
  v.push_back(
      {"IdsDtype",
       [](F& f, R&, S& s) {
         s.assign(size_t(f.topk_ids.numel()) * 8, 0);
         f.topk_ids = TensorView::contiguous(s.data(), DType::kI64, {f.topk_ids.shape[0], kK});
       },
       inv,
       {"topk_ids", "int64", "int32"}});
  v.push_back(
      {"IdsWidth",
       [](F& f, R&, S& s) {
         s.assign(size_t(f.topk_ids.shape[0]) * (kK + 1) * 4, 0);
         f.topk_ids = TensorView::contiguous(s.data(), DType::kI32, {f.topk_ids.shape[0], kK + 1});
       },
       inv,
       {"topk_ids", std::to_string(kK + 1), std::to_string(kK)}});
  v.push_back({"IdsRows",
               [](F& f, R&, S&) {
                 f.topk_ids = TensorView::contiguous(f.topk_ids.data, DType::kI32,
                                                     {f.topk_ids.shape[0] - 1, kK});
               },
               inv,
               {"topk_ids"}});
  v.push_back({"IdsStrided",
               [](F& f, R&, S& s) {
                 s.assign(size_t(f.topk_ids.shape[0]) * kK * 2 * 4, 0);
                 f.topk_ids.data = s.data();
                 f.topk_ids.strides[0] = 2 * kK;
               },
               inv,
               {"topk_ids", "contiguous"}});
  v.push_back({"WeightsDtype",
               [](F& f, R&, S&) { f.topk_weights.dtype = DType::kBF16; },
               inv,
               {"topk_weights", "bfloat16", "float32"}});
  v.push_back({"WeightsShape",
               [](F& f, R&, S&) {
                 f.topk_weights = TensorView::contiguous(f.topk_weights.data, DType::kF32,
                                                         {f.topk_weights.shape[0], 1});
               },
               inv,
               {"topk_weights"}});
  v.push_back({"WeightsStrided",
               [](F& f, R&, S& s) {
                 s.assign(size_t(f.topk_weights.shape[0]) * kK * 4 * 4, 0);
                 f.topk_weights.data = s.data();
                 f.topk_weights.strides[0] = 4 * kK;
               },
               inv,
               {"topk_weights", "contiguous"}});
  v.push_back({"IdTooLarge", [](F&, R& r, S&) { r.ids[3] = 9; }, inv, {"9", std::to_string(kE)}});
  v.push_back({"IdEqualsE", [](F&, R& r, S&) { r.ids[1] = kE; }, inv, {std::to_string(kE)}});
  v.push_back({"IdBelowMinusOne", [](F&, R& r, S&) { r.ids[2] = -2; }, inv, {"-2"}});
  // The CPU backend rejects non-finite routing weights (docs/python.md "Bad input").
  v.push_back({"WeightNaN",
               [](F&, R& r, S&) { r.w[5] = std::nanf(""); },
               inv,
               {"topk_weights[2, 1]", "nan", "not finite"}});
  v.push_back({"WeightInf",
               [](F&, R& r, S&) { r.w[0] = -INFINITY; },
               inv,
               {"topk_weights[0, 0]", "inf", "not finite"}});
  v.push_back({"EpilogueShape",
               [](F& f, R&, S& s) {
                 s.assign(4 * (kE + 3), 0);
                 f.epilogue.fc1_alpha = TensorView::contiguous(s.data(), DType::kF32, {kE + 3});
               },
               inv,
               {"fc1_alpha", std::to_string(kE + 3)}});
  v.push_back({"EpilogueDtype",
               [](F& f, R&, S& s) {
                 s.assign(2 * kE, 0);
                 f.epilogue.fc2_alpha = TensorView::contiguous(s.data(), DType::kBF16, {kE});
               },
               inv,
               {"fc2_alpha", "bfloat16"}});
  return v;
}

// W = 1: each bad input is rejected with its message, the caller's output buffer and inputs are
// untouched, and the next valid call gives bitwise the output of before.
TEST(BadInput, EachIsRejectedWithItsMessageAndChangesNothing) {
  const HostPack pack = random_pack(Recipe::kNvfp4, kE, kH, kI, 41);
  const LayerConfig cfg = make_config(Recipe::kNvfp4, kE, kCap, kH, kI, kK);
  MegaLayer layer(cpu_boot(1, 0, nullptr), cfg, pack.view(0, kE), pack.epilogue_view(0, kE));
  const RankInputs good = random_inputs(6, kH, kK, kE, 42);
  const Bits before = run_into(layer, good.forward_inputs(), good.T);
  ASSERT_EQ(count_nan(before), 0u);
  for (const auto& bad : bad_inputs()) {
    SCOPED_TRACE(bad.name);
    RankInputs in = good;
    std::vector<uint8_t> scratch;
    ForwardInputs fi = in.forward_inputs();
    bad.mutate(fi, in, scratch);
    const RankInputs snapshot = in;
    Bits out(size_t(good.T) * kH, kPoison);
    const Caught c = catch_error([&] {
      layer.forward(fi, TensorView::contiguous(out.data(), DType::kBF16, {good.T, kH}));
    });
    ASSERT_TRUE(c.thrown) << "accepted";
    EXPECT_TRUE(c.is_moe_error) << c.what;
    EXPECT_EQ(int(c.code), int(bad.code)) << c.what;
    for (const auto& m : bad.mentions)
      EXPECT_TRUE(contains(c.what, m)) << "message does not mention '" << m << "': " << c.what;
    EXPECT_EQ(count_nan(out), out.size()) << "the output buffer was written: " << c.what;
    // Bitwise (a NaN weight is not == itself).
    EXPECT_TRUE(in.x == snapshot.x && in.ids == snapshot.ids && in.w.size() == snapshot.w.size() &&
                std::memcmp(in.w.data(), snapshot.w.data(), in.w.size() * 4) == 0)
        << "inputs were modified";
    EXPECT_EQ(bitwise_diff(run_into(layer, good.forward_inputs(), good.T), before, kH), "")
        << "a valid call after the error gives another output";
  }
  // Output tensor of the wrong shape or dtype.
  {
    Bits out(size_t(good.T) * kH, kPoison);
    const Caught c = catch_error([&] {
      layer.forward(good.forward_inputs(),
                    TensorView::contiguous(out.data(), DType::kBF16, {good.T, kH - 64}));
    });
    EXPECT_TRUE(c.thrown && contains(c.what, "out") && contains(c.what, std::to_string(kH - 64)))
        << c.what;
    EXPECT_EQ(count_nan(out), out.size());
  }
  // An unknown workspace.
  {
    ForwardInputs fi = good.forward_inputs();
    fi.workspace = WorkspaceId{5};
    const Caught c = catch_error([&] { layer.forward(fi); });
    EXPECT_TRUE(c.thrown && contains(c.what, "5")) << c.what;
  }
  EXPECT_EQ(bitwise_diff(run_into(layer, good.forward_inputs(), good.T), before, kH), "");
}

TEST(BadInput, MoreTokensThanCapacityNamesBothNumbers) {
  const HostPack pack = random_pack(Recipe::kBf16, kE, kH, kI, 43);
  const LayerConfig cfg = make_config(Recipe::kBf16, kE, kCap, kH, kI, kK);
  MegaLayer layer(cpu_boot(1, 0, nullptr), cfg, pack.view(0, kE), pack.epilogue_view(0, kE));
  const RankInputs good = random_inputs(kCap, kH, kK, kE, 44);
  const Bits before = run_into(layer, good.forward_inputs(), good.T);
  const RankInputs over = random_inputs(kCap + 3, kH, kK, kE, 45);
  for (int form = 0; form < 4; ++form) {
    SCOPED_TRACE("form " + std::to_string(form));
    const Caught c = catch_error([&] {
      if (form == 0) layer.forward(over.forward_inputs());
      if (form == 1) layer.forward_view(over.forward_inputs());
      if (form == 2) {
        Bits out(size_t(over.T) * kH);
        layer.forward(over.forward_inputs(),
                      TensorView::contiguous(out.data(), DType::kBF16, {over.T, kH}));
      }
      if (form == 3) layer.forward_unfinalized(over.forward_inputs());  // also the wrong mode
    });
    ASSERT_TRUE(c.thrown);
    if (form == 3) continue;  // either error is right there
    EXPECT_EQ(int(c.code), int(ErrorCode::kCapacity)) << c.what;
    EXPECT_TRUE(contains(c.what, std::to_string(kCap + 3)) &&
                contains(c.what, std::to_string(kCap)))
        << c.what;
  }
  EXPECT_EQ(bitwise_diff(run_into(layer, good.forward_inputs(), good.T), before, kH), "");
}

// W = 2, only rank 1's input is bad: rank 1 gets the input error, rank 0 an error that names
// rank 1 — promptly, not after the timeout — and both ranks then run the next call as before.
TEST(BadInput, ABadRankMakesItsPeerFailNamingItAndBothRecover) {
  const int W = 2, El = kE / W;
  const HostPack pack = random_pack(Recipe::kMxfp4Mxfp8, kE, kH, kI, 46);
  const LayerConfig cfg = make_config(Recipe::kMxfp4Mxfp8, kE, kCap, kH, kI, kK);
  std::vector<RankInputs> good = {random_inputs(5, kH, kK, kE, 47),
                                  random_inputs(7, kH, kK, kE, 48)};
  const int64_t kTimeout = 10000;
  auto fleet = make_cpu_fleet(W);
  struct PerRank {
    Bits before, after_ids, after_dtype, after_cap;
    Caught ids_err, dtype_err, cap_err;
    double ids_ms = 0, dtype_ms = 0, cap_ms = 0;
  };
  std::vector<PerRank> res(W);
  run_fleet(W, [&](int r) {
    MegaLayer layer(cpu_boot(W, r, fleet, kTimeout), cfg, pack.view(r * El, El),
                    pack.epilogue_view(r * El, El));
    auto& me = res[r];
    me.before = run_into(layer, good[r].forward_inputs(), good[r].T);
    // 1. An expert id out of range on rank 1 (found by looking at the values).
    RankInputs bad = good[r];
    if (r == 1) bad.ids[0] = kE + 5;
    auto t0 = Clock::now();
    me.ids_err = catch_error([&] { run_into(layer, bad.forward_inputs(), bad.T); });
    me.ids_ms = ms_since(t0);
    me.after_ids = run_into(layer, good[r].forward_inputs(), good[r].T);
    // 2. A dtype error on rank 1 (found from the tensor description).
    ForwardInputs fi = good[r].forward_inputs();
    if (r == 1) fi.topk_weights.dtype = DType::kI32;
    t0 = Clock::now();
    me.dtype_err = catch_error([&] { run_into(layer, fi, good[r].T); });
    me.dtype_ms = ms_since(t0);
    me.after_dtype = run_into(layer, good[r].forward_inputs(), good[r].T);
    // 3. More tokens than the capacity on rank 1 only.
    const RankInputs over = random_inputs(r == 1 ? kCap + 1 : 2, kH, kK, kE, 49);
    t0 = Clock::now();
    me.cap_err = catch_error([&] { layer.forward(over.forward_inputs()); });
    me.cap_ms = ms_since(t0);
    me.after_cap = run_into(layer, good[r].forward_inputs(), good[r].T);
    layer.destroy();
  });
  EXPECT_TRUE(res[1].cap_err.thrown && res[1].cap_err.code == ErrorCode::kCapacity &&
              contains(res[1].cap_err.what, std::to_string(kCap + 1)))
      << res[1].cap_err.what;
  EXPECT_TRUE(res[1].ids_err.thrown && contains(res[1].ids_err.what, std::to_string(kE + 5)))
      << res[1].ids_err.what;
  EXPECT_TRUE(res[1].dtype_err.thrown && contains(res[1].dtype_err.what, "topk_weights"))
      << res[1].dtype_err.what;
  for (const auto* e : {&res[0].ids_err, &res[0].dtype_err, &res[0].cap_err}) {
    EXPECT_TRUE(e->thrown) << "rank 0 returned normally although rank 1 failed the call";
    EXPECT_EQ(int(e->code), int(ErrorCode::kPeer)) << e->what;
    EXPECT_TRUE(contains(e->what, "rank 1")) << "rank 0's error does not name rank 1: " << e->what;
  }
  EXPECT_LT(res[0].ids_ms, kTimeout / 2)
      << "rank 0 waited for the timeout: " << res[0].ids_err.what;
  EXPECT_LT(res[0].dtype_ms, kTimeout / 2)
      << "rank 0 waited for the timeout: " << res[0].dtype_err.what;
  EXPECT_LT(res[0].cap_ms, kTimeout / 2)
      << "rank 0 waited for the timeout: " << res[0].cap_err.what;
  for (int r = 0; r < W; ++r) {
    EXPECT_EQ(bitwise_diff(res[r].after_cap, res[r].before, kH), "") << "rank " << r;
    EXPECT_EQ(bitwise_diff(res[r].after_ids, res[r].before, kH), "") << "rank " << r;
    EXPECT_EQ(bitwise_diff(res[r].after_dtype, res[r].before, kH), "") << "rank " << r;
  }
}

// Every way one rank's call can be rejected locally must release its peers at once (they are
// already waiting in the same collective op), naming the rank; then both ranks run on as before.
struct LocalRejection {
  const char* name;
  std::function<void(MegaLayer&, const RankInputs&)> bad_call;  // run by rank 1
};

void PrintTo(const LocalRejection& c, std::ostream* os) { *os << c.name; }

class OneRankRejects : public ::testing::TestWithParam<LocalRejection> {};

TEST_P(OneRankRejects, PeerFailsPromptlyNamingItAndBothRecover) {
  const int W = 2, El = kE / W;
  const HostPack pack = random_pack(Recipe::kNvfp4, kE, kH, kI, 60);
  const LayerConfig cfg = make_config(Recipe::kNvfp4, kE, kCap, kH, kI, kK);
  const std::vector<RankInputs> good = {random_inputs(4, kH, kK, kE, 61),
                                        random_inputs(6, kH, kK, kE, 62)};
  const int64_t kTimeout = 4000;
  auto fleet = make_cpu_fleet(W);
  std::vector<Bits> before(W), after(W);
  std::vector<Caught> errs(W), after_err(W);
  double peer_ms = 0;
  run_fleet(W, [&](int r) {
    MegaLayer layer(cpu_boot(W, r, fleet, kTimeout), cfg, pack.view(r * El, El),
                    pack.epilogue_view(r * El, El));
    before[r] = run_into(layer, good[r].forward_inputs(), good[r].T);
    const auto t0 = Clock::now();
    errs[r] = catch_error([&] {
      if (r == 1)
        GetParam().bad_call(layer, good[r]);
      else
        run_into(layer, good[r].forward_inputs(), good[r].T);
    });
    if (r == 0) peer_ms = ms_since(t0);
    after_err[r] =
        catch_error([&] { after[r] = run_into(layer, good[r].forward_inputs(), good[r].T); });
  });
  ASSERT_TRUE(errs[1].thrown) << "the bad call was accepted";
  ASSERT_TRUE(errs[0].thrown) << "rank 0 returned normally although rank 1 failed the call";
  EXPECT_EQ(int(errs[0].code), int(ErrorCode::kPeer)) << errs[0].what;
  EXPECT_TRUE(contains(errs[0].what, "rank 1")) << errs[0].what;
  EXPECT_LT(peer_ms, kTimeout / 2) << "rank 0 waited for the timeout: " << errs[0].what
                                   << " (rank 1's error: " << errs[1].what << ")";
  for (int r = 0; r < W; ++r) {
    EXPECT_FALSE(after_err[r].thrown) << "rank " << r << " after: " << after_err[r].what;
    EXPECT_EQ(bitwise_diff(after[r], before[r], kH), "") << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Calls, OneRankRejects,
    ::testing::Values(LocalRejection{"ViewUnknownWorkspace",
                                     [](MegaLayer& l, const RankInputs& in) {
                                       ForwardInputs fi = in.forward_inputs();
                                       fi.workspace = WorkspaceId{7};
                                       l.forward_view(fi);
                                     }},
                      LocalRejection{"ViewOverCapacity",
                                     [](MegaLayer& l, const RankInputs&) {
                                       const RankInputs over =
                                           random_inputs(kCap + 2, kH, kK, kE, 63);
                                       l.forward_view(over.forward_inputs());
                                     }},
                      LocalRejection{"UnfinalizedOnFinalizingLayer",
                                     [](MegaLayer& l, const RankInputs& in) {
                                       l.forward_unfinalized(in.forward_inputs());
                                     }},
                      LocalRejection{"OwnedForwardHidden3D",
                                     [](MegaLayer& l, const RankInputs& in) {
                                       ForwardInputs fi = in.forward_inputs();
                                       fi.hidden_states = TensorView::contiguous(
                                           fi.hidden_states.data, DType::kBF16, {1, in.T, kH});
                                       l.forward(fi);
                                     }},
                      LocalRejection{"CallerOutWrongShape",
                                     [](MegaLayer& l, const RankInputs& in) {
                                       Bits out(size_t(in.T) * kH);
                                       l.forward(in.forward_inputs(),
                                                 TensorView::contiguous(out.data(), DType::kBF16,
                                                                        {in.T - 1, kH}));
                                     }},
                      LocalRejection{"OwnedForwardUnknownWorkspace",
                                     [](MegaLayer& l, const RankInputs& in) {
                                       ForwardInputs fi = in.forward_inputs();
                                       fi.workspace = WorkspaceId{-1};
                                       l.forward(fi);
                                     }}),
    [](const auto& info) { return std::string(info.param.name); });

// docs/contract.md §4: every rank runs a call with the same workspace. Ranks that disagree all get
// an error naming both workspaces (nobody waits for a timeout, nothing is written to their
// outputs), and the next call with one workspace gives the same bits as before.
TEST(BadInput, RanksWithDifferentWorkspacesAllFailNamingBoth) {
  const int W = 2, El = kE / W;
  const HostPack pack = random_pack(Recipe::kNvfp4, kE, kH, kI, 64);
  const LayerConfig cfg = make_config(Recipe::kNvfp4, kE, kCap, kH, kI, kK);
  const std::vector<RankInputs> good = {random_inputs(4, kH, kK, kE, 65),
                                        random_inputs(6, kH, kK, kE, 66)};
  const int64_t kTimeout = 4000;
  auto fleet = make_cpu_fleet(W);
  std::vector<Bits> before(W), after(W), during(W);
  std::vector<Caught> errs(W);
  std::vector<double> ms(W);
  run_fleet(W, [&](int r) {
    MegaLayer layer(cpu_boot(W, r, fleet, kTimeout), cfg, pack.view(r * El, El),
                    pack.epilogue_view(r * El, El));
    const WorkspaceId small = layer.create_workspace(8);
    before[r] = run_into(layer, good[r].forward_inputs(), good[r].T);
    ForwardInputs fi = good[r].forward_inputs();
    if (r == 1) fi.workspace = small;  // rank 0 keeps the default workspace
    during[r].assign(size_t(good[r].T) * kH, kPoison);
    const auto t0 = Clock::now();
    errs[r] = catch_error([&] {
      layer.forward(fi, TensorView::contiguous(during[r].data(), DType::kBF16, {good[r].T, kH}));
    });
    ms[r] = ms_since(t0);
    ForwardInputs again = good[r].forward_inputs();
    again.workspace = small;
    after[r] = run_into(layer, again, good[r].T);
  });
  for (int r = 0; r < W; ++r) {
    ASSERT_TRUE(errs[r].thrown) << "rank " << r << " accepted a call with another workspace";
    EXPECT_EQ(int(errs[r].code), int(ErrorCode::kInvalidArgument)) << errs[r].what;
    EXPECT_TRUE(contains(errs[r].what, "workspace 0") && contains(errs[r].what, "workspace 1"))
        << errs[r].what;
    EXPECT_LT(ms[r], kTimeout / 2) << "rank " << r << " waited for the timeout";
    EXPECT_EQ(count_nan(during[r]), during[r].size()) << "rank " << r << " wrote its output";
    EXPECT_EQ(bitwise_diff(after[r], before[r], kH), "") << "rank " << r;
  }
}

// W = 2, rank 1 never makes the call: rank 0 times out with an error naming peer rank 1 and the
// stage it waited at.
TEST(Faults, ASkippedCallTimesOutNamingThePeerAndStage) {
  const int W = 2, El = kE / W;
  const HostPack pack = random_pack(Recipe::kBf16, kE, kH, kI, 49);
  const LayerConfig cfg = make_config(Recipe::kBf16, kE, kCap, kH, kI, kK);
  const RankInputs in = random_inputs(4, kH, kK, kE, 50);
  const int64_t kTimeout = 1000;
  auto fleet = make_cpu_fleet(W);
  std::atomic<bool> rank0_done{false};
  Caught err, sticky, late;
  double elapsed = 0, sticky_ms = 0;
  auto errs = run_fleet_collect(W, [&](int r) {
    MegaLayer layer(cpu_boot(W, r, fleet, kTimeout), cfg, pack.view(r * El, El),
                    pack.epilogue_view(r * El, El));
    if (r == 0) {
      const auto t0 = Clock::now();
      err = catch_error([&] { layer.forward(in.forward_inputs()); });
      elapsed = ms_since(t0);
      // The failure is sticky: the next host call reports it, with the peer's rank, at once.
      const auto t1 = Clock::now();
      sticky = catch_error([&] { layer.forward(in.forward_inputs()); });
      sticky_ms = ms_since(t1);
      rank0_done = true;
    } else {
      // Skip the call; stay alive (a destroy would be a later collective) until rank 0 gave up.
      const auto t0 = Clock::now();
      while (!rank0_done && ms_since(t0) < 30000)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      // Now make the call, late: rank 0 has given up on it, so this must fail too, naming rank
      // 0 — not return an output computed with whatever its buffers hold.
      late = catch_error([&] { layer.forward(in.forward_inputs()); });
    }
    // The destructors run destroy() on desynchronized ranks: bounded, never throws.
  });
  for (int r = 0; r < W; ++r)
    EXPECT_FALSE(errs[r]) << "rank " << r << ": " << inspect(errs[r]).what;
  ASSERT_TRUE(err.thrown) << "rank 0's forward returned although rank 1 never came";
  EXPECT_EQ(int(err.code), int(ErrorCode::kPeer)) << err.what;
  EXPECT_TRUE(contains(err.what, "rank 1")) << err.what;
  EXPECT_TRUE(contains(lower(err.what), "stage")) << err.what;
  EXPECT_GE(elapsed, kTimeout * 0.9) << err.what;
  EXPECT_LT(elapsed, kTimeout * 10.0) << err.what;
  EXPECT_TRUE(sticky.thrown) << "the call after the failure ran";
  EXPECT_EQ(int(sticky.code), int(ErrorCode::kPeer)) << sticky.what;
  EXPECT_TRUE(contains(sticky.what, "rank 1")) << sticky.what;
  EXPECT_LT(sticky_ms, kTimeout * 0.5) << "the sticky error waited again: " << sticky.what;
  EXPECT_TRUE(late.thrown) << "rank 1's late call returned an output without rank 0";
  EXPECT_EQ(int(late.code), int(ErrorCode::kPeer)) << late.what;
  EXPECT_TRUE(contains(late.what, "rank 0")) << late.what;
}

TEST(Lifetime, CallsAfterDestroyFailClearlyAndDestroyIsIdempotent) {
  const int W = 2, El = kE / W;
  const HostPack pack = random_pack(Recipe::kNvfp4, kE, kH, kI, 51);
  const LayerConfig cfg = make_config(Recipe::kNvfp4, kE, kCap, kH, kI, kK);
  const RankInputs in = random_inputs(3, kH, kK, kE, 52);
  auto fleet = make_cpu_fleet(W);
  std::vector<std::vector<std::string>> bad(W);
  run_fleet(W, [&](int r) {
    MegaLayer layer(cpu_boot(W, r, fleet), cfg, pack.view(r * El, El),
                    pack.epilogue_view(r * El, El));
    layer.forward(in.forward_inputs());
    EXPECT_FALSE(layer.destroyed());
    layer.destroy();
    layer.destroy();  // idempotent
    if (!layer.destroyed()) bad[r].push_back("destroyed() is false after destroy()");
    const std::vector<std::pair<std::string, std::function<void()>>> calls = {
        {"forward", [&] { layer.forward(in.forward_inputs()); }},
        {"forward_view", [&] { layer.forward_view(in.forward_inputs()); }},
        {"forward_unfinalized", [&] { layer.forward_unfinalized(in.forward_inputs()); }},
        {"create_workspace", [&] { layer.create_workspace(4); }},
        {"select_workspace", [&] { layer.select_workspace(1); }},
        {"warmup", [&] { layer.warmup(); }},
        {"kernel_weights", [&] { layer.kernel_weights(); }},
        {"expert_weight_views", [&] { layer.expert_weight_views(); }},
    };
    for (const auto& [name, call] : calls) {
      const Caught c = catch_error(call);
      if (!c.thrown || c.code != ErrorCode::kDestroyed || !contains(c.what, "destroy"))
        bad[r].push_back(name + " after destroy: " + (c.thrown ? c.what : "no error"));
    }
  });
  for (int r = 0; r < W; ++r)
    for (const auto& b : bad[r]) ADD_FAILURE() << "rank " << r << ": " << b;
}

TEST(Lifetime, ForwardModeMismatchIsAnErrorAndChangesNothing) {
  const int W = 2, El = kE / W;
  const HostPack pack = random_pack(Recipe::kMxfp4Bf16, kE, kH, kI, 53);
  const RankInputs in = random_inputs(5, kH, kK, kE, 54);
  auto fleet = make_cpu_fleet(W);
  for (bool finalize : {true, false}) {
    SCOPED_TRACE(finalize ? "do_finalize = true" : "do_finalize = false");
    LayerConfig cfg = make_config(Recipe::kMxfp4Bf16, kE, kCap, kH, kI, kK);
    cfg.recipe.do_finalize = finalize;
    std::vector<Caught> errs(W);
    std::vector<Bits> before(W), after(W);
    run_fleet(W, [&](int r) {
      MegaLayer layer(cpu_boot(W, r, fleet), cfg, pack.view(r * El, El),
                      pack.epilogue_view(r * El, El));
      auto run_ok = [&] {
        if (finalize) return run_into(layer, in.forward_inputs(), in.T);
        return sum_unfinalized(layer.forward_unfinalized(in.forward_inputs()), in);
      };
      before[r] = run_ok();
      errs[r] = catch_error([&] {
        if (finalize)
          layer.forward_unfinalized(in.forward_inputs());
        else
          layer.forward(in.forward_inputs());
      });
      after[r] = run_ok();
      layer.destroy();
    });
    for (int r = 0; r < W; ++r) {
      EXPECT_TRUE(errs[r].thrown) << "rank " << r;
      EXPECT_EQ(int(errs[r].code), int(ErrorCode::kState)) << errs[r].what;
      EXPECT_TRUE(contains(errs[r].what, "do_finalize")) << errs[r].what;
      EXPECT_EQ(bitwise_diff(after[r], before[r], kH), "") << "rank " << r;
    }
  }
}

TEST(Lifetime, PropertiesAsVllmReadsThem) {
  const int W = 2;
  const HostPack pack = random_pack(Recipe::kMxfp4Mxfp8, 2 * kE, kH, kI, 69);
  const LayerConfig cfg = make_config(Recipe::kMxfp4Mxfp8, 2 * kE, kCap, kH, kI, kK);
  auto fleet = make_cpu_fleet(W);
  std::vector<std::string> bad(W);
  run_fleet(W, [&](int r) {
    MegaLayer layer(cpu_boot(W, r, fleet), cfg, pack.view(r * kE, kE),
                    pack.epilogue_view(r * kE, kE));
    auto check = [&](bool ok, const char* what) {
      if (!ok) bad[r] += std::string(what) + "; ";
    };
    check(layer.topk_indices_dtype() == DType::kI32, "topk index dtype int32");
    check(layer.output_is_reduced(), "output is reduced");
    check(!layer.is_monolithic(), "not monolithic");
    check(layer.rank() == r && layer.world_size() == W, "rank and world size");
    check(layer.num_local_experts() == kE, "E_local");
    check(layer.backend() == Backend::kCPU, "backend");
    check(layer.config().recipe.recipe == Recipe::kMxfp4Mxfp8, "config");
    check(layer.workspace_capacity(layer.default_workspace()) == kCap, "default capacity");
    check(!layer.uses_fp8_mma(), "no fp8 tensor cores on the CPU");
    layer.destroy();
    check(!layer.uses_fp8_mma(), "no fp8 MMA after destroy()");
  });
  for (int r = 0; r < W; ++r) EXPECT_EQ(bad[r], "") << "rank " << r;
}

// RecipeConfig::fp8_mma asks for the CUDA backend's fp8 path; the CPU backend computes the recipe
// exactly either way and says so.
TEST(Lifetime, CpuLayerWithFp8MmaReportsNone) {
  const HostPack pack = random_pack(Recipe::kMxfp4Mxfp8, kE, kH, kI, 70);
  LayerConfig cfg = make_config(Recipe::kMxfp4Mxfp8, kE, kCap, kH, kI, kK);
  cfg.recipe.fp8_mma = true;
  MegaLayer layer(cpu_boot(1, 0, make_cpu_fleet(1)), cfg, pack.view(0, kE),
                  pack.epilogue_view(0, kE));
  EXPECT_FALSE(layer.uses_fp8_mma());
}

// ---------------------------------------------------------------------------------------------
// Configuration

// Whether one of the reasons mentions every part.
bool any(const std::vector<std::string>& rs, const std::vector<std::string>& parts) {
  for (const auto& r : rs) {
    bool all = true;
    for (const auto& p : parts) all = all && contains(r, p);
    if (all) return true;
  }
  return false;
}

TEST(Config, UnsupportedReasonsListsEveryProblemAtOnce) {
  LayerConfig good = make_config(Recipe::kNvfp4, 8, 16, 256, 128, 2);
  EXPECT_TRUE(unsupported_reasons(good, 2).empty());
  EXPECT_TRUE(unsupported_reasons(good, 8).empty());
  // Where no CUDA backend can run, asking for it gives a reason instead of an empty list.
  if (resolve_backend(Backend::kAuto) == Backend::kCPU)
    EXPECT_FALSE(unsupported_reasons(good, 2, Backend::kCUDA).empty());

  // Three problems, three reasons, each naming its value and limit.
  LayerConfig three = make_config(Recipe::kBf16, 6, 16, 100, 90, 2);
  const auto r3 = unsupported_reasons(three, 4);
  ASSERT_EQ(r3.size(), 3u) << ::testing::PrintToString(r3);
  EXPECT_TRUE(any(r3, {"6", "4"})) << "E = 6 vs W = 4: " << ::testing::PrintToString(r3);
  EXPECT_TRUE(any(r3, {"100", "64"})) << "H = 100: " << ::testing::PrintToString(r3);
  EXPECT_TRUE(any(r3, {"90", "64"})) << "I = 90: " << ::testing::PrintToString(r3);

  // Every feature the library does not run, each its own reason.
  LayerConfig many = good;
  many.recipe.activation_dtype = DType::kF16;
  many.fleet.num_experts = 7;  // not divisible by W = 2
  many.fleet.hidden_size = 200;
  many.recipe.intermediate_size = 48;
  const auto rm = unsupported_reasons(many, 2);
  EXPECT_EQ(rm.size(), 4u) << ::testing::PrintToString(rm);
  EXPECT_TRUE(any(rm, {"float16"})) << ::testing::PrintToString(rm);
  EXPECT_TRUE(any(rm, {"7", "2"})) << ::testing::PrintToString(rm);
  EXPECT_TRUE(any(rm, {"200", "64"})) << ::testing::PrintToString(rm);
  EXPECT_TRUE(any(rm, {"48", "64"})) << ::testing::PrintToString(rm);

  // gpt-oss's expert semantics: the CPU backend runs them with every recipe, the CUDA backend
  // with mxfp4_bf16, nvfp4_bf16 and bf16 and names each elsewhere (here nvfp4, and the fp8 path
  // of mxfp4_mxfp8).
  LayerConfig oai = good;
  oai.recipe.has_expert_bias = true;
  oai.recipe.swiglu_alpha = 1.702f;
  oai.recipe.swiglu_beta = 1.0f;
  EXPECT_TRUE(unsupported_reasons(oai, 2, Backend::kCPU).empty())
      << ::testing::PrintToString(unsupported_reasons(oai, 2, Backend::kCPU));
  const auto rc = unsupported_reasons(oai, 2, Backend::kCUDA);
  EXPECT_TRUE(any(rc, {"bias", "CUDA"})) << ::testing::PrintToString(rc);
  EXPECT_TRUE(any(rc, {"alpha", "1.702", "CUDA"})) << ::testing::PrintToString(rc);
  for (Recipe r : {Recipe::kMxfp4Bf16, Recipe::kNvfp4Bf16, Recipe::kBf16}) {
    LayerConfig runs = oai;
    runs.recipe.recipe = r;
    const auto rr = unsupported_reasons(runs, 2, Backend::kCUDA);
    EXPECT_FALSE(any(rr, {"bias"}) || any(rr, {"alpha"})) << ::testing::PrintToString(rr);
  }
  LayerConfig oai_fp8 = oai;
  oai_fp8.recipe.recipe = Recipe::kMxfp4Mxfp8;
  oai_fp8.recipe.fp8_mma = true;
  EXPECT_TRUE(any(unsupported_reasons(oai_fp8, 2, Backend::kCUDA), {"bias", "fp8 tensor cores"}));
  LayerConfig nan_alpha = good;
  nan_alpha.recipe.swiglu_alpha = std::nanf("");
  EXPECT_TRUE(any(unsupported_reasons(nan_alpha, 2), {"swiglu_alpha", "finite"}));

  // What an engine may ask that the library does not do: each its own reason.
  LayerConfig engine = good;
  engine.recipe.weight_scheme = "awq";
  engine.recipe.skip_final_all_reduce = true;
  engine.recipe.runtime_weight_transfer = true;
  engine.recipe.dual_batch_overlap = true;
  const auto re = unsupported_reasons(engine, 2);
  EXPECT_EQ(re.size(), 4u) << ::testing::PrintToString(re);
  EXPECT_TRUE(any(re, {"weight scheme 'awq'", "nvfp4"})) << ::testing::PrintToString(re);
  EXPECT_TRUE(any(re, {"skip_final_all_reduce"})) << ::testing::PrintToString(re);
  EXPECT_TRUE(any(re, {"runtime weight transfer"})) << ::testing::PrintToString(re);
  EXPECT_TRUE(any(re, {"dual batch overlap"})) << ::testing::PrintToString(re);
  LayerConfig named = good;
  named.recipe.weight_scheme = recipe_name(good.recipe.recipe);  // a recipe's name: accepted
  EXPECT_TRUE(unsupported_reasons(named, 2).empty())
      << ::testing::PrintToString(unsupported_reasons(named, 2));

  // Single problems.
  LayerConfig h = good;
  h.fleet.hidden_size = 96;
  EXPECT_TRUE(any(unsupported_reasons(h, 1), {"96", "64"}));
  LayerConfig i = good;
  i.recipe.intermediate_size = 80;
  EXPECT_TRUE(any(unsupported_reasons(i, 1), {"80", "64"}));
  LayerConfig e = good;
  e.fleet.num_experts = 5;
  EXPECT_TRUE(any(unsupported_reasons(e, 2), {"5", "2"}));
  EXPECT_TRUE(unsupported_reasons(e, 1).empty());
  LayerConfig k = good;
  k.recipe.top_k = 9;
  EXPECT_TRUE(any(unsupported_reasons(k, 1), {"9", "8"}));
}

// fp8_mma: another recipe is refused on every backend; on the CUDA backend also W > 1 and H or I
// not a multiple of 128, each reason naming its value (the CUDA reasons need no GPU).
TEST(Config, Fp8MmaReasons) {
  LayerConfig ok = make_config(Recipe::kMxfp4Mxfp8, 8, 16, 256, 128, 2);
  ok.recipe.fp8_mma = true;
  EXPECT_TRUE(unsupported_reasons(ok, 1).empty())
      << ::testing::PrintToString(unsupported_reasons(ok, 1));
  LayerConfig nv = ok;
  nv.recipe.recipe = Recipe::kNvfp4;
  const auto rn = unsupported_reasons(nv, 1);
  ASSERT_EQ(rn.size(), 1u) << ::testing::PrintToString(rn);
  EXPECT_TRUE(any(rn, {"fp8_mma", "nvfp4"})) << ::testing::PrintToString(rn);

  const auto rc = unsupported_reasons(ok, 1, Backend::kCUDA);
  if (any(rc, {"no CUDA backend"})) GTEST_SKIP() << "this build has no CUDA backend";
  EXPECT_FALSE(any(rc, {"fp8_mma"})) << ::testing::PrintToString(rc);
  LayerConfig bad = ok;
  bad.fleet.hidden_size = 192;
  bad.recipe.intermediate_size = 320;
  const auto rb = unsupported_reasons(bad, 2, Backend::kCUDA);
  EXPECT_TRUE(any(rb, {"fp8_mma", "W = 2"})) << ::testing::PrintToString(rb);
  EXPECT_TRUE(any(rb, {"fp8_mma", "H = 192", "128"})) << ::testing::PrintToString(rb);
  EXPECT_TRUE(any(rb, {"fp8_mma", "I = 320", "128"})) << ::testing::PrintToString(rb);
  LayerConfig off = bad;
  off.recipe.fp8_mma = false;
  EXPECT_FALSE(any(unsupported_reasons(off, 2, Backend::kCUDA), {"fp8_mma"}));
}

// Construction with a bad configuration fails on every rank (nobody waits) with every reason.
TEST(Config, ConstructionRejectsWithEveryReasonOnEveryRank) {
  const int W = 2;
  LayerConfig cfg = make_config(Recipe::kBf16, 5, 16, 96, 64, 2);    // E % W and H
  const HostPack pack = random_pack(Recipe::kBf16, 4, 128, 64, 55);  // any views will do
  auto fleet = make_cpu_fleet(W);
  const auto t0 = Clock::now();
  auto errs = run_fleet_collect(W, [&](int r) {
    MegaLayer layer(cpu_boot(W, r, fleet, 20000), cfg, pack.view(r * 2, 2),
                    pack.epilogue_view(r * 2, 2));
  });
  EXPECT_LT(ms_since(t0), 5000.0);
  for (int r = 0; r < W; ++r) {
    const Caught c = inspect(errs[r]);
    ASSERT_TRUE(c.thrown) << "rank " << r;
    EXPECT_EQ(int(c.code), int(ErrorCode::kUnsupported)) << c.what;
    EXPECT_TRUE(contains(c.what, "5") && contains(c.what, "96") && contains(c.what, "64"))
        << c.what;
  }
  // A rank outside the world.
  const Caught c = catch_error([&] {
    MegaLayer layer(cpu_boot(2, 2, make_cpu_fleet(2)),
                    make_config(Recipe::kBf16, 4, 16, 128, 64, 2), pack.view(0, 2),
                    pack.epilogue_view(0, 2));
  });
  EXPECT_TRUE(c.thrown && contains(c.what, "rank 2")) << c.what;
}

TEST(Config, WeightTensorsOfTheWrongShapeOrDtypeAreNamed) {
  const HostPack pack = random_pack(Recipe::kNvfp4, kE, kH, kI, 56);
  const LayerConfig cfg = make_config(Recipe::kNvfp4, kE, kCap, kH, kI, kK);
  struct Case {
    const char* name;
    std::function<void(WeightPack&)> mutate;
  };
  const Case cases[] = {
      {"w13", [](WeightPack& w) { w.w13.shape[1] -= 1; }},
      {"w2", [](WeightPack& w) { w.w2.shape[2] += 1; }},
      {"w13_scale", [](WeightPack& w) { w.w13_scale.shape[2] = kH / 32; }},
      {"w2_scale", [](WeightPack& w) { w.w2_scale = TensorView{}; }},
      {"w13", [](WeightPack& w) { w.w13.dtype = DType::kF32; }},
      {"w13", [](WeightPack& w) { w.w13.shape[0] = kE + 1; }},
  };
  for (const auto& cs : cases) {
    WeightPack w = pack.view(0, kE);
    cs.mutate(w);
    const Caught c = catch_error(
        [&] { MegaLayer layer(cpu_boot(1, 0, nullptr), cfg, w, pack.epilogue_view(0, kE)); });
    EXPECT_TRUE(c.thrown && contains(c.what, cs.name)) << cs.name << ": " << c.what;
  }
  // Scales tagged as float8 bytes are accepted.
  EXPECT_FALSE(catch_error([&] {
                 MegaLayer layer(cpu_boot(1, 0, nullptr), cfg, pack.view(0, kE, DType::kF8E4M3),
                                 pack.epilogue_view(0, kE));
               }).thrown);
  // The bf16 recipe takes no scales.
  const HostPack b = random_pack(Recipe::kBf16, kE, kH, kI, 57);
  WeightPack wb = b.view(0, kE);
  wb.w13_scale = pack.view(0, kE).w13_scale;
  const Caught c = catch_error([&] {
    MegaLayer layer(cpu_boot(1, 0, nullptr), make_config(Recipe::kBf16, kE, kCap, kH, kI, kK), wb);
  });
  EXPECT_TRUE(c.thrown && contains(c.what, "scale")) << c.what;
}

TEST(Config, BootstrapAndWorkspaceMistakesAreNamed) {
  const HostPack pack = random_pack(Recipe::kBf16, kE, kH, kI, 67);
  const LayerConfig cfg = make_config(Recipe::kBf16, kE, kCap, kH, kI, kK);
  // W > 1 without a fleet; a fleet of another size.
  Caught c = catch_error([&] {
    MegaLayer l(cpu_boot(2, 0, nullptr), cfg, pack.view(0, 2), pack.epilogue_view(0, 2));
  });
  EXPECT_TRUE(c.thrown && contains(c.what, "fleet")) << c.what;
  c = catch_error([&] {
    MegaLayer l(cpu_boot(2, 0, make_cpu_fleet(3)), cfg, pack.view(0, 2), pack.epilogue_view(0, 2));
  });
  EXPECT_TRUE(c.thrown && contains(c.what, "3") && contains(c.what, "2")) << c.what;
  // Weights on a device the CPU backend cannot read.
  c = catch_error([&] {
    WeightPack w = pack.view(0, kE);
    w.w2.device = Device{DeviceKind::kCUDA, 0};
    MegaLayer l(cpu_boot(1, 0, nullptr), cfg, w, pack.epilogue_view(0, kE));
  });
  EXPECT_TRUE(c.thrown && contains(c.what, "w2")) << c.what;
  // Workspace calls with impossible arguments.
  MegaLayer layer(cpu_boot(1, 0, nullptr), cfg, pack.view(0, kE), pack.epilogue_view(0, kE));
  c = catch_error([&] { layer.create_workspace(0); });
  EXPECT_TRUE(c.thrown && contains(c.what, "0")) << c.what;
  c = catch_error([&] { layer.warmup(WorkspaceId{3}); });
  EXPECT_TRUE(c.thrown && contains(c.what, "3")) << c.what;
  c = catch_error([&] { layer.workspace_capacity(WorkspaceId{3}); });
  EXPECT_TRUE(c.thrown && contains(c.what, "3")) << c.what;
  // The layer still works.
  const RankInputs in = random_inputs(3, kH, kK, kE, 68);
  EXPECT_EQ(count_nan(run_into(layer, in.forward_inputs(), in.T)), 0u);
}

// Construction is collective: when one rank's weights or epilogue vectors are rejected, its
// peers (already waiting in the construction collective) fail at once naming it, and the fleet
// stays usable: a valid layer built on it next works on every rank.
TEST(Config, ConstructionRejectedOnOneRankReleasesPeersAndKeepsTheFleetUsable) {
  const int W = 2, El = kE / W;
  const HostPack pack = random_pack(Recipe::kNvfp4, kE, kH, kI, 64);
  const LayerConfig cfg = make_config(Recipe::kNvfp4, kE, kCap, kH, kI, kK);
  const std::vector<RankInputs> in = {random_inputs(5, kH, kK, kE, 65),
                                      random_inputs(3, kH, kK, kE, 66)};
  FleetSetup own{W, cfg, &pack};
  const auto want = run_calls(own, {in}, OutMode::kCaller);
  const int64_t kTimeout = 3000;
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which == 0 ? "w13 of the wrong shape on rank 1" : "fc2_alpha of the wrong size");
    auto fleet = make_cpu_fleet(W);
    std::vector<Caught> errs(W), later(W);
    std::vector<Bits> out(W);
    double rank0_ms = 0;
    std::vector<float> short_alpha(El - 1, 1.0f);
    run_fleet(W, [&](int r) {
      WeightPack w = pack.view(r * El, El);
      EpilogueVectors ep = pack.epilogue_view(r * El, El);
      if (r == 1 && which == 0) w.w13.shape[2] += 2;
      if (r == 1 && which == 1)
        ep.fc2_alpha = TensorView::contiguous(short_alpha.data(), DType::kF32, {El - 1});
      const auto t0 = Clock::now();
      errs[r] = catch_error([&] { MegaLayer bad(cpu_boot(W, r, fleet, kTimeout), cfg, w, ep); });
      if (r == 0) rank0_ms = ms_since(t0);
      later[r] = catch_error([&] {
        MegaLayer layer(cpu_boot(W, r, fleet, kTimeout), cfg, pack.view(r * El, El),
                        pack.epilogue_view(r * El, El));
        out[r] = run_into(layer, in[r].forward_inputs(), in[r].T);
        layer.destroy();
      });
    });
    EXPECT_TRUE(errs[1].thrown && contains(errs[1].what, which == 0 ? "w13" : "fc2_alpha"))
        << errs[1].what;
    EXPECT_TRUE(errs[0].thrown && contains(errs[0].what, "rank 1")) << "rank 0: " << errs[0].what;
    EXPECT_LT(rank0_ms, kTimeout / 2) << "rank 0 waited for the timeout: " << errs[0].what;
    for (int r = 0; r < W; ++r) {
      EXPECT_FALSE(later[r].thrown) << "rank " << r << ", the next layer: " << later[r].what;
      if (!later[r].thrown) EXPECT_EQ(bitwise_diff(out[r], want[0][r], kH), "") << "rank " << r;
    }
  }
}

// NaN scale bytes (E4M3 0x7F / 0xFF, UE8M0 0xFF) are rejected at construction, naming the tensor.
TEST(Config, NanScalesAreRejectedAtConstruction) {
  struct Case {
    Recipe recipe;
    bool fc1;
    uint8_t byte;
  };
  const Case cases[] = {{Recipe::kNvfp4, true, 0x7F},      {Recipe::kNvfp4, false, 0xFF},
                        {Recipe::kMxfp4Mxfp8, true, 0xFF}, {Recipe::kMxfp4Bf16, false, 0xFF},
                        {Recipe::kNvfp4Bf16, true, 0xFF},  {Recipe::kNvfp4Bf16, false, 0x7F}};
  for (const auto& cs : cases) {
    SCOPED_TRACE(std::string(recipe_name(cs.recipe)) + (cs.fc1 ? " w13_scale" : " w2_scale"));
    HostPack pack = random_pack(cs.recipe, kE, kH, kI, 58);
    const LayerConfig cfg = make_config(cs.recipe, kE, kCap, kH, kI, kK);
    auto& scales = cs.fc1 ? pack.w13_scale : pack.w2_scale;
    const size_t at =
        (cs.fc1 ? pack.w13_scale_bytes() : pack.w2_scale_bytes()) * 2 + 5;  // expert 2
    scales[at] = cs.byte;
    const Caught c = catch_error([&] {
      MegaLayer layer(cpu_boot(1, 0, nullptr), cfg, pack.view(0, kE), pack.epilogue_view(0, kE));
    });
    ASSERT_TRUE(c.thrown) << "NaN scale accepted";
    EXPECT_TRUE(contains(c.what, cs.fc1 ? "w13_scale" : "w2_scale")) << c.what;
    EXPECT_TRUE(contains(lower(c.what), "nan")) << c.what;
  }
  // W = 2, only rank 1's weights are bad: rank 1 names the tensor; rank 0 learns it in the
  // construction collective and names rank 1 at once (not after the timeout).
  HostPack pack = random_pack(Recipe::kNvfp4, kE, kH, kI, 59);
  pack.w13_scale[pack.w13_scale_bytes() * 3 + 1] = 0x7F;  // expert 3: rank 1's slot 1
  const LayerConfig cfg = make_config(Recipe::kNvfp4, kE, kCap, kH, kI, kK);
  auto fleet = make_cpu_fleet(2);
  const int64_t kTimeout = 3000;
  std::vector<double> ms(2);
  auto errs = run_fleet_collect(2, [&](int r) {
    const auto t0 = Clock::now();
    try {
      MegaLayer layer(cpu_boot(2, r, fleet, kTimeout), cfg, pack.view(r * 2, 2),
                      pack.epilogue_view(r * 2, 2));
    } catch (...) {
      ms[r] = ms_since(t0);
      throw;
    }
  });
  const Caught c1 = inspect(errs[1]), c0 = inspect(errs[0]);
  EXPECT_TRUE(c1.thrown && contains(c1.what, "w13_scale")) << c1.what;
  EXPECT_TRUE(c0.thrown && contains(c0.what, "rank 1")) << "rank 0: " << c0.what;
  EXPECT_LT(ms[0], kTimeout / 2) << "rank 0 waited for the timeout: " << c0.what;
}

}  // namespace
}  // namespace moe_ep::test
