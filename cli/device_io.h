// Host <-> device copies for the command's inputs and outputs (no-ops without CUDA).
#pragma once

#include <cstddef>
#include <memory>

namespace moe_ep::cli {

// Device memory holding a copy of `bytes` bytes at `host` (device `device`).
std::shared_ptr<void> to_device(const void* host, size_t bytes, int device);
std::shared_ptr<void> device_alloc(size_t bytes, int device);
void to_host(void* host, const void* dev, size_t bytes);
void device_sync();

}  // namespace moe_ep::cli
