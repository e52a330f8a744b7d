// The EP group on the CUDA backend (W = 1; include/moe_ep/group.h): layers built from one group
// give bitwise the outputs of separately built layers in interleaved order, N layers hold their
// weights plus one workspace set (device memory measured with cudaMemGetInfo), and a CUDA graph
// capturing a sequence of three layers' forwards (each layer's output is the next one's input)
// replays bitwise. Every test skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "moe_ep/formats.h"
#include "moe_ep/group.h"
#include "moe_ep/layer.h"
#include "moe_ep/weight_prep.h"
#include "unit/layer_test_util.h"

namespace moe_ep {
namespace {

using namespace gpu_test;

struct Geometry {
  Recipe recipe;
  int H, I, E, K;
};

LayerConfig config_of(const Geometry& g, int capacity) {
  return test::make_config(g.recipe, g.E, capacity, g.H, g.I, g.K);
}

PackedExperts random_experts(const Geometry& g, uint64_t seed) {
  const std::vector<float> w13 = random_vec(size_t(g.E) * 2 * g.I * g.H, seed, 0.06f);
  const std::vector<float> w2 = random_vec(size_t(g.E) * g.H * g.I, seed + 1, 0.06f);
  return pack_expert_weights(g.recipe, w13.data(), w2.data(), g.E, g.H, g.I);
}

Bootstrap gpu_boot() {
  Bootstrap b;
  b.backend = Backend::kCUDA;
  return b;
}

// Device memory of one call's inputs (and an output / next input of [T, H] bf16).
struct DeviceTokens {
  int T, H, K;
  void *x = nullptr, *ids = nullptr, *w = nullptr;
  DeviceTokens(int t, const Geometry& g, uint64_t seed) : T(t), H(g.H), K(g.K) {
    std::vector<uint16_t> hx(size_t(T) * H);
    for (size_t i = 0; i < hx.size(); ++i)
      hx[i] = fmt::float_to_bf16((1.0f + 3.0f * float((i / H) % 4)) * urand(seed, i));
    std::vector<int32_t> hid(size_t(T) * K);
    std::vector<float> hw(size_t(T) * K);
    for (int i = 0; i < T; ++i) {
      std::vector<int> used;
      for (int k = 0; k < K; ++k) {
        uint64_t r = mix(seed * 7919 + i * 131 + k);
        int e;
        do {
          e = int(r % uint64_t(g.E));
          r = mix(r);
        } while (std::find(used.begin(), used.end(), e) != used.end());
        used.push_back(e);
        hid[size_t(i) * K + k] = (i % 5 == 4 && k == K - 1) ? -1 : e;
        hw[size_t(i) * K + k] = 0.05f + 0.45f * (1.0f + urand(seed + 3, size_t(i) * K + k));
      }
    }
    cudaMalloc(&x, std::max<size_t>(16, hx.size() * 2));
    cudaMalloc(&ids, std::max<size_t>(16, hid.size() * 4));
    cudaMalloc(&w, std::max<size_t>(16, hw.size() * 4));
    cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(ids, hid.data(), hid.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(w, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice);
  }
  ~DeviceTokens() {
    cudaFree(x);
    cudaFree(ids);
    cudaFree(w);
  }
  DeviceTokens(const DeviceTokens&) = delete;
  DeviceTokens& operator=(const DeviceTokens&) = delete;
  // The call's inputs, with `hidden` in place of x when given (a previous layer's output).
  ForwardInputs inputs(void* hidden = nullptr, cudaStream_t s = nullptr) const {
    const Device d{DeviceKind::kCUDA, 0};
    ForwardInputs f;
    f.hidden_states = TensorView::contiguous(hidden ? hidden : x, DType::kBF16, {T, H}, d);
    f.topk_ids = TensorView::contiguous(ids, DType::kI32, {T, K}, d);
    f.topk_weights = TensorView::contiguous(w, DType::kF32, {T, K}, d);
    f.stream = s;
    return f;
  }
};

struct DeviceOut {
  void* p = nullptr;
  int T, H;
  DeviceOut(int t, int h) : T(t), H(h) {
    cudaMalloc(&p, std::max<size_t>(16, size_t(T) * H * 2));
    cudaMemset(p, 0xff, std::max<size_t>(16, size_t(T) * H * 2));  // NaN poison
  }
  ~DeviceOut() { cudaFree(p); }
  DeviceOut(const DeviceOut&) = delete;
  DeviceOut& operator=(const DeviceOut&) = delete;
  TensorView view() const {
    return TensorView::contiguous(p, DType::kBF16, {T, H}, Device{DeviceKind::kCUDA, 0});
  }
  std::vector<uint16_t> host() const {
    std::vector<uint16_t> v(size_t(T) * H);
    cudaDeviceSynchronize();
    cudaMemcpy(v.data(), p, v.size() * 2, cudaMemcpyDeviceToHost);
    return v;
  }
};

std::vector<uint16_t> host_bits(const TensorView& v) {
  std::vector<uint16_t> h(size_t(v.numel()));
  cudaDeviceSynchronize();
  cudaMemcpy(h.data(), v.data, h.size() * 2, cudaMemcpyDeviceToHost);
  return h;
}

size_t free_device_bytes() {
  size_t free_b = 0, total = 0;
  cudaDeviceSynchronize();
  cudaMemGetInfo(&free_b, &total);
  return free_b;
}

size_t weight_bytes(MegaLayer& layer) {
  const KernelWeights k = layer.kernel_weights();
  size_t n = 0;
  for (const TensorView* v : {&k.fc1_weight, &k.fc1_scale, &k.fc2_weight, &k.fc2_scale})
    if (v->defined()) n += v->nbytes();
  return n + 3 * size_t(layer.num_local_experts()) * 4;  // the epilogue vectors
}

const Geometry kQwen{Recipe::kNvfp4, 2048, 768, 16, 8};
// gpt-oss's H and I with K 8: a layer that needs more of the pool than kQwen's.
const Geometry kLarger{Recipe::kMxfp4Bf16, 2880, 2880, 8, 8};

TEST(GpuGroup, LayersBitwiseEqualToSeparateLayersInterleaved) {
  SKIP_WITHOUT_GPU();
  const Geometry geos[] = {kQwen, kQwen, kLarger};  // the pool grows at the third
  auto group = EpGroup::create(gpu_boot());
  std::vector<std::unique_ptr<MegaLayer>> grouped, alone;
  for (int i = 0; i < 3; ++i) {
    const PackedExperts p = random_experts(geos[i], 100 + i);
    const LayerConfig c = config_of(geos[i], 256);
    grouped.push_back(std::make_unique<MegaLayer>(group, c, p.view(), p.epilogue_view()));
    alone.push_back(std::make_unique<MegaLayer>(gpu_boot(), c, p.view(), p.epilogue_view()));
  }
  EXPECT_EQ(group->num_pooled_workspaces(), 1);
  size_t largest = 0;
  for (auto& l : alone) largest = std::max(largest, l->workspace_bytes(l->default_workspace()));
  EXPECT_EQ(group->pool_bytes(), largest);
  EXPECT_GT(grouped[2]->workspace_bytes(grouped[2]->default_workspace()),
            grouped[0]->workspace_bytes(grouped[0]->default_workspace()))
      << "the third layer re-made the pooled workspace larger";
  for (auto& l : grouped) l->warmup();
  const int order[] = {0, 2, 1, 0, 1, 2, 2, 0};
  const int tokens[] = {1, 256, 7, 128, 256, 3, 64, 0};
  for (int c = 0; c < 8; ++c) {
    const int i = order[c];
    SCOPED_TRACE("call " + std::to_string(c) + ", layer " + std::to_string(i));
    DeviceTokens in(tokens[c], geos[i], 500 + c);
    DeviceOut got(in.T, in.H), want(in.T, in.H);
    if (c % 2) {
      grouped[i]->forward(in.inputs(), got.view());
    } else {
      const TensorView v = grouped[i]->forward_view(in.inputs());
      CUDA_OK(cudaMemcpy(got.p, v.data, v.nbytes(), cudaMemcpyDeviceToDevice));
    }
    alone[i]->forward(in.inputs(), want.view());
    const std::vector<uint16_t> g = got.host(), w = want.host();
    ASSERT_TRUE(g == w) << "the grouped layer's output differs from the separate layer's";
    ASSERT_TRUE(std::none_of(g.begin(), g.end(), [](uint16_t b) { return (b & 0x7fff) > 0x7f80; }));
  }
  // The view lifetime: layer 0's view is overwritten by layer 1's call (same pooled workspace).
  DeviceTokens in(32, kQwen, 900);
  const TensorView v0 = grouped[0]->forward_view(in.inputs());
  const std::vector<uint16_t> a = host_bits(v0);
  const TensorView v1 = grouped[1]->forward_view(in.inputs());
  EXPECT_EQ(v0.data, v1.data);
  EXPECT_TRUE(host_bits(v0) == host_bits(v1) && host_bits(v0) != a);
  // Destroying a middle layer leaves the others working.
  grouped[1]->destroy();
  DeviceOut got(in.T, in.H), want(in.T, in.H);
  grouped[0]->forward(in.inputs(), got.view());
  alone[0]->forward(in.inputs(), want.view());
  EXPECT_TRUE(got.host() == want.host());
}

// N layers of one group use the device memory of their weights plus one workspace set.
TEST(GpuGroup, DeviceMemoryIsWeightsPlusOneWorkspaceSet) {
  SKIP_WITHOUT_GPU();
  const Geometry g{Recipe::kNvfp4, 7168, 2048, 8, 8};  // DeepSeek-V3's H, I, K
  const int kN = 6, kCapacity = 1024;
  const PackedExperts p = random_experts(g, 7);
  const LayerConfig c = config_of(g, kCapacity);
  size_t ws_one = 0, w_one = 0;
  {
    // Loads the kernels and measures one layer alone (workspace of its own).
    MegaLayer one(gpu_boot(), c, p.view(), p.epilogue_view());
    one.warmup();
    ws_one = one.workspace_bytes(one.default_workspace());
    w_one = weight_bytes(one);
  }
  const size_t before = free_device_bytes();
  auto group = EpGroup::create(gpu_boot());
  std::vector<std::unique_ptr<MegaLayer>> layers;
  for (int i = 0; i < kN; ++i)
    layers.push_back(std::make_unique<MegaLayer>(group, c, p.view(), p.epilogue_view()));
  for (auto& l : layers) l->warmup();
  const size_t used = before - free_device_bytes();
  const size_t expected = kN * w_one + ws_one;
  std::printf(
      "[ group ] %d layers: %.1f MiB used; weights %.1f MiB each, one workspace set %.1f "
      "MiB (pool %.1f MiB); separately built: %.1f MiB\n",
      kN, used / 1048576.0, w_one / 1048576.0, ws_one / 1048576.0, group->pool_bytes() / 1048576.0,
      kN * (w_one + ws_one) / 1048576.0);
  EXPECT_EQ(group->pool_bytes(), ws_one);
  // Allocation granularity (2 MiB pages) of the layers' small buffers (epilogue vectors, their
  // own state): up to 10 MiB a layer, and 32 MiB more.
  EXPECT_LE(used, expected + kN * (size_t(10) << 20) + (size_t(32) << 20));
  EXPECT_GE(used + (size_t(32) << 20), expected);
  EXPECT_LT(used, kN * w_one + 2 * ws_one) << "more than one workspace set";
  layers.clear();
  EXPECT_EQ(group->pool_bytes(), 0u);
}

// A CUDA graph capturing three layers' forwards in sequence (each output the next input) replays
// bitwise what the separately built layers compute eagerly.
TEST(GpuGroup, GraphOfThreeLayersReplaysBitwise) {
  SKIP_WITHOUT_GPU();
  auto group = EpGroup::create(gpu_boot());
  std::vector<std::unique_ptr<MegaLayer>> grouped, alone;
  for (int i = 0; i < 3; ++i) {
    const PackedExperts p = random_experts(kQwen, 40 + i);
    const LayerConfig c = config_of(kQwen, 128);
    grouped.push_back(std::make_unique<MegaLayer>(group, c, p.view(), p.epilogue_view()));
    alone.push_back(std::make_unique<MegaLayer>(gpu_boot(), c, p.view(), p.epilogue_view()));
  }
  for (auto& l : grouped) l->warmup();
  for (int T : {128, 5}) {
    SCOPED_TRACE("T = " + std::to_string(T));
    DeviceTokens in(T, kQwen, 60 + T);
    cudaStream_t st = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    DeviceOut o0(T, kQwen.H), o1(T, kQwen.H), o2(T, kQwen.H);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    grouped[0]->forward(in.inputs(nullptr, st), o0.view());
    grouped[1]->forward(in.inputs(o0.p, st), o1.view());
    grouped[2]->forward(in.inputs(o1.p, st), o2.view());
    CUDA_OK(cudaStreamEndCapture(st, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    DeviceOut e0(T, kQwen.H), e1(T, kQwen.H), e2(T, kQwen.H);
    alone[0]->forward(in.inputs(), e0.view());
    alone[1]->forward(in.inputs(e0.p), e1.view());
    alone[2]->forward(in.inputs(e1.p), e2.view());
    const std::vector<uint16_t> want = e2.host();
    for (int replay = 0; replay < 2; ++replay) {
      CUDA_OK(cudaMemset(o2.p, 0xff, size_t(T) * kQwen.H * 2));
      CUDA_OK(cudaGraphLaunch(exec, st));
      CUDA_OK(cudaStreamSynchronize(st));
      EXPECT_TRUE(o1.host() == e1.host()) << "replay " << replay << ": layer 1";
      EXPECT_TRUE(o2.host() == want) << "replay " << replay << ": layer 2";
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
  }
}

}  // namespace
}  // namespace moe_ep
