// EpGroup: the transport and the workspace pool that the layers of one EP group share.
#include <algorithm>
#include <string>

#include "layer/group_pool.h"
#include "moe_ep/status.h"

namespace moe_ep {

std::shared_ptr<EpGroup> EpGroup::create(const Bootstrap& bootstrap) {
  auto impl = std::make_unique<Impl>();
  impl->boot = bootstrap;
  if (bootstrap.world_size < 1)
    throw Error(ErrorCode::kInvalidArgument,
                "EpGroup: W = " + std::to_string(bootstrap.world_size) + " must be >= 1");
  if (bootstrap.rank < 0 || bootstrap.rank >= bootstrap.world_size)
    throw Error(ErrorCode::kInvalidArgument,
                "EpGroup: rank " + std::to_string(bootstrap.rank) +
                    " is not in [0, W = " + std::to_string(bootstrap.world_size) + ")");
  if (bootstrap.timeout_ms <= 0 || bootstrap.warmup_timeout_ms <= 0)
    throw Error(ErrorCode::kInvalidArgument, "EpGroup: timeouts must be > 0 ms (timeout_ms " +
                                                 std::to_string(bootstrap.timeout_ms) +
                                                 ", warmup_timeout_ms " +
                                                 std::to_string(bootstrap.warmup_timeout_ms) + ")");
  impl->boot.backend = resolve_backend(bootstrap.backend);
  impl->transport = impl->boot.backend == Backend::kCUDA ? make_cuda_group_transport(impl->boot)
                                                         : make_cpu_group_transport(impl->boot);
  return std::shared_ptr<EpGroup>(new EpGroup(std::move(impl)));
}

EpGroup::EpGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EpGroup::~EpGroup() {
  try {
    destroy();
  } catch (...) {
  }
}

int EpGroup::world_size() const { return impl_->boot.world_size; }
int EpGroup::rank() const { return impl_->boot.rank; }
Backend EpGroup::backend() const { return impl_->boot.backend; }
int EpGroup::device() const { return impl_->boot.device; }
const Bootstrap& EpGroup::bootstrap() const { return impl_->boot; }
bool EpGroup::destroyed() const { return impl_->destroyed; }

size_t EpGroup::pool_bytes() const {
  size_t total = 0;
  for (const auto& [capacity, weak] : impl_->pools)
    if (auto ws = weak.lock()) total += ws->bytes();
  return total;
}

int EpGroup::num_pooled_workspaces() const {
  int n = 0;
  for (const auto& [capacity, weak] : impl_->pools) n += weak.expired() ? 0 : 1;
  return n;
}

void EpGroup::destroy() {
  Impl& m = *impl_;
  if (m.destroyed) return;
  if (m.live_layers > 0)
    throw Error(ErrorCode::kState, "EpGroup::destroy: " + std::to_string(m.live_layers) +
                                       " layer(s) built from the group are still alive; destroy "
                                       "them first");
  m.destroyed = true;
  m.pools.clear();
  m.transport->destroy();
}

void EpGroup::Impl::check_live(const char* what) const {
  if (destroyed)
    throw Error(ErrorCode::kDestroyed,
                std::string("moe_ep: ") + what + " on an EP group after its destroy()");
}

std::shared_ptr<PooledWorkspace> EpGroup::Impl::acquire(int capacity, const PoolNeeds& needs) {
  check_live("a workspace");
  auto it = pools.find(capacity);
  if (it != pools.end()) {
    if (auto ws = it->second.lock()) {
      if (needs.window.total_bytes > ws->window_bytes || needs.scratch_bytes > ws->scratch_bytes) {
        transport->grow_workspace(*ws, needs);
        ws->window_bytes = std::max(ws->window_bytes, needs.window.total_bytes);
        ws->scratch_bytes = std::max(ws->scratch_bytes, needs.scratch_bytes);
        ++ws->generation;
      }
      return ws;
    }
  }
  std::unique_ptr<PooledWorkspace> made = transport->make_workspace(capacity, next_key, needs);
  made->capacity = capacity;
  made->key = next_key++;
  made->window_bytes = needs.window.total_bytes;
  made->scratch_bytes = needs.scratch_bytes;
  // The deleter keeps the transport alive: the last layer may outlive the group's destroy().
  std::shared_ptr<GroupTransport> t = transport;
  std::shared_ptr<PooledWorkspace> ws(made.release(), [t](PooledWorkspace* p) {
    t->release_workspace(*p);
    delete p;
  });
  pools[capacity] = ws;
  return ws;
}

}  // namespace moe_ep
