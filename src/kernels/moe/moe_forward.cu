// The forward's small kernels (prepare = quantize + route, finalize) and the one-time weight
// preprocessing; launch_forward strings the stages together.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "kernels/moe/moe_launch.h"
#include "kernels/moe/sm90_moe_device.cuh"
#include "moe_ep/formats.h"

namespace moe_ep::kern {
namespace {

constexpr int kPrepThreads = 512;
constexpr int kMaxLocalExperts = 1024;  // cuda_backend_unsupported_reasons says so beyond it

__device__ __forceinline__ int valid_tokens(const ForwardArgs& a) {
  if (!a.num_tokens) return a.tokens;
  const int n = *a.num_tokens;
  return n < 0 ? 0 : (n > a.tokens ? a.tokens : n);
}

__device__ void report_bad_id(DeviceError* err, int index, int value, int limit) {
  if (atomicCAS(&err->code, 0, 1) == 0) {
    err->index = index;
    err->value = value;
    err->limit = limit;
    __threadfence_system();
  }
}

// Block 0: routing (counts, offsets, tiles, the expert-sorted pair list). Pairs of one expert
// take positions in arrival order (atomics); every output column of the GEMMs is computed the
// same way wherever it sits, so the result does not depend on that order.
__device__ void route(const ForwardArgs& a) {
  __shared__ int cnt[kMaxLocalExperts], off[kMaxLocalExperts], toff[kMaxLocalExperts];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int El = a.local_experts, tn = a.tile_n;
  const int P = valid_tokens(a) * a.K;
  for (int e = tid; e < El; e += kPrepThreads) cnt[e] = 0;
  __syncthreads();
  for (int i = tid; i < P; i += kPrepThreads) {
    const int id = a.ids[i];
    if (id == -1) continue;
    if (id < -1 || id >= a.num_experts) {
      report_bad_id(a.error, i, id, a.num_experts);
      continue;
    }
    const int le = id - a.expert_base;
    if (le >= 0 && le < El) atomicAdd(&cnt[le], 1);
  }
  __syncthreads();
  if (warp == 0) {
    int carry_p = 0, carry_t = 0;
    for (int base = 0; base < El; base += 32) {
      const int e = base + lane;
      const int c = e < El ? cnt[e] : 0, nt = (c + tn - 1) / tn;
      int ip = c, it = nt;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, ip, o), z = __shfl_up_sync(0xffffffffu, it, o);
        if (lane >= o) {
          ip += y;
          it += z;
        }
      }
      if (e < El) {
        off[e] = carry_p + ip - c;
        toff[e] = carry_t + it - nt;
      }
      carry_p += __shfl_sync(0xffffffffu, ip, 31);
      carry_t += __shfl_sync(0xffffffffu, it, 31);
    }
    if (lane == 0) *a.num_tiles = carry_t;
  }
  __syncthreads();
  for (int e = tid; e < El; e += kPrepThreads) {
    const int c = cnt[e];
    for (int j = 0; j * tn < c; ++j) {
      TileInfo ti;
      ti.expert = e;
      ti.start = off[e] + j * tn;
      ti.rows = min(tn, c - j * tn);
      a.tiles[toff[e] + j] = ti;
    }
    cnt[e] = 0;  // becomes the placement cursor
  }
  __syncthreads();
  for (int i = tid; i < P; i += kPrepThreads) {
    const int id = a.ids[i];
    if (id < 0 || id >= a.num_experts) continue;
    const int le = id - a.expert_base;
    if (le < 0 || le >= El) continue;
    a.sorted_pairs[off[le] + atomicAdd(&cnt[le], 1)] = i;
  }
}

__device__ __forceinline__ bool live_id(int id, int E) { return id >= 0 && id < E; }

// Blocks 1..T: token t = blockIdx.x - 1. Writes xq row t (x as the GEMM sees it: q*s in bf16,
// exact) and, for the unfinalized outputs, weights/indices and zero rows for empty slots.
template <Recipe R>
__global__ void __launch_bounds__(kPrepThreads) prepare_kernel(const ForwardArgs a) {
  if (blockIdx.x == 0) {
    route(a);
    return;
  }
  const int t = blockIdx.x - 1, tid = threadIdx.x;
  const int T = valid_tokens(a), K = a.K, H = a.H;
  if (a.weights_out) {
    for (int k = 0; k < K; ++k) {
      const int row = t * K + k;
      const bool live = t < T && live_id(a.ids[row], a.num_experts);
      if (tid == 0) {
        a.weights_out[row] = t < T ? (a.weight_in_fc1 ? 1.0f : a.topk_weights[row]) : 0.0f;
        a.indices_out[row] = live ? row : -1;
      }
      if (!live) {
        uint4* d = reinterpret_cast<uint4*>(a.y_rows + size_t(row) * H);
        for (int i = tid; i < H / 8; i += kPrepThreads) d[i] = make_uint4(0, 0, 0, 0);
      }
    }
  }
  if (t >= T) return;
  const uint16_t* x = a.x + int64_t(t) * a.x_stride;
  uint16_t* xq = a.xq + size_t(t) * H;
  if constexpr (R == Recipe::kNvfp4) {
    for (int b = tid; b < H / 16; b += kPrepThreads) {
      uint16_t v[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = x[b * 16 + i];
      uint8_t packed[8];
      const float s = fmt::e4m3_to_float(fmt::quantize_block_nvfp4(v, a.input_norm_const, packed));
      uint32_t o[8];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        o[i] = uint32_t(fmt::float_to_bf16(fmt::e2m1_to_float(packed[i] & 0xf) * s)) |
               (uint32_t(fmt::float_to_bf16(fmt::e2m1_to_float(packed[i] >> 4) * s)) << 16);
      uint4* d = reinterpret_cast<uint4*>(xq + b * 16);
      d[0] = make_uint4(o[0], o[1], o[2], o[3]);
      d[1] = make_uint4(o[4], o[5], o[6], o[7]);
    }
  } else if constexpr (R == Recipe::kMxfp4Mxfp8) {
    for (int b = tid; b < H / 32; b += kPrepThreads) {
      uint16_t v[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) v[i] = x[b * 32 + i];
      uint8_t q[32];
      const float s = fmt::ue8m0_to_float(fmt::quantize_block_mxfp8(v, q));
      uint4* d = reinterpret_cast<uint4*>(xq + b * 32);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t o[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          o[i] = uint32_t(fmt::float_to_bf16(fmt::e4m3_to_float(q[j * 8 + 2 * i]) * s)) |
                 (uint32_t(fmt::float_to_bf16(fmt::e4m3_to_float(q[j * 8 + 2 * i + 1]) * s)) << 16);
        d[j] = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
  } else {
    for (int i = tid; i < H; i += kPrepThreads) xq[i] = x[i];
  }
}

// out[t] = bf16(sum_k c * float(y[t,k])) in slot order, multiply and add rounded separately.
constexpr int kFinThreads = 128;
__global__ void __launch_bounds__(kFinThreads) finalize_kernel(const ForwardArgs a) {
  const int t = blockIdx.x;
  const int c8 = (blockIdx.y * kFinThreads + threadIdx.x) * 8;
  if (c8 >= a.H) return;
  const int T = valid_tokens(a), K = a.K, H = a.H;
  uint4* dst = reinterpret_cast<uint4*>(a.out + size_t(t) * H + c8);
  if (t >= T) {
    *dst = make_uint4(0, 0, 0, 0);
    return;
  }
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
  for (int k = 0; k < K; ++k) {
    const int row = t * K + k;
    if (!live_id(a.ids[row], a.num_experts)) continue;
    const float c = a.weight_in_fc1 ? 1.0f : a.topk_weights[row];
    const uint4 v = *reinterpret_cast<const uint4*>(a.y_rows + size_t(row) * H + c8);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc[2 * i] = fmt::add_rn(acc[2 * i], fmt::mul_rn(c, fmt::bf16_to_float(w[i] & 0xffff)));
      acc[2 * i + 1] = fmt::add_rn(acc[2 * i + 1], fmt::mul_rn(c, fmt::bf16_to_float(w[i] >> 16)));
    }
  }
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    o[i] = uint32_t(fmt::float_to_bf16(acc[2 * i])) |
           (uint32_t(fmt::float_to_bf16(acc[2 * i + 1])) << 16);
  *dst = make_uint4(o[0], o[1], o[2], o[3]);
}

// EP unfinalized output: slot (t, k) of the source copies its combine row (live slot) or writes
// zeros, plus the weights / indices the single-GPU prepare writes.
__global__ void __launch_bounds__(kFinThreads)
    unfinalized_copy_kernel(const ForwardArgs a, uint16_t* rows) {
  const int t = blockIdx.x, k = blockIdx.y, K = a.K, H = a.H;
  const int T = valid_tokens(a), row = t * K + k;
  const bool live = t < T && live_id(a.ids[row], a.num_experts);
  if (threadIdx.x == 0) {
    a.weights_out[row] = t < T ? (a.weight_in_fc1 ? 1.0f : a.topk_weights[row]) : 0.0f;
    a.indices_out[row] = live ? row : -1;
  }
  uint4* d = reinterpret_cast<uint4*>(rows + size_t(row) * H);
  const uint4* src = reinterpret_cast<const uint4*>(a.y_rows + size_t(row) * H);
  for (int i = threadIdx.x; i < H / 8; i += kFinThreads)
    d[i] = live ? src[i] : make_uint4(0, 0, 0, 0);
}

// ---------------------------------------------------------------------------------------------
// Weight preprocessing (moe_params.h describes the resident layout).

struct PrepShape {
  int E, M, K, I, mtiles, chunks;
  bool fc1;
  __device__ int row_of(int mtile, int frag, int r) const {
    return fc1 ? (frag & 1) * I + mtile * kFc1TileH + (frag >> 1) * 16 + r
               : mtile * kTileRows + frag * 16 + r;
  }
};

// One thread per 16-byte piece of the resident weights.
__global__ void preprocess_weights_kernel(PrepShape p, bool four_bit, const uint8_t* raw,
                                          uint8_t* out, size_t pieces_per_expert) {
  const size_t total = pieces_per_expert * p.E;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const int e = int(idx / pieces_per_expert);
    const size_t rem = idx % pieces_per_expert;
    const int per_frag = four_bit ? 32 : 128;
    const size_t blk = rem / per_frag;
    const int within = int(rem % per_frag);
    const int lane = four_bit ? within : within / 4;
    const int frag = int(blk % kTileFrags);
    const int chunk = int(blk / kTileFrags % p.chunks);
    const int mtile = int(blk / kTileFrags / p.chunks);
    const int g = lane >> 2, t4 = lane & 3;
    uint32_t words[4];
    if (four_bit) {
      for (int s = 0; s < 4; ++s) {
        uint32_t w = 0;
        for (int j = 0; j < 4; ++j) {
          const int row = p.row_of(mtile, frag, g + (j & 1) * 8);
          const int kc = chunk * kKChunk + s * 16 + 2 * t4 + (j >> 1) * 8;
          uint32_t byte = 0;
          if (row < p.M) byte = raw[(size_t(e) * p.M + row) * (p.K / 2) + kc / 2];
          // Low element = low nibble (even k), high element = high nibble; bit layout of
          // decode_e2m1x8 (sm90_moe_device.cuh).
          for (int half = 0; half < 2; ++half) {
            const uint32_t code = half ? byte >> 4 : byte & 0xfu;
            for (int bit = 0; bit < 4; ++bit)
              w |= ((code >> bit) & 1u) << (e2m1_bit_pos(j, bit) + 16 * half);
          }
        }
        words[s] = w;
      }
    } else {
      const int s = within & 3;
      for (int j = 0; j < 4; ++j) {
        const int row = p.row_of(mtile, frag, g + (j & 1) * 8);
        const int kc = chunk * kKChunk + s * 16 + 2 * t4 + (j >> 1) * 8;
        uint32_t v = 0;
        if (row < p.M)
          v = *reinterpret_cast<const uint32_t*>(raw + ((size_t(e) * p.M + row) * p.K + kc) * 2);
        words[j] = v;
      }
    }
    *reinterpret_cast<uint4*>(out + idx * 16) = make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// One thread per resident scale byte. bad[0..3] = {flag, expert, row, byte}.
__global__ void preprocess_scales_kernel(PrepShape p, bool nv, const uint8_t* raw, uint8_t* out,
                                         size_t bytes_per_expert, int* bad) {
  const size_t total = bytes_per_expert * p.E;
  const int per_frag = nv ? 64 : 32, per_row = nv ? 4 : 2, block = nv ? 16 : 32;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const int e = int(idx / bytes_per_expert);
    const size_t rem = idx % bytes_per_expert;
    const size_t blk = rem / per_frag;
    const int within = int(rem % per_frag);
    const int r = within / per_row, s = within % per_row;
    const int frag = int(blk % kTileFrags);
    const int chunk = int(blk / kTileFrags % p.chunks);
    const int mtile = int(blk / kTileFrags / p.chunks);
    const int row = p.row_of(mtile, frag, r);
    uint8_t b = 0;
    if (row < p.M) {
      b = raw[(size_t(e) * p.M + row) * (p.K / block) + chunk * per_row + s];
      const bool is_bad = nv ? (b & 0x7f) == 0x7f : b > 191;
      if (is_bad && atomicCAS(&bad[0], 0, 1) == 0) {
        bad[1] = e;
        bad[2] = row;
        bad[3] = b;
      }
    }
    out[idx] = b;
  }
}

}  // namespace

cudaError_t set_kernel_attributes(Recipe recipe) {
  // Querying attributes loads each module now, not lazily inside a graph capture.
  cudaFuncAttributes attr;
  cudaError_t err = cudaFuncGetAttributes(&attr, finalize_kernel);
  if (err == cudaSuccess) {
    switch (recipe) {
      case Recipe::kNvfp4:
        err = cudaFuncGetAttributes(&attr, prepare_kernel<Recipe::kNvfp4>);
        break;
      case Recipe::kMxfp4Mxfp8:
        err = cudaFuncGetAttributes(&attr, prepare_kernel<Recipe::kMxfp4Mxfp8>);
        break;
      case Recipe::kMxfp4Bf16:
        err = cudaFuncGetAttributes(&attr, prepare_kernel<Recipe::kMxfp4Bf16>);
        break;
      case Recipe::kBf16:
        err = cudaFuncGetAttributes(&attr, prepare_kernel<Recipe::kBf16>);
        break;
    }
  }
  if (err != cudaSuccess) return err;
  switch (recipe) {
    case Recipe::kNvfp4:
      return set_gemm_attributes_nvfp4();
    case Recipe::kMxfp4Mxfp8:
      return set_gemm_attributes_mxfp4_mxfp8();
    case Recipe::kMxfp4Bf16:
      return set_gemm_attributes_mxfp4_bf16();
    case Recipe::kBf16:
      return set_gemm_attributes_bf16();
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_forward(const ForwardArgs& a, cudaStream_t s, cudaEvent_t* ev) {
  if (a.tokens == 0) return cudaSuccess;
  if (ev) cudaEventRecord(ev[0], s);
  const dim3 pgrid(a.xq_ready ? 1 : a.tokens + 1);
  switch (a.recipe) {
    case Recipe::kNvfp4:
      prepare_kernel<Recipe::kNvfp4><<<pgrid, kPrepThreads, 0, s>>>(a);
      break;
    case Recipe::kMxfp4Mxfp8:
      prepare_kernel<Recipe::kMxfp4Mxfp8><<<pgrid, kPrepThreads, 0, s>>>(a);
      break;
    case Recipe::kMxfp4Bf16:
      prepare_kernel<Recipe::kMxfp4Bf16><<<pgrid, kPrepThreads, 0, s>>>(a);
      break;
    case Recipe::kBf16:
      prepare_kernel<Recipe::kBf16><<<pgrid, kPrepThreads, 0, s>>>(a);
      break;
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (ev) cudaEventRecord(ev[1], s);
  switch (a.recipe) {
    case Recipe::kNvfp4:
      err = launch_gemms_nvfp4(a, s, ev ? ev + 2 : nullptr);
      break;
    case Recipe::kMxfp4Mxfp8:
      err = launch_gemms_mxfp4_mxfp8(a, s, ev ? ev + 2 : nullptr);
      break;
    case Recipe::kMxfp4Bf16:
      err = launch_gemms_mxfp4_bf16(a, s, ev ? ev + 2 : nullptr);
      break;
    case Recipe::kBf16:
      err = launch_gemms_bf16(a, s, ev ? ev + 2 : nullptr);
      break;
  }
  if (err != cudaSuccess) return err;
  if (ev) cudaEventRecord(ev[3], s);
  if (a.out) {
    const dim3 fgrid(a.tokens, (a.H / 8 + kFinThreads - 1) / kFinThreads);
    finalize_kernel<<<fgrid, kFinThreads, 0, s>>>(a);
    err = cudaGetLastError();
  }
  if (ev) cudaEventRecord(ev[4], s);
  return err;
}

cudaError_t launch_finalize(const ForwardArgs& a, uint16_t* unfinalized_rows, cudaStream_t s) {
  if (a.tokens == 0) return cudaSuccess;
  if (a.out) {
    const dim3 fgrid(a.tokens, (a.H / 8 + kFinThreads - 1) / kFinThreads);
    finalize_kernel<<<fgrid, kFinThreads, 0, s>>>(a);
  } else {
    unfinalized_copy_kernel<<<dim3(a.tokens, a.K), kFinThreads, 0, s>>>(a, unfinalized_rows);
  }
  return cudaGetLastError();
}

cudaError_t preprocess_weights(Recipe recipe, bool fc1, int E, int H, int I, const uint8_t* raw,
                               const uint8_t* raw_scale, uint8_t* out, uint8_t* out_scale,
                               cudaStream_t stream, std::string* why) {
  const ResidentShape rs = resident_shape(recipe, H, I);
  PrepShape p;
  p.E = E;
  p.fc1 = fc1;
  p.I = I;
  p.M = fc1 ? 2 * I : H;
  p.K = fc1 ? H : I;
  p.mtiles = fc1 ? rs.fc1_mtiles : rs.fc2_mtiles;
  p.chunks = fc1 ? rs.fc1_chunks : rs.fc2_chunks;
  const bool four_bit = recipe != Recipe::kBf16;
  const size_t wbytes = fc1 ? rs.fc1_bytes : rs.fc2_bytes;
  const size_t sbytes = fc1 ? rs.fc1_scale_bytes : rs.fc2_scale_bytes;
  why->clear();
  if (E == 0) return cudaSuccess;
  const int threads = 256, blocks = 132 * 16;
  preprocess_weights_kernel<<<blocks, threads, 0, stream>>>(p, four_bit, raw, out, wbytes / 16);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || !four_bit)
    return err != cudaSuccess ? err : cudaStreamSynchronize(stream);
  int* bad = nullptr;
  if ((err = cudaMalloc(&bad, 4 * sizeof(int))) != cudaSuccess) return err;
  cudaMemsetAsync(bad, 0, 4 * sizeof(int), stream);
  preprocess_scales_kernel<<<blocks, threads, 0, stream>>>(p, recipe == Recipe::kNvfp4, raw_scale,
                                                           out_scale, sbytes, bad);
  int host_bad[4] = {0, 0, 0, 0};
  err = cudaGetLastError();
  if (err == cudaSuccess)
    err = cudaMemcpyAsync(host_bad, bad, sizeof host_bad, cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  cudaFree(bad);
  if (err == cudaSuccess && host_bad[0]) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", host_bad[3]);
    *why = std::string(fc1 ? "w13_scale" : "w2_scale") + " byte " + hex + " at local expert " +
           std::to_string(host_bad[1]) + ", row " + std::to_string(host_bad[2]) +
           (recipe == Recipe::kNvfp4
                ? " is an E4M3 NaN"
                : " is a UE8M0 NaN or a scale above 2^64 (bytes > 191 are not supported)");
  }
  return err;
}

}  // namespace moe_ep::kern
