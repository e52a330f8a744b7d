// The CPU backend's side of an EP group (src/layer/group_pool.h): the fleet, a channel of its
// own on which pooled workspaces are published (key = the pool's creation index), and pooled
// workspaces in host memory.
#pragma once

#include <cstdint>
#include <memory>

#include "layer/group_pool.h"
#include "reference/cpu_fleet.h"

namespace moe_ep {

class CpuPooledWorkspace final : public PooledWorkspace {
 public:
  size_t bytes() const override { return size; }
  std::shared_ptr<uint8_t> mem;  // shared: a layer that faulted hands a copy to the fleet
  size_t size = 0;
};

class CpuGroupTransport final : public GroupTransport {
 public:
  explicit CpuGroupTransport(const Bootstrap& boot);
  std::unique_ptr<PooledWorkspace> make_workspace(int capacity, int key,
                                                  const PoolNeeds& needs) override;
  void grow_workspace(PooledWorkspace& ws, const PoolNeeds& needs) override;
  void release_workspace(PooledWorkspace&) noexcept override {}
  void destroy() override {}

  const std::shared_ptr<CpuFleet>& fleet() const { return fleet_; }
  int pool_channel() const { return channel_; }  // where pooled workspaces are published

 private:
  void allocate(CpuPooledWorkspace& ws, size_t bytes);  // then publish and meet the peers

  Bootstrap boot_;
  std::shared_ptr<CpuFleet> fleet_;
  int channel_ = 0;
  int64_t seq_ = 0;
};

}  // namespace moe_ep
