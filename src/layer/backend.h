// The seam between the public MegaLayer (validation, API surface) and the backends that run
// it (the CPU reference in src/reference, the CUDA backend in src/cuda). MegaLayer checks every
// argument before a backend sees it; a backend may assume shapes, dtypes and strides are right.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moe_ep/config.h"
#include "moe_ep/group.h"
#include "moe_ep/layer.h"
#include "moe_ep/plan.h"
#include "moe_ep/weight_prep.h"

namespace moe_ep {

constexpr int kMaxTopK = 16;

// One forward's inputs after MegaLayer's checks. Epilogue views are absent (ndim 0) where the
// caller passed none; the backend substitutes its own.
struct ValidatedForward {
  TensorView x;        // bf16 [T, H], rows of stride x.strides[0] elements, unit inner stride
  TensorView ids;      // i32 [T, K] contiguous
  TensorView weights;  // f32 [T, K] contiguous
  EpilogueVectors epilogue;
  int workspace = 0;
  int tokens = 0;                       // rows of x (an upper bound when num_tokens is set)
  const int32_t* num_tokens = nullptr;  // device-side valid count, see ForwardInputs
  void* stream = nullptr;
};

// Where a forward writes. Exactly one of `out` or the unfinalized triple is defined.
struct ForwardTargets {
  TensorView out;      // bf16 [T, H] contiguous
  TensorView rows;     // bf16 [T*K, H] contiguous
  TensorView weights;  // f32 [T, K]
  TensorView indices;  // i32 [T, K]
};

class LayerBackend {
 public:
  virtual ~LayerBackend() = default;
  virtual Device device() const = 0;
  virtual int create_workspace(int capacity) = 0;
  virtual int num_workspaces() const = 0;
  virtual int workspace_capacity(int ws) const = 0;
  virtual size_t workspace_bytes(int ws) const = 0;
  virtual void warmup(int ws) = 0;
  virtual void forward(const ValidatedForward& in, const ForwardTargets& out) = 0;
  // bf16 [tokens, H] view of the workspace's finalized-output area.
  virtual TensorView workspace_output(int ws, int tokens) = 0;
  virtual KernelWeights kernel_weights() = 0;
  virtual ExpertWeightViews expert_weight_views() = 0;
  virtual int allreduce_max(int value) = 0;  // collective
  virtual Tensor allocate(DType dtype, std::initializer_list<int64_t> shape) = 0;
  virtual void destroy() = 0;  // collective; called once
  // This rank rejected a collective call's arguments before taking part: tell the peers (where
  // the transport can) so they fail fast instead of timing out.
  virtual void abandon_call(const std::string& why) { (void)why; }
  // The expert GEMMs run on fp8 tensor cores (the CUDA backend's fp8 MMA path of mxfp4_mxfp8).
  virtual bool fp8_mma() const { return false; }
  // The launch plan of a forward of `tokens` tokens in workspace `ws`, and of the latest forward
  // (diagnostics; the CPU reference has no launches).
  virtual ForwardPlan plan(int tokens, int ws) const {
    (void)ws;
    ForwardPlan p;
    p.tokens = tokens;
    return p;
  }
  virtual ForwardPlan last_plan() const { return ForwardPlan{}; }
  // Per-stage events of the following forwards (MegaLayer::set_stage_events); ignored by the CPU.
  virtual void set_stage_events(void* const* events) { (void)events; }
  virtual void set_plan_options(const PlanOptions& options) { (void)options; }
};

// A layer of `group` (its transport and workspace pool; the group outlives the backend).
std::unique_ptr<LayerBackend> make_cpu_backend(EpGroup& group, const LayerConfig& config,
                                               const WeightPack& weights,
                                               const EpilogueVectors& epilogue);

// Whether the CUDA backend runs expert biases and an activation slope / offset (contract §3.1)
// for this configuration, and the reason naming `what` where it does not (config.cpp).
bool cuda_runs_extended_epilogue(const LayerConfig& config);
std::string extended_epilogue_reason(const LayerConfig& config, const std::string& what);

// CUDA backend (src/cuda). Without a CUDA build these report "not built".
bool cuda_backend_usable();
std::vector<std::string> cuda_backend_unsupported_reasons(const LayerConfig& config,
                                                          int world_size);
std::unique_ptr<LayerBackend> make_cuda_backend(EpGroup& group, const LayerConfig& config,
                                                const WeightPack& weights,
                                                const EpilogueVectors& epilogue);

// Shape/dtype checks of a weight pack (shared by the backends). Throws moe_ep::Error.
void validate_weight_pack(const LayerConfig& config, int world_size, const WeightPack& w);
// Checks an epilogue vector: absent, or f32 [E_local] contiguous. Throws moe_ep::Error.
void validate_epilogue_vector(const TensorView& v, int num_local_experts, const char* name);

}  // namespace moe_ep
