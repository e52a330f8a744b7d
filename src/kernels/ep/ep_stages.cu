// The CUDA backend's stages around the EP transport (W > 1): the source quantizes x into
// activation rows for dispatch; the owner turns the received rows into virtual tokens that the
// single-GPU route / GEMM kernels consume unchanged (docs/protocol.md §8).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/launch.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/quant4_device.cuh"
#include "kernels/common/quantize_math.h"
#include "moe_ep/formats.h"

namespace moe_ep::kern {
namespace {

__device__ __forceinline__ int valid_count(int bound, const int32_t* dev) {
  if (!dev) return bound;
  const int n = *dev;
  return n < 0 ? 0 : (n > bound ? bound : n);
}

// Elements of a row one block of the EP source / unpack kernels covers: 8 per thread, so a
// decode token spreads over H / 1024 blocks instead of one (quant4_device.cuh).
constexpr int kEpElems = 1024;
constexpr int kEpThreads = kEpElems / 8;
__host__ __device__ inline int ep_blocks_per_row(int H) { return (H + kEpElems - 1) / kEpElems; }

// Block (t, part): part `part` of token t's row quantized into its activation row (data
// bytes, then one scale byte per block), and (part 0) token t's ids checked (the first bad one
// recorded, as the single-GPU route does). Rows past the valid count are left alone (dispatch
// never reads them).
template <Recipe R>
__global__ void __launch_bounds__(kEpThreads) ep_source_kernel(const EpSourceArgs a) {
  pdl_launch_dependents();  // dispatch may launch; it waits for this grid in pdl_wait
  const int t = blockIdx.x, part = blockIdx.y, tid = threadIdx.x;
  if (t >= valid_count(a.tokens, a.num_tokens)) return;
  const int K = a.K, H = a.H;
  if (part == 0) {
    for (int k = tid; k < K; k += kEpThreads) {
      const int id = a.ids[size_t(t) * K + k];
      if ((id < -1 || id >= a.num_experts) && atomicCAS(&a.error->code, 0, 1) == 0) {
        a.error->index = t * K + k;
        a.error->value = id;
        a.error->limit = a.num_experts;
        __threadfence_system();
      }
    }
  }
  const uint16_t* x = a.x + int64_t(t) * a.x_stride;
  uint8_t* row = a.act + size_t(t) * a.act_row_bytes;
  const int i0 = part * kEpElems + 8 * tid;
  const bool on = i0 < H;  // H is a multiple of the block (16 / 32): whole groups are on or off
  uint32_t w[4];
  load_x8(x, i0, on, x_rows16(a.x, a.x_stride), x_rows8(a.x, a.x_stride), w);
  if constexpr (kQuantizesActivations<R>) {
    float v[8];
    bf16_words_to_f32(w, v);
    uint8_t q[8];
    float d[8];
    const uint8_t sb = quantize_n<R, 8>(v, a.input_norm_const, q, d);
    if (!on) return;
    if constexpr (R == Recipe::kNvfp4) {
      // Even element in the low nibble (fmt::quantize_block_nvfp4's packing).
      uint32_t packed = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) packed |= uint32_t(q[j]) << (4 * j);
      *reinterpret_cast<uint32_t*>(row + i0 / 2) = packed;
      if (i0 % fmt::kNvfp4Block == 0) row[a.act_data_bytes + i0 / fmt::kNvfp4Block] = sb;
    } else {
      uint32_t p[2] = {0u, 0u};
#pragma unroll
      for (int j = 0; j < 8; ++j) p[j / 4] |= uint32_t(q[j]) << (8 * (j % 4));
      *reinterpret_cast<uint2*>(row + i0) = make_uint2(p[0], p[1]);
      if (i0 % fmt::kMxBlock == 0) row[a.act_data_bytes + i0 / fmt::kMxBlock] = sb;
    }
  } else {
    if (on) *reinterpret_cast<uint4*>(row + size_t(i0) * 2) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Block (b, part, src): part `part` of virtual tokens v = src * capacity + i for the kUnpackRows
// rows i = b * kUnpackRows + j: their xq rows (q * s in bf16, exact: the same bits the
// single-GPU prepare writes for the same token, so EP and EP = 1 outputs agree bit for bit) and
// (part 0) their ids and weights. 8 elements per thread and row (one 16-byte store) on qmath's
// unpack math. Every row's words are loaded together with the received count, before anything
// depends on it (rows past the count are read but not used: the window holds capacity rows per
// source), so a thread waits for one round trip instead of one per row plus one for the count.
constexpr int kUnpackRows = 4;

// One row's share of a thread: the packed words and the scale byte.
struct UnpackIn {
  uint4 v;
  uint8_t sb;
};

template <Recipe R>
__device__ __forceinline__ UnpackIn unpack_load(const uint8_t* row, int i0, int data_bytes) {
  UnpackIn in{};
  if constexpr (R == Recipe::kNvfp4) {
    in.v.x = *reinterpret_cast<const uint32_t*>(row + i0 / 2);
    in.sb = row[data_bytes + i0 / fmt::kNvfp4Block];
  } else if constexpr (R == Recipe::kMxfp4Mxfp8) {
    const uint2 u = *reinterpret_cast<const uint2*>(row + i0);
    in.v.x = u.x;
    in.v.y = u.y;
    in.sb = row[data_bytes + i0 / fmt::kMxBlock];
  } else {
    in.v = *reinterpret_cast<const uint4*>(row + size_t(i0) * 2);
  }
  return in;
}

template <Recipe R>
__device__ __forceinline__ uint4 unpack8(const UnpackIn& in) {
  if constexpr (!kQuantizesActivations<R>) return in.v;  // bf16 rows as they are
  uint32_t o[4] = {0u, 0u, 0u, 0u};
  if constexpr (R == Recipe::kNvfp4) {
    const uint32_t p = in.v.x;
    if (!qmath::nvfp4_unpack8(p, in.sb, o)) {  // a NaN scale: the reference
      const float s = fmt::e4m3_to_float(in.sb);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t byte = (p >> (8 * j)) & 0xffu;
        o[j] = uint32_t(fmt::float_to_bf16(fmt::e2m1_to_float(byte & 0xf) * s)) |
               (uint32_t(fmt::float_to_bf16(fmt::e2m1_to_float(byte >> 4) * s)) << 16);
      }
    }
  } else if constexpr (R == Recipe::kMxfp4Mxfp8) {
    const uint32_t q[2] = {in.v.x, in.v.y};
    if (!qmath::mxfp8_unpack8(q, in.sb, o)) {  // NaN codes or scales, tiny scales: the reference
      const float s = fmt::ue8m0_to_float(in.sb);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t w = q[j / 2] >> (16 * (j % 2));
        o[j] = uint32_t(fmt::float_to_bf16(fmt::e4m3_to_float(w & 0xffu) * s)) |
               (uint32_t(fmt::float_to_bf16(fmt::e4m3_to_float((w >> 8) & 0xffu) * s)) << 16);
      }
    }
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

template <Recipe R>
__global__ void __launch_bounds__(kEpThreads) ep_unpack_kernel(const EpUnpackArgs a) {
  pdl_wait();  // the received rows and counts: dispatch (and its wait) completed first
  pdl_launch_dependents();
  const int part = blockIdx.y, src = blockIdx.z, tid = threadIdx.x;
  const int first = blockIdx.x * kUnpackRows;
  const int K = a.K, H = a.H;
  const int i0 = part * kEpElems + 8 * tid;  // H is a multiple of 64
  const bool on = i0 < H;
  const size_t r0 = size_t(src) * a.capacity + first;
  UnpackIn in[kUnpackRows];
  if (on) {
#pragma unroll
    for (int j = 0; j < kUnpackRows; ++j)
      if (first + j < a.capacity)
        in[j] = unpack_load<R>(a.window + a.recv_act_off + (r0 + j) * a.act_row_bytes, i0,
                               a.act_data_bytes);
  }
  int n = *reinterpret_cast<const int32_t*>(a.window + a.recv_count_off + size_t(src) * 4);
  n = n < 0 ? 0 : (n > a.capacity ? a.capacity : n);
  // A failed wait of this call (or an earlier sticky error): the counts and rows may be stale or
  // half written, so route nothing (every id -1): nothing is computed, and with the fused
  // combine nothing is stored into a peer's memory.
  if (a.ep_error != nullptr && *reinterpret_cast<const volatile uint32_t*>(a.ep_error) != 0u) n = 0;
  const int rows = min(kUnpackRows, a.capacity - first);
  if (part == 0) {
    // The rows' (row, slot) items spread over the threads (one chain of loads each, not one per
    // row in turn).
    for (int it = tid; it < rows * K; it += kEpThreads) {
      const int j = it / K, k = it - j * K;
      const size_t r = r0 + j;
      if (first + j >= n) {
        a.ids[r * K + k] = -1;
        if (a.y_dst != nullptr) a.y_dst[r * K + k] = nullptr;
        continue;
      }
      const uint8_t* meta = a.window + a.recv_meta_off + r * a.meta_row_bytes;
      const int id = reinterpret_cast<const int32_t*>(meta + 4)[k];
      const float w = reinterpret_cast<const float*>(meta + 4 + 4 * K)[k];
      const int tok = *reinterpret_cast<const int32_t*>(meta);
      // Fused combine: fc2 writes this row's local slots at the source's combine row tok*K+k. A
      // token index outside the source's combine area gets no slot (never computed, never
      // stored; the unfused combine skips such a row, too).
      const bool tok_ok = a.y_dst == nullptr || (tok >= 0 && tok < a.capacity);
      const bool local = tok_ok && id >= a.expert_base && id < a.expert_base + a.local_experts;
      a.ids[r * K + k] = local ? id : -1;
      a.weights[r * K + k] = w;
      if (a.y_dst != nullptr)
        a.y_dst[r * K + k] =
            local ? a.peer_combine[src] + (size_t(tok) * K + k) * size_t(H) : nullptr;
    }
  }
  if (!on) return;
#pragma unroll
  for (int j = 0; j < kUnpackRows; ++j)
    if (j < rows && first + j < n)
      *reinterpret_cast<uint4*>(a.xq + (r0 + j) * H + i0) = unpack8<R>(in[j]);
}

}  // namespace

cudaError_t launch_ep_source(const EpSourceArgs& a, cudaStream_t s) {
  if (a.tokens == 0) return cudaSuccess;
  const dim3 blocks(unsigned(a.tokens), unsigned(ep_blocks_per_row(a.H)));
  switch (a.recipe) {
    case Recipe::kNvfp4:
      ep_source_kernel<Recipe::kNvfp4><<<blocks, kEpThreads, 0, s>>>(a);
      break;
    case Recipe::kMxfp4Mxfp8:
      ep_source_kernel<Recipe::kMxfp4Mxfp8><<<blocks, kEpThreads, 0, s>>>(a);
      break;
    case Recipe::kMxfp4Bf16:
      ep_source_kernel<Recipe::kMxfp4Bf16><<<blocks, kEpThreads, 0, s>>>(a);
      break;
    case Recipe::kBf16:
      ep_source_kernel<Recipe::kBf16><<<blocks, kEpThreads, 0, s>>>(a);
      break;
    case Recipe::kNvfp4Bf16:
      ep_source_kernel<Recipe::kNvfp4Bf16><<<blocks, kEpThreads, 0, s>>>(a);
      break;
  }
  return cudaGetLastError();
}

cudaError_t launch_ep_unpack(const EpUnpackArgs& a, cudaStream_t s) {
  if (a.world <= 0 || a.capacity <= 0 || a.H <= 0) return cudaSuccess;
  const dim3 grid(unsigned((a.capacity + kUnpackRows - 1) / kUnpackRows),
                  unsigned(ep_blocks_per_row(a.H)), unsigned(a.world));
  const dim3 block(kEpThreads);
  switch (a.recipe) {
    case Recipe::kNvfp4:
      return launch_pdl(ep_unpack_kernel<Recipe::kNvfp4>, grid, block, 0, s, a);
    case Recipe::kMxfp4Mxfp8:
      return launch_pdl(ep_unpack_kernel<Recipe::kMxfp4Mxfp8>, grid, block, 0, s, a);
    case Recipe::kMxfp4Bf16:
      return launch_pdl(ep_unpack_kernel<Recipe::kMxfp4Bf16>, grid, block, 0, s, a);
    case Recipe::kBf16:
      return launch_pdl(ep_unpack_kernel<Recipe::kBf16>, grid, block, 0, s, a);
    case Recipe::kNvfp4Bf16:
      return launch_pdl(ep_unpack_kernel<Recipe::kNvfp4Bf16>, grid, block, 0, s, a);
  }
  return cudaErrorInvalidValue;
}

}  // namespace moe_ep::kern
