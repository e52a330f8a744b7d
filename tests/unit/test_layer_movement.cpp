// Data movement, bitwise (docs/contract.md §7): bf16 weights chosen so that every output row says
// which rank and token it came from and which expert ran it; each slot is checked on its own
// through forward_unfinalized, and the finalized sum through forward.
#include <gtest/gtest.h>

#include "layer_test_util.h"

namespace moe_ep::test {
namespace {

constexpr int kH = 64, kI = 64, kK = 4, kCap = 48, kLocal = 4;
constexpr float kGate = 32.0f;  // sigmoid(32) is exactly 1.0f: exp(-32) < 2^-25

// x[t] = [1, rank, t, 0...]; expert e: g = 32, u = [rank, t, e + 1, 1, 0...], so h = 32 u and
// y = w2 h = [rank, t, e + 1, 0.., 1 at column 3 + e, 0...]. All values are exact in bf16.
HostPack payload_pack(int E) {
  HostPack p;
  p.allocate(Recipe::kBf16, E, kH, kI);
  auto* w13 = reinterpret_cast<uint16_t*>(p.w13.data());
  auto* w2 = reinterpret_cast<uint16_t*>(p.w2.data());
  auto set13 = [&](int e, int row, int col, float v) {
    w13[(size_t(e) * 2 * kI + row) * kH + col] = fmt::float_to_bf16(v);
  };
  auto set2 = [&](int e, int row, int col, float v) {
    w2[(size_t(e) * kH + row) * kI + col] = fmt::float_to_bf16(v);
  };
  for (int e = 0; e < E; ++e) {
    for (int j = 0; j < kI; ++j) set13(e, j, 0, kGate);
    set13(e, kI + 0, 1, 1.0f);
    set13(e, kI + 1, 2, 1.0f);
    set13(e, kI + 2, 0, float(e + 1));
    set13(e, kI + 3, 0, 1.0f);
    set2(e, 0, 0, 1.0f / kGate);
    set2(e, 1, 1, 1.0f / kGate);
    set2(e, 2, 2, 1.0f / kGate);
    set2(e, 3 + e, 3, 1.0f / kGate);
  }
  return p;
}

RankInputs payload_inputs(int rank, int T, int E, uint64_t seed) {
  RankInputs in = random_inputs(T, kH, kK, E, seed, Routing::kUniform, 0.25);
  std::fill(in.x.begin(), in.x.end(), 0);
  for (int t = 0; t < T; ++t) {
    in.x[size_t(t) * kH + 0] = fmt::float_to_bf16(1.0f);
    in.x[size_t(t) * kH + 1] = fmt::float_to_bf16(float(rank));
    in.x[size_t(t) * kH + 2] = fmt::float_to_bf16(float(t));
    for (int k = 0; k < kK; ++k) in.w[size_t(t) * kK + k] = float(1 << k);  // exact sums
  }
  return in;
}

// y[t,k] as this design makes it, scaled by the top-k weight when fc1 applies it.
std::vector<float> expected_row(int rank, int t, int e, float scale) {
  std::vector<float> y(kH, 0.0f);
  y[0] = float(rank) * scale;
  y[1] = float(t) * scale;
  y[2] = float(e + 1) * scale;
  y[3 + e] = 1.0f * scale;
  return y;
}

struct MovementCase {
  int world;
  bool topk_in_fc1;
};

void PrintTo(const MovementCase& c, std::ostream* os) {
  *os << "W=" << c.world << (c.topk_in_fc1 ? " topk_in_fc1" : "");
}

class DataMovement : public ::testing::TestWithParam<MovementCase> {};

TEST_P(DataMovement, EverySlotReachesItsExpertAndComesBack) {
  const int W = GetParam().world;
  const bool in_fc1 = GetParam().topk_in_fc1;
  const int E = W * kLocal;
  ASSERT_LE(3 + E, kH);
  // The design rests on sigmoid(32) == 1.0f, so that h = 32 u exactly.
  ASSERT_EQ(fmt::swiglu(kGate, 3.0f, -1.0f), 96.0f);
  ASSERT_EQ(1.0f / (1.0f + std::exp(-kGate)), 1.0f);
  const HostPack pack = payload_pack(E);
  LayerConfig cfg = make_config(Recipe::kBf16, E, kCap, kH, kI, kK);
  cfg.recipe.apply_topk_in_fc1 = in_fc1;

  // Three calls per layer with token counts that differ by rank and shrink and grow.
  const int kCalls = 3;
  std::vector<std::vector<RankInputs>> calls(kCalls);
  for (int c = 0; c < kCalls; ++c)
    for (int r = 0; r < W; ++r) {
      const int T = (c == 1) ? (r * 7) % 5 : (c == 0 ? kCap - r : 1 + (r * 13 + 5) % kCap);
      calls[c].push_back(payload_inputs(r, T, E, 1000 * c + r + 17 * W));
    }

  // Finalized: bitwise against the sum this design predicts (fp32, slot order).
  FleetSetup s{W, cfg, &pack};
  auto outs = run_calls(s, calls, OutMode::kCaller);
  for (int c = 0; c < kCalls; ++c)
    for (int r = 0; r < W; ++r) {
      const RankInputs& in = calls[c][r];
      Bits want(size_t(in.T) * kH);
      for (int t = 0; t < in.T; ++t) {
        std::vector<float> acc(kH, 0.0f);
        for (int k = 0; k < kK; ++k) {
          const int e = in.ids[t * kK + k];
          if (e < 0) continue;
          const float w = in.w[t * kK + k];
          const auto y = expected_row(r, t, e, in_fc1 ? w : 1.0f);
          for (int o = 0; o < kH; ++o) acc[o] = acc[o] + (in_fc1 ? 1.0f : w) * y[o];
        }
        for (int o = 0; o < kH; ++o) want[size_t(t) * kH + o] = fmt::float_to_bf16(acc[o]);
      }
      EXPECT_EQ(bitwise_diff(outs[c][r], want, kH), "")
          << "finalized, call " << c << " rank " << r << " T=" << in.T;
    }

  // Unfinalized: every slot's row on its own.
  cfg.recipe.do_finalize = false;
  auto fleet = W > 1 ? make_cpu_fleet(W) : nullptr;
  std::vector<std::vector<std::string>> problems(W);
  run_fleet(W, [&](int r) {
    Bootstrap b = cpu_boot(W, r, fleet);
    MegaLayer layer(b, cfg, pack.view(r * kLocal, kLocal), pack.epilogue_view(r * kLocal, kLocal));
    auto& bad = problems[r];
    for (int c = 0; c < kCalls; ++c) {
      const RankInputs& in = calls[c][r];
      UnfinalizedOutput u = layer.forward_unfinalized(in.forward_inputs());
      const auto& rv = u.rows.view();
      if (rv.ndim != 2 || rv.shape[0] != int64_t(in.T) * kK || rv.shape[1] != kH ||
          rv.dtype != DType::kBF16) {
        bad.push_back("rows has shape " + rv.describe());
        continue;
      }
      const auto* rows = u.rows.ptr<uint16_t>();
      const auto* idx = u.indices.ptr<int32_t>();
      const auto* wts = u.weights.ptr<float>();
      for (int t = 0; t < in.T && bad.size() < 5; ++t)
        for (int k = 0; k < kK; ++k) {
          const int e = in.ids[t * kK + k];
          const std::string where = "call " + std::to_string(c) + " rank " + std::to_string(r) +
                                    " token " + std::to_string(t) + " slot " + std::to_string(k);
          if (e < 0) {
            if (idx[t * kK + k] != -1)
              bad.push_back(where + ": empty slot has index " + std::to_string(idx[t * kK + k]));
            continue;
          }
          if (idx[t * kK + k] != t * kK + k) {
            bad.push_back(where + ": index " + std::to_string(idx[t * kK + k]));
            continue;
          }
          const float w = in.w[t * kK + k];
          const float want_w = in_fc1 ? 1.0f : w;
          if (wts[t * kK + k] != want_w)
            bad.push_back(where + ": weight " + std::to_string(wts[t * kK + k]) + ", want " +
                          std::to_string(want_w));
          const auto y = expected_row(r, t, e, in_fc1 ? w : 1.0f);
          const uint16_t* got = rows + (size_t(t) * kK + k) * kH;
          for (int o = 0; o < kH; ++o)
            if (got[o] != fmt::float_to_bf16(y[o])) {
              bad.push_back(
                  where + " (expert " + std::to_string(e) + "): column " + std::to_string(o) +
                  " is " + std::to_string(fmt::bf16_to_float(got[o])) + ", want " +
                  std::to_string(y[o]) + " (columns 0..2 = source rank, token, expert+1)");
              break;
            }
        }
    }
    layer.destroy();
  });
  for (int r = 0; r < W; ++r)
    for (const auto& p : problems[r]) ADD_FAILURE() << p;
}

INSTANTIATE_TEST_SUITE_P(Worlds, DataMovement,
                         ::testing::Values(MovementCase{1, false}, MovementCase{2, false},
                                           MovementCase{4, false}, MovementCase{8, false},
                                           MovementCase{2, true}, MovementCase{8, true}),
                         [](const auto& info) {
                           return "W" + std::to_string(info.param.world) +
                                  (info.param.topk_in_fc1 ? "_TopkInFc1" : "");
                         });

// The finalize order is part of the contract (docs/contract.md §3: fp32, slot order k = 0, 1, ...).
// Weights [2^30, -2^30, 1] make it visible: column 1 of every y[t,k] is t, so slot order gives
// (2^30 t - 2^30 t) + t = t, while any other order loses t to rounding.
TEST(FinalizeOrder, SlotOrderIsVisibleInTheOutput) {
  const int W = 2, E = W * kLocal, K = 3;
  const HostPack pack = payload_pack(E);
  const LayerConfig cfg = make_config(Recipe::kBf16, E, kCap, kH, kI, K);
  std::vector<std::vector<RankInputs>> calls(1);
  for (int r = 0; r < W; ++r) {
    RankInputs in = random_inputs(12, kH, K, E, 600 + r);  // all slots live, distinct experts
    std::fill(in.x.begin(), in.x.end(), 0);
    for (int t = 0; t < in.T; ++t) {
      in.x[size_t(t) * kH + 0] = fmt::float_to_bf16(1.0f);
      in.x[size_t(t) * kH + 1] = fmt::float_to_bf16(float(r));
      in.x[size_t(t) * kH + 2] = fmt::float_to_bf16(float(t + 1));
      in.w[t * K + 0] = 1073741824.0f;
      in.w[t * K + 1] = -1073741824.0f;
      in.w[t * K + 2] = 1.0f;
    }
    calls[0].push_back(in);
  }
  FleetSetup s{W, cfg, &pack};
  for (OutMode mode : {OutMode::kCaller, OutMode::kUnfinalized}) {
    SCOPED_TRACE(out_mode_name(mode));
    const auto outs = run_calls(s, calls, mode);
    for (int r = 0; r < W; ++r)
      for (int t = 0; t < calls[0][r].T; ++t)
        EXPECT_EQ(fmt::bf16_to_float(outs[0][r][size_t(t) * kH + 1]), float(t + 1))
            << "rank " << r << " token " << t << ": slots not summed in order 0, 1, 2";
  }
}

}  // namespace
}  // namespace moe_ep::test
