// Non-owning tensor views (what crosses the API) and a small owning tensor for outputs the
// library allocates. Strides are in elements, as in DLPack and torch.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

namespace moe_ep {

enum class DType : uint8_t {
  kU8,      // raw bytes: packed E2M1 pairs, E4M3 / UE8M0 scale bytes
  kF8E4M3,  // E4M3 bytes tagged as such (accepted wherever E4M3 bytes are expected)
  kF8E8M0,  // UE8M0 bytes tagged as such (accepted wherever UE8M0 bytes are expected)
  kI32,
  kI64,
  kF32,
  kBF16,
  kF16,
};

size_t dtype_size(DType t);
const char* dtype_name(DType t);

enum class DeviceKind : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int index = 0;
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
};

constexpr int kMaxDims = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kU8;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // elements
  Device device{};

  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = {});
  bool defined() const { return ndim > 0; }  // an optional argument left out has ndim 0
  int64_t numel() const;
  int64_t size(int d) const { return shape[d]; }
  bool is_contiguous() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  std::string describe() const;  // "bf16[7, 2048] cpu"
};

// An owning tensor: storage released when the last copy goes away.
class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<void> storage, TensorView view)
      : storage_(std::move(storage)), view_(view) {}
  static Tensor empty(DType dtype, std::initializer_list<int64_t> shape, Device device = {});
  const TensorView& view() const { return view_; }
  template <class T>
  T* ptr() const {
    return view_.ptr<T>();
  }
  int64_t numel() const { return view_.numel(); }

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

}  // namespace moe_ep
