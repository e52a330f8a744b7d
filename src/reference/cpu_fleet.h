// An in-process fleet of W CPU ranks (one thread each) that behaves like the GPUs' transport:
// each rank publishes its workspace windows, peers write into them through plain pointers (the
// LSA pointers of the GPU path), and ranks meet at bounded barriers. Barriers are monotonic
// tickets, so a rank that gives up a call can tell its peers without any reset. Several layers
// may share one fleet: each opens its own channel (in the same order on every rank).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace moe_ep {

class CpuFleet {
 public:
  explicit CpuFleet(int world_size);
  int world_size() const { return world_size_; }

  // The k-th channel opened by a rank is channel k: ranks that open in the same order agree.
  int open_channel(int rank);

  // Waits until every rank of the channel reached `ticket` (tickets only grow). Throws
  // Error(kPeer) naming the first missing peer and `stage` after timeout_ms, or at once when a
  // peer abandoned the collective op `seq`.
  void barrier(int channel, int rank, uint64_t ticket, int64_t seq, const char* stage,
               int64_t timeout_ms);
  // This rank gives up collective op `seq` (e.g. its input was rejected): peers waiting in it
  // stop waiting and report why.
  void abandon(int channel, int rank, int64_t seq, const std::string& why);

  // Symmetric windows: a rank publishes `ptr` under `key`; peers look it up.
  void publish(int channel, int rank, int key, void* ptr);
  void* peer_ptr(int channel, int peer, int key);

  // Memory a rank gives up while peers may still hold pointers into it (its windows, at a
  // destroy after a fault): freed with the fleet, which outlives every rank that can reach it.
  void retain(std::shared_ptr<void> memory);

  // All-gather of one int64 per rank (a barrier at `ticket`).
  std::vector<int64_t> allgather(int channel, int rank, int64_t value, uint64_t ticket, int64_t seq,
                                 const char* stage, int64_t timeout_ms);

 private:
  struct Channel {
    std::vector<uint64_t> arrived;       // per rank: highest ticket reached
    std::vector<int64_t> abandoned_seq;  // per rank: last op it abandoned (-1: none)
    std::vector<std::string> why;
    std::map<std::pair<int, int>, void*> windows;  // (rank, key)
    std::map<uint64_t, std::vector<int64_t>> gathered;
  };
  Channel& channel(int c);

  int world_size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> opened_;  // per rank: channels opened so far
  std::map<int, Channel> channels_;
  std::vector<std::shared_ptr<void>> retained_;
};

}  // namespace moe_ep
