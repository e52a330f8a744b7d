// The MoE-EP layer object (docs/contract.md §4): one per MoE layer and rank, built from an EP
// group (moe_ep/group.h) whose transport and workspace pool it shares with the group's other
// layers. Construction, workspaces and destroy are collective over the EP group; forward is
// collective too (every rank calls it with the same workspace, also with T = 0).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moe_ep/config.h"
#include "moe_ep/group.h"
#include "moe_ep/plan.h"
#include "moe_ep/status.h"
#include "moe_ep/tensor.h"

namespace moe_ep {

// Weights of this rank's E_local experts as the checkpoint stores them (docs/contract.md §3.1):
//   4-bit recipes: w13 u8 [E_local, 2I, H/2], w2 u8 [E_local, H, I/2],
//                  w13_scale u8 [E_local, 2I, H/g], w2_scale u8 [E_local, H, I/g]
//   bf16 recipe:   w13 bf16 [E_local, 2I, H], w2 bf16 [E_local, H, I], no scales.
// Rows [0, I) of w13 are gate, rows [I, 2I) are up. Copied at construction.
struct WeightPack {
  TensorView w13, w2, w13_scale, w2_scale;
};

// Per-expert fp32 [E_local] epilogue vectors (fc1_alpha / fc2_alpha: nvfp4 and nvfp4_bf16;
// fc1_norm_const: nvfp4). Left out: 1.0 for every expert.
struct EpilogueVectors {
  TensorView fc1_alpha, fc2_alpha, fc1_norm_const;
  // Expert biases (gpt-oss; contract §3.1), at construction only: f32 [E_local, 2I] added to
  // fc1's result after the alpha, before the clamp (gate rows, then up rows), and f32
  // [E_local, H] added to fc2's fp32 result before its bf16 rounding (times the top-k weight
  // where the recipe applies it in fc1). The CUDA backend runs them for mxfp4_bf16, nvfp4_bf16 and
  // bf16.
  TensorView fc1_bias, fc2_bias;
};

// A workspace profile: created collectively, in the same order on all ranks.
struct WorkspaceId {
  int index = 0;
  bool operator==(const WorkspaceId& o) const { return index == o.index; }
};

struct ForwardInputs {
  TensorView hidden_states;  // bf16 [T, H], T <= workspace capacity
  TensorView topk_ids;       // i32 [T, K], values in [0, E) or -1 (empty slot)
  TensorView topk_weights;   // f32 [T, K]
  // Per-call epilogue vectors; each left out falls back to the layer's own.
  EpilogueVectors epilogue;
  std::optional<WorkspaceId> workspace;  // default workspace when left out
  void* stream = nullptr;                // cudaStream_t for the CUDA backend
  // Optional int32 scalar on the layer's device: the number of valid leading tokens, read when
  // the forward runs (so a CUDA graph captured at T rows replays with any count <= T). Rows at
  // and past it are not computed; their outputs are written as zeros.
  const int32_t* num_tokens = nullptr;
};

struct UnfinalizedOutput {
  Tensor rows;     // bf16 [T*K, H]: row t*K+k is y[t,k] (weighted if the recipe did it in fc1)
  Tensor weights;  // f32 [T, K]: ones if the weight was applied in fc1, else topk_weights
  Tensor indices;  // i32 [T, K]: row of each slot in `rows`, -1 for an empty slot
};

// The same three outputs in caller memory (contiguous, on the layer's device), so that an
// unfinalized forward allocates nothing and can be captured in a CUDA graph.
struct UnfinalizedViews {
  TensorView rows;     // bf16 [T*K, H]
  TensorView weights;  // f32 [T, K]
  TensorView indices;  // i32 [T, K]
};

// Byte views [E_local, bytes_per_expert] of exactly the memory the kernels read.
struct KernelWeights {
  TensorView fc1_weight, fc1_scale, fc2_weight, fc2_scale;  // scales absent for bf16
};

struct ExpertWeightViews {
  KernelWeights weights;
  TensorView fc1_alpha, fc2_alpha, fc1_norm_const;  // f32 [E_local]
  // The layer's expert biases, f32 [E_local, 2I] and [E_local, H]; undefined without them.
  TensorView fc1_bias, fc2_bias;
};

class LayerBackend;  // src/layer/backend.h

class MegaLayer {
 public:
  // Collective over the EP group. Throws moe_ep::Error (with every reason) when the
  // configuration or the weights are rejected. The layer shares `group`'s transport and
  // workspace pool (its default workspace is the pool's of capacity max_tokens_per_rank).
  MegaLayer(std::shared_ptr<EpGroup> group, const LayerConfig& config, const WeightPack& weights,
            const EpilogueVectors& epilogue = {});
  // The same with a group of its own, made from `bootstrap` and destroyed with the layer.
  MegaLayer(const Bootstrap& bootstrap, const LayerConfig& config, const WeightPack& weights,
            const EpilogueVectors& epilogue = {});
  ~MegaLayer();  // calls destroy(); never throws
  MegaLayer(const MegaLayer&) = delete;
  MegaLayer& operator=(const MegaLayer&) = delete;

  // --- forward ---------------------------------------------------------------------------
  // Finalized output into caller memory `out` bf16 [T, H].
  void forward(const ForwardInputs& in, const TensorView& out);
  // Finalized output, owned by the caller.
  Tensor forward(const ForwardInputs& in);
  // Finalized output as a zero-copy view of the workspace, valid in stream order until the
  // next call of ANY layer of the group that uses the same pooled workspace (and until the pool
  // re-makes that workspace larger for a layer built later).
  TensorView forward_view(const ForwardInputs& in);
  // Only on a layer built with do_finalize = false: owned outputs, or the caller's buffers.
  UnfinalizedOutput forward_unfinalized(const ForwardInputs& in);
  void forward_unfinalized(const ForwardInputs& in, const UnfinalizedViews& out);

  // --- workspaces -------------------------------------------------------------------------
  WorkspaceId default_workspace() const;
  // Collective. The group's pooled workspace of that capacity (made, or re-made larger, when
  // this layer needs more than it holds); a capacity this layer has already gives a second id of
  // the same memory.
  WorkspaceId create_workspace(int capacity);
  // The decode workspace an engine's scheduler bounds (collective, the same numbers on every
  // rank): capacity cdiv(max_num_seqs * (1 + num_speculative_tokens), sp_size) tokens per rank;
  // the workspace of that capacity when the layer has one already. Warmed up, so a forward in it
  // can be captured right away.
  WorkspaceId create_decode_workspace(int max_num_seqs, int num_speculative_tokens = 0,
                                      int sp_size = 1);
  int workspace_capacity(WorkspaceId ws) const;
  // Bytes this layer's geometry uses of the workspace (window + scratch); the pooled memory
  // behind it may be larger (EpGroup::pool_bytes).
  size_t workspace_bytes(WorkspaceId ws) const;
  // The smallest workspace whose capacity holds `max_tokens_any_rank` (the largest T of any
  // rank in this call; the caller knows it, e.g. from its scheduler).
  WorkspaceId select_workspace(int max_tokens_any_rank) const;
  // The same, with the largest T found by a collective over the group.
  WorkspaceId select_workspace_collective(int local_tokens);

  void warmup(std::optional<WorkspaceId> ws = std::nullopt);

  // --- weights (EPLB) ---------------------------------------------------------------------
  KernelWeights kernel_weights();
  ExpertWeightViews expert_weight_views();

  // --- lifetime ---------------------------------------------------------------------------
  void destroy();  // collective, idempotent
  bool destroyed() const;

  // --- properties as vLLM reads them ------------------------------------------------------
  const LayerConfig& config() const { return config_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int num_local_experts() const { return config_.fleet.num_experts / world_size_; }
  Backend backend() const { return backend_kind_; }
  // The group the layer was built from (null after destroy()).
  const std::shared_ptr<EpGroup>& group() const { return group_; }
  DType topk_indices_dtype() const { return DType::kI32; }
  bool output_is_reduced() const { return true; }
  bool is_monolithic() const { return false; }
  bool can_overlap_shared_experts() const { return true; }
  // Whether the expert GEMMs run on fp8 tensor cores (RecipeConfig::fp8_mma on the CUDA
  // backend); false otherwise and after destroy().
  bool uses_fp8_mma() const;

  // --- diagnostics -----------------------------------------------------------------------
  // The launch plan a forward of `tokens` tokens (in `ws`, the default workspace when left out)
  // runs, without running it; and the plan of the latest forward. ForwardPlan::to_string()
  // prints either in one line. The CPU backend's plan names no kernels.
  ForwardPlan plan(int tokens, std::optional<WorkspaceId> ws = std::nullopt) const;
  ForwardPlan last_plan() const;
  // Replaces LayerConfig::plan_options for the following forwards (tests and benchmarks that
  // compare variants on one layer's weights). Checked as at construction; the combine mode
  // applies to workspaces created afterwards. Not collective: give every rank the same options.
  void set_plan_options(const PlanOptions& options);
  // CUDA backend: the following forwards record per-stage events into `events` (owned by the
  // caller, live while set): cudaEvent_t[5] at W = 1 (before prepare, fc1, fc2 and finalize,
  // and at the end), cudaEvent_t[7] at W > 1 (before quantize, dispatch, unpack, expert compute,
  // combine and finalize, and at the end). Null stops it.
  void set_stage_events(void* const* events);

 private:
  LayerBackend& live(const char* what);
  void build(std::shared_ptr<EpGroup> group, const WeightPack& weights,
             const EpilogueVectors& epilogue);

  LayerConfig config_;
  int rank_ = 0, world_size_ = 1;
  Backend backend_kind_ = Backend::kCPU;
  std::shared_ptr<EpGroup> group_;  // declared before impl_: outlives the backend
  bool owns_group_ = false;         // made by the Bootstrap constructor: destroyed with the layer
  std::unique_ptr<LayerBackend> impl_;
};

}  // namespace moe_ep
