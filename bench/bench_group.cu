// Benchmark of the EP group's workspace pool (include/moe_ep/group.h) on one GPU: builds
// --layers layers (default 58, DeepSeek-V3's MoE layers) of H 7168, I 2048, K 8 (--shape) at
// --capacity tokens per rank (default 4096) from one EpGroup, E reduced (--experts, default 16)
// so that every layer's weights fit, each layer with weights of its own. Reports the device
// memory the group uses (cudaMemGetInfo), the pool's bytes against the workspaces the layers
// would hold if built alone, and, per token count, the median time of one layer's forward in the
// group and of the same layer built alone (each forward captured in a CUDA graph, >= 20 timed
// replays), and of the whole sequence of layers in one graph (each layer's output the next one's
// input) divided by the layer count.
// --json PATH writes one record per token count; MOE_EP_COMMIT names the tree's commit in them.
//   bench_group [--layers N] [--experts E] [--capacity C] [--tokens 1,128,4096]
//               [--recipe nvfp4|mxfp4_mxfp8|mxfp4_bf16|bf16] [--iters N] [--json PATH]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.cuh"
#include "cuda_check.h"
#include "moe_ep/formats.h"
#include "moe_ep/group.h"
#include "moe_ep/layer.h"

using namespace moe_ep;
using namespace moe_ep::bench;

namespace {

// A device buffer of n bytes filled as bench::fill's `kind` says.
void* filled(size_t n, uint64_t seed, int kind) {
  void* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(n, 16)));
  fill(p, n, seed, kind);
  return p;
}

size_t free_bytes() {
  size_t f = 0, t = 0;
  CK(cudaDeviceSynchronize());
  CK(cudaMemGetInfo(&f, &t));
  return f;
}

// Median µs of `iters` replays of the graph `record` captures on `st` (3 warm-up replays).
template <class Record>
double time_graph(cudaStream_t st, int iters, Record&& record) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ex = nullptr;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  record();
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ex, g, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ex, st));
  const std::vector<float> us = time_between_events(
      st, iters, [](int) {}, [&](int) { CK(cudaGraphLaunch(ex, st)); });
  CK(cudaGraphExecDestroy(ex));
  CK(cudaGraphDestroy(g));
  return median(us);
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 58, E = 16, capacity = 4096, iters = 20;
  const int H = 7168, I = 2048, K = 8;
  std::vector<int> tokens = {1, 128, 4096};
  Recipe recipe = Recipe::kNvfp4;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    const bool known = a == "--layers" || a == "--experts" || a == "--capacity" || a == "--iters" ||
                       a == "--tokens" || a == "--recipe" || a == "--json";
    if (!known || i + 1 >= argc) {
      std::fprintf(stderr,
                   "usage: %s [--layers N] [--experts E] [--capacity C] [--tokens a,b] "
                   "[--recipe R] [--iters N] [--json PATH]\n",
                   argv[0]);
      return 1;
    }
    ++i;
    if (a == "--layers") layers = std::atoi(v.c_str());
    if (a == "--experts") E = std::atoi(v.c_str());
    if (a == "--capacity") capacity = std::atoi(v.c_str());
    if (a == "--iters") iters = std::max(20, std::atoi(v.c_str()));
    if (a == "--tokens") tokens = parse_ints(v);
    if (a == "--json") json_path = v;
    if (a == "--recipe") {
      const auto r = parse_recipe(v);
      if (!r) {
        std::fprintf(stderr, "unknown recipe %s\n", v.c_str());
        return 1;
      }
      recipe = *r;
    }
  }
  if (layers < 1 || E < 1 || capacity < 1 || tokens.empty()) {
    std::fprintf(stderr, "--layers, --experts, --capacity and --tokens must be >= 1\n");
    return 1;
  }
  for (int t : tokens)
    if (t < 1 || t > capacity) {
      std::fprintf(stderr, "tokens %d outside [1, capacity %d]\n", t, capacity);
      return 1;
    }
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  const LayerConfig c = layer_config(recipe, E, capacity, H, I, K);
  const Device dev{DeviceKind::kCUDA, 0};
  // Checkpoint-layout weights of one layer (seeded per layer), made on the GPU and freed after
  // the layer preprocessed them.
  auto build = [&](std::shared_ptr<EpGroup> group, int seed) {
    const DeviceWeights w(recipe, H, I, E, 10 * uint64_t(seed), dev);
    return group ? std::make_unique<MegaLayer>(group, c, w.pack)
                 : std::make_unique<MegaLayer>(Bootstrap{.backend = Backend::kCUDA}, c, w.pack);
  };

  const size_t before = free_bytes();
  auto group = EpGroup::create(Bootstrap{.backend = Backend::kCUDA});
  std::vector<std::unique_ptr<MegaLayer>> model;
  for (int l = 0; l < layers; ++l) {
    model.push_back(build(group, l));
    model.back()->warmup();
  }
  const size_t used = before - free_bytes();
  const size_t ws_one = model[0]->workspace_bytes(model[0]->default_workspace());
  std::unique_ptr<MegaLayer> alone = build(nullptr, 0);  // the group's layer 0, built alone
  alone->warmup();
  std::printf("group of %d layers (%s, H %d, I %d, E %d, K %d, capacity %d) on one GPU\n", layers,
              recipe_name(recipe), H, I, E, K, capacity);
  std::printf("  device memory used by the group: %.2f GiB\n", used / 1073741824.0);
  std::printf(
      "  pool: %.3f GiB in %d workspace(s); built alone the layers would hold %.2f GiB "
      "of workspaces (%.3f GiB each)\n",
      group->pool_bytes() / 1073741824.0, group->num_pooled_workspaces(),
      double(layers) * ws_one / 1073741824.0, ws_one / 1073741824.0);

  const char* commit = std::getenv("MOE_EP_COMMIT");
  FILE* js = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "w");
  if (!json_path.empty() && !js) {
    std::fprintf(stderr, "cannot write %s\n", json_path.c_str());
    return 1;
  }
  if (js) std::fprintf(js, "[\n");
  cudaStream_t st = nullptr;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::printf("  %8s %14s %14s %22s\n", "tokens", "group_us", "alone_us", "sequence_us/layer");
  for (int T : tokens) {
    std::vector<int32_t> ids(size_t(T) * K);
    std::vector<float> w(size_t(T) * K, 1.0f / K);
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k)
        ids[size_t(t) * K + k] = (t * 7 + k * (E / K > 0 ? E / K : 1)) % E;
    void* x = filled(size_t(T) * H * 2, 99 + T, 4);
    void *d_ids = nullptr, *d_w = nullptr, *out_a = nullptr, *out_b = nullptr;
    CK(cudaMalloc(&d_ids, ids.size() * 4));
    CK(cudaMalloc(&d_w, w.size() * 4));
    CK(cudaMalloc(&out_a, size_t(T) * H * 2));
    CK(cudaMalloc(&out_b, size_t(T) * H * 2));
    CK(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
    auto inputs = [&](void* hidden) {
      ForwardInputs f;
      f.hidden_states = TensorView::contiguous(hidden, DType::kBF16, {T, H}, dev);
      f.topk_ids = TensorView::contiguous(d_ids, DType::kI32, {T, K}, dev);
      f.topk_weights = TensorView::contiguous(d_w, DType::kF32, {T, K}, dev);
      f.stream = st;
      return f;
    };
    const TensorView oa = TensorView::contiguous(out_a, DType::kBF16, {T, H}, dev);
    const TensorView ob = TensorView::contiguous(out_b, DType::kBF16, {T, H}, dev);
    const double g_us = time_graph(st, iters, [&] { model[0]->forward(inputs(x), oa); });
    const double a_us = time_graph(st, iters, [&] { alone->forward(inputs(x), oa); });
    const double seq_us = time_graph(st, iters, [&] {
      for (int l = 0; l < layers; ++l)
        model[l]->forward(inputs(l == 0 ? x : (l % 2 ? out_a : out_b)), l % 2 ? ob : oa);
    });
    std::printf("  %8d %14.1f %14.1f %22.1f\n", T, g_us, a_us, seq_us / layers);
    if (js)
      std::fprintf(js,
                   "%s  {\"commit\": \"%s\", \"bench\": \"group\", \"recipe\": \"%s\", "
                   "\"layers\": %d, \"H\": %d, \"I\": %d, \"E\": %d, \"K\": %d, "
                   "\"capacity\": %d, \"tokens_per_rank\": %d, \"group_us\": %.2f, "
                   "\"alone_us\": %.2f, \"sequence_us_per_layer\": %.2f, "
                   "\"pool_bytes\": %zu, \"workspace_bytes_alone\": %zu, "
                   "\"group_device_bytes\": %zu}",
                   T == tokens.front() ? "" : ",\n", commit ? commit : "", recipe_name(recipe),
                   layers, H, I, E, K, capacity, T, g_us, a_us, seq_us / layers,
                   group->pool_bytes(), ws_one, used);
    for (void* q : {x, d_ids, d_w, out_a, out_b}) CK(cudaFree(q));
  }
  if (js) {
    std::fprintf(js, "\n]\n");
    std::fclose(js);
  }
  CK(cudaStreamDestroy(st));
  alone.reset();
  model.clear();
  group->destroy();
  return 0;
}
