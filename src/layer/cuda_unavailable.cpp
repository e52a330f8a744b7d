// Builds without nvcc have no CUDA backend; these say so.
#if !defined(MOE_EP_HAVE_CUDA)
#include "layer/backend.h"
#include "moe_ep/status.h"

namespace moe_ep {

bool cuda_backend_usable() { return false; }

std::vector<std::string> cuda_backend_unsupported_reasons(const LayerConfig&, int) {
  return {"this build has no CUDA backend (nvcc was not found when it was configured)"};
}

std::unique_ptr<LayerBackend> make_cuda_backend(const Bootstrap&, const LayerConfig&,
                                                const WeightPack&, const EpilogueVectors&) {
  throw Error(ErrorCode::kUnsupported, "this build has no CUDA backend");
}

}  // namespace moe_ep
#endif
