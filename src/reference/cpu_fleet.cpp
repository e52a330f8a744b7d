#include "reference/cpu_fleet.h"

#include <chrono>
#include <memory>

#include "moe_ep/config.h"
#include "moe_ep/status.h"

namespace moe_ep {

std::shared_ptr<CpuFleet> make_cpu_fleet(int world_size) {
  if (world_size < 1)
    throw Error(ErrorCode::kInvalidArgument,
                "make_cpu_fleet: world size " + std::to_string(world_size) + " must be >= 1");
  return std::make_shared<CpuFleet>(world_size);
}

CpuFleet::CpuFleet(int world_size) : world_size_(world_size), opened_(world_size, 0) {}

CpuFleet::Channel& CpuFleet::channel(int c) {
  auto it = channels_.find(c);
  if (it == channels_.end()) {
    Channel ch;
    ch.arrived.assign(world_size_, 0);
    ch.abandoned_seq.assign(world_size_, -1);
    ch.why.assign(world_size_, "");
    it = channels_.emplace(c, std::move(ch)).first;
  }
  return it->second;
}

int CpuFleet::open_channel(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  const int c = opened_[rank]++;
  channel(c);
  return c;
}

void CpuFleet::barrier(int c, int rank, uint64_t ticket, int64_t seq, const char* stage,
                       int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  Channel& ch = channel(c);
  if (ch.arrived[rank] < ticket) ch.arrived[rank] = ticket;
  cv_.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int missing = -1;
    for (int r = 0; r < world_size_; ++r) {
      if (r != rank && ch.abandoned_seq[r] == seq)
        throw Error(ErrorCode::kPeer, "moe_ep: peer rank " + std::to_string(r) +
                                          " abandoned the call (stage '" + stage +
                                          "'): " + ch.why[r]);
      if (missing < 0 && ch.arrived[r] < ticket) missing = r;
    }
    if (missing < 0) return;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      missing = -1;
      for (int r = 0; r < world_size_ && missing < 0; ++r)
        if (ch.arrived[r] < ticket) missing = r;
      if (missing < 0) return;
      throw Error(ErrorCode::kPeer, "moe_ep: rank " + std::to_string(rank) + " timed out after " +
                                        std::to_string(timeout_ms) + " ms at stage '" + stage +
                                        "' waiting for peer rank " + std::to_string(missing));
    }
  }
}

void CpuFleet::abandon(int c, int rank, int64_t seq, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  Channel& ch = channel(c);
  ch.abandoned_seq[rank] = seq;
  ch.why[rank] = why;
  cv_.notify_all();
}

void CpuFleet::publish(int c, int rank, int key, void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  channel(c).windows[{rank, key}] = ptr;
}

void CpuFleet::retain(std::shared_ptr<void> memory) {
  std::lock_guard<std::mutex> lock(mu_);
  retained_.push_back(std::move(memory));
}

void* CpuFleet::peer_ptr(int c, int peer, int key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& w = channel(c).windows;
  auto it = w.find({peer, key});
  if (it == w.end())
    throw Error(ErrorCode::kPeer, "moe_ep: rank " + std::to_string(peer) +
                                      " has not published workspace " + std::to_string(key));
  return it->second;
}

std::vector<int64_t> CpuFleet::allgather(int c, int rank, int64_t value, uint64_t ticket,
                                         int64_t seq, const char* stage, int64_t timeout_ms) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = channel(c).gathered[ticket];
    if (slot.empty()) slot.assign(world_size_, 0);
    slot[rank] = value;
  }
  barrier(c, rank, ticket, seq, stage, timeout_ms);
  std::lock_guard<std::mutex> lock(mu_);
  auto& g = channel(c).gathered;
  std::vector<int64_t> out = g[ticket];
  // Entries far behind every rank are no longer read by anyone.
  while (!g.empty() && g.begin()->first + 64 < ticket) g.erase(g.begin());
  return out;
}

}  // namespace moe_ep
