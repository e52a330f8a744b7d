// The CUDA backend's side of an EP group (src/layer/group_pool.h): the EP communicator that every
// layer of the group shares (W > 1), and pooled workspaces in device memory: at W = 1 one
// allocation holding the largest window layout and scratch of its layers; at W > 1 a symmetric
// window of the communicator (registered once per pooled workspace) and a scratch allocation.
#pragma once

#include <memory>

#include "cuda/comm/nccl_comm.h"
#include "cuda/cuda_backend.h"
#include "layer/group_pool.h"

namespace moe_ep::cuda {

class CudaPooledWorkspace final : public PooledWorkspace {
 public:
  ~CudaPooledWorkspace() override { mem.release(); }
  size_t bytes() const override { return mem.bytes + window_alloc_bytes; }
  // W = 1: window layout + scratch (ScratchLayout with base = the layout's bytes); W > 1: scratch.
  DeviceBuffer mem;
  int ep_index = -1;              // W > 1: the communicator's window
  size_t window_alloc_bytes = 0;  // W > 1: the window as allocated
};

class CudaGroupTransport final : public GroupTransport {
 public:
  explicit CudaGroupTransport(const Bootstrap& boot);  // collective at W > 1 (the communicator)
  ~CudaGroupTransport() override;
  std::unique_ptr<PooledWorkspace> make_workspace(int capacity, int key,
                                                  const PoolNeeds& needs) override;
  void grow_workspace(PooledWorkspace& ws, const PoolNeeds& needs) override;
  void release_workspace(PooledWorkspace& ws) noexcept override;
  void destroy() override;

  EpComm* comm() const { return comm_.get(); }  // null at W = 1
  int device() const { return device_; }

 private:
  void select_device() const;

  int world_ = 1, rank_ = 0, device_ = 0;
  std::unique_ptr<EpComm> comm_;
};

}  // namespace moe_ep::cuda
