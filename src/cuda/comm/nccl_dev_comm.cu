// NCCL device-API pieces of EpComm: ncclDevComm lifetime, LSA base pointers, bounded barrier.
#include <nccl.h>
#include <nccl_device.h>

#include "cuda/comm/nccl_dev_comm.h"
#include "kernels/ep/ep_device.cuh"

// The bounded barrier reads the LSA barrier session's inbox and epoch the way NCCL 2.28's
// ncclLsaBarrierSession::wait does; re-check it when moving to another NCCL minor version.
static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0) &&
                  NCCL_VERSION_CODE < NCCL_VERSION(2, 29, 0),
              "ep_lsa_barrier_kernel follows the LSA barrier layout of NCCL 2.28");

namespace moe_ep {

struct EpDevComm {
  ncclDevComm dc;
};

namespace {

__global__ void ep_lsa_bases_kernel(ncclDevComm dc, ncclWindow_t win, int world, uint8_t** out) {
  for (int r = threadIdx.x; r < world; r += blockDim.x) {
    const int lsa_peer = ncclTeamRankToLsa(dc, ncclTeamWorld(dc), r);
    out[r] = static_cast<uint8_t*>(ncclGetLsaPointer(win, 0, lsa_peer));
  }
}

__global__ void ep_lsa_barrier_kernel(ncclDevComm dc, EpTransport tp) {
  ncclCoopCta cta;
  ncclLsaBarrierSession<ncclCoopCta> bar(cta, dc, ncclTeamTagLsa(), 0);
  // Release: every store this rank made before the barrier (window zeroing at setup, the last
  // forward at teardown) is visible to a peer once that peer's wait below sees our arrival.
  bar.arrive(cta, cuda::memory_order_release);
  // Bounded form of bar.wait(cta, acquire): the peer's inbox slot reaches epoch + 1.
  const uint32_t want = bar.epoch + 1;
  for (int i = threadIdx.x; i < bar.team.nRanks - 1; i += blockDim.x) {
    const int peer = i + (bar.team.rank <= i ? 1 : 0);
    cuda::atomic_ref<uint32_t> inbox(*bar.ucInbox(bar.team.rank, peer));
    const uint64_t start = ep::globaltimer_ns();
    while (true) {
      // Acquire: the peer's pre-barrier stores are visible after this load sees its arrival.
      const uint32_t got = inbox.load(cuda::memory_order_acquire);
      if (got - want <= (uint32_t(-1) >> 1)) break;
      const uint64_t waited = ep::globaltimer_ns() - start;
      if (waited > tp.timeout_ns) {
        ep::record_error(tp, EpStage::kBarrier, ncclTeamRankToWorld(dc, bar.team, peer), 0, want,
                         got, waited);
        break;
      }
      __nanosleep(128);
    }
  }
  bar.epoch += 1;
  cta.sync();
}  // the session's destructor stores the epoch for the next barrier

}  // namespace

ncclResult_t ep_dev_comm_create(ncclComm_t comm, int lsa_barriers, EpDevComm** out,
                                EpDevCommInfo* info) {
  *out = nullptr;
  auto* d = new EpDevComm{};
  ncclDevCommRequirements reqs = {};
  reqs.lsaBarrierCount = lsa_barriers;
  const ncclResult_t r = ncclDevCommCreate(comm, &reqs, &d->dc);
  if (r != ncclSuccess) {
    delete d;
    return r;
  }
  info->rank = d->dc.rank;
  info->num_ranks = d->dc.nRanks;
  info->lsa_rank = d->dc.lsaRank;
  info->lsa_size = d->dc.lsaSize;
  *out = d;
  return ncclSuccess;
}

ncclResult_t ep_dev_comm_destroy(ncclComm_t comm, EpDevComm* dc) {
  if (dc == nullptr) return ncclSuccess;
  const ncclResult_t r = ncclDevCommDestroy(comm, &dc->dc);
  delete dc;
  return r;
}

cudaError_t ep_query_lsa_bases(const EpDevComm* dc, ncclWindow_t win, int world, uint8_t** out,
                               cudaStream_t stream) {
  uint8_t** dev = nullptr;
  cudaError_t e = cudaMalloc(&dev, sizeof(uint8_t*) * world);
  if (e != cudaSuccess) return e;
  ep_lsa_bases_kernel<<<1, 64, 0, stream>>>(dc->dc, win, world, dev);
  e = cudaGetLastError();
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(out, dev, sizeof(uint8_t*) * world, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  const cudaError_t f = cudaFree(dev);
  return e != cudaSuccess ? e : f;
}

cudaError_t ep_launch_lsa_barrier(const EpDevComm* dc, const EpTransport& tp, cudaStream_t stream) {
  ep_lsa_barrier_kernel<<<1, 64, 0, stream>>>(dc->dc, tp);
  return cudaGetLastError();
}

}  // namespace moe_ep
