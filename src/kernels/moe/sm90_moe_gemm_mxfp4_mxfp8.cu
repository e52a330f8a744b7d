// Grouped GEMMs (fc1, fc2; tile_n 16 mma.sync and 128 wgmma) of the mxfp4_mxfp8 recipe.
#include "kernels/moe/sm90_moe_gemm_impl.cuh"

namespace moe_ep::kern {

cudaError_t launch_gemms_mxfp4_mxfp8(const ForwardArgs& a, cudaStream_t s, cudaEvent_t* ev) {
  return launch_gemms<Recipe::kMxfp4Mxfp8>(a, s, ev);
}

cudaError_t set_gemm_attributes_mxfp4_mxfp8() { return set_gemm_attributes<Recipe::kMxfp4Mxfp8>(); }

}  // namespace moe_ep::kern
