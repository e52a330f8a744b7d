// The parts of EpComm that need NCCL's device API (nccl_device.h compiles only under nvcc): the
// ncclDevComm with its LSA barriers, the LSA base pointers of a window, and a bounded barrier.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>

#include "kernels/ep/ep_params.h"

namespace moe_ep {

struct EpDevComm;  // owns an ncclDevComm (defined in nccl_dev_comm.cu)

struct EpDevCommInfo {
  int rank = 0, num_ranks = 0, lsa_rank = 0, lsa_size = 0;
};

// ncclDevCommCreate with `lsa_barriers` LSA barriers. On failure returns the NCCL result and
// leaves *out null.
ncclResult_t ep_dev_comm_create(ncclComm_t comm, int lsa_barriers, EpDevComm** out,
                                EpDevCommInfo* info);
ncclResult_t ep_dev_comm_destroy(ncclComm_t comm, EpDevComm* dc);  // deletes dc

// Host copy of every world rank's LSA base pointer of `win` (offset 0): out[r], r < world.
// Synchronizes `stream`.
cudaError_t ep_query_lsa_bases(const EpDevComm* dc, ncclWindow_t win, int world, uint8_t** out,
                               cudaStream_t stream);

// NCCL LSA barrier 0 over all ranks (release on arrive, acquire on wait) with a bounded wait:
// after tp.timeout_ns it records a sticky error (stage kBarrier, the missing peer) in tp.error
// and returns. Only tp.state, tp.error, tp.rank and tp.timeout_ns are used.
cudaError_t ep_launch_lsa_barrier(const EpDevComm* dc, const EpTransport& tp, cudaStream_t stream);

}  // namespace moe_ep
