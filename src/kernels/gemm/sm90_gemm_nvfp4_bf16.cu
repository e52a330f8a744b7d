// The grouped GEMMs (fc1, fc2) of the nvfp4_bf16 recipe: every kernel a plan can pick for it.
#include "kernels/gemm/gemm_launch.cuh"

namespace moe_ep::kern {

cudaError_t launch_gemms_nvfp4_bf16(const ForwardArgs& a, const ForwardPlan& p, cudaStream_t s,
                                    cudaEvent_t* ev) {
  return launch_gemms<Recipe::kNvfp4Bf16>(a, p, s, ev);
}

cudaError_t set_gemm_attributes_nvfp4_bf16() { return set_gemm_attributes<Recipe::kNvfp4Bf16>(); }

}  // namespace moe_ep::kern
