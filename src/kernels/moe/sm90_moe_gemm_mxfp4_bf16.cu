// Grouped GEMMs (fc1, fc2; tile_n 16 mma.sync and 128 wgmma) of the mxfp4_bf16 recipe.
#include "kernels/moe/sm90_moe_gemm_impl.cuh"

namespace moe_ep::kern {

cudaError_t launch_gemms_mxfp4_bf16(const ForwardArgs& a, cudaStream_t s, cudaEvent_t* ev) {
  return launch_gemms<Recipe::kMxfp4Bf16>(a, s, ev);
}

cudaError_t set_gemm_attributes_mxfp4_bf16() { return set_gemm_attributes<Recipe::kMxfp4Bf16>(); }

}  // namespace moe_ep::kern
