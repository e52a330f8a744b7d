// An NCCL unique id as plain bytes, and its hand-over from rank 0 to the other ranks of forked
// processes (the moe-ep command, bench_layer --ep, the multi-GPU tests). Plain C++: the
// CUDA backend's communicator implements exchange(); it is declared here so that the programs
// need no NCCL header.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace moe_ep {

using NcclUniqueIdBytes = std::array<char, 128>;  // the bytes of an ncclUniqueId

// Through memory the processes share (an anonymous MAP_SHARED mapping; zeroed memory is an empty
// slot): rank 0 creates and publishes the id; the others wait for it, at most timeout_ms (Error
// kPeer after that).
struct SharedUniqueId {
  std::atomic<int> ready;
  NcclUniqueIdBytes id;
  NcclUniqueIdBytes exchange(int rank, int64_t timeout_ms = 120000);
};

}  // namespace moe_ep
