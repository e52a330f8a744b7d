// Probe of the decode GEMM's weight stream (docs/kernels.md), outside the layer: the
// same producer (one warp: per ring slot one bulk copy of the M-tile's weights, one of its
// scales, one per live B row, completing on the slot's full mbarrier) and consumers that only
// wait, optionally read the slot and spend a fixed number of integer instructions per chunk,
// then release it. It says how fast the stream structure itself goes at the 1-token and
// 128-token DSV3 fc1 shapes, with 1, 2 or 4 K-chunks per slot and 2 or 4 CTAs per SM, so the
// kernel's own time can be split into "stream" and "consumers". Not the layer.
//   stream_probe [--iters N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda_check.h"
#include "kernels/gemm/decode/sm90_decode.cuh"

namespace {

using namespace moe_ep::kern;

constexpr int kW = 4096;     // weight bytes of one 64-wide K-chunk of a 128-row M-tile
constexpr int kS = 512;      // its scale bytes (nvfp4: 128 rows x 4)
constexpr int kBRow = 144;   // one B row of a chunk in the slot (64 bf16 + 16 bytes padding)
constexpr int kBCopy = 128;  // bytes copied per live B row and chunk
constexpr int kCWarps = 4;   // consumer warps
constexpr int kThreads = 32 * (kCWarps + 1);

struct Args {
  const uint8_t* w;  // [ctas][chunks][kW]
  const uint8_t* s;  // [ctas][chunks][kS]
  const uint8_t* b;  // [8 rows][chunks][kBCopy]
  int chunks;        // per CTA (a multiple of the chunks per slot)
  int stages;
  int brows;  // live B rows copied per slot (1..8)
  int read;   // consumers read their share of the slot's weights
  int work;   // dependent-chain iterations (4 IMAD each) per chunk per consumer warp
  uint32_t* sink;
  // CTAs from `split` on stream `chunks2` chunks each, after the first split CTAs' bytes (fc1's
  // and fc2's weights of one token in one launch).
  int split;
  int chunks2;
};

template <int kCps>
__host__ __device__ constexpr int slot_bytes() {
  return kCps * (kW + kS + 8 * kBRow);
}

template <int kCps, bool kHint>
__global__ void __launch_bounds__(kThreads) stream_kernel(Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t full[32], empty[32];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < a.stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kCWarps * 32);
    }
    mbar_init_fence();
  }
  __syncthreads();
  constexpr int kSlot = slot_bytes<kCps>();
  const bool second = int(blockIdx.x) >= a.split;
  const int chunks = second ? a.chunks2 : a.chunks;
  const size_t first = second ? size_t(a.split) * a.chunks + (blockIdx.x - a.split) * size_t(chunks)
                              : size_t(blockIdx.x) * chunks;
  const int slots = chunks / kCps;
  const uint8_t* w = a.w + first * kW;
  const uint8_t* s = a.s + first * kS;
  if (warp == kCWarps) {
    uint64_t policy = 0;
    if constexpr (kHint)
      asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    const uint32_t tx = uint32_t(kCps * (kW + kS + a.brows * kBCopy));
    int slot = 0;
    uint32_t phase = 0;
    for (int c = 0; c < slots; ++c) {
      if (c >= a.stages) mbar_wait(&empty[slot], phase ^ 1);
      unsigned char* st = smem + slot * kSlot;
      if (lane == 0) {
        mbar_arrive_expect_tx(&full[slot], tx);
        if constexpr (kHint) {
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
              " [%0], [%1], %2, [%3], %4;\n" ::"r"(smem_addr(st)),
              "l"(w + size_t(c) * kCps * kW), "r"(kCps * kW), "r"(smem_addr(&full[slot])),
              "l"(policy)
              : "memory");
        } else {
          bulk_load(st, w + size_t(c) * kCps * kW, kCps * kW, &full[slot]);
        }
        bulk_load(st + kCps * kW, s + size_t(c) * kCps * kS, kCps * kS, &full[slot]);
      }
      if (lane < a.brows)
        bulk_load(st + kCps * (kW + kS) + lane * kCps * kBRow,
                  a.b + (size_t(lane) * a.chunks + size_t(c) * kCps) * kBCopy, kCps * kBCopy,
                  &full[slot]);
      if (++slot == a.stages) {
        slot = 0;
        phase ^= 1;
      }
    }
  } else {
    uint32_t acc = 0, x0 = tid, x1 = tid + 1, x2 = tid + 2, x3 = tid + 3;
    const uint32_t zero = uint32_t(a.stages) >> 8;
    int slot = 0;
    uint32_t phase = 0;
    for (int c = 0; c < slots; ++c) {
      const uint32_t st = smem_addr(smem + slot * kSlot);
      mbar_wait(&full[slot], phase);
      uint32_t dep = 0;
      if (a.read) {
#pragma unroll
        for (int k = 0; k < kCps; ++k) {
          const uint4 v = lds128(st + k * kW + warp * 1024 + lane * 16);
          const uint4 u = lds128(st + k * kW + warp * 1024 + 512 + lane * 16);
          dep ^= v.x ^ v.w ^ u.y ^ u.z;
        }
      }
      mbar_arrive_after(smem_addr(&empty[slot]), dep & zero);
      acc ^= dep;
      for (int i = 0; i < a.work * kCps; ++i) {
        x0 = x0 * 0x9E3779B9u + acc;
        x1 = x1 * 0x85EBCA6Bu + x0;
        x2 = x2 * 0xC2B2AE35u + x1;
        x3 = x3 * 0x27D4EB2Fu + x2;
      }
      if (++slot == a.stages) {
        slot = 0;
        phase ^= 1;
      }
    }
    if ((acc ^ x3) == 0x12345678u) a.sink[blockIdx.x] = acc;  // keeps the loads and the work
  }
}

// The same weight and scale bytes read straight into registers, no shared-memory ring: each warp
// of a CTA reads its share of every chunk (kWarps = 4: 1 KB of weights, two 16-byte loads per
// lane, and 128 scale bytes; kWarps = 8: half that) with ld.global.nc, keeping kDepth chunks in
// flight in registers, then spends `work` dependent iterations per chunk on them. Says whether a
// decode kernel without the ring could stream faster than the ring's producer.
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ldg_stream32(const void* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

template <int kDepth, int kWarps>
__global__ void __launch_bounds__(32 * kWarps) direct_kernel(Args a) {
  constexpr int kWPer = kW / kWarps / 32 / 16;  // 16-byte weight loads per lane and chunk
  const int tid = threadIdx.x;
  const uint8_t* w = a.w + size_t(blockIdx.x) * a.chunks * kW + tid * 16;
  const uint8_t* s = a.s + size_t(blockIdx.x) * a.chunks * kS + (tid % (kS / 4)) * 4;
  uint4 rw[kDepth][kWPer];
  uint32_t rs[kDepth];
  auto load = [&](int j, int c) {
#pragma unroll
    for (int i = 0; i < kWPer; ++i)
      rw[j][i] = ldg_stream(w + size_t(c) * kW + i * (32 * kWarps * 16));
    rs[j] = ldg_stream32(s + size_t(c) * kS);
  };
#pragma unroll
  for (int j = 0; j < kDepth; ++j) load(j, j < a.chunks ? j : 0);
  uint32_t acc = 0, x0 = tid, x1 = tid + 1, x2 = tid + 2, x3 = tid + 3;
  for (int c0 = 0; c0 < a.chunks; c0 += kDepth) {
#pragma unroll
    for (int j = 0; j < kDepth; ++j) {
      uint32_t dep = rs[j];
#pragma unroll
      for (int i = 0; i < kWPer; ++i) dep ^= rw[j][i].x ^ rw[j][i].y ^ rw[j][i].z ^ rw[j][i].w;
      acc ^= dep;
      for (int i = 0; i < a.work; ++i) {
        x0 = x0 * 0x9E3779B9u + acc;
        x1 = x1 * 0x85EBCA6Bu + x0;
        x2 = x2 * 0xC2B2AE35u + x1;
        x3 = x3 * 0x27D4EB2Fu + x2;
      }
      const int next = c0 + j + kDepth;
      if (next < a.chunks) load(j, next);
    }
  }
  if ((acc ^ x3) == 0x12345678u) a.sink[blockIdx.x] = acc;
}

// The read ceiling: every byte of the buffer once, grid-stride, 4 loads of 16 bytes in flight
// per thread.
__global__ void __launch_bounds__(256) read_all_kernel(const uint4* p, size_t n16, uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = ldg_stream(p + i + k * stride);
#pragma unroll
    for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = ldg_stream(p + i);
    acc ^= v.x ^ v.w;
  }
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

// Median of `iters` timed launches (events around each, two warm-up launches first), µs.
template <class F>
float time_launches(int iters, F&& launch) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> t;
  for (int i = 0; i < iters + 2; ++i) {
    CK(cudaEventRecord(e0));
    launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 2) t.push_back(ms * 1000.0f);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return t[t.size() / 2];
}

struct DirectCase {
  const char* name;
  int ctas, chunks, depth, warps, work;
};

template <int kDepth, int kWarps>
float run_direct(const DirectCase& c, const Args& base, int iters) {
  Args a = base;
  a.chunks = c.chunks;
  a.work = c.work;
  return time_launches(iters, [&] { direct_kernel<kDepth, kWarps><<<c.ctas, 32 * kWarps>>>(a); });
}

// A case names a (depth, warps) that has no instance: stop rather than time another one.
[[noreturn]] void no_instance(const char* name) {
  std::fprintf(stderr, "stream_probe: case '%s' has no kernel instance\n", name);
  std::exit(2);
}

float dispatch_direct(const DirectCase& c, const Args& a, int iters) {
  if (c.warps == 8 && c.depth == 8) return run_direct<8, 8>(c, a, iters);
  if (c.warps == 8 && c.depth == 16) return run_direct<16, 8>(c, a, iters);
  if (c.warps == 4 && c.depth == 4) return run_direct<4, 4>(c, a, iters);
  if (c.warps == 4 && c.depth == 8) return run_direct<8, 4>(c, a, iters);
  no_instance(c.name);
}

struct Case {
  const char* name;
  int ctas, chunks, cps, per_sm, brows, read, work;
  bool hint;
  // A second part (ctas2 CTAs of chunks2 chunks on the next bytes): in the same launch, or
  // (two_launches) as a second launch with its ring sized for per_sm2 CTAs per SM, timed together.
  int ctas2 = 0, chunks2 = 0, per_sm2 = 0;
  bool two_launches = false;
};

template <int kCps, bool kHint>
float run_case(const Case& c, const Args& base, int iters, int* stages_out) {
  auto kernel = stream_kernel<kCps, kHint>;
  const int slot = slot_bytes<kCps>();
  auto stages_for = [&](int per_sm) { return std::min(24, (228 * 1024 / per_sm - 2048) / slot); };
  const int stages = stages_for(c.per_sm);
  *stages_out = stages;
  const int stages2 = c.two_launches ? stages_for(c.per_sm2) : stages;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          std::max(stages, stages2) * slot));
  Args a = base;
  a.chunks = c.chunks;
  a.stages = stages;
  a.brows = c.brows;
  a.read = c.read;
  a.work = c.work;
  a.split = c.ctas;  // CTAs past the first part (none without ctas2) stream the second
  a.chunks2 = c.chunks2;
  if (!c.two_launches)
    return time_launches(iters, [&] { kernel<<<c.ctas + c.ctas2, kThreads, stages * slot>>>(a); });
  // The second launch: its CTAs all in the second part, on the bytes after the first part's.
  Args b = a;
  b.split = 0;
  b.w = a.w + size_t(c.ctas) * c.chunks * kW;
  b.s = a.s + size_t(c.ctas) * c.chunks * kS;
  b.stages = stages2;
  return time_launches(iters, [&] {
    kernel<<<c.ctas, kThreads, stages * slot>>>(a);
    kernel<<<c.ctas2, kThreads, b.stages * slot>>>(b);
  });
}

template <bool kHint>
float dispatch(const Case& c, const Args& a, int iters, int* stages) {
  switch (c.cps) {
    case 1:
      return run_case<1, kHint>(c, a, iters, stages);
    case 2:
      return run_case<2, kHint>(c, a, iters, stages);
    case 4:
      return run_case<4, kHint>(c, a, iters, stages);
  }
  no_instance(c.name);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  for (int i = 1; i + 1 < argc; i += 2)
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
  // DSV3 fc1 (K = 7168: 112 chunks per M-tile): 1 token = 8 experts x 32 M-tiles = 256 CTAs; 128
  // tokens = all 256 experts = 8192 CTAs. fc2 at 1 token: 8 experts x 56 M-tiles, 32 chunks.
  const Case cases[] = {
      {"t1 fc1 1x18 rows1", 256, 112, 1, 2, 1, 0, 0, false},
      {"t1 fc1 1x18 rows1 read", 256, 112, 1, 2, 1, 1, 0, false},
      {"t1 fc1 1x18 rows1 read work40", 256, 112, 1, 2, 1, 1, 40, false},
      {"t1 fc1 1x18 rows1 read work40 hint", 256, 112, 1, 2, 1, 1, 40, true},
      {"t1 fc1 1x8 (4/SM ring) rows1 read", 256, 112, 1, 4, 1, 1, 0, false},
      {"t1 fc1 2/slot rows1 read", 256, 112, 2, 2, 1, 1, 0, false},
      {"t1 fc1 2/slot rows1 read work40", 256, 112, 2, 2, 1, 1, 40, false},
      {"t1 fc1 4/slot rows1 read", 256, 112, 4, 2, 1, 1, 0, false},
      {"t1 fc1 4/slot rows1 read work40", 256, 112, 4, 2, 1, 1, 40, false},
      {"t1 fc1 1x18 rows8 read", 256, 112, 1, 2, 8, 1, 0, false},
      {"t1 fc2 1x18 rows1 read", 448, 32, 1, 2, 1, 1, 0, false},
      {"t1 fc2 2/slot rows1 read", 448, 32, 2, 2, 1, 1, 0, false},
      {"t128 fc1 1x8 rows8 read", 8192, 112, 1, 4, 8, 1, 0, false},
      {"t128 fc1 1x8 rows8 read work40", 8192, 112, 1, 4, 8, 1, 40, false},
      {"t128 fc1 1x8 rows8 read work40 hint", 8192, 112, 1, 4, 8, 1, 40, true},
      {"t128 fc1 2/slot rows8 read", 8192, 112, 2, 4, 8, 1, 0, false},
      {"t128 fc1 2/slot rows8 read work40", 8192, 112, 2, 4, 8, 1, 40, false},
      {"t128 fc1 1x18 (2/SM) rows8 read work40", 8192, 112, 1, 2, 8, 1, 40, false},
      // fc1 and fc2 of one token (256 x 112 and 448 x 32 chunks, 198 MB): one launch against
      // two launches back to back (the layer's kernel boundary, without PDL).
      {"t1 fc1+fc2 one launch 4/slot 2/SM", 256, 112, 4, 2, 1, 1, 0, false, 448, 32, 0, false},
      {"t1 fc1+fc2 one launch 4/slot 3/SM", 256, 112, 4, 3, 1, 1, 0, false, 448, 32, 0, false},
      {"t1 fc1+fc2 one launch 4/slot 4/SM", 256, 112, 4, 4, 1, 1, 0, false, 448, 32, 0, false},
      {"t1 fc1, fc2 two launches 4/slot", 256, 112, 4, 2, 1, 1, 0, false, 448, 32, 4, true},
      {"t1 fc1+fc2 one launch 2/SM work40", 256, 112, 4, 2, 1, 1, 40, false, 448, 32, 0, false},
      {"t1 fc1, fc2 two launches work40", 256, 112, 4, 2, 1, 1, 40, false, 448, 32, 4, true},
  };
  size_t max_w = 0;
  for (const Case& c : cases)  // both parts of a case read consecutive bytes
    max_w = std::max(max_w, (size_t(c.ctas) * c.chunks + size_t(c.ctas2) * c.chunks2) * kW);
  uint8_t *w, *s, *b;
  uint32_t* sink;
  CK(cudaMalloc(&w, max_w));
  CK(cudaMalloc(&s, max_w / (kW / kS)));
  CK(cudaMalloc(&b, 8 * 112 * kBCopy));
  CK(cudaMalloc(&sink, 8192 * 4));
  CK(cudaMemset(w, 1, max_w));
  CK(cudaMemset(s, 2, max_w / (kW / kS)));
  CK(cudaMemset(b, 3, 8 * 112 * kBCopy));
  Args a{};
  a.w = w;
  a.s = s;
  a.b = b;
  a.sink = sink;
  std::printf("%-42s %6s %6s %10s %10s\n", "case", "stages", "slotKB", "median_us", "TB/s");
  for (const Case& c : cases) {
    int stages = 0;
    const float us =
        c.hint ? dispatch<true>(c, a, iters, &stages) : dispatch<false>(c, a, iters, &stages);
    const double bytes =
        (double(c.ctas) * c.chunks + double(c.ctas2) * c.chunks2) * (kW + kS + c.brows * kBCopy);
    const double slot_kb = c.cps * (kW + kS + 8 * kBRow) / 1024.0;
    std::printf("%-42s %6d %6.2f %10.1f %10.2f\n", c.name, stages, slot_kb, us,
                bytes / (us * 1e-6) / 1e12);
  }
  // Weights and scales straight to registers (no B rows), the 1-token fc1 / fc2 and 128-token
  // fc1 shapes.
  const DirectCase dcases[] = {
      {"direct t1 fc1 4w depth4", 256, 112, 4, 4, 0},
      {"direct t1 fc1 4w depth8", 256, 112, 8, 4, 0},
      {"direct t1 fc1 8w depth8", 256, 112, 8, 8, 0},
      {"direct t1 fc1 8w depth16", 256, 112, 16, 8, 0},
      {"direct t1 fc1 4w depth8 work40", 256, 112, 8, 4, 40},
      {"direct t1 fc1 8w depth8 work20", 256, 112, 8, 8, 20},
      {"direct t1 fc1 8w depth16 work20", 256, 112, 16, 8, 20},
      {"direct t1 fc2 4w depth8", 448, 32, 8, 4, 0},
      {"direct t1 fc2 8w depth8", 448, 32, 8, 8, 0},
      {"direct t1 fc2 8w depth16 work20", 448, 32, 16, 8, 20},
      {"direct t128 fc1 4w depth8", 8192, 112, 8, 4, 0},
      {"direct t128 fc1 8w depth8 work20", 8192, 112, 8, 8, 20},
  };
  for (const DirectCase& c : dcases) {
    const float us = dispatch_direct(c, a, iters);
    const double bytes = double(c.ctas) * c.chunks * (kW + kS);
    std::printf("%-42s %6s %6s %10.1f %10.2f\n", c.name, "-", "-", us, bytes / (us * 1e-6) / 1e12);
  }
  // The plain read ceiling over the 1-token fc1 weight bytes (117 MB) and the whole buffer.
  for (size_t bytes : {size_t(256) * 112 * kW, max_w}) {
    for (int blocks : {132 * 4, 132 * 8}) {
      const size_t n16 = bytes / 16;
      const float us = time_launches(iters, [&] {
        read_all_kernel<<<blocks, 256>>>(reinterpret_cast<const uint4*>(w), n16, sink);
      });
      std::printf("read_all %4.0f MB %4d blocks %22s %10.1f %10.2f\n", bytes / 1e6, blocks, "", us,
                  bytes / (us * 1e-6) / 1e12);
    }
  }
  return 0;
}
