// The CUDA backend's construction, weights, errors and lifetime (cuda_backend.h).
#include "cuda/cuda_backend.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_group.h"
#include "kernels/ep/ep_launch.h"
#include "reference/cpu_math.h"

namespace moe_ep {
namespace cuda {
constexpr int kMaxLocalExperts = 1024;
static_assert(kern::kEpUnpackMaxRanks == kEpMaxRanks, "unpack addresses every transport rank");

// The fp8 MMA path of mxfp4_mxfp8 (weights in the fp8 resident layout, every tile on
// sm90_moe_fp8_ws_kernel; docs/kernels.md), for prefill: faster than the recipe's default
// path from 512 tokens on DSV3 and at 2048 and 4096 on Qwen3, slower at decode sizes; not bitwise
// equal to the CPU, and where a token has one slot its error can pass the 5e-3 tolerance (up to
// 6.2e-3 measured), hence opt-in.
// Why it cannot run this configuration (empty: it can): one GPU only, K dimensions multiples of its
// 128-wide stage.
std::vector<std::string> fp8_mma_reasons(const LayerConfig& c, int world_size) {
  std::vector<std::string> r;
  if (world_size != 1)
    r.push_back("fp8_mma runs on one GPU (W = 1), not W = " + std::to_string(world_size));
  for (const auto& [name, v] : {std::pair{"hidden size H", c.fleet.hidden_size},
                                std::pair{"intermediate size I", c.recipe.intermediate_size}})
    if (v % 128 != 0)
      r.push_back(std::string("fp8_mma needs ") + name + " = " + std::to_string(v) +
                  " to be a multiple of 128");
  return r;
}

CudaBackend::CudaBackend(EpGroup& group, const LayerConfig& cfg, const WeightPack& w,
                         const EpilogueVectors& epi)
    : cfg_(cfg), dev_{DeviceKind::kCUDA, group.device()}, group_(&group.impl()) {
  const Bootstrap& boot = group.bootstrap();
  check(cudaSetDevice(boot.device), "cudaSetDevice(" + std::to_string(boot.device) + ")");
  const int H = cfg.fleet.hidden_size, I = cfg.recipe.intermediate_size;
  W_ = boot.world_size;
  rank_ = boot.rank;
  El_ = cfg.fleet.num_experts / boot.world_size;
  rs_ = kern::resident_shape(cfg.recipe.recipe, H, I);
  fp8_ = cfg.recipe.fp8_mma;  // unsupported_reasons refused it where it cannot run
  check(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, boot.device),
        "reading the SM count");
  transport_ = std::static_pointer_cast<CudaGroupTransport>(group_->transport);
  comm_ = transport_->comm();
  try {
    try {
      load_weights(w);
      load_bias(epi.fc1_bias, 2 * cfg.recipe.intermediate_size, fc1_bias_, "fc1_bias");
      load_bias(epi.fc2_bias, cfg.fleet.hidden_size, fc2_bias_, "fc2_bias");
    } catch (const Error& e) {
      if (W_ == 1 || e.code() != ErrorCode::kInvalidArgument) throw;
      weight_error_ = e.what();
    }
    load_vector(epi.fc1_alpha, fc1_alpha_, "fc1_alpha");
    load_vector(epi.fc2_alpha, fc2_alpha_, "fc2_alpha");
    load_vector(epi.fc1_norm_const, fc1_nc_, "fc1_norm_const");
    check(cudaHostAlloc(reinterpret_cast<void**>(&err_host_), sizeof(kern::DeviceError),
                        cudaHostAllocMapped),
          "cudaHostAlloc of the error word");
    std::memset(err_host_, 0, sizeof(kern::DeviceError));
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&err_dev_), err_host_, 0),
          "cudaHostGetDevicePointer");
    check(kern::set_kernel_attributes(cfg.recipe.recipe), "setting kernel attributes");
    if (W_ > 1) {
      // Every rank learns whether any rank rejected its weights, so none waits for a peer
      // that already gave up (a collective, like the communicator above).
      const int bad = comm_->allreduce_max(weight_error_.empty() ? 0 : 1);
      if (bad) {
        if (!weight_error_.empty()) throw Error(ErrorCode::kInvalidArgument, weight_error_);
        throw Error(ErrorCode::kInvalidArgument,
                    "moe_ep cuda: rank " + std::to_string(rank_) +
                        ": another rank rejected its weights at construction");
      }
    } else if (!weight_error_.empty()) {
      throw Error(ErrorCode::kInvalidArgument, weight_error_);
    }
    create_workspace(cfg.fleet.max_tokens_per_rank);
  } catch (...) {
    release();
    throw;
  }
}

void CudaBackend::warmup(int ws) {
  check_host_errors();
  select_device();
  refresh_state(ws);
  check(kern::set_kernel_attributes(cfg_.recipe.recipe), "loading the kernels");
  check(cudaDeviceSynchronize(), "warmup synchronize");
  if (comm_) comm_->barrier();
  check_host_errors();
}

KernelWeights CudaBackend::kernel_weights() {
  check_host_errors();
  KernelWeights k;
  k.fc1_weight = bytes_view(w1_, rs_.fc1_bytes);
  k.fc2_weight = bytes_view(w2_, rs_.fc2_bytes);
  if (rs_.fc1_scale_bytes) {
    k.fc1_scale = bytes_view(s1_, rs_.fc1_scale_bytes);
    k.fc2_scale = bytes_view(s2_, rs_.fc2_scale_bytes);
  }
  return k;
}

ExpertWeightViews CudaBackend::expert_weight_views() {
  ExpertWeightViews v;
  v.weights = kernel_weights();
  v.fc1_alpha = TensorView::contiguous(fc1_alpha_.ptr, DType::kF32, {El_}, dev_);
  v.fc2_alpha = TensorView::contiguous(fc2_alpha_.ptr, DType::kF32, {El_}, dev_);
  v.fc1_norm_const = TensorView::contiguous(fc1_nc_.ptr, DType::kF32, {El_}, dev_);
  if (fc1_bias_.ptr)
    v.fc1_bias = TensorView::contiguous(fc1_bias_.ptr, DType::kF32,
                                        {El_, 2 * cfg_.recipe.intermediate_size}, dev_);
  if (fc2_bias_.ptr)
    v.fc2_bias =
        TensorView::contiguous(fc2_bias_.ptr, DType::kF32, {El_, cfg_.fleet.hidden_size}, dev_);
  return v;
}

int CudaBackend::allreduce_max(int value) {
  if (!comm_) return value;
  check_host_errors();
  select_device();
  return comm_->allreduce_max(value);
}

Tensor CudaBackend::allocate(DType dtype, std::initializer_list<int64_t> shape) {
  select_device();
  TensorView v = TensorView::contiguous(nullptr, dtype, shape, dev_);
  const size_t bytes = v.nbytes();
  void* p = nullptr;
  if (bytes)
    check(cudaMalloc(&p, bytes), "cudaMalloc of an output (" + std::to_string(bytes) + " bytes)");
  std::shared_ptr<void> storage(p, [](void* q) {
    if (q) cudaFree(q);
  });
  v.data = p;
  return Tensor(storage, v);
}

void CudaBackend::abandon_call(const std::string& why) {
  if (!comm_ || comm_->destroyed()) return;
  try {
    select_device();
    comm_->abandon(why, static_cast<cudaStream_t>(last_stream_));
  } catch (const Error&) {
    // Nothing more to do: the peers time out and name this rank, as before.
  }
}

void CudaBackend::destroy() {
  select_device();
  const cudaError_t err = cudaDeviceSynchronize();
  std::string pending;
  if (err_host_ && err_host_->code) pending = device_error_message();
  std::string peer;
  if (comm_ && !comm_->destroyed())
    if (auto r = comm_->error()) peer = ep_error_message(*r);
  // The pooled workspaces go back to the group (the last user frees each, collectively); the
  // communicator is the group's (its destroy frees it).
  release();
  check(err, "synchronize at destroy");
  if (!peer.empty()) throw Error(ErrorCode::kPeer, peer);
  if (!pending.empty()) throw Error(ErrorCode::kInvalidArgument, pending);
}

void CudaBackend::check_host_errors() {
  if (comm_) comm_->check();
  check_device_error();
}

void CudaBackend::select_device() {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != dev_.index)
    check(cudaSetDevice(dev_.index), "cudaSetDevice");
}

const Workspace& CudaBackend::get_ws(int ws) const {
  if (ws < 0 || ws >= int(workspaces_.size()))
    throw Error(ErrorCode::kInvalidArgument, "workspace " + std::to_string(ws) +
                                                 " does not exist (the layer has " +
                                                 std::to_string(workspaces_.size()) + ")");
  return *workspaces_[ws];
}

std::string CudaBackend::device_error_message() const {
  const volatile kern::DeviceError* e = err_host_;
  const int K = cfg_.recipe.top_k;
  return "moe_ep cuda: an earlier forward on cuda:" + std::to_string(dev_.index) +
         " saw topk_ids[" + std::to_string(e->index / K) + ", " + std::to_string(e->index % K) +
         "] = " + std::to_string(e->value) + ", out of range [-1, E = " + std::to_string(e->limit) +
         "); that slot was skipped, so that call's output is wrong";
}

void CudaBackend::check_device_error() {
  if (!err_host_) return;
  volatile kern::DeviceError* e = err_host_;
  if (e->code == 0) return;
  const std::string msg = device_error_message();
  e->code = 0;
  throw Error(ErrorCode::kInvalidArgument, msg);
}

const uint8_t* CudaBackend::on_device(const TensorView& v, DeviceBuffer& tmp, const char* name) {
  if (v.device.kind == DeviceKind::kCUDA) {
    if (v.device.index != dev_.index)
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(name) + " is on cuda:" + std::to_string(v.device.index) +
                      ", the layer runs on cuda:" + std::to_string(dev_.index));
    return static_cast<const uint8_t*>(v.data);
  }
  tmp.allocate(v.nbytes(), name);
  if (v.nbytes())
    check(cudaMemcpy(tmp.ptr, v.data, v.nbytes(), cudaMemcpyHostToDevice),
          std::string("copying ") + name + " to the device");
  return tmp.as<uint8_t>();
}

void CudaBackend::load_weights(const WeightPack& w) {
  const Recipe r = cfg_.recipe.recipe;
  const int H = cfg_.fleet.hidden_size, I = cfg_.recipe.intermediate_size;
  const bool four_bit = recipe_traits(r).weights_4bit;
  w1_.allocate(rs_.fc1_bytes * El_, "fc1 weights");
  w2_.allocate(rs_.fc2_bytes * El_, "fc2 weights");
  if (four_bit) {
    s1_.allocate(rs_.fc1_scale_bytes * El_, "fc1 scales");
    s2_.allocate(rs_.fc2_scale_bytes * El_, "fc2 scales");
  }
  for (int fc = 1; fc <= 2; ++fc) {
    DeviceBuffer tw, ts;
    const TensorView& wv = fc == 1 ? w.w13 : w.w2;
    const TensorView& sv = fc == 1 ? w.w13_scale : w.w2_scale;
    const uint8_t* raw = on_device(wv, tw, fc == 1 ? "w13" : "w2");
    const uint8_t* raw_s =
        four_bit ? on_device(sv, ts, fc == 1 ? "w13_scale" : "w2_scale") : nullptr;
    std::string why;
    check(kern::preprocess_weights(r, fc == 1, El_, H, I, raw, raw_s,
                                   (fc == 1 ? w1_ : w2_).as<uint8_t>(),
                                   (fc == 1 ? s1_ : s2_).as<uint8_t>(), nullptr, &why, fp8_),
          "preprocessing the weights");
    tw.release();
    ts.release();
    if (!why.empty()) throw Error(ErrorCode::kInvalidArgument, why);
  }
}

void CudaBackend::load_bias(const TensorView& v, int n, DeviceBuffer& dst, const char* name) {
  if (!v.defined()) return;
  if (v.dtype != DType::kF32 || v.ndim != 2 || v.shape[0] != El_ || v.shape[1] != n ||
      !v.is_contiguous())
    throw Error(ErrorCode::kInvalidArgument, std::string(name) + " is " + v.describe() +
                                                 ", expected f32 [" + std::to_string(El_) + ", " +
                                                 std::to_string(n) + "] contiguous");
  const bool on_device = v.device.kind == DeviceKind::kCUDA;
  if (on_device && v.device.index != dev_.index)
    throw Error(ErrorCode::kInvalidArgument,
                std::string(name) + " is " + v.describe() +
                    ", expected host memory or cuda:" + std::to_string(dev_.index));
  std::vector<float> host(size_t(El_) * n);
  check(cudaMemcpy(host.data(), v.data, host.size() * 4,
                   on_device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost),
        name);
  for (size_t i = 0; i < host.size(); ++i)
    if (!std::isfinite(host[i]))
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(name) + "[" + std::to_string(i / n) + ", " + std::to_string(i % n) +
                      "] = " + std::to_string(host[i]) + " is not finite");
  dst.allocate(host.size() * 4, name);
  check(cudaMemcpy(dst.ptr, host.data(), host.size() * 4, cudaMemcpyHostToDevice), name);
}

void CudaBackend::load_vector(const TensorView& v, DeviceBuffer& dst, const char* name) {
  std::vector<float> ones(El_, 1.0f);
  dst.allocate(size_t(El_) * 4, name);
  if (!v.defined()) {
    check(cudaMemcpy(dst.ptr, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice), name);
    return;
  }
  const cudaMemcpyKind kind =
      v.device.kind == DeviceKind::kCUDA ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
  check(cudaMemcpy(dst.ptr, v.data, size_t(El_) * 4, kind), name);
}

void CudaBackend::release() {
  for (auto& ws : workspaces_) ws->state.release();
  workspaces_.clear();
  for (DeviceBuffer* b :
       {&w1_, &w2_, &s1_, &s2_, &fc1_alpha_, &fc2_alpha_, &fc1_nc_, &fc1_bias_, &fc2_bias_})
    b->release();
  if (err_host_) cudaFreeHost(err_host_);
  err_host_ = nullptr;
  err_dev_ = nullptr;
}

}  // namespace cuda

namespace {
using cuda::fp8_mma_reasons;
using cuda::kMaxLocalExperts;
int device_count() {
  static const int n = [] {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return c;
  }();
  return n;
}

}  // namespace

bool cuda_backend_usable() { return device_count() > 0; }

std::vector<std::string> cuda_backend_unsupported_reasons(const LayerConfig& config,
                                                          int world_size) {
  std::vector<std::string> r;
  if (world_size > kEpMaxRanks)
    r.push_back("W = " + std::to_string(world_size) + " ranks exceed the EP transport's limit " +
                std::to_string(kEpMaxRanks));
  if (config.recipe.top_k > kEpMaxTopK)
    r.push_back("top_k " + std::to_string(config.recipe.top_k) + " exceeds the EP transport's " +
                std::to_string(kEpMaxTopK));
  const int n = device_count();
  if (n == 0) {
    r.push_back("no CUDA device is present");
  } else {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess && prop.major != 9)
      r.push_back("CUDA device " + std::to_string(dev) + " (" + prop.name + ") is sm_" +
                  std::to_string(prop.major * 10 + prop.minor) +
                  "; the kernels are built for sm_90a (Hopper)");
  }
  if (config.recipe.fp8_mma)
    for (auto& why : fp8_mma_reasons(config, world_size)) r.push_back(std::move(why));
  if (world_size >= 1 && config.fleet.num_experts / world_size > kMaxLocalExperts)
    r.push_back("E_local = " + std::to_string(config.fleet.num_experts / world_size) +
                " local experts exceed the CUDA backend's limit " +
                std::to_string(kMaxLocalExperts));
  return r;
}

std::unique_ptr<LayerBackend> make_cuda_backend(EpGroup& group, const LayerConfig& config,
                                                const WeightPack& weights,
                                                const EpilogueVectors& epilogue) {
  return std::make_unique<cuda::CudaBackend>(group, config, weights, epilogue);
}

}  // namespace moe_ep
