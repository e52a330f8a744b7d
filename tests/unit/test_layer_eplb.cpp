// EPLB (docs/contract.md §4): moving experts through kernel_weights() / expert_weight_views() —
// between the slots of one rank and between ranks — and remapping topk_ids gives bitwise the same
// outputs.
#include <gtest/gtest.h>

#include <barrier>

#include "layer_test_util.h"

namespace moe_ep::test {
namespace {

constexpr int kH = 128, kI = 64, kE = 8, kK = 3, kCap = 16, kW = 2, kLocal = kE / kW;

std::vector<TensorView> byte_views(const KernelWeights& kw) {
  std::vector<TensorView> v;
  for (const TensorView* t : {&kw.fc1_weight, &kw.fc1_scale, &kw.fc2_weight, &kw.fc2_scale})
    if (t->defined()) v.push_back(*t);
  return v;
}

uint8_t* row_ptr(const TensorView& v, int slot) {
  return static_cast<uint8_t*>(v.data) + size_t(slot) * size_t(v.strides[0]) * dtype_size(v.dtype);
}

size_t row_bytes(const TensorView& v) { return size_t(v.shape[1]) * dtype_size(v.dtype); }

std::vector<TensorView> alpha_views(const ExpertWeightViews& ev) {
  std::vector<TensorView> v;
  for (const TensorView* t : {&ev.fc1_alpha, &ev.fc2_alpha, &ev.fc1_norm_const})
    if (t->defined()) v.push_back(*t);
  return v;
}

// One expert's kernel-resident state: every weight/scale row and epilogue value.
struct ExpertState {
  std::vector<std::vector<uint8_t>> rows;
  std::vector<float> alphas;
};

ExpertState read_expert(MegaLayer& layer, int slot) {
  ExpertState s;
  for (const auto& v : byte_views(layer.kernel_weights()))
    s.rows.emplace_back(row_ptr(v, slot), row_ptr(v, slot) + row_bytes(v));
  for (const auto& v : alpha_views(layer.expert_weight_views()))
    s.alphas.push_back(v.ptr<float>()[slot]);
  return s;
}

void write_expert(MegaLayer& layer, int slot, const ExpertState& s) {
  const auto views = byte_views(layer.kernel_weights());
  for (size_t i = 0; i < views.size(); ++i)
    std::memcpy(row_ptr(views[i], slot), s.rows[i].data(), s.rows[i].size());
  const auto alphas = alpha_views(layer.expert_weight_views());
  for (size_t i = 0; i < alphas.size(); ++i) alphas[i].ptr<float>()[slot] = s.alphas[i];
}

void remap(std::vector<RankInputs>& ranks, int a, int b) {
  for (auto& r : ranks)
    for (auto& id : r.ids) id = id == a ? b : (id == b ? a : id);
}

class Eplb : public ::testing::TestWithParam<Recipe> {};

TEST_P(Eplb, MovingExpertsAndRemappingIdsKeepsOutputsBitwise) {
  const Recipe recipe = GetParam();
  const HostPack pack = random_pack(recipe, kE, kH, kI, 31 + int(recipe));
  const LayerConfig cfg = make_config(recipe, kE, kCap, kH, kI, kK);
  std::vector<RankInputs> inputs;
  for (int r = 0; r < kW; ++r) inputs.push_back(random_inputs(kCap - r, kH, kK, kE, 300 + r));
  // The caller's epilogue vectors for the per-call variant (phase 3).
  std::vector<std::vector<float>> caller_alpha(3);
  caller_alpha[0] = pack.fc1_alpha;
  caller_alpha[1] = pack.fc2_alpha;
  caller_alpha[2] = pack.fc1_norm_const;

  auto fleet = make_cpu_fleet(kW);
  std::barrier sync(kW);
  std::vector<ExpertState> staging(kW);
  std::vector<std::vector<Bits>> outs(4, std::vector<Bits>(kW));
  std::vector<std::string> bad(kW);
  std::vector<std::vector<RankInputs>> phase_inputs(4);
  phase_inputs[0] = inputs;
  remap(inputs, 1, 2);  // phase 1: global experts 1 and 2 swap slots on rank 0
  phase_inputs[1] = inputs;
  remap(inputs, 3, 4);  // phase 2: global 3 (rank 0 slot 3) and 4 (rank 1 slot 0) swap ranks
  phase_inputs[2] = inputs;
  remap(inputs, 4, 7);  // phase 3: rank 1 slots 0 and 3 swap, alphas through per-call vectors
  phase_inputs[3] = inputs;

  run_fleet(kW, [&](int r) {
    Bootstrap b = cpu_boot(kW, r, fleet);
    MegaLayer layer(b, cfg, pack.view(r * kLocal, kLocal), pack.epilogue_view(r * kLocal, kLocal));
    const KernelWeights kw = layer.kernel_weights();
    const bool four_bit = recipe_traits(recipe).weights_4bit;
    for (const TensorView* t : {&kw.fc1_weight, &kw.fc2_weight, &kw.fc1_scale, &kw.fc2_scale}) {
      const bool scale = t == &kw.fc1_scale || t == &kw.fc2_scale;
      if (scale && !four_bit) continue;
      if (!t->defined() || t->ndim != 2 || t->shape[0] != kLocal || dtype_size(t->dtype) != 1 ||
          !t->is_contiguous())
        bad[r] += "kernel_weights tensor is " + t->describe() + "; ";
    }
    const auto views = byte_views(kw);
    if (views.size() != (four_bit ? 4u : 2u)) bad[r] += "wrong number of kernel weight tensors; ";
    // Everything the kernels read, in bytes, must be there.
    size_t total = 0;
    for (const auto& v : views) total += row_bytes(v);
    const size_t want = four_bit ? pack.w13_bytes() + pack.w2_bytes() + pack.w13_scale_bytes() +
                                       pack.w2_scale_bytes()
                                 : pack.w13_bytes() + pack.w2_bytes();
    if (total != want)
      bad[r] +=
          "bytes per expert " + std::to_string(total) + ", want " + std::to_string(want) + "; ";
    if (!bad[r].empty()) return;

    auto run = [&](int phase, bool per_call) {
      ForwardInputs fi = phase_inputs[phase][r].forward_inputs();
      if (per_call)
        for (int i = 0; i < 3; ++i) {
          TensorView v =
              TensorView::contiguous(caller_alpha[i].data() + r * kLocal, DType::kF32, {kLocal});
          (i == 0   ? fi.epilogue.fc1_alpha
           : i == 1 ? fi.epilogue.fc2_alpha
                    : fi.epilogue.fc1_norm_const) = v;
        }
      Tensor t = layer.forward(fi);
      outs[phase][r].assign(t.ptr<uint16_t>(), t.ptr<uint16_t>() + t.numel());
    };
    run(0, false);

    // Phase 1: swap slots 1 and 2 on rank 0.
    if (r == 0) {
      const ExpertState a = read_expert(layer, 1), c = read_expert(layer, 2);
      write_expert(layer, 1, c);
      write_expert(layer, 2, a);
    }
    run(1, false);

    // Phase 2: rank 0 slot 3 <-> rank 1 slot 0, through staging buffers.
    const int my_slot = r == 0 ? 3 : 0;
    staging[r] = read_expert(layer, my_slot);
    sync.arrive_and_wait();
    write_expert(layer, my_slot, staging[1 - r]);
    sync.arrive_and_wait();
    run(2, false);

    // Phase 3: rank 1 slots 0 and 3 swap their weights through kernel_weights(); the epilogue
    // values move in the caller's vectors, passed per call.
    if (r == 1) {
      ExpertState a = read_expert(layer, 0), c = read_expert(layer, 3);
      a.alphas.clear();  // leave the layer's own epilogue values where they are
      c.alphas.clear();
      const auto views3 = byte_views(layer.kernel_weights());
      for (size_t i = 0; i < views3.size(); ++i) {
        std::memcpy(row_ptr(views3[i], 0), c.rows[i].data(), c.rows[i].size());
        std::memcpy(row_ptr(views3[i], 3), a.rows[i].data(), a.rows[i].size());
      }
    }
    // The caller's vectors in the layout after phases 1-3 (global slots 1<->2, 3<->4, 4<->7).
    sync.arrive_and_wait();
    if (r == 0)
      for (auto& v : caller_alpha) {
        std::swap(v[1], v[2]);
        std::swap(v[3], v[4]);
        std::swap(v[4], v[7]);
      }
    sync.arrive_and_wait();
    run(3, true);
    layer.destroy();
  });
  for (int r = 0; r < kW; ++r) {
    ASSERT_EQ(bad[r], "") << "rank " << r;
    EXPECT_EQ(count_nan(outs[0][r]), 0u);
    for (int phase = 1; phase < 4; ++phase)
      EXPECT_EQ(bitwise_diff(outs[phase][r], outs[0][r], kH), "")
          << "after phase " << phase << ", rank " << r;
  }
  // The baseline is the recipe's math (so the moves were checked on real outputs).
  const Reference ref = reference_forward(cfg, pack, phase_inputs[0]);
  for (int r = 0; r < kW; ++r)
    EXPECT_LE(rel_l2(outs[0][r], ref.out[r]), reference_tolerance(recipe)) << "rank " << r;
}

// A redundant copy (EPLB replicates a hot expert into another physical slot): after copying
// global expert 2 (rank 0) over global expert 5 (rank 1) through kernel_weights() /
// expert_weight_views(), routing a token's slot to 5 instead of 2 gives bitwise the same output.
TEST_P(Eplb, RedundantCopyOnAnotherRankGivesTheSameBits) {
  const Recipe recipe = GetParam();
  const HostPack pack = random_pack(recipe, kE, kH, kI, 41 + int(recipe));
  const LayerConfig cfg = make_config(recipe, kE, kCap, kH, kI, kK);
  std::vector<RankInputs> inputs;
  for (int r = 0; r < kW; ++r)
    inputs.push_back(random_inputs(kCap, kH, kK, kE, 400 + r, Routing::kOneExpert, 0.0, 2));
  for (auto& in : inputs)  // expert 5 is overwritten by the copy: nothing may use it before
    for (auto& id : in.ids) id = id == 5 ? -1 : id;
  std::vector<RankInputs> moved = inputs;
  int rerouted = 0;
  for (auto& in : moved)
    for (int t = 0; t < in.T; t += 2)  // every other token's slot 0 goes to the copy
      for (int k = 0; k < kK; ++k)
        if (in.ids[t * kK + k] == 2 &&
            std::count(in.ids.begin() + t * kK, in.ids.begin() + (t + 1) * kK, 5) == 0) {
          in.ids[t * kK + k] = 5;
          ++rerouted;
        }
  ASSERT_GT(rerouted, 4);
  auto fleet = make_cpu_fleet(kW);
  std::barrier sync(kW);
  ExpertState staged;
  std::vector<Bits> before(kW), after(kW);
  run_fleet(kW, [&](int r) {
    Bootstrap b = cpu_boot(kW, r, fleet);
    MegaLayer layer(b, cfg, pack.view(r * kLocal, kLocal), pack.epilogue_view(r * kLocal, kLocal));
    auto run = [&](const RankInputs& in) {
      Tensor t = layer.forward(in.forward_inputs());
      return Bits(t.ptr<uint16_t>(), t.ptr<uint16_t>() + t.numel());
    };
    before[r] = run(inputs[r]);
    if (r == 0) staged = read_expert(layer, 2);
    sync.arrive_and_wait();
    if (r == 1) write_expert(layer, 5 - kLocal, staged);
    sync.arrive_and_wait();
    after[r] = run(moved[r]);
    layer.destroy();
  });
  for (int r = 0; r < kW; ++r) EXPECT_EQ(bitwise_diff(after[r], before[r], kH), "") << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Recipes, Eplb, ::testing::ValuesIn(kAllRecipes), [](const auto& info) {
  std::string s = recipe_name(info.param);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  return s;
});

}  // namespace
}  // namespace moe_ep::test
