// Finalize: out[t] = bf16(sum over the token's slots, in slot order, of weight x y row), or the
// unfinalized triple (rows, weights, indices) of an EP forward.
#include <cuda_runtime.h>

#include "kernels/common/forward_device.cuh"
#include "kernels/common/launch.h"
#include "kernels/common/pdl.cuh"
#include "moe_ep/formats.h"

namespace moe_ep::kern {
namespace {

// out[t] = bf16(sum_k c * float(y[t,k])) in slot order, multiply and add rounded separately.
// The ids, weights and y rows of up to 8 slots are loaded before the ordered sum, so the loads
// overlap instead of forming a chain of K dependent round trips.
constexpr int kFinThreads = 128;
constexpr int kFinBatch = 8;
__global__ void __launch_bounds__(kFinThreads) finalize_kernel(const ForwardArgs a) {
  pdl_wait();  // y rows are fc2's output
  pdl_launch_dependents();
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
  for (int k0 = 0; k0 < K; k0 += kFinBatch) {
    bool live[kFinBatch];
    float c[kFinBatch];
    uint4 v[kFinBatch];
#pragma unroll
    for (int j = 0; j < kFinBatch; ++j) {
      const int row = t * K + k0 + j;
      live[j] = k0 + j < K && live_id(a.ids[row], a.num_experts);
      c[j] = live[j] ? (a.weight_in_fc1 ? 1.0f : a.topk_weights[row]) : 0.0f;
      v[j] = live[j] ? *reinterpret_cast<const uint4*>(a.y_rows + size_t(row) * H + c8)
                     : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kFinBatch; ++j) {
      if (!live[j]) continue;
      const uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[2 * i] = fmt::add_rn(acc[2 * i], fmt::mul_rn(c[j], fmt::bf16_to_float(w[i] & 0xffff)));
        acc[2 * i + 1] =
            fmt::add_rn(acc[2 * i + 1], fmt::mul_rn(c[j], fmt::bf16_to_float(w[i] >> 16)));
      }
    }
  }
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = fmt::bf16x2(acc[2 * i], acc[2 * i + 1]);
  *dst = make_uint4(o[0], o[1], o[2], o[3]);
}

// EP unfinalized output: slot (t, k) of the source copies its combine row (live slot) or writes
// zeros, plus the weights / indices the single-GPU prepare writes.
__global__ void __launch_bounds__(kFinThreads)
    unfinalized_copy_kernel(const ForwardArgs a, uint16_t* rows) {
  pdl_wait();  // y rows: the combine's (EP) output
  pdl_launch_dependents();
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

dim3 finalize_grid(const ForwardArgs& a) {
  return dim3(a.tokens, (a.H / 8 + kFinThreads - 1) / kFinThreads);
}

}  // namespace

cudaError_t set_finalize_attributes() {
  cudaFuncAttributes attr;
  const cudaError_t err = cudaFuncGetAttributes(&attr, finalize_kernel);
  return err != cudaSuccess ? err : cudaFuncGetAttributes(&attr, unfinalized_copy_kernel);
}

cudaError_t launch_finalize_after_gemms(const ForwardArgs& a, cudaStream_t s) {
  // Programmatic dependent launch: finalize's CTAs are resident when fc2 ends.
  return launch_pdl(finalize_kernel, finalize_grid(a), dim3(kFinThreads), 0, s, a);
}

cudaError_t launch_finalize(const ForwardArgs& args, uint16_t* unfinalized_rows, cudaStream_t s) {
  if (args.tokens == 0) return cudaSuccess;
  ForwardArgs a = args;
  // After the EP combine (its wait orders the peers' rows): PDL, as the other EP kernels.
  if (a.out) {
    return launch_pdl(finalize_kernel, finalize_grid(a), dim3(kFinThreads), 0, s, a);
  }
  return launch_pdl(unfinalized_copy_kernel, dim3(a.tokens, a.K), dim3(kFinThreads), 0, s, a,
                    unfinalized_rows);
}

}  // namespace moe_ep::kern
