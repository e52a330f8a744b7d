// The grouped GEMMs (fc1, fc2) of the mxfp4_bf16 recipe: every kernel a plan can pick for it.
#include "kernels/gemm/gemm_launch.cuh"

namespace moe_ep::kern {

cudaError_t launch_gemms_mxfp4_bf16(const ForwardArgs& a, const ForwardPlan& p, cudaStream_t s,
                                    cudaEvent_t* ev) {
  return launch_gemms<Recipe::kMxfp4Bf16>(a, p, s, ev);
}

cudaError_t set_gemm_attributes_mxfp4_bf16() { return set_gemm_attributes<Recipe::kMxfp4Bf16>(); }

}  // namespace moe_ep::kern
