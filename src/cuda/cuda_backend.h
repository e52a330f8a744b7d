// The CUDA layer backend (docs/kernels.md): weights preprocessed once into the resident
// layout of the kernels, one workspace allocation per capacity, and a forward of
// stream-ordered launches with no host synchronization (graph-capturable).
//
// EP = 1: prepare (quantize + route), fc1, fc2, finalize. W > 1 (docs/protocol.md §8): the
// workspace is an EpComm symmetric window plus local scratch; source quantize -> ep dispatch
// (with its wait fused) -> unpack the received rows into virtual tokens -> the same route / GEMM
// kernels -> ep combine (wait fused) -> finalize from the local combine area. By default fc2
// stores straight into the sources' combine areas and the combine kernel only signals and waits
// (CombineMode::kCopy: fc2 writes a local y buffer that the combine kernel copies). Sticky
// transport errors (a peer that never arrived, abandoned the call or ran it in another
// workspace) are thrown as kPeer by the next host call; a call this rank rejects is abandoned
// towards its peers (abandon_call).
//
// Bad ids cannot be found on the host without a sync: the forward skips such a slot and sets a
// sticky error word in host-mapped memory; the next host call on the layer (forward, warmup,
// create_workspace, kernel_weights, destroy) throws it as kInvalidArgument once the faulty
// forward has finished on the device.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "common/workspace_layout.h"
#include "cuda/comm/nccl_comm.h"
#include "kernels/common/launch.h"
#include "layer/backend.h"
#include "layer/group_pool.h"
#include "moe_ep/plan.h"
#include "moe_ep/status.h"

namespace moe_ep::cuda {

[[noreturn]] inline void cuda_fail(cudaError_t err, const std::string& what) {
  throw Error(ErrorCode::kBackend, "moe_ep cuda: " + what + " failed: " + cudaGetErrorName(err) +
                                       " (" + cudaGetErrorString(err) + ")");
}

inline void check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) cuda_fail(err, what);
}

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  void allocate(size_t n, const char* what) {
    release();
    if (n == 0) return;
    check(cudaMalloc(&ptr, n),
          std::string("cudaMalloc of ") + std::to_string(n) + " bytes for " + what);
    bytes = n;
  }
  void release() {
    if (ptr) cudaFree(ptr);
    ptr = nullptr;
    bytes = 0;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

// One of the layer's workspaces: this layer's window layout and scratch layout in the group's
// pooled workspace of its capacity (W > 1: an EpComm symmetric window + a scratch allocation;
// W = 1: one allocation, the layout at its front), and the layer's own state beside it.
struct Workspace {
  int capacity = 0;
  WorkspaceLayout layout;
  ScratchLayout scratch;
  std::shared_ptr<PooledWorkspace> pool;      // a CudaPooledWorkspace (src/cuda/cuda_group.h)
  DeviceBuffer state;                         // ScratchLayout::State: this layer's counters
  uint64_t generation = 0;                    // of the pool when the state was derived
  CombineMode combine = CombineMode::kFused;  // W > 1: fixed at creation (PlanOptions)
};

// The expert side's buffers in a workspace's scratch (`base`: the scratch allocation; `state`:
// the layer's own state): fc1's output, the routing list and tiles, the spread route's counters.
inline void attach_expert_scratch(kern::ForwardArgs& a, unsigned char* base, unsigned char* state,
                                  const ScratchLayout& s) {
  a.h = reinterpret_cast<uint16_t*>(base + s.h_off);
  a.sorted_pairs = reinterpret_cast<int32_t*>(base + s.pairs_off);
  a.tiles = reinterpret_cast<kern::TileInfo*>(base + s.tiles_off);
  a.num_tiles = reinterpret_cast<int32_t*>(base + s.num_tiles_off);
  a.counts = reinterpret_cast<int32_t*>(state + s.state.counts_off);
  a.pair_rank = reinterpret_cast<int32_t*>(base + s.ranks_off);
}

class CudaGroupTransport;  // src/cuda/cuda_group.h

// The backend by concern: construction, weights and lifetime (cuda_backend.cpp), workspaces
// (cuda_workspace.cpp), the single-GPU forward (cuda_forward.cpp), the EP forward
// (cuda_forward_ep.cpp).
class CudaBackend final : public LayerBackend {
 public:
  CudaBackend(EpGroup& group, const LayerConfig& cfg, const WeightPack& w,
              const EpilogueVectors& epi);
  ~CudaBackend() override { release(); }

  Device device() const override { return dev_; }

  int create_workspace(int capacity) override;

  int num_workspaces() const override { return int(workspaces_.size()); }
  int workspace_capacity(int ws) const override { return get_ws(ws).capacity; }
  bool fp8_mma() const override { return fp8_; }

  ForwardPlan plan(int tokens, int ws) const override {
    return plan_for(tokens, get_ws(ws).capacity);
  }
  ForwardPlan last_plan() const override { return last_plan_; }
  void set_plan_options(const PlanOptions& o) override { cfg_.plan_options = o; }
  void set_stage_events(void* const* events) override {
    stage_events_ = const_cast<void*>(static_cast<const void*>(events));
  }
  size_t workspace_bytes(int ws) const override;

  void warmup(int ws) override;

  void forward(const ValidatedForward& in, const ForwardTargets& out) override;

  TensorView workspace_output(int ws, int tokens) override;

  KernelWeights kernel_weights() override;

  ExpertWeightViews expert_weight_views() override;

  int allreduce_max(int value) override;

  Tensor allocate(DType dtype, std::initializer_list<int64_t> shape) override;

  // This rank rejected a call's arguments: its peers' waits of that call fail at once, naming
  // this rank, instead of timing out (docs/protocol.md §6). Ordered after this rank's earlier
  // forwards (their stream), so none of those is reported as abandoned.
  void abandon_call(const std::string& why) override;

  void destroy() override;

 private:
  // Sticky transport error first (kPeer, names the peer and stage), then a bad id.
  void check_host_errors();

  kern::ForwardArgs common_args(const ValidatedForward& in) const;

  // W > 1, every rank (T = 0 too), one stream, no host sync (docs/protocol.md §8).
  void forward_ep(const ValidatedForward& in, const ForwardTargets& out, const Workspace& ws);

  void select_device();

  ForwardPlan plan_for(int tokens, int capacity) const;

  const Workspace& get_ws(int ws) const;
  // The pooled memory of `w`: its window (this rank's) and its scratch allocation.
  unsigned char* window_base(const Workspace& w) const;
  unsigned char* scratch_base(const Workspace& w) const;
  // Re-derives the layer's state of `ws` (the fp8 path's tensor map of h8) after the group
  // re-made its pooled memory larger. Host work with a copy: not under capture.
  void refresh_state(int ws);

  TensorView bytes_view(const DeviceBuffer& b, size_t per_expert) const {
    return TensorView::contiguous(b.ptr, DType::kU8, {El_, int64_t(per_expert)}, dev_);
  }

  std::string device_error_message() const;

  void check_device_error();

  // Host or device checkpoint tensor -> device pointer (copies host data into `tmp`).
  const uint8_t* on_device(const TensorView& v, DeviceBuffer& tmp, const char* name);

  void load_weights(const WeightPack& w);

  void load_vector(const TensorView& v, DeviceBuffer& dst, const char* name);
  // An expert bias (contract §3.1): absent, or f32 [E_local, n] contiguous on the host or this
  // device, finite; copied into dst.
  void load_bias(const TensorView& v, int n, DeviceBuffer& dst, const char* name);

  void release();

  LayerConfig cfg_;
  Device dev_;
  int W_ = 1, rank_ = 0;
  int El_ = 0;
  EpGroup::Impl* group_ = nullptr;  // outlives the backend (MegaLayer holds the group)
  std::shared_ptr<CudaGroupTransport> transport_;
  EpComm* comm_ = nullptr;  // the group's communicator (W > 1)
  void* last_stream_ =
      nullptr;  // W > 1: the stream of the latest forward (abandon orders after it)
  int num_sms_ = 1;
  std::string weight_error_;  // W > 1: this rank's weight rejection, agreed on collectively
  kern::ResidentShape rs_{};
  bool fp8_ = false;              // the fp8 MMA path of mxfp4_mxfp8 (RecipeConfig::fp8_mma)
  ForwardPlan last_plan_;         // of the latest forward (diagnostics)
  void* stage_events_ = nullptr;  // cudaEvent_t[5] (W = 1) or [7] (W > 1), or null
  DeviceBuffer w1_, w2_, s1_, s2_, fc1_alpha_, fc2_alpha_, fc1_nc_;
  DeviceBuffer fc1_bias_, fc2_bias_;  // [E_local, 2I], [E_local, H] f32; empty without biases
  kern::DeviceError* err_host_ = nullptr;
  kern::DeviceError* err_dev_ = nullptr;
  std::vector<std::unique_ptr<Workspace>> workspaces_;
};

}  // namespace moe_ep::cuda
