// The EP group (docs/contract.md §4): made once per process and EP group from a Bootstrap, and
// shared (std::shared_ptr) by every layer built from it. Its layers share
//   - the transport: the NCCL communicator (CUDA backend, W > 1) or the CPU fleet's channel;
//   - the workspace pool: one workspace (symmetric window + scratch) per capacity, sized for the
//     largest geometry (H, I, K, E_local, recipe) of the layers that use it, reused by every
//     layer in stream order. A layer's own state is its weights, its epilogue vectors and a few
//     counters per workspace.
// Layers of one group must not run concurrently (one stream, or calls ordered by the caller):
// they write into the same pooled buffers. A workspace view (MegaLayer::forward_view) of one
// layer is therefore valid until the next call of ANY layer that uses the same pooled workspace.
//
// Sizing: a pooled workspace is made at the first layer that asks for its capacity, sized for
// that layer; a later layer that needs more re-makes it larger at its construction (or at its
// create_workspace), collectively. Re-making frees the old buffers: workspace views taken before
// it are invalid, and CUDA graphs captured before it must be captured again (warm up and capture
// after building every layer). The pool never shrinks; a pooled workspace is freed when the last
// layer that uses it is destroyed.
//
// Creation, layer construction, workspace creation and destruction are collective over the EP
// group: every rank makes the same calls in the same order (so every rank's pool has the same
// sizes and indices).
#pragma once

#include <cstddef>
#include <memory>

#include "moe_ep/config.h"

namespace moe_ep {

class EpGroup {
 public:
  // Collective. Checks the bootstrap (rank in [0, W), a CPU fleet of W ranks, an NCCL
  // communicator or unique id for the CUDA backend at W > 1) and sets up the transport.
  static std::shared_ptr<EpGroup> create(const Bootstrap& bootstrap);
  ~EpGroup();  // destroy(); never throws
  EpGroup(const EpGroup&) = delete;
  EpGroup& operator=(const EpGroup&) = delete;

  int world_size() const;
  int rank() const;
  Backend backend() const;  // resolved (never kAuto)
  int device() const;       // CUDA ordinal (CUDA backend)
  const Bootstrap& bootstrap() const;

  // Bytes of every pooled workspace alive now (device memory on the CUDA backend, host memory
  // on the CPU): windows and scratch, not the layers' weights.
  size_t pool_bytes() const;
  // Pooled workspaces alive now (one per capacity in use).
  int num_pooled_workspaces() const;

  // Collective and idempotent: frees the transport. Every layer built from the group must be
  // destroyed first (kState otherwise). Later layer constructions fail with kDestroyed.
  void destroy();
  bool destroyed() const;

  // The library's own access to the transport and the pool (src/layer/group_pool.h).
  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  explicit EpGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moe_ep
