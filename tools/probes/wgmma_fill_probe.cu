// Probe of the m64 kernel's K loop for bf16 weights (docs/kernels.md §4.3), outside the layer:
// one CTA per SM of four warpgroups, each the m64nNk16 wgmma consumer of 64 weight rows against
// one B stage of N token rows (128-byte swizzle), a four-stage ring of 64-wide K-chunks (N x 128
// bytes of B, 32 KB of weights), loaded two chunks ahead. Each mode adds one piece of the
// kernel's loop, or fills the stages another way, so that the loop's ceiling and the cost of
// each piece read off as MMA rates (the data: zeros, or with --random bf16 values in [-1, 1),
// which draw more power; zero-filled copies write zeros either way; the rates are above what the
// layer reaches under the power cap: compare modes, not against the layer):
//   mma      wgmmas only (A in registers, up to 2 in flight per warpgroup, as the kernel)
//   mma_ss   the same with A from shared memory (wgmma's SS form)
//   lds      + each k16 step's A fragment from the stage (ld.shared, the resident layout)
//   sync     + a CTA barrier per chunk
//   cp_zero  + the fill by per-thread cp.async (16 bytes each, B and weights) with zero fill
//            (no global reads), the wait and the proxy fence: the kernel's loop
//   cp       the same reading global memory (an L2-resident buffer): the kernel's loop
//   bulk_w   the weights as one bulk copy per chunk, B by per-thread cp.async
//   bulk_b   B as one bulk copy per chunk (rows contiguous), the weights by cp.async
//   bulk     both as bulk copies (the stage's full mbarrier instead of cp.async groups)
//   rows     the weights as one bulk copy, B as one bulk copy per 128-byte row
//   wgmma_fill_probe [--chunks N] [--random]
// Build as tools/README.md says for the probes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda_check.h"
#include "kernels/gemm/wgmma/sm90_wgmma.cuh"

namespace {

using namespace moe_ep::kern;

enum Mode { kMma, kMmaSs, kLds, kSync, kCpZero, kCp, kBulkW, kBulkB, kBulk, kRows };
constexpr const char* kModeNames[] = {"mma", "mma_ss", "lds",    "sync", "cp_zero",
                                      "cp",  "bulk_w", "bulk_b", "bulk", "rows"};

constexpr int kStages = 4, kAhead = 2;
constexpr int kWBytes = 4 * 64 * 64 * 2;  // 256 weight rows x 64 K, bf16
constexpr int stage_bytes(int n) { return n * 128 + kWBytes; }
constexpr int kSrcBytes = 1 << 20;  // the global source buffer (L2-resident)

template <int N>
using SsOp = decltype(gmma::ss_op_selector<cute::bfloat16_t, cute::bfloat16_t, float,
                                           cute::Shape<cute::_64, cute::Int<N>, cute::_16>>());
template <class Op, size_t... I>
__device__ __forceinline__ void wgmma_ss(float* d, uint64_t da, uint64_t db,
                                         std::index_sequence<I...>) {
  Op::fma(da, db, d[I]...);
}

template <int kN, Mode kMode>
__global__ void __launch_bounds__(512, 1)
    fill_probe_kernel(int chunks, const uint8_t* src, float* sink) {
  constexpr bool kCpB = kMode == kCpZero || kMode == kCp || kMode == kBulkW;
  constexpr bool kCpW = kMode == kCpZero || kMode == kCp || kMode == kBulkB;
  constexpr bool kBulkCopies =
      kMode == kBulkW || kMode == kBulkB || kMode == kBulk || kMode == kRows;
  constexpr bool kReadsA = kMode != kMma && kMode != kMmaSs;
  constexpr int kSB = stage_bytes(kN);
  const uint32_t src_size = kMode == kCpZero ? 0u : 16u;
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t full[kStages];
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const uint32_t base = smem_addr(smem);
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  for (int i = tid * 16; i < kStages * kSB; i += 512 * 16)
    *reinterpret_cast<uint4*>(smem + i) = *reinterpret_cast<const uint4*>(src + i % kSrcBytes);
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) mbar_init(&full[i], 1);
    mbar_init_fence();
  }
  __syncthreads();

  // Chunk c's sources: anywhere in the buffer (only the bytes moved matter).
  auto wsrc = [&](int c, int off) { return src + ((size_t(c) * kWBytes + off) % kSrcBytes); };
  auto bsrc = [&](int c, int off) {
    return src + ((size_t(c) * kN * 128 + off + kSrcBytes / 2) % kSrcBytes);
  };
  auto issue_bulk = [&](int c) {
    const int slot = c % kStages;
    unsigned char* st = smem + slot * kSB;
    const uint32_t bytes = (kCpW ? 0u : uint32_t(kWBytes)) + (kCpB ? 0u : uint32_t(kN * 128));
    if (kMode == kRows ? tid < 32 : tid == 0) {
      if (lane == 0) mbar_arrive_expect_tx(&full[slot], bytes);
      if (kMode == kRows) {
        __syncwarp();
        for (int r = lane; r < kN; r += 32)
          bulk_load(st + r * 128, bsrc(c, r * 128), 128, &full[slot]);
      } else if (!kCpB) {
        bulk_load(st, bsrc(c, 0), kN * 128, &full[slot]);
      }
      if (!kCpW && lane == 0) bulk_load(st + kN * 128, wsrc(c, 0), kWBytes, &full[slot]);
    }
  };
  auto issue_cp = [&](int c) {
    const uint32_t st = base + uint32_t((c % kStages) * kSB);
    if constexpr (kCpB)
      for (int p = tid; p < kN * 8; p += 512) cp_async16_sz(st + p * 16, bsrc(c, p * 16), src_size);
    if constexpr (kCpW)
#pragma unroll
      for (int i = 0; i < kWBytes / (16 * 512); ++i)
        cp_async16_sz(st + kN * 128 + (i * 512 + tid) * 16, wsrc(c, (i * 512 + tid) * 16),
                      src_size);
    cp_async_commit();
  };
  for (int c = 0; c < kAhead && c < chunks; ++c) {
    if constexpr (kBulkCopies) issue_bulk(c);
    if constexpr (kCpB || kCpW) issue_cp(c);
  }

  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0f;
  uint32_t af[2][4];
#pragma unroll
  for (int s = 0; s < 2; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      af[s][i] = reinterpret_cast<const uint32_t*>(src)[tid * 8 + s * 4 + i];
  const uint32_t desc0_lo = uint32_t(sw128_desc(base));
  for (int c = 0; c < chunks; ++c) {
    const int slot = c % kStages;
    const uint32_t soff = uint32_t(slot * kSB);
    if constexpr (kCpB || kCpW) {
      cp_async_wait<kAhead - 1>();
      fence_proxy_async_smem();
    }
    if constexpr (kBulkCopies) mbar_wait(&full[slot], uint32_t(c / kStages) & 1u);
    if constexpr (kMode >= kSync) __syncthreads();
    if (c + kAhead < chunks) {
      if constexpr (kBulkCopies) issue_bulk(c + kAhead);
      if constexpr (kCpB || kCpW) issue_cp(c + kAhead);
    } else if constexpr (kCpB || kCpW) {
      cp_async_commit();  // an empty group keeps the wait's count
    }
    const uint64_t desc = sw128_desc_at(desc0_lo, soff);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t* f = af[s & 1];
      if constexpr (kReadsA) {
        const uint4 v =
            *reinterpret_cast<const uint4*>(smem + soff + kN * 128 + wg * 8192 + warp * 2048 +
                                            lane * 64 + (bf16_resident_step(lane, s) << 4));
        f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
      }
      wgmma_fence();
      if constexpr (kMode == kMmaSs) {
        const uint64_t da = sw128_desc_at(desc0_lo, soff + kN * 128 + wg * 8192);
        wgmma_ss<SsOp<kN>>(acc, da + uint64_t(2 * s), desc + uint64_t(2 * s),
                           std::make_index_sequence<kN / 2>{});
      } else {
        wgmma_m64<kN>(acc, af[s & 1], desc + uint64_t(2 * s));
      }
      wgmma_commit();
      wgmma_wait<1>();
      keep_alive4(af[(s + 1) & 1]);
    }
  }
  wgmma_wait<0>();
  cp_async_wait<0>();
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) sum += acc[i];
  sink[tid] = sum;  // keeps the MMAs
}

template <int kN, Mode kMode>
void run(int sms, int chunks, const uint8_t* src, float* sink) {
  auto k = fill_probe_kernel<kN, kMode>;
  const int smem = kStages * stage_bytes(kN) + 1024;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int r = 0; r < 5; ++r) {
    CK(cudaEventRecord(e0));
    k<<<sms, 512, smem>>>(chunks, src, sink);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  CK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  const double flop = 2.0 * sms * chunks * 256.0 * kN * 64;
  std::printf("%-8s N=%3d  median %.3f ms  %5.0f TFLOP/s\n", kModeNames[kMode], kN, ms[2],
              flop / (ms[2] * 1e-3) / 1e12);
}

template <int kN>
void run_all(int sms, int chunks, const uint8_t* src, float* sink) {
  run<kN, kMma>(sms, chunks, src, sink);
  run<kN, kMmaSs>(sms, chunks, src, sink);
  run<kN, kLds>(sms, chunks, src, sink);
  run<kN, kSync>(sms, chunks, src, sink);
  run<kN, kCpZero>(sms, chunks, src, sink);
  run<kN, kCp>(sms, chunks, src, sink);
  run<kN, kBulkW>(sms, chunks, src, sink);
  run<kN, kBulkB>(sms, chunks, src, sink);
  run<kN, kBulk>(sms, chunks, src, sink);
  run<kN, kRows>(sms, chunks, src, sink);
}

}  // namespace

int main(int argc, char** argv) {
  int chunks = 3000;
  bool random = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--chunks") == 0 && i + 1 < argc) {
      chunks = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--random") == 0) {
      random = true;
    } else {
      std::fprintf(stderr, "usage: wgmma_fill_probe [--chunks N] [--random]\n");
      return 2;
    }
  }
  if (chunks < 1) {
    std::fprintf(stderr, "--chunks: %d, at least 1\n", chunks);
    return 2;
  }
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint8_t* src = nullptr;
  float* sink = nullptr;
  CK(cudaMalloc(&src, kSrcBytes));
  std::vector<uint16_t> host(kSrcBytes / 2, 0);
  if (random) {
    uint32_t x = 12345;
    for (uint16_t& v : host) {  // bf16 in [-1, 1): sign, exponent 119..126, random mantissa
      x = x * 1664525u + 1013904223u;
      v = uint16_t(((x >> 31) << 15) | ((119 + ((x >> 24) & 7)) << 7) | ((x >> 8) & 0x7f));
    }
  }
  CK(cudaMemcpy(src, host.data(), kSrcBytes, cudaMemcpyHostToDevice));
  std::printf("data: %s\n", random ? "random bf16" : "zeros");
  CK(cudaMalloc(&sink, 512 * sizeof(float)));
  run_all<160>(sms, chunks, src, sink);
  run_all<96>(sms, chunks, src, sink);
  CK(cudaFree(src));
  CK(cudaFree(sink));
  return 0;
}
