// The grouped GEMMs (fc1, fc2) of the mxfp4_mxfp8 recipe: every kernel a plan can pick for it,
// the fp8 path's among them (RecipeConfig::fp8_mma).
#include "kernels/gemm/fp8/sm90_fp8.cuh"
#include "kernels/gemm/gemm_launch.cuh"

namespace moe_ep::kern {

cudaError_t launch_gemms_mxfp4_mxfp8(const ForwardArgs& a, const ForwardPlan& p, cudaStream_t s,
                                     cudaEvent_t* ev) {
  if (p.fc1.kernel == GemmKernel::kFp8) return launch_fp8_gemms(a, p, s, ev);
  return launch_gemms<Recipe::kMxfp4Mxfp8>(a, p, s, ev);
}

cudaError_t set_gemm_attributes_mxfp4_mxfp8() {
  return first_error({set_gemm_attributes<Recipe::kMxfp4Mxfp8>(), set_fp8_attributes()});
}

}  // namespace moe_ep::kern
