#include "reference/cpu_fleet.h"

#include <chrono>

#include "moe_ep/config.h"
#include "moe_ep/status.h"

namespace moe_ep {

std::shared_ptr<CpuFleet> make_cpu_fleet(int world_size) {
  if (world_size < 1)
    throw Error(ErrorCode::kInvalidArgument,
                "make_cpu_fleet: world size " + std::to_string(world_size) + " must be >= 1");
  return std::make_shared<CpuFleet>(world_size);
}

CpuFleet::CpuFleet(int world_size)
    : world_size_(world_size),
      arrived_(world_size, 0),
      abandoned_seq_(world_size, -1),
      abandon_why_(world_size) {}

void CpuFleet::barrier(int rank, uint64_t ticket, int64_t call_seq, const char* stage,
                       int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  if (arrived_[rank] < ticket) arrived_[rank] = ticket;
  cv_.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int missing = -1;
    for (int r = 0; r < world_size_; ++r) {
      if (r != rank && abandoned_seq_[r] == call_seq && call_seq >= 0)
        throw Error(ErrorCode::kPeer, "moe_ep: rank " + std::to_string(r) +
                                          " abandoned the call at stage '" + stage +
                                          "': " + abandon_why_[r]);
      if (missing < 0 && arrived_[r] < ticket) missing = r;
    }
    if (missing < 0) return;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      bool all = true;
      for (int r = 0; r < world_size_; ++r) all = all && arrived_[r] >= ticket;
      if (all) return;
      throw Error(ErrorCode::kPeer, "moe_ep: rank " + std::to_string(rank) + " timed out after " +
                                        std::to_string(timeout_ms) + " ms at stage '" + stage +
                                        "' waiting for peer rank " + std::to_string(missing));
    }
  }
}

void CpuFleet::abandon(int rank, int64_t call_seq, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  abandoned_seq_[rank] = call_seq;
  abandon_why_[rank] = why;
  cv_.notify_all();
}

void CpuFleet::publish(int rank, int key, void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  windows_[{rank, key}] = ptr;
}

void* CpuFleet::peer_ptr(int peer, int key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = windows_.find({peer, key});
  if (it == windows_.end())
    throw Error(ErrorCode::kPeer, "moe_ep: rank " + std::to_string(peer) +
                                      " has not published window " + std::to_string(key));
  return it->second;
}

std::vector<int64_t> CpuFleet::allgather(int rank, int64_t value, uint64_t ticket,
                                         int64_t call_seq, const char* stage,
                                         int64_t timeout_ms) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = gathered_[ticket];
    if (slot.empty()) slot.assign(world_size_, 0);
    slot[rank] = value;
  }
  barrier(rank, ticket, call_seq, stage, timeout_ms);
  std::vector<int64_t> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = gathered_[ticket];
  }
  // Everyone has read once every rank passed the next barrier; entries are small and keyed by
  // ticket, so old ones are dropped lazily here.
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = gathered_.begin(); it != gathered_.end() && it->first + 64 < ticket;)
      it = gathered_.erase(it);
  }
  return out;
}

}  // namespace moe_ep
