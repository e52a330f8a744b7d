// Host entry points of the forward's kernels. Every function enqueues on `stream` and returns the
// CUDA error of its launches; nothing synchronizes except preprocess_weights, which runs once at
// construction. What to launch comes from the launch plan (include/moe_ep/plan.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/common/forward_args.h"
#include "moe_ep/plan.h"

namespace moe_ep::kern {

// Loads every kernel a plan can pick for `recipe` and raises their dynamic shared-memory limits
// (once, before any capture).
cudaError_t set_kernel_attributes(Recipe recipe);

// The whole forward as `plan` says: prepare (quantize x + route, one launch), fc1, fc2, finalize
// (when args.out is set). With `stage_events` (5 events) it records one before each stage and one
// at the end (the benchmark's per-stage times).
cudaError_t launch_forward(const ForwardArgs& args, const ForwardPlan& plan, cudaStream_t stream,
                           cudaEvent_t* stage_events = nullptr);

// Only the last stage: finalize (args.out set) or the unfinalized triple (weights_out /
// indices_out, rows copied from args.y_rows into unfinalized_rows), after the EP combine.
cudaError_t launch_finalize(const ForwardArgs& args, uint16_t* unfinalized_rows,
                            cudaStream_t stream);

// The EP stages around the transport (kernels/ep/ep_stages.cu).
cudaError_t launch_ep_source(const EpSourceArgs& args, cudaStream_t stream);
cudaError_t launch_ep_unpack(const EpUnpackArgs& args, cudaStream_t stream);

// Checkpoint-layout weights of `num_experts` experts (device memory) -> the resident layout
// (forward_args.h). `fc1` picks the gate/up interleave (rows = 2I) or fc2 (rows = H, padded).
// Scale bytes are checked: NaN (E4M3 0x7F/0xFF, UE8M0 0xFF) and UE8M0 above 191 (2^64) are
// reported in `*why` (empty when all are fine). `fp8_layout`: 4-bit words in the fp8 path's
// layout (fp8_resident_piece). Synchronizes.
cudaError_t preprocess_weights(Recipe recipe, bool fc1, int num_experts, int H, int I,
                               const uint8_t* raw, const uint8_t* raw_scale, uint8_t* out,
                               uint8_t* out_scale, cudaStream_t stream, std::string* why,
                               bool fp8_layout = false);

// Encodes the tensor map of h8 (`rows` rows of I e4m3 bytes at `h8`: boxes of 128 bytes x 8
// rows, 128-byte swizzle, zeros past the rows) into `dst` (128 bytes of device memory, 64-byte
// aligned), synchronously, for the fp8 kernel's fc2 (ForwardArgs::h8_tmap). cudaErrorNotSupported
// where the driver has no cuTensorMapEncodeTiled.
cudaError_t encode_fp8_h_tensor_map(void* dst, const uint8_t* h8, size_t rows, int I);

// ---- the stages' own entry points (launch_forward strings them together) -------------------
cudaError_t launch_prepare(const ForwardArgs& args, const ForwardPlan& plan, bool pdl,
                           cudaStream_t stream);
cudaError_t set_prepare_attributes(Recipe recipe);
cudaError_t launch_finalize_after_gemms(const ForwardArgs& args, cudaStream_t stream);
cudaError_t set_finalize_attributes();
// The fp8 path's fold: each of `rows` bf16 rows of `cols` values to e4m3 bytes against one power
// of two per row (fp8_row_reference, fp8_fold).
cudaError_t launch_fp8_fold(const uint16_t* src, int rows, int cols, uint8_t* dst, uint8_t* ref,
                            cudaStream_t s);
// The grouped GEMMs of one recipe (kernels/gemm/sm90_gemm_<recipe>.cu).
cudaError_t launch_gemms_nvfp4(const ForwardArgs& a, const ForwardPlan& p, cudaStream_t s,
                               cudaEvent_t* ev);
cudaError_t launch_gemms_mxfp4_mxfp8(const ForwardArgs& a, const ForwardPlan& p, cudaStream_t s,
                                     cudaEvent_t* ev);
cudaError_t launch_gemms_mxfp4_bf16(const ForwardArgs& a, const ForwardPlan& p, cudaStream_t s,
                                    cudaEvent_t* ev);
cudaError_t launch_gemms_bf16(const ForwardArgs& a, const ForwardPlan& p, cudaStream_t s,
                              cudaEvent_t* ev);
cudaError_t launch_gemms_nvfp4_bf16(const ForwardArgs& a, const ForwardPlan& p, cudaStream_t s,
                                    cudaEvent_t* ev);
cudaError_t set_gemm_attributes_nvfp4();
cudaError_t set_gemm_attributes_mxfp4_mxfp8();
cudaError_t set_gemm_attributes_mxfp4_bf16();
cudaError_t set_gemm_attributes_bf16();
cudaError_t set_gemm_attributes_nvfp4_bf16();

}  // namespace moe_ep::kern
