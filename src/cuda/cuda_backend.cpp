// The CUDA layer backend. Until its kernels land, a CUDA build reports that the layer does not
// run on the GPU yet (the quantize kernels under src/kernels/ are built and tested on their own).
#include <cuda_runtime.h>

#include "layer/backend.h"
#include "moe_ep/status.h"

namespace moe_ep {

bool cuda_backend_usable() { return false; }

std::vector<std::string> cuda_backend_unsupported_reasons(const LayerConfig&, int) {
  return {"the CUDA layer backend is not implemented in this build yet"};
}

std::unique_ptr<LayerBackend> make_cuda_backend(const Bootstrap&, const LayerConfig&,
                                                const WeightPack&, const EpilogueVectors&) {
  throw Error(ErrorCode::kUnsupported, "the CUDA layer backend is not implemented yet");
}

}  // namespace moe_ep
