// The EP group's internals (include/moe_ep/group.h): the backend's transport and the workspace
// pool. A pooled workspace is keyed by capacity and holds the largest window and scratch its
// layers asked for; layers hold it by shared_ptr, the group by weak_ptr, so the last layer that
// uses it frees it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "common/workspace_layout.h"
#include "moe_ep/group.h"

namespace moe_ep {

// What one layer needs of the pooled workspace of a capacity: its window layout (peers address
// it) and the bytes of its local scratch (the CUDA backend's ScratchLayout; none on the CPU).
struct PoolNeeds {
  WorkspaceLayout window;
  size_t scratch_bytes = 0;
};

// The memory of one pooled workspace; each backend's transport derives its own.
class PooledWorkspace {
 public:
  virtual ~PooledWorkspace() = default;
  virtual size_t bytes() const = 0;  // window + scratch, as allocated

  int capacity = 0;
  int key = 0;               // the group's creation index: equal on every rank
  size_t window_bytes = 0;   // the largest window layout of its layers so far
  size_t scratch_bytes = 0;  // the largest scratch of its layers so far
  uint64_t generation = 0;   // + 1 each time it is re-made larger (derived state goes stale)
};

// A backend's side of the group: the transport that every layer of the group shares, and how
// pooled workspaces are made. All calls but the destructor are collective.
class GroupTransport {
 public:
  virtual ~GroupTransport() = default;
  // A new pooled workspace holding `needs`.
  virtual std::unique_ptr<PooledWorkspace> make_workspace(int capacity, int key,
                                                          const PoolNeeds& needs) = 0;
  // Re-makes `ws` to hold `needs` as well as what it held (the old memory is freed).
  virtual void grow_workspace(PooledWorkspace& ws, const PoolNeeds& needs) = 0;
  // The last layer that used `ws` is gone (before its memory is freed; never throws).
  virtual void release_workspace(PooledWorkspace& ws) noexcept = 0;
  virtual void destroy() = 0;
};

struct EpGroup::Impl {
  Bootstrap boot;  // backend resolved
  std::shared_ptr<GroupTransport> transport;
  std::map<int, std::weak_ptr<PooledWorkspace>> pools;  // by capacity
  int next_key = 0;
  int live_layers = 0;  // layers built from the group and not destroyed
  bool destroyed = false;

  // The pooled workspace of `capacity`, made or re-made larger so that it holds `needs`.
  // Collective (every rank asks for the same capacities and needs in the same order).
  std::shared_ptr<PooledWorkspace> acquire(int capacity, const PoolNeeds& needs);
  void check_live(const char* what) const;
};

// Backend transports (src/reference/cpu_group.cpp, src/cuda/cuda_group.cpp). The CUDA one reports
// "not built" in a build without nvcc.
std::shared_ptr<GroupTransport> make_cpu_group_transport(const Bootstrap& boot);
std::shared_ptr<GroupTransport> make_cuda_group_transport(const Bootstrap& boot);

}  // namespace moe_ep
