// Parameters of the expert-parallel transport kernels (dispatch, wait, combine), shared by host
// and device. Raw pointers only: no NCCL device types, so the CUDA backend can embed these in
// its own kernels. docs/protocol.md describes the protocol these fields drive.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/workspace_layout.h"

namespace moe_ep {

// Ranks one transport addresses: the owner masks of dispatch are 64-bit.
constexpr int kEpMaxRanks = 64;
constexpr int kEpMaxTopK = 16;

// The stage a wait belongs to (reported by the sticky error).
enum class EpStage : int32_t {
  kNone = 0,
  kDispatch = 1,  // an owner waited for a source's dispatch signal
  kCombine = 2,   // a source waited for an owner's combine signal
  kBarrier = 3,   // setup / teardown barrier (NCCL LSA barrier)
  kAbandon = 4,   // this rank rejected a call's arguments and told its peers (no wait)
};

inline const char* ep_stage_name(EpStage s) {
  switch (s) {
    case EpStage::kDispatch:
      return "dispatch";
    case EpStage::kCombine:
      return "combine";
    case EpStage::kBarrier:
      return "barrier";
    case EpStage::kAbandon:
      return "abandon";
    default:
      return "none";
  }
}

// Why a wait failed (EpErrorRecord::cause).
enum class EpErrorCause : uint32_t {
  kWait = 0,               // the peer never arrived (timeout) or abandoned the call
  kWorkspaceMismatch = 1,  // the peer runs this call with another workspace (announce slots)
};

// The sticky error, in host-mapped pinned memory: the device writes it once (the first wait
// that times out), the host reads it at the next call without a sync. `flag` is written last.
struct EpErrorRecord {
  uint32_t flag;      // 0: no error; 1: the fields below are valid
  int32_t stage;      // EpStage
  int32_t peer;       // the rank that never arrived
  int32_t rank;       // the rank that waited
  uint64_t call;      // the workspace's call number (epoch) of the wait; for a workspace
                      // mismatch the communicator's forward call number
  uint64_t expected;  // signal value waited for
  uint64_t observed;  // last value seen (mismatch: the peer's announce word)
  uint64_t waited_ns;
  uint32_t cause;          // EpErrorCause
  int32_t workspace;       // this rank's workspace of the failed wait (-1: none, a barrier)
  int32_t peer_workspace;  // mismatch: the workspace the peer announced for the same call
  int32_t pad;
};

// Per-workspace device state (plain device memory of this rank, not symmetric). Zeroed at
// workspace creation; afterwards only the kernels touch it, so graph replays keep counting.
struct EpState {
  uint64_t call;              // forward calls started on this workspace (set by dispatch)
  uint32_t dispatch_arrived;  // blocks of the running dispatch that finished their stores
  uint32_t combine_arrived;   // same for combine
  uint32_t error;             // device mirror of EpErrorRecord::flag (cheap to poll)
  uint32_t pad[3];
  // Rows of the running dispatch taken so far at each owner (unordered rows; reset to 0 by the
  // dispatch's last block when it publishes them as recv_count).
  uint32_t rows[kEpMaxRanks];
};

// Signal values are epochs, never reset: call n (n >= 1) publishes 2n-1 after its dispatch
// stores and 2n after its combine stores. A peer's slot only grows.
MOE_EP_HD uint64_t ep_dispatch_signal(uint64_t call) { return 2 * call - 1; }
MOE_EP_HD uint64_t ep_combine_signal(uint64_t call) { return 2 * call; }

// A rank that rejects a call's arguments (it never launches that call) writes
// kEpAbandonBit | e into its slot at every rank, e = the last epoch it published. Slots are
// written with an atomic max, so the marker stays above every epoch; a waiter whose target is
// above e learns at once that the peer abandoned the call (instead of timing out).
constexpr uint64_t kEpAbandonBit = 1ull << 63;

// Workspace announce (docs/protocol.md §3): with its dispatch signal of the communicator's
// forward call c (counted over every workspace), a rank writes (c << 16) | workspace into its
// slot of every rank's announce window (one small symmetric window per communicator, not per
// workspace, so it is seen whichever workspace the reader runs). A dispatch wait that finds the
// peer's announce of its own call c naming another workspace knows the peer will never signal in
// this workspace: it records kWorkspaceMismatch at once instead of timing out.
constexpr int kEpAnnounceWsBits = 16;
MOE_EP_HD uint64_t ep_announce(uint64_t call, int workspace) {
  return call << kEpAnnounceWsBits | (uint64_t(uint32_t(workspace)) & 0xffffu);
}
MOE_EP_HD uint64_t ep_announce_call(uint64_t a) { return a >> kEpAnnounceWsBits; }
MOE_EP_HD int ep_announce_workspace(uint64_t a) { return int(a & 0xffffu); }

// What every transport kernel needs: the workspace of this rank and its peers.
struct EpTransport {
  WorkspaceLayout layout;
  int rank = 0;
  int world_size = 1;
  uint8_t* peer_base[kEpMaxRanks] = {};  // each rank's window (LSA pointer); [rank] is local
  EpState* state = nullptr;              // this workspace's state (device memory)
  EpErrorRecord* error = nullptr;        // host-mapped sticky error (device pointer)
  uint64_t timeout_ns = 0;               // bound of every wait (%globaltimer)
  // Workspace check (null / -1: off, e.g. the barrier's transport). `workspace` is this
  // workspace's index in its EpComm; announce[r] is rank r's announce window ([W] uint64, LSA
  // pointer); `calls` the communicator's forward counter (device memory, set by dispatch).
  int workspace = -1;
  uint64_t* calls = nullptr;
  uint64_t* announce[kEpMaxRanks] = {};
};

// dispatch: every source token row goes once to each owner rank that holds one of its experts.
// Row order at an owner: in the order tiles of tokens take rows (the metadata row names the
// token; nothing downstream depends on the order), or with ordered_rows the source's tokens in
// increasing order.
struct EpDispatchParams {
  EpTransport tp;
  const uint8_t* act = nullptr;             // [T][act_stride] bytes; each row act_row_bytes long
  int64_t act_stride = 0;                   // bytes between rows, multiple of 16
  const int32_t* topk_ids = nullptr;        // [T][K], each in [0, E) or -1
  const float* topk_weights = nullptr;      // [T][K]
  int num_tokens = 0;                       // T, or the upper bound when num_tokens_dev is set
  const int32_t* num_tokens_dev = nullptr;  // optional device count (graph replay), clamped
  int num_local_experts = 1;                // E_local: owner of expert e is e / E_local
  int num_blocks = 0;                       // grid size (0: a default)
  int num_threads = 512;
  // The last block to finish also waits for every source's dispatch signal (what
  // launch_ep_wait(kDispatch) does), saving a launch.
  bool fused_wait = false;
  // Rows in increasing token order (a count pass before the copies) instead of per-tile atomics.
  bool ordered_rows = false;
  // A grid of one block (decode sizes) keeps the rows per owner in shared memory and publishes
  // with one system fence, no global atomics (grid_arrive_last's `solo`); false: the general path.
  bool solo = true;
  // The caller's ids, weights and count are complete when this grid starts (its predecessor in
  // the stream is a plain launch that started after them, as the layer's quantize kernel): they
  // are read before the wait for the predecessor's grid. False: after it (any predecessor).
  bool early_inputs = false;
};

// combine: every (source, received row, local slot) result row goes back to the source's
// combine area at row token*K + slot.
struct EpCombineParams {
  EpTransport tp;
  const uint16_t* y = nullptr;  // bf16 result rows of this owner
  int64_t y_stride = 0;         // elements between rows of y (>= H, multiple of 8)
  // Optional [W][capacity][K]: row of y holding (source, received row, slot). Null: y is dense
  // in receive order, row (src * capacity + row) * K + slot.
  const int32_t* y_index = nullptr;
  int num_local_experts = 1;
  int num_blocks = 0;
  int num_threads = 512;
  bool fused_wait = false;  // the last block also waits for every owner's combine signal
  // Fused combine (docs/protocol.md §8): the expert GEMM (fc2) of this call already stored every
  // result row into the sources' combine areas, in an earlier kernel of this stream. The kernel
  // moves nothing (y is unused, may be null): it fences, publishes epoch 2n to every source and,
  // with fused_wait, waits for every owner, exactly as after its own copies. One block suffices.
  bool signal_only = false;
  bool solo = true;  // one block: publish with one system fence (as EpDispatchParams::solo)
};

// wait: this rank waits for every peer's signal of the current call and stage.
struct EpWaitParams {
  EpTransport tp;
  EpStage stage = EpStage::kDispatch;
};

// Reference finalize over the combine area (tests): out[t] = bf16(sum_k c[t,k] * y[t,k]) in
// slot order, c = weights or 1.
struct EpFinalizeParams {
  EpTransport tp;
  const int32_t* topk_ids = nullptr;
  const float* topk_weights = nullptr;  // null: c = 1
  uint16_t* out = nullptr;              // [T][H] bf16
  int num_tokens = 0;
  const int32_t* num_tokens_dev = nullptr;
};

}  // namespace moe_ep
