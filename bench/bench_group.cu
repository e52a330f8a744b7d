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

#include "cuda_check.h"
#include "moe_ep/formats.h"
#include "moe_ep/group.h"
#include "moe_ep/layer.h"

using namespace moe_ep;

namespace {

__device__ __forceinline__ uint64_t hash64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// kind 0: random bytes; 1: E4M3 scales in [0x20, 0x2f]; 2: UE8M0 in [119, 123]; 3: bf16 in
// +-0.05; 4: bf16 in +-2.
__global__ void fill_kernel(uint8_t* p, size_t n, uint64_t seed, int kind) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t h = hash64(seed * 0x100000001b3ull + i);
    if (kind == 0) {
      p[i] = uint8_t(h);
    } else if (kind == 1) {
      p[i] = uint8_t(0x20 + (h & 15));
    } else if (kind == 2) {
      p[i] = uint8_t(119 + h % 5);
    } else if (i % 2 == 0) {
      const float u = float(h >> 40) / 16777216.0f * 2.0f - 1.0f;
      const uint16_t b = fmt::float_to_bf16(u * (kind == 3 ? 0.05f : 2.0f));
      p[i] = uint8_t(b);
      if (i + 1 < n) p[i + 1] = uint8_t(b >> 8);
    }
  }
}

void* filled(size_t n, uint64_t seed, int kind) {
  void* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(n, 16)));
  fill_kernel<<<132 * 8, 256>>>(static_cast<uint8_t*>(p), n, seed, kind);
  CK(cudaGetLastError());
  return p;
}

size_t free_bytes() {
  size_t f = 0, t = 0;
  CK(cudaDeviceSynchronize());
  CK(cudaMemGetInfo(&f, &t));
  return f;
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
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
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int it = 0; it < iters; ++it) {
    CK(cudaEventRecord(ev[2 * it], st));
    CK(cudaGraphLaunch(ex, st));
    CK(cudaEventRecord(ev[2 * it + 1], st));
  }
  CK(cudaStreamSynchronize(st));
  std::vector<float> us(iters);
  for (int it = 0; it < iters; ++it) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, ev[2 * it], ev[2 * it + 1]));
    us[it] = ms * 1000;
  }
  for (auto& e : ev) CK(cudaEventDestroy(e));
  CK(cudaGraphExecDestroy(ex));
  CK(cudaGraphDestroy(g));
  return median(us);
}

std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> v;
  for (size_t i = 0; i < s.size();) {
    const size_t j = s.find(',', i);
    v.push_back(std::atoi(s.substr(i, j - i).c_str()));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return v;
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
  const RecipeTraits tr = recipe_traits(recipe);
  LayerConfig c;
  c.fleet.num_experts = E;
  c.fleet.max_tokens_per_rank = capacity;
  c.fleet.hidden_size = H;
  c.recipe.recipe = recipe;
  c.recipe.intermediate_size = I;
  c.recipe.top_k = K;
  const Device dev{DeviceKind::kCUDA, 0};
  // Checkpoint-layout weights of one layer (seeded per layer), made on the GPU and freed after
  // the layer preprocessed them.
  auto build = [&](std::shared_ptr<EpGroup> group, int seed) {
    const int64_t w13_cols = tr.weights_4bit ? H / 2 : H, w2_cols = tr.weights_4bit ? I / 2 : I;
    const size_t elem = tr.weights_4bit ? 1 : 2;
    const int wkind = tr.weights_4bit ? 0 : 3, skind = tr.e4m3_scales ? 1 : 2;
    void* w13 = filled(size_t(E) * 2 * I * w13_cols * elem, 10 * seed + 1, wkind);
    void* w2 = filled(size_t(E) * H * w2_cols * elem, 10 * seed + 2, wkind);
    void *s13 = nullptr, *s2 = nullptr;
    WeightPack p;
    const DType wd = tr.weights_4bit ? DType::kU8 : DType::kBF16;
    p.w13 = TensorView::contiguous(w13, wd, {E, 2 * I, w13_cols}, dev);
    p.w2 = TensorView::contiguous(w2, wd, {E, H, w2_cols}, dev);
    if (tr.weights_4bit) {
      const int g = tr.weight_block;
      s13 = filled(size_t(E) * 2 * I * (H / g), 10 * seed + 3, skind);
      s2 = filled(size_t(E) * H * (I / g), 10 * seed + 4, skind);
      p.w13_scale = TensorView::contiguous(s13, DType::kU8, {E, 2 * I, H / g}, dev);
      p.w2_scale = TensorView::contiguous(s2, DType::kU8, {E, H, I / g}, dev);
    }
    std::unique_ptr<MegaLayer> layer =
        group ? std::make_unique<MegaLayer>(group, c, p)
              : std::make_unique<MegaLayer>(Bootstrap{.backend = Backend::kCUDA}, c, p);
    for (void* q : {w13, w2, s13, s2})
      if (q) CK(cudaFree(q));
    return layer;
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
