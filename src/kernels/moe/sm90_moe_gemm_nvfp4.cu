// Grouped GEMMs (fc1, fc2; tile_n 16 mma.sync and 128 wgmma) of the nvfp4 recipe.
#include "kernels/moe/sm90_moe_gemm_impl.cuh"

namespace moe_ep::kern {

cudaError_t launch_gemms_nvfp4(const ForwardArgs& a, cudaStream_t s, cudaEvent_t* ev) {
  return launch_gemms<Recipe::kNvfp4>(a, s, ev);
}

cudaError_t set_gemm_attributes_nvfp4() { return set_gemm_attributes<Recipe::kNvfp4>(); }

}  // namespace moe_ep::kern
