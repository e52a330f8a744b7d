// What the benchmark programs share (bench_layer, bench_group): random checkpoint-layout weights
// and activations made on the GPU, event timing of a stream's launches, medians, the --tokens
// list.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "moe_ep/config.h"
#include "moe_ep/formats.h"
#include "moe_ep/layer.h"

namespace moe_ep::bench {

__device__ __forceinline__ uint64_t hash64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// kind 0: random bytes; 1: E4M3 scales in [0x20, 0x2f]; 2: UE8M0 in [119, 123]; 3: bf16 in
// +-0.05; 4: bf16 activations in +-2.
__global__ void fill_kernel(uint8_t* p, size_t n, uint64_t seed, int kind) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t h = hash64(seed * 0x100000001b3ull + i);
    switch (kind) {
      case 0:
        p[i] = uint8_t(h);
        break;
      case 1:
        p[i] = uint8_t(0x20 + (h & 15));
        break;
      case 2:
        p[i] = uint8_t(119 + h % 5);
        break;
      case 3:
      case 4: {
        if (i % 2) break;
        const float u = float(h >> 40) / 16777216.0f * 2.0f - 1.0f;
        const uint16_t b = fmt::float_to_bf16(u * (kind == 3 ? 0.05f : 2.0f));
        p[i] = uint8_t(b);
        if (i + 1 < n) p[i + 1] = uint8_t(b >> 8);
        break;
      }
    }
  }
}

inline void fill(void* p, size_t n, uint64_t seed, int kind) {
  fill_kernel<<<132 * 8, 256>>>(static_cast<uint8_t*>(p), n, seed, kind);
  CK(cudaGetLastError());
}

// The layer configuration of a benchmark case: E experts, H, I, top-k K, workspace capacity.
inline moe_ep::LayerConfig layer_config(moe_ep::Recipe recipe, int E, int capacity, int H, int I,
                                        int K) {
  moe_ep::LayerConfig c;
  c.fleet.num_experts = E;
  c.fleet.max_tokens_per_rank = capacity;
  c.fleet.hidden_size = H;
  c.recipe.recipe = recipe;
  c.recipe.intermediate_size = I;
  c.recipe.top_k = K;
  return c;
}

// Random checkpoint-layout weights of `El` experts on the GPU (never zeros; valid scale bytes),
// freed with the object. seed_base separates ranks.
struct DeviceWeights {
  void *w13 = nullptr, *w2 = nullptr, *s13 = nullptr, *s2 = nullptr;
  size_t bytes_per_expert = 0;  // weights and scales of one expert
  WeightPack pack;
  DeviceWeights(Recipe recipe, int hidden, int inter, int64_t El, uint64_t seed_base, Device gpu) {
    const RecipeTraits tr = recipe_traits(recipe);
    const size_t E = El, H = hidden, I = inter;
    const size_t w13_bytes = tr.weights_4bit ? E * 2 * I * H / 2 : E * 2 * I * H * 2;
    const size_t w2_bytes = tr.weights_4bit ? E * H * I / 2 : E * H * I * 2;
    const size_t s13_bytes = tr.weights_4bit ? E * 2 * I * H / tr.weight_block : 0;
    const size_t s2_bytes = tr.weights_4bit ? E * H * I / tr.weight_block : 0;
    bytes_per_expert = (w13_bytes + w2_bytes + s13_bytes + s2_bytes) / E;
    CK(cudaMalloc(&w13, w13_bytes));
    CK(cudaMalloc(&w2, w2_bytes));
    fill(w13, w13_bytes, seed_base + 1, tr.weights_4bit ? 0 : 3);
    fill(w2, w2_bytes, seed_base + 2, tr.weights_4bit ? 0 : 3);
    if (tr.weights_4bit) {
      CK(cudaMalloc(&s13, s13_bytes));
      CK(cudaMalloc(&s2, s2_bytes));
      fill(s13, s13_bytes, seed_base + 3, tr.e4m3_scales ? 1 : 2);
      fill(s2, s2_bytes, seed_base + 4, tr.e4m3_scales ? 1 : 2);
      pack.w13 = TensorView::contiguous(w13, DType::kU8, {El, 2 * inter, hidden / 2}, gpu);
      pack.w2 = TensorView::contiguous(w2, DType::kU8, {El, hidden, inter / 2}, gpu);
      pack.w13_scale =
          TensorView::contiguous(s13, DType::kU8, {El, 2 * inter, hidden / tr.weight_block}, gpu);
      pack.w2_scale =
          TensorView::contiguous(s2, DType::kU8, {El, hidden, inter / tr.weight_block}, gpu);
    } else {
      pack.w13 = TensorView::contiguous(w13, DType::kBF16, {El, 2 * inter, hidden}, gpu);
      pack.w2 = TensorView::contiguous(w2, DType::kBF16, {El, hidden, inter}, gpu);
    }
    CK(cudaDeviceSynchronize());
  }
  ~DeviceWeights() {
    cudaFree(w13);
    cudaFree(w2);
    cudaFree(s13);
    cudaFree(s2);
  }
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;
};

inline std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoi(item));
  return v;
}

inline double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// `iters` calls of launch(it) on `st`, each between two events (before(it) runs ahead of the
// first): the µs of each.
template <class Before, class Launch>
std::vector<float> time_between_events(cudaStream_t st, int iters, const Before& before,
                                       const Launch& launch) {
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int it = 0; it < iters; ++it) {
    before(it);
    CK(cudaEventRecord(ev[2 * it], st));
    launch(it);
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
  return us;
}

}  // namespace moe_ep::bench
