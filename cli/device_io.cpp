#include "device_io.h"

#include <string>

#include "moe_ep/status.h"

#if defined(MOE_EP_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace moe_ep::cli {

#if defined(MOE_EP_HAVE_CUDA)
namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(ErrorCode::kBackend, std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace

std::shared_ptr<void> device_alloc(size_t bytes, int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  void* p = nullptr;
  check(cudaMalloc(&p, bytes ? bytes : 16), "cudaMalloc");
  return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
}

std::shared_ptr<void> to_device(const void* host, size_t bytes, int device) {
  auto p = device_alloc(bytes, device);
  if (bytes) check(cudaMemcpy(p.get(), host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  return p;
}

void to_host(void* host, const void* dev, size_t bytes) {
  if (bytes) check(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

void device_sync() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
#else
std::shared_ptr<void> device_alloc(size_t, int) {
  throw Error(ErrorCode::kUnsupported, "this build has no CUDA");
}
std::shared_ptr<void> to_device(const void*, size_t, int) {
  throw Error(ErrorCode::kUnsupported, "this build has no CUDA");
}
void to_host(void*, const void*, size_t) {
  throw Error(ErrorCode::kUnsupported, "this build has no CUDA");
}
void device_sync() {}
#endif

}  // namespace moe_ep::cli
