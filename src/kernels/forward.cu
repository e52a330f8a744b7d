// The single-GPU forward's launches in stream order, as the launch plan says: prepare (quantize
// x + route), fc1, fc2 (the plan's GEMM kernels), finalize. An EP owner runs the same chain on
// the received rows (xq_ready), after the unpack kernel.
#include <cuda_runtime.h>

#include "kernels/common/launch.h"
#include "kernels/common/pdl.cuh"
#include "moe_ep/plan.h"

namespace moe_ep::kern {

cudaError_t set_kernel_attributes(Recipe recipe) {
  // Querying attributes loads each module now, not lazily inside a graph capture.
  cudaError_t err = set_finalize_attributes();
  if (err == cudaSuccess) err = set_prepare_attributes(recipe);
  if (err != cudaSuccess) return err;
  switch (recipe) {
    case Recipe::kNvfp4:
      return set_gemm_attributes_nvfp4();
    case Recipe::kMxfp4Mxfp8:
      return set_gemm_attributes_mxfp4_mxfp8();
    case Recipe::kMxfp4Bf16:
      return set_gemm_attributes_mxfp4_bf16();
    case Recipe::kBf16:
      return set_gemm_attributes_bf16();
    case Recipe::kNvfp4Bf16:
      return set_gemm_attributes_nvfp4_bf16();
  }
  return cudaErrorInvalidValue;
}

namespace {
cudaError_t launch_gemms(const ForwardArgs& a, const ForwardPlan& p, cudaStream_t s,
                         cudaEvent_t* ev) {
  switch (a.recipe) {
    case Recipe::kNvfp4:
      return launch_gemms_nvfp4(a, p, s, ev);
    case Recipe::kMxfp4Mxfp8:
      return launch_gemms_mxfp4_mxfp8(a, p, s, ev);
    case Recipe::kMxfp4Bf16:
      return launch_gemms_mxfp4_bf16(a, p, s, ev);
    case Recipe::kBf16:
      return launch_gemms_bf16(a, p, s, ev);
    case Recipe::kNvfp4Bf16:
      return launch_gemms_nvfp4_bf16(a, p, s, ev);
  }
  return cudaErrorInvalidValue;
}
}  // namespace

cudaError_t launch_forward(const ForwardArgs& args, const ForwardPlan& p, cudaStream_t s,
                           cudaEvent_t* ev) {
  if (args.tokens == 0) return cudaSuccess;
  ForwardArgs a = args;
  a.tile_n = p.tile_n;
  a.tile_split_rows = p.tile16_row_split ? p.tile_n / 2 : p.m64_split ? kM64NarrowTileN : 0;
  a.fp8_widths = p.fp8_forced_widths;
  if (ev) cudaEventRecord(ev[0], s);
  // One GPU: the forward's first kernel, a plain launch. EP owner (xq_ready): after the unpack.
  cudaError_t err = launch_prepare(a, p, /*pdl=*/a.xq_ready, s);
  if (err != cudaSuccess) return err;
  if (a.fp8) {  // x folded to e4m3 rows for the fp8 GEMM
    if ((err = launch_fp8_fold(a.xq, a.tokens, a.H, a.xq8, a.xref, s)) != cudaSuccess) return err;
  }
  if (ev) cudaEventRecord(ev[1], s);
  if ((err = launch_gemms(a, p, s, ev ? ev + 2 : nullptr)) != cudaSuccess) return err;
  if (ev) cudaEventRecord(ev[3], s);
  if (a.out) err = launch_finalize_after_gemms(a, s);
  if (ev) cudaEventRecord(ev[4], s);
  return err;
}

}  // namespace moe_ep::kern
