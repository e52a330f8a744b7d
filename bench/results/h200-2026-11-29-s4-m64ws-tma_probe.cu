// Device probe (docs/gpu_kernels.md §10, s4): where does a one-row TMA box with the 128-byte
// swizzle land in shared memory? Row n of a 16 x 64 bf16 matrix is loaded alone (box 64 x 1)
// to offset n * 128 of a 1024-aligned buffer. If the swizzle follows the shared-memory address,
// its 16-byte chunk j sits at chunk j ^ (n & 7); if it follows the row within the box (always
// 0), at chunk j. A box of 64 x 8 rows is loaded as the reference pattern.
// Build: nvcc -std=c++17 -arch=sm_90a -o tma_probe h200-2026-11-29-s4-m64ws-tma_probe.cu
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

__global__ void probe(const __grid_constant__ CUtensorMap map, uint16_t* out, int box_rows,
                      int rot) {
  __shared__ __align__(1024) uint16_t sm[16 * 64];
  __shared__ __align__(8) uint64_t bar;
  const uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
  for (int i = threadIdx.x; i < 16 * 64; i += blockDim.x) sm[i] = 0xffff;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(b));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b), "r"(16 * 128)
                 : "memory");
    for (int n = 0; n < 16; n += box_rows) {
      // Destination slot of row n: (n + rot) mod 16 (rot = 0: its own row).
      const int slot = (n + rot) & 15;
      const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(sm + slot * 64));
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
          "{%2, %3}], [%4];\n" ::"r"(dst),
          "l"(&map), "r"(0), "r"(n), "r"(b)
          : "memory");
    }
  }
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(b)
        : "memory");
  }
  for (int i = threadIdx.x; i < 16 * 64; i += blockDim.x) out[i] = sm[i];
}

int main() {
  uint16_t h[16 * 64];
  for (int i = 0; i < 16 * 64; ++i) h[i] = uint16_t(i);  // row n, element k: n * 64 + k
  uint16_t *g, *o;
  cudaMalloc(&g, sizeof h);
  cudaMalloc(&o, sizeof h);
  cudaMemcpy(g, h, sizeof h, cudaMemcpyHostToDevice);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &q) !=
          cudaSuccess ||
      fn == nullptr) {
    std::printf("no cuTensorMapEncodeTiled\n");
    return 1;
  }
  auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  int fails = 0;
  for (int box_rows : {8, 1}) {
    for (int rot : {0, 3}) {
      if (box_rows == 8 && rot != 0) continue;
      CUtensorMap map;
      const cuuint64_t dims[2] = {64, 16};
      const cuuint64_t strides[1] = {128};
      const cuuint32_t box[2] = {64, cuuint32_t(box_rows)};
      const cuuint32_t estr[2] = {1, 1};
      const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, g, dims, strides, box,
                                estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      if (r != CUDA_SUCCESS) {
        std::printf("encode box %d: CUresult %d\n", box_rows, int(r));
        return 1;
      }
      probe<<<1, 128>>>(map, o, box_rows, rot);
      const cudaError_t e = cudaDeviceSynchronize();
      if (e != cudaSuccess) {
        std::printf("box %d rot %d: %s\n", box_rows, rot, cudaGetErrorString(e));
        return 1;
      }
      uint16_t s[16 * 64];
      cudaMemcpy(s, o, sizeof s, cudaMemcpyDeviceToHost);
      // For each smem slot and 16-byte chunk position c: which (row, chunk) landed there.
      int addr_ok = 0, box_ok = 0;
      for (int slot = 0; slot < 16; ++slot) {
        const int n = (slot - rot + 16) & 15;
        for (int j = 0; j < 8; ++j) {
          const bool a = s[slot * 64 + ((j ^ (slot & 7)) * 8)] == uint16_t(n * 64 + j * 8);
          const bool bx =
              s[slot * 64 + ((j ^ ((n % box_rows) & 7)) * 8)] == uint16_t(n * 64 + j * 8);
          addr_ok += a;
          box_ok += bx;
        }
      }
      std::printf(
          "box 64x%d rot %d: chunk j of row n at j ^ (smem row & 7): %d/128; at j ^ (row in box & "
          "7): %d/128\n",
          box_rows, rot, addr_ok, box_ok);
      std::printf("  slot 3 holds:");
      for (int c = 0; c < 8; ++c) std::printf(" %d", int(s[3 * 64 + c * 8]));
      std::printf("\n");
      fails += addr_ok != 128;
    }
  }
  std::printf(fails ? "swizzle does NOT follow the smem address in every case\n"
                    : "swizzle follows the smem address bits\n");
  return 0;
}
