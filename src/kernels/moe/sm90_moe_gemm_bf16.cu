// Grouped GEMMs (fc1, fc2; tile_n 16 mma.sync and 128 wgmma) of the bf16 recipe.
#include "kernels/moe/sm90_moe_gemm_impl.cuh"

namespace moe_ep::kern {

cudaError_t launch_gemms_bf16(const ForwardArgs& a, cudaStream_t s, cudaEvent_t* ev) {
  return launch_gemms<Recipe::kBf16>(a, s, ev);
}

cudaError_t set_gemm_attributes_bf16() { return set_gemm_attributes<Recipe::kBf16>(); }

}  // namespace moe_ep::kern
