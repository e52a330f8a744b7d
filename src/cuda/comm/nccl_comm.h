// EpComm: the expert-parallel communicator of one rank. It bootstraps NCCL (from a caller's
// ncclComm_t or from a unique id), creates the ncclDevComm with LSA barriers, allocates each
// workspace as an NCCL symmetric window (ncclMemAlloc + ncclCommWindowRegister SYMMETRIC) laid
// out by WorkspaceLayout, resolves every peer's LSA base pointer, and owns the sticky error
// record that the transport kernels (src/kernels/ep) write when a wait times out.
//
// Collective calls (constructor, create_workspace, barrier, allreduce_max, destroy) must be
// made by every rank in the same order. Nothing here runs inside a forward: a forward only
// launches the kernels of src/kernels/ep/ep_launch.h with transport(ws).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/unique_id.h"
#include "common/workspace_layout.h"
#include "kernels/ep/ep_params.h"

namespace moe_ep {

NcclUniqueIdBytes ep_create_unique_id();  // ncclGetUniqueId

// The NCCL release a process runs with against the one the build compiled against
// (NCCL_VERSION_CODE). The device API (ncclDevComm, LSA barriers) is compiled into moe_ep's
// kernels from the headers, and NCCL's structures carry no version, so another release faults
// in the first LSA barrier instead of failing a call (seen: headers 2.28.9, a system 2.28.3
// loaded). ep_nccl_mismatch: empty where the codes agree, else the message naming both releases
// and the library file. ep_check_nccl_runtime throws it (ErrorCode::kUnsupported); the EP
// communicator's constructors call it first.
std::string ep_nccl_mismatch(int runtime_code, int build_code, const std::string& library);
void ep_check_nccl_runtime();
std::string ep_unique_id_to_hex(const NcclUniqueIdBytes& id);
NcclUniqueIdBytes ep_unique_id_from_hex(const std::string& hex);  // throws on a bad string

struct EpCommOptions {
  int device = -1;                     // CUDA ordinal of this rank (-1: the current device)
  int64_t timeout_ms = 30000;          // bound of every wait of a forward
  int64_t warmup_timeout_ms = 120000;  // setup, warmup, barriers and teardown
  int lsa_barriers = 4;                // NCCL LSA barriers of the ncclDevComm (index 0 is ours)
};

// One symmetric window. Peers address it at the same offsets (WorkspaceLayout).
struct EpWorkspace {
  WorkspaceLayout layout;
  uint8_t* base = nullptr;          // this rank's window (device memory)
  size_t bytes = 0;                 // allocated (>= layout.total_bytes)
  ncclWindow_t window = nullptr;    // NCCL window handle (device-API kernels)
  std::vector<uint8_t*> peer_base;  // [world]: LSA pointer of each rank's window
  EpState* state = nullptr;         // epoch counters of this workspace (device memory)
};

class EpComm {
 public:
  // Uses the caller's communicator (not destroyed here). Collective.
  EpComm(ncclComm_t comm, const EpCommOptions& options);
  // Creates its own communicator with ncclCommInitRank. Collective.
  EpComm(const NcclUniqueIdBytes& id, int rank, int world_size, const EpCommOptions& options);
  ~EpComm();  // destroy(), errors swallowed
  EpComm(const EpComm&) = delete;
  EpComm& operator=(const EpComm&) = delete;

  int rank() const;
  int world_size() const;
  int device() const;
  ncclComm_t nccl() const;

  // Allocates, registers and zeroes a window for `layout` (world_size must match), then a
  // barrier so that no peer signals into it before it is zero. Returns its index. Collective.
  int create_workspace(const WorkspaceLayout& layout);
  // Re-makes window `ws` larger so that it holds `layout` too (an EP group's pooled workspace,
  // include/moe_ep/group.h): waits for this rank's work and meets the peers (none still writes
  // into the old window), frees it, then allocates, registers and zeroes the new one (signals
  // and the epoch state start again at zero on every rank) and meets the peers again. Keeps the
  // index. Collective.
  void regrow_workspace(int ws, const WorkspaceLayout& layout);
  // Frees window `ws` (its last user is gone): waits for this rank's work, meets the peers
  // (skipped once a sticky error is set), deregisters and frees it. The index stays taken;
  // workspace(ws) refuses it afterwards. Collective.
  void free_workspace(int ws);
  int num_workspaces() const;
  const EpWorkspace& workspace(int ws) const;

  // Everything a transport kernel needs for workspace `ws`; `warmup` picks the warmup timeout.
  EpTransport transport(int ws, bool warmup = false) const;
  // The same with the offsets of `layout` (one layer's geometry in a pooled window, which must
  // hold it: Error(kInvalidArgument) otherwise).
  EpTransport transport(int ws, const WorkspaceLayout& layout, bool warmup = false) const;
  void set_timeouts(int64_t timeout_ms, int64_t warmup_timeout_ms);
  int64_t timeout_ms(bool warmup) const;

  // The sticky error written by a device wait that timed out, if any (no sync).
  std::optional<EpErrorRecord> error() const;
  // Throws Error(kPeer) naming the peer, stage and call when the sticky error is set; throws
  // Error(kDestroyed) after destroy(). Call it at the start of every host call.
  void check() const;

  // This rank rejected the arguments of the call it was about to make (it launches nothing for
  // it): every workspace's slot of this rank at every peer gets an abandon marker, enqueued on
  // `stream` (null: the legacy default stream) after this rank's earlier calls (on the internal
  // stream when `stream` is capturing),
  // so the peers' waits of that call fail at once naming this rank instead of timing out. The
  // epochs no longer agree afterwards: this rank's error is sticky too (`why` is kept for it).
  // Not collective; never blocks.
  void abandon(const std::string& why, cudaStream_t stream);

  // Host-synchronizing barrier of all ranks over the NCCL LSA barrier, bounded by the warmup
  // timeout; then check(). Collective. Not for the forward path.
  void barrier();
  // The same barrier enqueued on `stream` without a host sync (benchmarks start timed stages
  // with it so both GPUs enter together). Not concurrently with barrier(). Collective.
  void barrier_async(cudaStream_t stream);
  // Max of `value` over ranks (ncclAllReduce on the comm; syncs). Collective.
  int allreduce_max(int value);

  // Collective and idempotent: waits for this rank's work, meets the peers at a barrier (none
  // still writes into our windows), then deregisters and frees every window, the device comm,
  // and the NCCL communicator when this object created it. Throws the first failure.
  void destroy();
  bool destroyed() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Human-readable sticky error ("rank 0: peer rank 1 did not arrive at stage 'dispatch' ...").
std::string ep_error_message(const EpErrorRecord& r);

}  // namespace moe_ep
