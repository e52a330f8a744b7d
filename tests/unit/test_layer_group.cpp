// The EP group and its workspace pool (include/moe_ep/group.h, docs/contract.md §4): layers of
// one group, of the same and of different geometries, give bitwise the outputs of separately
// built layers in any call order; the pool holds one workspace per capacity, sized for the
// largest geometry; destroying a layer leaves the others working; a workspace view lives until
// the next call of any layer in the same pooled workspace.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "layer_test_util.h"
#include "moe_ep/group.h"

namespace moe_ep::test {
namespace {

constexpr int kCap = 32;

struct Geometry {
  Recipe recipe;
  int E, H, I, K;
};

// Built in this order, so the pool starts at the first geometry and grows at the third.
const Geometry kGeometries[] = {
    {Recipe::kNvfp4, 8, 128, 64, 2},
    {Recipe::kNvfp4, 8, 128, 64, 2},        // same geometry, other weights
    {Recipe::kMxfp4Mxfp8, 8, 256, 128, 4},  // the largest
    {Recipe::kBf16, 4, 64, 64, 2},
};
constexpr int kLayers = 4;

struct LayerData {
  Geometry g;
  LayerConfig cfg;
  HostPack pack;
};

std::vector<LayerData> make_layers(int capacity = kCap) {
  std::vector<LayerData> out;
  for (int i = 0; i < kLayers; ++i) {
    const Geometry& g = kGeometries[i];
    out.push_back({g, make_config(g.recipe, g.E, capacity, g.H, g.I, g.K),
                   random_pack(g.recipe, g.E, g.H, g.I, 1000 + i)});
  }
  return out;
}

Bits bits_of(const TensorView& v) {
  Bits b(size_t(v.numel()));
  if (!b.empty()) std::memcpy(b.data(), v.data, b.size() * 2);
  return b;
}

// One call of the interleaved sequence: which layer, this rank's T, and the output form.
struct Call {
  int layer, T;
  bool view;
};
const std::vector<Call> kCalls = {
    {0, 5, false},    {2, 7, true}, {1, kCap, false}, {3, 0, true},    {0, 1, true},
    {2, kCap, false}, {1, 3, true}, {3, 9, false},    {0, kCap, true}, {2, 4, false}};

Bits run_call(MegaLayer& layer, const RankInputs& in, bool view) {
  if (view) return bits_of(layer.forward_view(in.forward_inputs()));
  Bits out(size_t(in.T) * in.H, kPoison);
  layer.forward(in.forward_inputs(),
                TensorView::contiguous(out.data(), DType::kBF16, {in.T, in.H}));
  return out;
}

// Every rank of W: layers built from one group per rank and the same layers built separately
// (each with a group of its own) run kCalls interleaved; the outputs are bitwise equal.
void check_group_equals_separate(int W) {
  const auto data = make_layers();
  auto fleet = W > 1 ? make_cpu_fleet(W) : nullptr;
  std::vector<std::vector<std::string>> diffs(W);
  std::vector<size_t> pool_bytes(W), largest(W);
  run_fleet(W, [&](int r) {
    auto group = EpGroup::create(cpu_boot(W, r, fleet));
    std::vector<std::unique_ptr<MegaLayer>> grouped, alone;
    for (const auto& d : data) {
      const int el = d.g.E / W;
      grouped.push_back(std::make_unique<MegaLayer>(group, d.cfg, d.pack.view(r * el, el),
                                                    d.pack.epilogue_view(r * el, el)));
      alone.push_back(std::make_unique<MegaLayer>(
          cpu_boot(W, r, fleet), d.cfg, d.pack.view(r * el, el), d.pack.epilogue_view(r * el, el)));
    }
    for (size_t c = 0; c < kCalls.size(); ++c) {
      const Call& call = kCalls[c];
      const Geometry& g = data[call.layer].g;
      // Ranks differ in T (rank 1 brings fewer tokens, within the capacity).
      const int T = r == 0 ? call.T : call.T / 2;
      const RankInputs in = random_inputs(T, g.H, g.K, g.E, 77 + 10 * c + r);
      const Bits got = run_call(*grouped[call.layer], in, call.view);
      const Bits want = run_call(*alone[call.layer], in, call.view);
      const std::string d = bitwise_diff(got, want, g.H);
      if (!d.empty())
        diffs[r].push_back("call " + std::to_string(c) + " (layer " + std::to_string(call.layer) +
                           ", T " + std::to_string(T) + "): " + d);
    }
    pool_bytes[r] = group->pool_bytes();
    largest[r] = alone[2]->workspace_bytes(alone[2]->default_workspace());
    EXPECT_EQ(group->num_pooled_workspaces(), 1) << "rank " << r;
  });
  for (int r = 0; r < W; ++r) {
    EXPECT_TRUE(diffs[r].empty()) << "rank " << r << ": " << diffs[r].front();
    // One workspace set, of the largest geometry's size (not the sum over the layers).
    EXPECT_EQ(pool_bytes[r], largest[r]) << "rank " << r;
  }
}

TEST(EpGroup, LayersBitwiseEqualToSeparateLayersInterleaved) { check_group_equals_separate(1); }

TEST(EpGroup, LayersBitwiseEqualToSeparateLayersInterleavedTwoRanks) {
  check_group_equals_separate(2);
}

TEST(EpGroup, PoolHoldsOneWorkspacePerCapacitySizedForTheLargestGeometry) {
  const auto data = make_layers();
  auto group = EpGroup::create(cpu_boot(1, 0, nullptr));
  EXPECT_EQ(group->pool_bytes(), 0u);
  std::vector<std::unique_ptr<MegaLayer>> layers;
  std::vector<size_t> need;
  size_t sum = 0, largest = 0;
  for (const auto& d : data) {
    layers.push_back(std::make_unique<MegaLayer>(group, d.cfg, d.pack.view(0, d.g.E),
                                                 d.pack.epilogue_view(0, d.g.E)));
    need.push_back(layers.back()->workspace_bytes(layers.back()->default_workspace()));
    sum += need.back();
    largest = std::max(largest, need.back());
    // The pool follows the largest geometry built so far.
    EXPECT_EQ(group->pool_bytes(), largest) << "after layer " << layers.size() - 1;
    EXPECT_EQ(group->num_pooled_workspaces(), 1);
  }
  EXPECT_LT(group->pool_bytes(), sum);
  EXPECT_GT(need[2], need[0]);  // the test's premise: the third layer needs more

  // A second capacity is a second pooled workspace, again sized for the largest user.
  const WorkspaceId small0 = layers[0]->create_workspace(8);
  EXPECT_EQ(group->num_pooled_workspaces(), 2);
  const size_t small_need0 = layers[0]->workspace_bytes(small0);
  EXPECT_EQ(group->pool_bytes(), largest + small_need0);
  layers[1]->create_workspace(8);  // the same geometry: nothing grows
  EXPECT_EQ(group->pool_bytes(), largest + small_need0);
  const WorkspaceId small2 = layers[2]->create_workspace(8);
  EXPECT_EQ(group->pool_bytes(), largest + layers[2]->workspace_bytes(small2));
  EXPECT_EQ(group->num_pooled_workspaces(), 2);
  // A layer's second workspace of a capacity it has is the same memory under another id.
  const WorkspaceId again = layers[0]->create_workspace(8);
  EXPECT_NE(again.index, small0.index);
  EXPECT_EQ(group->num_pooled_workspaces(), 2);

  // The smaller workspace serves calls after the pool grew under it, bitwise as before.
  const RankInputs in = random_inputs(6, data[0].g.H, data[0].g.K, data[0].g.E, 5);
  MegaLayer alone(cpu_boot(1, 0, nullptr), data[0].cfg, data[0].pack.view(0, data[0].g.E),
                  data[0].pack.epilogue_view(0, data[0].g.E));
  ForwardInputs fi = in.forward_inputs();
  fi.workspace = small0;
  Bits got(size_t(in.T) * in.H, kPoison), want(got.size(), kPoison);
  layers[0]->forward(fi, TensorView::contiguous(got.data(), DType::kBF16, {in.T, in.H}));
  alone.forward(in.forward_inputs(),
                TensorView::contiguous(want.data(), DType::kBF16, {in.T, in.H}));
  EXPECT_EQ(bitwise_diff(got, want, in.H), "");

  // Layers of another default capacity use a pooled workspace of their own.
  const LayerConfig other =
      make_config(data[0].g.recipe, data[0].g.E, 16, data[0].g.H, data[0].g.I, data[0].g.K);
  MegaLayer at16(group, other, data[0].pack.view(0, data[0].g.E),
                 data[0].pack.epilogue_view(0, data[0].g.E));
  EXPECT_EQ(group->num_pooled_workspaces(), 3);
  at16.destroy();
  EXPECT_EQ(group->num_pooled_workspaces(), 2);  // its last user is gone
}

TEST(EpGroup, DestroyingAMiddleLayerLeavesTheOthersWorking) {
  const auto data = make_layers();
  auto group = EpGroup::create(cpu_boot(1, 0, nullptr));
  std::vector<std::unique_ptr<MegaLayer>> layers, alone;
  for (const auto& d : data) {
    layers.push_back(std::make_unique<MegaLayer>(group, d.cfg, d.pack.view(0, d.g.E),
                                                 d.pack.epilogue_view(0, d.g.E)));
    alone.push_back(std::make_unique<MegaLayer>(
        cpu_boot(1, 0, nullptr), d.cfg, d.pack.view(0, d.g.E), d.pack.epilogue_view(0, d.g.E)));
  }
  const size_t bytes = group->pool_bytes();
  layers[2]->destroy();  // the largest, in the middle
  EXPECT_TRUE(layers[2]->destroyed());
  EXPECT_EQ(group->pool_bytes(), bytes) << "the pool stays with the other layers";
  const Caught late = catch_error([&] { layers[2]->forward(RankInputs{}.forward_inputs()); });
  EXPECT_EQ(int(late.code), int(ErrorCode::kDestroyed)) << late.what;
  // The group refuses to go while layers live.
  const Caught early = catch_error([&] { group->destroy(); });
  EXPECT_EQ(int(early.code), int(ErrorCode::kState)) << early.what;
  EXPECT_FALSE(group->destroyed());
  for (int i : {0, 1, 3, 0}) {
    const Geometry& g = data[i].g;
    const RankInputs in = random_inputs(kCap - i, g.H, g.K, g.E, 300 + i);
    EXPECT_EQ(bitwise_diff(run_call(*layers[i], in, i == 1), run_call(*alone[i], in, false), g.H),
              "")
        << "layer " << i;
  }
  for (int i : {0, 1, 3}) layers[i]->destroy();
  EXPECT_EQ(group->pool_bytes(), 0u) << "the last layer freed the pool";
  EXPECT_EQ(group->num_pooled_workspaces(), 0);
  group->destroy();
  group->destroy();  // idempotent
  const Caught after =
      catch_error([&] { MegaLayer l(group, data[0].cfg, data[0].pack.view(0, data[0].g.E)); });
  EXPECT_EQ(int(after.code), int(ErrorCode::kDestroyed)) << after.what;
}

// The documented view lifetime: a view of layer A's output is overwritten by layer B's call in
// the same pooled workspace.
TEST(EpGroup, WorkspaceViewIsOverwrittenByAnotherLayersCall) {
  const auto data = make_layers();
  auto group = EpGroup::create(cpu_boot(1, 0, nullptr));
  const LayerData& a = data[0];
  const LayerData& b = data[1];  // same geometry, other weights
  MegaLayer la(group, a.cfg, a.pack.view(0, a.g.E), a.pack.epilogue_view(0, a.g.E));
  MegaLayer lb(group, b.cfg, b.pack.view(0, b.g.E), b.pack.epilogue_view(0, b.g.E));
  const RankInputs in = random_inputs(12, a.g.H, a.g.K, a.g.E, 9);
  const TensorView va = la.forward_view(in.forward_inputs());
  const Bits a_out = bits_of(va);
  const TensorView vb = lb.forward_view(in.forward_inputs());
  EXPECT_EQ(va.data, vb.data) << "both views are the pooled workspace's output area";
  const Bits b_out = bits_of(vb);
  EXPECT_NE(bitwise_fraction(a_out, b_out), 1.0) << "the two layers' weights differ";
  EXPECT_EQ(bitwise_diff(bits_of(va), b_out, a.g.H), "")
      << "A's view now holds B's output (the view died at B's call)";
  // A layer of its own group keeps its view across B's call.
  MegaLayer own(cpu_boot(1, 0, nullptr), a.cfg, a.pack.view(0, a.g.E),
                a.pack.epilogue_view(0, a.g.E));
  const TensorView vo = own.forward_view(in.forward_inputs());
  lb.forward_view(in.forward_inputs());
  EXPECT_EQ(bitwise_diff(bits_of(vo), a_out, a.g.H), "");
}

TEST(EpGroup, BadBootstrapAndNullGroupAreRefused) {
  Caught c = catch_error([] { EpGroup::create(cpu_boot(2, 2, make_cpu_fleet(2))); });
  EXPECT_EQ(int(c.code), int(ErrorCode::kInvalidArgument)) << c.what;
  EXPECT_TRUE(contains(c.what, "rank 2")) << c.what;
  c = catch_error([] { EpGroup::create(cpu_boot(2, 0, make_cpu_fleet(3))); });
  EXPECT_EQ(int(c.code), int(ErrorCode::kInvalidArgument)) << c.what;
  EXPECT_TRUE(contains(c.what, "world size 3")) << c.what;
  c = catch_error([] { EpGroup::create(cpu_boot(2, 0, nullptr)); });
  EXPECT_TRUE(contains(c.what, "cpu_fleet")) << c.what;
  const auto data = make_layers();
  c = catch_error([&] {
    MegaLayer l(std::shared_ptr<EpGroup>{}, data[0].cfg, data[0].pack.view(0, data[0].g.E));
  });
  EXPECT_EQ(int(c.code), int(ErrorCode::kInvalidArgument)) << c.what;
  // A configuration the group's W cannot run names the group's W.
  auto fleet = make_cpu_fleet(3);
  c = catch_error([&] {
    auto g = EpGroup::create(cpu_boot(3, 0, fleet));
    MegaLayer l(g, data[0].cfg, data[0].pack.view(0, 2));
  });
  EXPECT_EQ(int(c.code), int(ErrorCode::kUnsupported)) << c.what;
}

}  // namespace
}  // namespace moe_ep::test
