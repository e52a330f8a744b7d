// The fp8 path's fold of x and h into e4m3 rows against one power of two per row, and the
// tensor map through which its fc2 reads h.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "kernels/common/launch.h"
#include "kernels/common/quantize_math.h"
#include "kernels/gemm/fp8/fp8_fragments.h"
#include "moe_ep/formats.h"

namespace moe_ep::kern {

// x (after prepare) or h (after fc1) folded (fp8_row_reference, fp8_fold): one block of 128
// threads per row of `cols` bf16 values (a multiple of 8), 16-byte loads, the row's amax, then
// 8 e4m3 bytes per 16 loaded (the conversion instruction, as fmt::float_to_e4m3: qmath).
__global__ void __launch_bounds__(128)
    fp8_fold_rows_kernel(const uint16_t* src, int cols, uint8_t* dst, uint8_t* ref) {
  const size_t row = blockIdx.x;
  const uint4* s = reinterpret_cast<const uint4*>(src + row * cols);
  const int nv = cols / 8;
  auto lo = [](uint32_t w) { return __uint_as_float(w << 16); };
  auto hi = [](uint32_t w) { return __uint_as_float(w & 0xffff0000u); };
  float amax = 0.0f;
  for (int i = threadIdx.x; i < nv; i += 128) {
    const uint4 v = s[i];
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) amax = fmaxf(amax, fmaxf(fabsf(lo(w[j])), fabsf(hi(w[j]))));
  }
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  __shared__ float red[4];
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
  const uint8_t r = fp8_row_reference(amax);
  if (threadIdx.x == 0) ref[row] = r;
  const float inv = fmt::exp2i(127 - int(r));
  uint2* d = reinterpret_cast<uint2*>(dst + row * cols);
  for (int i = threadIdx.x; i < nv; i += 128) {
    const uint4 v = s[i];
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t p[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      p[j] = kernels::qmath::e4m3_pair(fmt::mul_rn(lo(w[j]), inv), fmt::mul_rn(hi(w[j]), inv));
    d[i] = make_uint2(p[0] | (p[1] << 16), p[2] | (p[3] << 16));
  }
}

cudaError_t launch_fp8_fold(const uint16_t* src, int rows, int cols, uint8_t* dst, uint8_t* ref,
                            cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  fp8_fold_rows_kernel<<<rows, 128, 0, s>>>(src, cols, dst, ref);
  return cudaGetLastError();
}

cudaError_t encode_fp8_h_tensor_map(void* dst, const uint8_t* h8, size_t rows, int I) {
  // The driver's encoder through the runtime (no link against libcuda).
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return cudaErrorNotSupported;
  if (rows == 0 || I % 128 != 0 || (reinterpret_cast<uintptr_t>(h8) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(dst) & 63) != 0)
    return cudaErrorInvalidValue;
  alignas(64) CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(I), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(I)};
  const cuuint32_t box[2] = {128, 8};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(h8), dims, strides, box,
             elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  return cudaMemcpy(dst, &map, sizeof(map), cudaMemcpyHostToDevice);
}

}  // namespace moe_ep::kern
