// Grouped GEMMs (fc1, fc2; tile_n 16 mma.sync and 128 wgmma, or the fp8 path) of the
// mxfp4_mxfp8 recipe.
#include "kernels/moe/sm90_moe_fp8.cuh"
#include "kernels/moe/sm90_moe_gemm_impl.cuh"

namespace moe_ep::kern {

cudaError_t launch_gemms_mxfp4_mxfp8(const ForwardArgs& a, cudaStream_t s, cudaEvent_t* ev) {
  if (a.fp8) return launch_fp8_gemms(a, s, ev);  // docs/gpu_kernels.md §8
  return launch_gemms<Recipe::kMxfp4Mxfp8>(a, s, ev);
}

cudaError_t set_gemm_attributes_mxfp4_mxfp8() {
  return first_error({set_gemm_attributes<Recipe::kMxfp4Mxfp8>(), set_fp8_attributes()});
}

}  // namespace moe_ep::kern
