// Builds without nvcc have no CUDA backend; these say so.
#if !defined(MOE_EP_HAVE_CUDA)
#include "layer/backend.h"
#include "layer/group_pool.h"
#include "moe_ep/status.h"

namespace moe_ep {

bool cuda_backend_usable() { return false; }

std::vector<std::string> cuda_backend_unsupported_reasons(const LayerConfig&, int) {
  return {"this build has no CUDA backend (nvcc was not found when it was configured)"};
}

std::unique_ptr<LayerBackend> make_cuda_backend(EpGroup&, const LayerConfig&, const WeightPack&,
                                                const EpilogueVectors&) {
  throw Error(ErrorCode::kUnsupported, "this build has no CUDA backend");
}

std::shared_ptr<GroupTransport> make_cuda_group_transport(const Bootstrap&) {
  throw Error(ErrorCode::kUnsupported, "this build has no CUDA backend");
}

}  // namespace moe_ep
#endif
