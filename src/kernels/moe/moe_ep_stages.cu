// The CUDA backend's stages around the EP transport (W > 1): the source quantizes x into
// activation rows for dispatch; the owner turns the received rows into virtual tokens that the
// single-GPU route / GEMM kernels consume unchanged (docs/protocol.md §8).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/moe/moe_launch.h"
#include "moe_ep/formats.h"

namespace moe_ep::kern {
namespace {

constexpr int kThreads256 = 256;

__device__ __forceinline__ int valid_count(int bound, const int32_t* dev) {
  if (!dev) return bound;
  const int n = *dev;
  return n < 0 ? 0 : (n > bound ? bound : n);
}

// N bf16 values (N % 8 == 0) from x: 16-byte loads when `vec`, else 2-byte loads.
template <int N>
__device__ __forceinline__ void load_bf16(const uint16_t* x, bool vec, uint16_t (&v)[N]) {
  if (vec) {
#pragma unroll
    for (int q = 0; q < N / 8; ++q) {
      const uint4 w = __ldg(reinterpret_cast<const uint4*>(x) + q);
      const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[8 * q + 2 * i] = uint16_t(u[i] & 0xffffu);
        v[8 * q + 2 * i + 1] = uint16_t(u[i] >> 16);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = x[i];
  }
}

// Block t: token t's ids are checked (first bad one recorded, as the single-GPU route does) and
// its row quantized. Rows past the valid count are left alone (dispatch never reads them).
template <Recipe R>
__global__ void __launch_bounds__(kThreads256) ep_source_kernel(const EpSourceArgs a) {
  const int t = blockIdx.x, tid = threadIdx.x;
  if (t >= valid_count(a.tokens, a.num_tokens)) return;
  const int K = a.K, H = a.H;
  for (int k = tid; k < K; k += kThreads256) {
    const int id = a.ids[size_t(t) * K + k];
    if ((id < -1 || id >= a.num_experts) && atomicCAS(&a.error->code, 0, 1) == 0) {
      a.error->index = t * K + k;
      a.error->value = id;
      a.error->limit = a.num_experts;
      __threadfence_system();
    }
  }
  const uint16_t* x = a.x + int64_t(t) * a.x_stride;
  uint8_t* row = a.act + size_t(t) * a.act_row_bytes;
  // 16-byte loads of x where its rows allow (the caller's tensor need not be aligned).
  const bool vec = ((reinterpret_cast<uintptr_t>(a.x) | uintptr_t(a.x_stride) * 2) & 15) == 0;
  if constexpr (R == Recipe::kNvfp4) {
    for (int b = tid; b < H / 16; b += kThreads256) {
      uint16_t v[16];
      load_bf16<16>(x + b * 16, vec, v);
      uint8_t packed[8];
      const uint8_t sb = fmt::quantize_block_nvfp4(v, a.input_norm_const, packed);
      uint2 p;
      p.x = uint32_t(packed[0]) | uint32_t(packed[1]) << 8 | uint32_t(packed[2]) << 16 |
            uint32_t(packed[3]) << 24;
      p.y = uint32_t(packed[4]) | uint32_t(packed[5]) << 8 | uint32_t(packed[6]) << 16 |
            uint32_t(packed[7]) << 24;
      *reinterpret_cast<uint2*>(row + b * 8) = p;
      row[a.act_data_bytes + b] = sb;
    }
  } else if constexpr (R == Recipe::kMxfp4Mxfp8) {
    for (int b = tid; b < H / 32; b += kThreads256) {
      uint16_t v[32];
      load_bf16<32>(x + b * 32, vec, v);
      uint8_t q[32];
      const uint8_t sb = fmt::quantize_block_mxfp8(v, q);
      uint4* d = reinterpret_cast<uint4*>(row + b * 32);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          w[i] = uint32_t(q[16 * j + 4 * i]) | uint32_t(q[16 * j + 4 * i + 1]) << 8 |
                 uint32_t(q[16 * j + 4 * i + 2]) << 16 | uint32_t(q[16 * j + 4 * i + 3]) << 24;
        d[j] = make_uint4(w[0], w[1], w[2], w[3]);
      }
      row[a.act_data_bytes + b] = sb;
    }
  } else {
    uint16_t* d = reinterpret_cast<uint16_t*>(row);
    if (vec && H % 8 == 0) {  // act rows are 16-byte aligned
      for (int c = tid; c < H / 8; c += kThreads256)
        reinterpret_cast<uint4*>(d)[c] = __ldg(reinterpret_cast<const uint4*>(x) + c);
    } else {
      for (int i = tid; i < H; i += kThreads256) d[i] = x[i];
    }
  }
}

// Block v = src * capacity + row. xq values are q * s in bf16 (exact), the same bits the
// single-GPU prepare writes for the same token, so EP and EP = 1 outputs agree bit for bit.
template <Recipe R>
__global__ void __launch_bounds__(kThreads256) ep_unpack_kernel(const EpUnpackArgs a) {
  const int v = blockIdx.x, tid = threadIdx.x;
  const int src = v / a.capacity, i = v % a.capacity, K = a.K, H = a.H;
  int n = *reinterpret_cast<const int32_t*>(a.window + a.recv_count_off + size_t(src) * 4);
  n = n < 0 ? 0 : (n > a.capacity ? a.capacity : n);
  const size_t r = size_t(src) * a.capacity + i;
  if (i >= n) {
    for (int k = tid; k < K; k += kThreads256) a.ids[r * K + k] = -1;
    return;
  }
  const uint8_t* meta = a.window + a.recv_meta_off + r * a.meta_row_bytes;
  const int32_t* mids = reinterpret_cast<const int32_t*>(meta + 4);
  const float* mw = reinterpret_cast<const float*>(meta + 4 + 4 * K);
  for (int k = tid; k < K; k += kThreads256) {
    const int id = mids[k];
    const bool local = id >= a.expert_base && id < a.expert_base + a.local_experts;
    a.ids[r * K + k] = local ? id : -1;
    a.weights[r * K + k] = mw[k];
  }
  const uint8_t* row = a.window + a.recv_act_off + r * a.act_row_bytes;
  uint16_t* xq = a.xq + r * H;
  if constexpr (R == Recipe::kNvfp4) {
    for (int b = tid; b < H / 16; b += kThreads256) {
      const uint2 p = *reinterpret_cast<const uint2*>(row + b * 8);
      const float s = fmt::e4m3_to_float(row[a.act_data_bytes + b]);
      const uint32_t pw[2] = {p.x, p.y};
      uint32_t o[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t byte = (pw[j / 4] >> (8 * (j % 4))) & 0xffu;
        o[j] = uint32_t(fmt::float_to_bf16(fmt::e2m1_to_float(byte & 0xf) * s)) |
               (uint32_t(fmt::float_to_bf16(fmt::e2m1_to_float(byte >> 4) * s)) << 16);
      }
      uint4* d = reinterpret_cast<uint4*>(xq + b * 16);
      d[0] = make_uint4(o[0], o[1], o[2], o[3]);
      d[1] = make_uint4(o[4], o[5], o[6], o[7]);
    }
  } else if constexpr (R == Recipe::kMxfp4Mxfp8) {
    for (int b = tid; b < H / 32; b += kThreads256) {
      const float s = fmt::ue8m0_to_float(row[a.act_data_bytes + b]);
      const uint8_t* q = row + b * 32;
      uint4* d = reinterpret_cast<uint4*>(xq + b * 32);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
          o[e] = uint32_t(fmt::float_to_bf16(fmt::e4m3_to_float(q[j * 8 + 2 * e]) * s)) |
                 (uint32_t(fmt::float_to_bf16(fmt::e4m3_to_float(q[j * 8 + 2 * e + 1]) * s)) << 16);
        d[j] = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
  } else {
    const uint4* s = reinterpret_cast<const uint4*>(row);
    uint4* d = reinterpret_cast<uint4*>(xq);
    for (int c = tid; c < H / 8; c += kThreads256) d[c] = s[c];
  }
}

}  // namespace

cudaError_t launch_ep_source(const EpSourceArgs& a, cudaStream_t s) {
  if (a.tokens == 0) return cudaSuccess;
  switch (a.recipe) {
    case Recipe::kNvfp4:
      ep_source_kernel<Recipe::kNvfp4><<<a.tokens, kThreads256, 0, s>>>(a);
      break;
    case Recipe::kMxfp4Mxfp8:
      ep_source_kernel<Recipe::kMxfp4Mxfp8><<<a.tokens, kThreads256, 0, s>>>(a);
      break;
    case Recipe::kMxfp4Bf16:
      ep_source_kernel<Recipe::kMxfp4Bf16><<<a.tokens, kThreads256, 0, s>>>(a);
      break;
    case Recipe::kBf16:
      ep_source_kernel<Recipe::kBf16><<<a.tokens, kThreads256, 0, s>>>(a);
      break;
  }
  return cudaGetLastError();
}

cudaError_t launch_ep_unpack(const EpUnpackArgs& a, cudaStream_t s) {
  const int blocks = a.world * a.capacity;
  if (blocks == 0) return cudaSuccess;
  switch (a.recipe) {
    case Recipe::kNvfp4:
      ep_unpack_kernel<Recipe::kNvfp4><<<blocks, kThreads256, 0, s>>>(a);
      break;
    case Recipe::kMxfp4Mxfp8:
      ep_unpack_kernel<Recipe::kMxfp4Mxfp8><<<blocks, kThreads256, 0, s>>>(a);
      break;
    case Recipe::kMxfp4Bf16:
      ep_unpack_kernel<Recipe::kMxfp4Bf16><<<blocks, kThreads256, 0, s>>>(a);
      break;
    case Recipe::kBf16:
      ep_unpack_kernel<Recipe::kBf16><<<blocks, kThreads256, 0, s>>>(a);
      break;
  }
  return cudaGetLastError();
}

}  // namespace moe_ep::kern
