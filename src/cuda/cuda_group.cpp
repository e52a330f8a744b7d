#include "cuda/cuda_group.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace moe_ep {
namespace cuda {

CudaGroupTransport::CudaGroupTransport(const Bootstrap& boot)
    : world_(boot.world_size), rank_(boot.rank), device_(boot.device) {
  check(cudaSetDevice(boot.device), "cudaSetDevice(" + std::to_string(boot.device) + ")");
  if (world_ == 1) return;
  EpCommOptions o;
  o.device = boot.device;
  o.timeout_ms = boot.timeout_ms;
  o.warmup_timeout_ms = boot.warmup_timeout_ms;
  if (boot.nccl_comm) {
    comm_ = std::make_unique<EpComm>(static_cast<ncclComm_t>(boot.nccl_comm), o);
  } else if (boot.nccl_unique_id) {
    NcclUniqueIdBytes id;
    std::memcpy(id.data(), boot.nccl_unique_id->data(), id.size());
    comm_ = std::make_unique<EpComm>(id, boot.rank, boot.world_size, o);
  } else {
    throw Error(ErrorCode::kInvalidArgument,
                "moe_ep cuda: W = " + std::to_string(world_) +
                    " needs Bootstrap::nccl_comm or Bootstrap::nccl_unique_id");
  }
  if (comm_->rank() != rank_ || comm_->world_size() != world_)
    throw Error(ErrorCode::kInvalidArgument,
                "moe_ep cuda: the NCCL communicator is rank " + std::to_string(comm_->rank()) +
                    " of " + std::to_string(comm_->world_size()) + ", the bootstrap says rank " +
                    std::to_string(rank_) + " of " + std::to_string(world_));
}

CudaGroupTransport::~CudaGroupTransport() {
  try {
    if (comm_) comm_->destroy();
  } catch (...) {
  }
}

void CudaGroupTransport::select_device() const {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != device_)
    check(cudaSetDevice(device_), "cudaSetDevice");
}

std::unique_ptr<PooledWorkspace> CudaGroupTransport::make_workspace(int capacity, int key,
                                                                    const PoolNeeds& needs) {
  select_device();
  auto ws = std::make_unique<CudaPooledWorkspace>();
  ws->capacity = capacity;
  ws->key = key;
  if (comm_) {
    ws->ep_index = comm_->create_workspace(needs.window);  // collective, same order everywhere
    ws->window_alloc_bytes = comm_->workspace(ws->ep_index).bytes;
  }
  ws->mem.allocate(needs.scratch_bytes, "a pooled workspace");
  return ws;
}

void CudaGroupTransport::grow_workspace(PooledWorkspace& pooled, const PoolNeeds& needs) {
  select_device();
  auto& ws = static_cast<CudaPooledWorkspace&>(pooled);
  // Every forward that used the old memory is done before it is freed.
  check(cudaDeviceSynchronize(), "synchronize before re-making a pooled workspace");
  if (comm_ && needs.window.total_bytes > ws.window_bytes) {
    comm_->regrow_workspace(ws.ep_index, needs.window);  // collective
    ws.window_alloc_bytes = comm_->workspace(ws.ep_index).bytes;
  }
  if (needs.scratch_bytes > ws.scratch_bytes)
    ws.mem.allocate(needs.scratch_bytes, "a pooled workspace");
}

void CudaGroupTransport::release_workspace(PooledWorkspace& pooled) noexcept {
  auto& ws = static_cast<CudaPooledWorkspace&>(pooled);
  try {
    select_device();
    cudaDeviceSynchronize();
    ws.mem.release();
    if (comm_ && ws.ep_index >= 0) comm_->free_workspace(ws.ep_index);  // collective
  } catch (...) {
    // The window goes with the communicator at the group's destroy.
  }
  ws.window_alloc_bytes = 0;
}

void CudaGroupTransport::destroy() {
  if (!comm_) return;
  select_device();
  comm_->destroy();  // collective: barrier with the peers, frees the windows and the comm
}

}  // namespace cuda

std::shared_ptr<GroupTransport> make_cuda_group_transport(const Bootstrap& boot) {
  return std::make_shared<cuda::CudaGroupTransport>(boot);
}

}  // namespace moe_ep
