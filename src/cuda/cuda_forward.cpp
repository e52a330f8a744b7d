// The CUDA backend's single-GPU forward (W = 1): the launch plan of the call, then prepare,
// fc1, fc2 and finalize as it says; and the arguments every forward shares.
#include <cstdint>

#include "cuda/cuda_backend.h"
#include "plan/forward_plan.h"
#include "reference/cpu_math.h"

namespace moe_ep::cuda {

void CudaBackend::forward(const ValidatedForward& in, const ForwardTargets& out) {
  check_host_errors();
  select_device();
  refresh_state(in.workspace);
  const Workspace& ws = get_ws(in.workspace);
  if (W_ > 1) return forward_ep(in, out, ws);
  unsigned char* base = scratch_base(ws);  // the window layout at its front (W = 1)
  unsigned char* state = ws.state.as<unsigned char>();
  kern::ForwardArgs a = common_args(in);
  a.expert_base = 0;
  a.tokens = in.tokens;
  a.num_tokens = in.num_tokens;
  a.x = in.x.ptr<uint16_t>();
  a.x_stride = in.x.strides[0];
  a.ids = in.ids.ptr<int32_t>();
  a.topk_weights = in.weights.ptr<float>();
  a.xq = reinterpret_cast<uint16_t*>(base + ws.scratch.xq_off);
  // Recipes with bf16 activations read x as it is: where its rows are xq's (contiguous, 16-byte
  // aligned for the GEMMs' 16-byte copies), fc1 reads x and prepare only routes.
  const Recipe r = cfg_.recipe.recipe;
  const bool bf16_activations = r != Recipe::kNvfp4 && r != Recipe::kMxfp4Mxfp8;
  if (bf16_activations && a.x_stride == a.H && reinterpret_cast<uintptr_t>(a.x) % 16 == 0) {
    a.xq = const_cast<uint16_t*>(a.x);  // read only: prepare writes xq only when it copies
    a.xq_is_x = true;
  }
  attach_expert_scratch(a, base, state, ws.scratch);
  if (fp8_) {
    a.fp8 = true;
    a.xq8 = base + ws.scratch.xq8_off;
    a.xref = base + ws.scratch.xref_off;
    a.h8 = base + ws.scratch.h8_off;
    a.href = base + ws.scratch.href_off;
    a.h8_tmap = state + ws.scratch.state.h8map_off;
    a.fp8_sched = reinterpret_cast<int32_t*>(state + ws.scratch.state.fp8_sched_off);
  }
  if (out.out.defined()) {
    a.y_rows = reinterpret_cast<uint16_t*>(base + ws.layout.combine_off);
    a.out = out.out.ptr<uint16_t>();
  } else {
    a.y_rows = out.rows.ptr<uint16_t>();
    a.weights_out = out.weights.ptr<float>();
    a.indices_out = out.indices.ptr<int32_t>();
  }
  last_plan_ = plan_for(in.tokens, ws.capacity);
  check(kern::launch_forward(a, last_plan_, static_cast<cudaStream_t>(in.stream),
                             static_cast<cudaEvent_t*>(stage_events_)),
        "launching the forward");
}

kern::ForwardArgs CudaBackend::common_args(const ValidatedForward& in) const {
  kern::ForwardArgs a;
  const auto& rc = cfg_.recipe;
  a.recipe = rc.recipe;
  a.H = cfg_.fleet.hidden_size;
  a.I = rc.intermediate_size;
  a.K = rc.top_k;
  a.local_experts = El_;
  a.num_experts = cfg_.fleet.num_experts;
  a.input_norm_const = rc.input_norm_const;
  a.swiglu_limit = rc.swiglu_limit ? *rc.swiglu_limit : -1.0f;
  a.weight_in_fc1 = applies_weight_in_fc1(rc);
  a.fc1_alpha =
      in.epilogue.fc1_alpha.defined() ? in.epilogue.fc1_alpha.ptr<float>() : fc1_alpha_.as<float>();
  a.fc2_alpha =
      in.epilogue.fc2_alpha.defined() ? in.epilogue.fc2_alpha.ptr<float>() : fc2_alpha_.as<float>();
  a.fc1_norm_const = in.epilogue.fc1_norm_const.defined() ? in.epilogue.fc1_norm_const.ptr<float>()
                                                          : fc1_nc_.as<float>();
  a.fc1_bias = fc1_bias_.as<float>();
  a.fc2_bias = fc2_bias_.as<float>();
  a.swiglu_alpha = rc.swiglu_alpha;
  a.swiglu_beta = rc.swiglu_beta;
  a.w1 = w1_.as<uint8_t>();
  a.s1 = s1_.as<uint8_t>();
  a.w2 = w2_.as<uint8_t>();
  a.s2 = s2_.as<uint8_t>();
  a.rs = rs_;
  a.error = err_dev_;
  return a;
}

ForwardPlan CudaBackend::plan_for(int tokens, int capacity) const {
  plan::PlanInputs p;
  p.recipe = cfg_.recipe.recipe;
  p.H = cfg_.fleet.hidden_size;
  p.I = cfg_.recipe.intermediate_size;
  p.K = cfg_.recipe.top_k;
  p.local_experts = El_;
  p.world = W_;
  p.fp8 = fp8_;
  p.extended_epilogue = fc1_bias_.ptr != nullptr || fc2_bias_.ptr != nullptr ||
                        cfg_.recipe.swiglu_alpha != 1.0f || cfg_.recipe.swiglu_beta != 0.0f;
  p.num_sms = num_sms_;
  p.tokens = tokens;
  p.capacity = capacity;
  return plan::make_forward_plan(p, cfg_.plan_options);
}

}  // namespace moe_ep::cuda
