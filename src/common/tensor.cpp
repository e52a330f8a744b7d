#include "moe_ep/tensor.h"

#include <cstdlib>

#include "moe_ep/status.h"

namespace moe_ep {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kU8:
    case DType::kF8E4M3:
    case DType::kF8E8M0:
      return 1;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kI32:
    case DType::kF32:
      return 4;
    case DType::kI64:
      return 8;
  }
  return 1;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kU8:
      return "uint8";
    case DType::kF8E4M3:
      return "float8_e4m3fn";
    case DType::kF8E8M0:
      return "float8_e8m0fnu";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
  }
  return "?";
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.ndim = int(shape.size());
  if (v.ndim > kMaxDims) throw Error(ErrorCode::kInvalidArgument, "tensor has more than 4 dims");
  int i = 0;
  for (int64_t s : shape) v.shape[i++] = s;
  int64_t stride = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.strides[d] = stride;
    stride *= v.shape[d];
  }
  v.device = device;
  return v;
}

int64_t TensorView::numel() const {
  if (ndim == 0) return 0;
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;  // an empty tensor's strides carry no meaning (DLPack may give 0)
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != stride) return false;
    stride *= shape[d];
  }
  return true;
}

std::string TensorView::describe() const {
  // Plain string building, no iostreams: the library must not depend on the locale machinery of
  // whichever libstdc++ a host process (e.g. Python with torch) loaded first.
  std::string s = std::string(dtype_name(dtype)) + "[";
  for (int d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  s += "] ";
  s +=
      device.kind == DeviceKind::kCPU ? std::string("cpu") : "cuda:" + std::to_string(device.index);
  return s;
}

Tensor Tensor::empty(DType dtype, std::initializer_list<int64_t> shape, Device device) {
  if (device.kind != DeviceKind::kCPU)
    throw Error(ErrorCode::kInvalidArgument, "Tensor::empty allocates host memory only");
  TensorView v = TensorView::contiguous(nullptr, dtype, shape, device);
  const size_t bytes = std::max<size_t>(v.nbytes(), 1);
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) throw Error(ErrorCode::kBackend, "out of host memory allocating " + v.describe());
  v.data = p;
  return Tensor(std::shared_ptr<void>(p, std::free), v);
}

}  // namespace moe_ep
