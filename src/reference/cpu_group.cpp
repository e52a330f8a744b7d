#include "reference/cpu_group.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "moe_ep/status.h"

namespace moe_ep {

CpuGroupTransport::CpuGroupTransport(const Bootstrap& boot) : boot_(boot), fleet_(boot.cpu_fleet) {
  if (!fleet_) {
    if (boot.world_size != 1)
      throw Error(ErrorCode::kInvalidArgument,
                  "the CPU backend with W = " + std::to_string(boot.world_size) +
                      " > 1 needs Bootstrap::cpu_fleet (make_cpu_fleet(W))");
    fleet_ = make_cpu_fleet(1);
  }
  if (fleet_->world_size() != boot.world_size)
    throw Error(ErrorCode::kInvalidArgument,
                "cpu_fleet has world size " + std::to_string(fleet_->world_size()) +
                    ", Bootstrap says W = " + std::to_string(boot.world_size));
  channel_ = fleet_->open_channel(boot.rank);
}

void CpuGroupTransport::allocate(CpuPooledWorkspace& ws, size_t bytes) {
  const size_t rounded = std::max<size_t>(256, (bytes + 255) / 256 * 256);
  std::shared_ptr<uint8_t> mem(static_cast<uint8_t*>(std::aligned_alloc(256, rounded)), std::free);
  if (!mem)
    throw Error(ErrorCode::kBackend, "out of host memory (" + std::to_string(bytes) + " B)");
  std::memset(mem.get(), 0, rounded);
  fleet_->publish(channel_, boot_.rank, ws.key, mem.get());
  // Collective: peers address the new memory only after every rank has published its own.
  ++seq_;
  fleet_->barrier(channel_, boot_.rank, uint64_t(seq_), seq_, "pool workspace",
                  boot_.warmup_timeout_ms);
  ws.mem = std::move(mem);  // frees the old memory: no peer addresses it any more
  ws.size = bytes;
}

std::unique_ptr<PooledWorkspace> CpuGroupTransport::make_workspace(int capacity, int key,
                                                                   const PoolNeeds& needs) {
  auto ws = std::make_unique<CpuPooledWorkspace>();
  ws->capacity = capacity;
  ws->key = key;
  allocate(*ws, needs.window.total_bytes);
  return ws;
}

void CpuGroupTransport::grow_workspace(PooledWorkspace& ws, const PoolNeeds& needs) {
  auto& cpu = static_cast<CpuPooledWorkspace&>(ws);
  allocate(cpu, std::max(cpu.size, needs.window.total_bytes));
}

std::shared_ptr<GroupTransport> make_cpu_group_transport(const Bootstrap& boot) {
  return std::make_shared<CpuGroupTransport>(boot);
}

}  // namespace moe_ep
