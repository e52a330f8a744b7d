// An in-process fleet of W CPU ranks (one thread each) that behaves like the GPUs' transport:
// each rank registers its workspace windows, peers write into them through plain pointers (the
// LSA pointers of the GPU path), and ranks meet at bounded barriers. Barriers are monotonic
// tickets, so a rank that fails a call can tell its peers without any reset.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace moe_ep {

class CpuFleet {
 public:
  explicit CpuFleet(int world_size);
  int world_size() const { return world_size_; }

  // Waits until every rank reached `ticket` (tickets only grow). Throws Error(kPeer) naming the
  // first missing peer and `stage` after timeout_ms, or at once when a peer abandoned the call
  // with sequence number `call_seq`.
  void barrier(int rank, uint64_t ticket, int64_t call_seq, const char* stage, int64_t timeout_ms);
  // This rank gives up call `call_seq` (its input was rejected, or it failed): peers waiting in
  // that call stop waiting and report it.
  void abandon(int rank, int64_t call_seq, const std::string& why);

  // Symmetric windows: rank publishes `ptr` for key; peer_ptr reads a peer's pointer.
  void publish(int rank, int key, void* ptr);
  void* peer_ptr(int peer, int key);

  // Small all-gather of one int64 per rank, used for collective decisions (construction,
  // workspace selection). Takes part in a barrier with the given ticket.
  std::vector<int64_t> allgather(int rank, int64_t value, uint64_t ticket, int64_t call_seq,
                                 const char* stage, int64_t timeout_ms);

 private:
  int world_size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> arrived_;        // per rank: highest ticket reached
  std::vector<int64_t> abandoned_seq_;   // per rank: last call it abandoned (-1: none)
  std::vector<std::string> abandon_why_;
  std::map<std::pair<int, int>, void*> windows_;
  std::map<uint64_t, std::vector<int64_t>> gathered_;
};

}  // namespace moe_ep
