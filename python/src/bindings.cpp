// The Python extension moe_ep._moe_ep: the C++ layer behind nanobind. Tensors cross as DLPack
// (nb::ndarray: numpy, torch, cupy, ...) without copies; the Python package (python/moe_ep)
// allocates outputs with the caller's framework and picks the CUDA stream. Everything that can
// block (construction, forward, destroy) releases the GIL, so W CPU ranks can run on W threads.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moe_ep/checkpoint.h"
#include "moe_ep/config.h"
#include "moe_ep/group.h"
#include "moe_ep/layer.h"
#include "moe_ep/status.h"
#include "moe_ep/tensor.h"
#include "moe_ep/weight_prep.h"

#if defined(MOE_EP_HAVE_CUDA)
#include <nccl.h>
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace moe_ep::python {
namespace {

using InArray = nb::ndarray<nb::ro>;  // read-only arrays are fine for inputs
using OutArray = nb::ndarray<>;

// Which framework a returned array belongs to (the Python side passes it).
enum Framework : int { kNumpy = 0, kTorch = 1, kDlpack = 2 };

// Python exception classes per ErrorCode, registered by moe_ep/_errors.py at import.
constexpr int kNumCodes = int(ErrorCode::kState) + 1;
PyObject* g_error_classes[kNumCodes] = {};

[[noreturn]] void invalid(const std::string& msg) { throw Error(ErrorCode::kInvalidArgument, msg); }

// DLPack type codes beyond nanobind's enum (DLPack 1.x).
constexpr uint8_t kDlFloat8E4M3Fn = 10, kDlFloat8E8M0Fnu = 14;

DType dtype_from_dlpack(nb::dlpack::dtype dt, const char* name) {
  using C = nb::dlpack::dtype_code;
  if (dt.lanes == 1) {
    if (dt.code == uint8_t(C::UInt) && dt.bits == 8) return DType::kU8;
    // numpy has no bfloat16: uint16 arrays are taken as bf16 bit patterns.
    if (dt.code == uint8_t(C::UInt) && dt.bits == 16) return DType::kBF16;
    if (dt.code == uint8_t(C::Bfloat) && dt.bits == 16) return DType::kBF16;
    if (dt.code == uint8_t(C::Int) && dt.bits == 32) return DType::kI32;
    if (dt.code == uint8_t(C::Int) && dt.bits == 64) return DType::kI64;
    if (dt.code == uint8_t(C::Float) && dt.bits == 32) return DType::kF32;
    if (dt.code == uint8_t(C::Float) && dt.bits == 16) return DType::kF16;
    if (dt.code == kDlFloat8E4M3Fn && dt.bits == 8) return DType::kF8E4M3;
    if (dt.code == kDlFloat8E8M0Fnu && dt.bits == 8) return DType::kF8E8M0;
  }
  invalid(std::string(name) + " has a dtype moe_ep does not take (DLPack code " +
          std::to_string(dt.code) + ", " + std::to_string(dt.bits) + " bits, " +
          std::to_string(dt.lanes) +
          " lanes); expected bfloat16 (or uint16 bits), float32, int32 or uint8");
}

nb::dlpack::dtype dtype_to_dlpack(DType t, Framework fw) {
  using C = nb::dlpack::dtype_code;
  switch (t) {
    case DType::kU8:
    case DType::kF8E4M3:
    case DType::kF8E8M0:
      return {uint8_t(C::UInt), 8, 1};
    case DType::kI32:
      return {uint8_t(C::Int), 32, 1};
    case DType::kI64:
      return {uint8_t(C::Int), 64, 1};
    case DType::kF32:
      return {uint8_t(C::Float), 32, 1};
    case DType::kF16:
      return {uint8_t(C::Float), 16, 1};
    case DType::kBF16:
      // numpy cannot hold bfloat16: hand out the bits as uint16.
      if (fw == kNumpy) return {uint8_t(C::UInt), 16, 1};
      return {uint8_t(C::Bfloat), 16, 1};
  }
  return {uint8_t(C::UInt), 8, 1};
}

template <class Array>
TensorView to_view(const Array& a, const char* name) {
  TensorView v;
  if (a.ndim() < 1 || a.ndim() > size_t(kMaxDims))
    invalid(std::string(name) + " has " + std::to_string(a.ndim()) + " dims; moe_ep takes 1 to " +
            std::to_string(kMaxDims));
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.dtype = dtype_from_dlpack(a.dtype(), name);
  if (dtype_size(v.dtype) * 8 != a.dtype().bits)
    invalid(std::string(name) + ": element size mismatch");
  v.ndim = int(a.ndim());
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = int64_t(a.shape(d));
    v.strides[d] = a.stride(d);
  }
  switch (a.device_type()) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value:
      v.device = {DeviceKind::kCPU, 0};
      break;
    case nb::device::cuda::value:
      v.device = {DeviceKind::kCUDA, int(a.device_id())};
      break;
    default:
      invalid(std::string(name) + " is on DLPack device type " + std::to_string(a.device_type()) +
              "; moe_ep takes CPU and CUDA memory");
  }
  return v;
}

template <class Array>
TensorView to_view(const std::optional<Array>& a, const char* name) {
  return a ? to_view(*a, name) : TensorView{};
}

// A TensorView as an array of `fw` that keeps `owner` alive (zero-copy).
nb::object to_python(const TensorView& v, nb::handle owner, Framework fw) {
  if (!v.defined()) return nb::none();
  size_t shape[kMaxDims];
  int64_t strides[kMaxDims];
  for (int d = 0; d < v.ndim; ++d) {
    shape[d] = size_t(v.shape[d]);
    strides[d] = v.strides[d];
  }
  const int dev =
      v.device.kind == DeviceKind::kCPU ? nb::device::cpu::value : nb::device::cuda::value;
  if (fw == kNumpy && v.device.kind != DeviceKind::kCPU) fw = kDlpack;
  const nb::dlpack::dtype dt = dtype_to_dlpack(v.dtype, fw);
  if (fw == kNumpy)
    return nb::ndarray<nb::numpy>(v.data, size_t(v.ndim), shape, owner, strides, dt, dev,
                                  v.device.index)
        .cast();
  if (fw == kTorch)
    return nb::ndarray<nb::pytorch>(v.data, size_t(v.ndim), shape, owner, strides, dt, dev,
                                    v.device.index)
        .cast();
  return nb::ndarray<>(v.data, size_t(v.ndim), shape, owner, strides, dt, dev, v.device.index)
      .cast();
}

// Weights and per-expert epilogue vectors as numpy arrays that keep `owner` alive: w13, w2,
// w13_scale, w2_scale, fc1_alpha, fc2_alpha, fc1_norm_const (None where a view is undefined).
nb::dict weights_dict(const WeightPack& wp, const EpilogueVectors& ev, nb::handle owner) {
  nb::dict d;
  d["w13"] = to_python(wp.w13, owner, kNumpy);
  d["w2"] = to_python(wp.w2, owner, kNumpy);
  d["w13_scale"] = to_python(wp.w13_scale, owner, kNumpy);
  d["w2_scale"] = to_python(wp.w2_scale, owner, kNumpy);
  d["fc1_alpha"] = to_python(ev.fc1_alpha, owner, kNumpy);
  d["fc2_alpha"] = to_python(ev.fc2_alpha, owner, kNumpy);
  d["fc1_norm_const"] = to_python(ev.fc1_norm_const, owner, kNumpy);
  return d;
}

// An owning library tensor handed to Python without a copy.
nb::object owned_to_python(Tensor t, Framework fw) {
  auto* keep = new Tensor(std::move(t));
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  return to_python(keep->view(), owner, fw);
}

DType parse_dtype(const std::string& s) {
  for (DType t : {DType::kU8, DType::kF8E4M3, DType::kF8E8M0, DType::kI32, DType::kI64, DType::kF32,
                  DType::kBF16, DType::kF16})
    if (s == dtype_name(t)) return t;
  invalid("unknown dtype name '" + s + "'");
}

Backend parse_backend(const std::string& s) {
  for (Backend b : {Backend::kAuto, Backend::kCPU, Backend::kCUDA})
    if (s == backend_name(b)) return b;
  invalid("unknown backend '" + s + "' (expected auto, cpu or cuda)");
}

// Configuration as Python fills it (config.h's LayerConfig, flattened, names as strings).
struct Spec {
  int num_experts = 0, max_tokens_per_rank = 0, hidden_size = 0;
  int intermediate_size = 0, top_k = 0;
  std::string recipe = "bf16";
  std::optional<float> swiglu_limit;
  float swiglu_alpha = 1.0f, swiglu_beta = 0.0f;
  bool apply_topk_in_fc1 = false, do_finalize = true;
  float input_norm_const = 1.0f;
  std::string activation_dtype = "bfloat16", combine_dtype = "bfloat16";
  bool has_expert_bias = false, has_custom_swiglu_alpha_beta = false;
  bool fp8_mma = false;
  std::string weight_scheme;
  bool skip_final_all_reduce = false, runtime_weight_transfer = false, dual_batch_overlap = false;

  LayerConfig to_config() const {
    LayerConfig c;
    c.fleet.num_experts = num_experts;
    c.fleet.max_tokens_per_rank = max_tokens_per_rank;
    c.fleet.hidden_size = hidden_size;
    auto r = parse_recipe(recipe);
    if (!r)
      invalid("unknown recipe '" + recipe +
              "' (expected nvfp4, mxfp4_mxfp8, mxfp4_bf16, bf16 or nvfp4_bf16)");
    c.recipe.recipe = *r;
    c.recipe.intermediate_size = intermediate_size;
    c.recipe.top_k = top_k;
    c.recipe.swiglu_limit = swiglu_limit;
    c.recipe.swiglu_alpha = swiglu_alpha;
    c.recipe.swiglu_beta = swiglu_beta;
    c.recipe.apply_topk_in_fc1 = apply_topk_in_fc1;
    c.recipe.do_finalize = do_finalize;
    c.recipe.input_norm_const = input_norm_const;
    c.recipe.activation_dtype = parse_dtype(activation_dtype);
    c.recipe.combine_dtype = parse_dtype(combine_dtype);
    c.recipe.has_expert_bias = has_expert_bias;
    c.recipe.has_custom_swiglu_alpha_beta = has_custom_swiglu_alpha_beta;
    c.recipe.fp8_mma = fp8_mma;
    c.recipe.weight_scheme = weight_scheme;
    c.recipe.skip_final_all_reduce = skip_final_all_reduce;
    c.recipe.runtime_weight_transfer = runtime_weight_transfer;
    c.recipe.dual_batch_overlap = dual_batch_overlap;
    return c;
  }
};

struct PyCpuFleet {
  std::shared_ptr<CpuFleet> fleet;
  int world_size;
  explicit PyCpuFleet(int w) : fleet(make_cpu_fleet(w)), world_size(w) {}
};

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// The bootstrap of a layer or group from the Python arguments.
Bootstrap make_bootstrap(int world_size, int rank, const std::string& backend, int device,
                         PyCpuFleet* cpu_fleet, const std::optional<nb::bytes>& nccl_unique_id,
                         uintptr_t nccl_comm, int64_t timeout_ms, int64_t warmup_timeout_ms) {
  Bootstrap boot;
  boot.world_size = world_size;
  boot.rank = rank;
  boot.backend = parse_backend(backend);
  boot.device = device;
  boot.nccl_comm = reinterpret_cast<void*>(nccl_comm);
  if (nccl_unique_id) {
    if (nccl_unique_id->size() != 128)
      invalid("nccl_unique_id has " + std::to_string(nccl_unique_id->size()) +
              " bytes, expected 128");
    std::array<char, 128> id;
    std::memcpy(id.data(), nccl_unique_id->c_str(), 128);
    boot.nccl_unique_id = id;
  }
  if (cpu_fleet) {
    if (cpu_fleet->world_size != world_size)
      invalid("cpu_fleet has world size " + std::to_string(cpu_fleet->world_size) +
              ", the layer was given world_size " + std::to_string(world_size));
    boot.cpu_fleet = cpu_fleet->fleet;
  }
  boot.timeout_ms = timeout_ms;
  boot.warmup_timeout_ms = warmup_timeout_ms;
  return boot;
}

// Drops a group or layer owned from Python. Its destroy is collective: the peers' Python
// threads must run while this one waits, so the GIL is released (unless the interpreter is
// finalizing, when no other thread runs Python).
template <class Owner>
void release_collective(Owner& p) {
  if (p && !p->destroyed() && !interpreter_finalizing()) {
    nb::gil_scoped_release release;
    p.reset();
  } else {
    p.reset();
  }
}

struct PyGroup {
  std::shared_ptr<EpGroup> group;

  ~PyGroup() { release_collective(group); }
  EpGroup& get() {
    if (!group) throw Error(ErrorCode::kDestroyed, "moe_ep: the EP group was never constructed");
    return *group;
  }
};

struct PyLayer {
  std::unique_ptr<MegaLayer> layer;

  ~PyLayer() { release_collective(layer); }
  MegaLayer& get() {
    if (!layer) throw Error(ErrorCode::kDestroyed, "moe_ep: the layer was never constructed");
    return *layer;
  }
};

ForwardInputs make_inputs(const InArray& x, const InArray& ids, const InArray& w,
                          const std::optional<InArray>& fc1_alpha,
                          const std::optional<InArray>& fc2_alpha,
                          const std::optional<InArray>& fc1_norm_const, int workspace,
                          uintptr_t stream, const std::optional<InArray>& num_tokens) {
  ForwardInputs in;
  in.hidden_states = to_view(x, "hidden_states");
  in.topk_ids = to_view(ids, "topk_ids");
  in.topk_weights = to_view(w, "topk_weights");
  in.epilogue.fc1_alpha = to_view(fc1_alpha, "fc1_alpha");
  in.epilogue.fc2_alpha = to_view(fc2_alpha, "fc2_alpha");
  in.epilogue.fc1_norm_const = to_view(fc1_norm_const, "fc1_norm_const");
  if (workspace >= 0) in.workspace = WorkspaceId{workspace};
  in.stream = reinterpret_cast<void*>(stream);
  if (num_tokens) {
    const TensorView n = to_view(*num_tokens, "num_tokens");
    if (n.dtype != DType::kI32 || n.numel() != 1)
      invalid("num_tokens must be one int32 element on the layer's device, got " + n.describe());
    in.num_tokens = static_cast<const int32_t*>(n.data);
  }
  return in;
}

void translate_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    const int code = int(e.code());
    PyObject* cls = (code >= 0 && code < kNumCodes) ? g_error_classes[code] : nullptr;
    PyErr_SetString(cls ? cls : PyExc_RuntimeError, e.what());
  }
}

}  // namespace
}  // namespace moe_ep::python

NB_MODULE(_moe_ep, m) {
  using namespace moe_ep;
  using namespace moe_ep::python;
  m.doc() = "moe_ep: the MoE expert-parallel layer (C++ core; use the moe_ep package)";

  nb::register_exception_translator(translate_error);

  m.def(
      "_set_error_classes",
      [](std::vector<nb::object> classes) {
        if (classes.size() != size_t(kNumCodes))
          invalid("_set_error_classes: expected " + std::to_string(kNumCodes) + " classes");
        for (int i = 0; i < kNumCodes; ++i) {
          Py_XDECREF(g_error_classes[i]);
          g_error_classes[i] = classes[i].release().ptr();
        }
      },
      "classes"_a);
  m.def("_error_code_names", [] {
    std::vector<std::string> names;
    for (int i = 0; i < kNumCodes; ++i) names.push_back(error_code_name(ErrorCode(i)));
    return names;
  });

  nb::class_<Spec>(m, "_Spec")
      .def(nb::init<>())
      .def_rw("num_experts", &Spec::num_experts)
      .def_rw("max_tokens_per_rank", &Spec::max_tokens_per_rank)
      .def_rw("hidden_size", &Spec::hidden_size)
      .def_rw("intermediate_size", &Spec::intermediate_size)
      .def_rw("top_k", &Spec::top_k)
      .def_rw("recipe", &Spec::recipe)
      .def_rw("swiglu_limit", &Spec::swiglu_limit)
      .def_rw("apply_topk_in_fc1", &Spec::apply_topk_in_fc1)
      .def_rw("do_finalize", &Spec::do_finalize)
      .def_rw("input_norm_const", &Spec::input_norm_const)
      .def_rw("activation_dtype", &Spec::activation_dtype)
      .def_rw("combine_dtype", &Spec::combine_dtype)
      .def_rw("has_expert_bias", &Spec::has_expert_bias)
      .def_rw("has_custom_swiglu_alpha_beta", &Spec::has_custom_swiglu_alpha_beta)
      .def_rw("weight_scheme", &Spec::weight_scheme)
      .def_rw("swiglu_alpha", &Spec::swiglu_alpha)
      .def_rw("swiglu_beta", &Spec::swiglu_beta)
      .def_rw("skip_final_all_reduce", &Spec::skip_final_all_reduce)
      .def_rw("runtime_weight_transfer", &Spec::runtime_weight_transfer)
      .def_rw("dual_batch_overlap", &Spec::dual_batch_overlap)
      .def_rw("fp8_mma", &Spec::fp8_mma);

  m.def(
      "_unsupported_reasons",
      [](const Spec& spec, int world_size, const std::string& backend) {
        Backend b = resolve_backend(parse_backend(backend));
        return unsupported_reasons(spec.to_config(), world_size, b);
      },
      "spec"_a, "world_size"_a, "backend"_a);

  m.def("_resolve_backend", [](const std::string& b) {
    return std::string(backend_name(resolve_backend(parse_backend(b))));
  });

  m.def("_nccl_unique_id", []() -> nb::bytes {
#if defined(MOE_EP_HAVE_CUDA)
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      throw Error(ErrorCode::kBackend,
                  std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
    static_assert(sizeof(id) == 128);
    return nb::bytes(reinterpret_cast<const char*>(&id), sizeof(id));
#else
    throw Error(ErrorCode::kUnsupported, "this build of moe_ep has no CUDA/NCCL support");
#endif
  });

  nb::class_<PyCpuFleet>(m, "CpuFleet",
                         "An in-process fleet of W CPU ranks; every rank's layer shares it.")
      .def(nb::init<int>(), "world_size"_a)
      .def_ro("world_size", &PyCpuFleet::world_size)
      .def("__repr__",
           [](const PyCpuFleet& f) { return "CpuFleet(" + std::to_string(f.world_size) + ")"; });

  nb::class_<PyGroup>(m, "_Group")
      .def(
          "__init__",
          [](PyGroup* self, int world_size, int rank, const std::string& backend, int device,
             PyCpuFleet* cpu_fleet, std::optional<nb::bytes> nccl_unique_id, uintptr_t nccl_comm,
             int64_t timeout_ms, int64_t warmup_timeout_ms) {
            const Bootstrap boot =
                make_bootstrap(world_size, rank, backend, device, cpu_fleet, nccl_unique_id,
                               nccl_comm, timeout_ms, warmup_timeout_ms);
            std::shared_ptr<EpGroup> g;
            {
              nb::gil_scoped_release release;  // collective at W > 1 (the communicator)
              g = EpGroup::create(boot);
            }
            new (self) PyGroup{std::move(g)};
          },
          "world_size"_a, "rank"_a, "backend"_a, "device"_a, "cpu_fleet"_a.none(),
          "nccl_unique_id"_a.none(), "nccl_comm"_a, "timeout_ms"_a, "warmup_timeout_ms"_a)
      .def_prop_ro("world_size", [](PyGroup& g) { return g.get().world_size(); })
      .def_prop_ro("rank", [](PyGroup& g) { return g.get().rank(); })
      .def_prop_ro("backend",
                   [](PyGroup& g) { return std::string(backend_name(g.get().backend())); })
      .def_prop_ro("device", [](PyGroup& g) { return g.get().device(); })
      .def_prop_ro("pool_bytes", [](PyGroup& g) { return g.get().pool_bytes(); })
      .def_prop_ro("num_pooled_workspaces",
                   [](PyGroup& g) { return g.get().num_pooled_workspaces(); })
      .def_prop_ro("destroyed", [](PyGroup& g) { return g.get().destroyed(); })
      .def("destroy", [](PyGroup& g) {
        EpGroup& group = g.get();
        nb::gil_scoped_release release;
        group.destroy();
      });

  nb::class_<PyLayer>(m, "_Layer")
      .def(
          "__init__",
          [](PyLayer* self, const Spec& spec, const InArray& w13, const InArray& w2,
             const std::optional<InArray>& w13_scale, const std::optional<InArray>& w2_scale,
             const std::optional<InArray>& fc1_alpha, const std::optional<InArray>& fc2_alpha,
             const std::optional<InArray>& fc1_norm_const, const std::optional<InArray>& fc1_bias,
             const std::optional<InArray>& fc2_bias, int world_size, int rank,
             const std::string& backend, int device, PyCpuFleet* cpu_fleet,
             std::optional<nb::bytes> nccl_unique_id, uintptr_t nccl_comm, int64_t timeout_ms,
             int64_t warmup_timeout_ms, PyGroup* group) {
            const LayerConfig config = spec.to_config();
            WeightPack wp;
            wp.w13 = to_view(w13, "w13");
            wp.w2 = to_view(w2, "w2");
            wp.w13_scale = to_view(w13_scale, "w13_scale");
            wp.w2_scale = to_view(w2_scale, "w2_scale");
            EpilogueVectors ev;
            ev.fc1_alpha = to_view(fc1_alpha, "fc1_alpha");
            ev.fc2_alpha = to_view(fc2_alpha, "fc2_alpha");
            ev.fc1_norm_const = to_view(fc1_norm_const, "fc1_norm_const");
            ev.fc1_bias = to_view(fc1_bias, "fc1_bias");
            ev.fc2_bias = to_view(fc2_bias, "fc2_bias");
            std::unique_ptr<MegaLayer> layer;
            if (group) {
              group->get();  // throws for a group that was never constructed
              std::shared_ptr<EpGroup> g = group->group;
              nb::gil_scoped_release release;  // collective: peers construct on other threads
              layer = std::make_unique<MegaLayer>(std::move(g), config, wp, ev);
            } else {
              const Bootstrap boot =
                  make_bootstrap(world_size, rank, backend, device, cpu_fleet, nccl_unique_id,
                                 nccl_comm, timeout_ms, warmup_timeout_ms);
              nb::gil_scoped_release release;
              layer = std::make_unique<MegaLayer>(boot, config, wp, ev);
            }
            new (self) PyLayer{std::move(layer)};
          },
          "spec"_a, "w13"_a, "w2"_a, "w13_scale"_a.none(), "w2_scale"_a.none(),
          "fc1_alpha"_a.none(), "fc2_alpha"_a.none(), "fc1_norm_const"_a.none(),
          "fc1_bias"_a.none(), "fc2_bias"_a.none(), "world_size"_a, "rank"_a, "backend"_a,
          "device"_a, "cpu_fleet"_a.none(), "nccl_unique_id"_a.none(), "nccl_comm"_a,
          "timeout_ms"_a, "warmup_timeout_ms"_a, "group"_a.none())
      .def(
          "forward",
          [](PyLayer& s, const InArray& x, const InArray& ids, const InArray& w,
             const OutArray& out, const std::optional<InArray>& a1,
             const std::optional<InArray>& a2, const std::optional<InArray>& nc, int workspace,
             uintptr_t stream, const std::optional<InArray>& ntok) {
            MegaLayer& layer = s.get();
            const ForwardInputs in = make_inputs(x, ids, w, a1, a2, nc, workspace, stream, ntok);
            const TensorView o = to_view(out, "out");
            nb::gil_scoped_release release;
            layer.forward(in, o);
          },
          "hidden_states"_a, "topk_ids"_a, "topk_weights"_a, "out"_a, "fc1_alpha"_a.none(),
          "fc2_alpha"_a.none(), "fc1_norm_const"_a.none(), "workspace"_a, "stream"_a,
          "num_tokens"_a.none())
      .def(
          "forward_view",
          [](PyLayer& s, const InArray& x, const InArray& ids, const InArray& w,
             const std::optional<InArray>& a1, const std::optional<InArray>& a2,
             const std::optional<InArray>& nc, int workspace, uintptr_t stream,
             const std::optional<InArray>& ntok, int fw) {
            MegaLayer& layer = s.get();
            const ForwardInputs in = make_inputs(x, ids, w, a1, a2, nc, workspace, stream, ntok);
            TensorView v;
            {
              nb::gil_scoped_release release;
              v = layer.forward_view(in);
            }
            return to_python(v, nb::find(&s), Framework(fw));
          },
          "hidden_states"_a, "topk_ids"_a, "topk_weights"_a, "fc1_alpha"_a.none(),
          "fc2_alpha"_a.none(), "fc1_norm_const"_a.none(), "workspace"_a, "stream"_a,
          "num_tokens"_a.none(), "framework"_a)
      .def(
          "forward_unfinalized",
          [](PyLayer& s, const InArray& x, const InArray& ids, const InArray& w,
             const std::optional<InArray>& a1, const std::optional<InArray>& a2,
             const std::optional<InArray>& nc, int workspace, uintptr_t stream,
             const std::optional<InArray>& ntok, int fw) {
            MegaLayer& layer = s.get();
            const ForwardInputs in = make_inputs(x, ids, w, a1, a2, nc, workspace, stream, ntok);
            UnfinalizedOutput o;
            {
              nb::gil_scoped_release release;
              o = layer.forward_unfinalized(in);
            }
            return nb::make_tuple(owned_to_python(o.rows, Framework(fw)),
                                  owned_to_python(o.weights, Framework(fw)),
                                  owned_to_python(o.indices, Framework(fw)));
          },
          "hidden_states"_a, "topk_ids"_a, "topk_weights"_a, "fc1_alpha"_a.none(),
          "fc2_alpha"_a.none(), "fc1_norm_const"_a.none(), "workspace"_a, "stream"_a,
          "num_tokens"_a.none(), "framework"_a)
      .def(
          "forward_unfinalized_into",
          [](PyLayer& s, const InArray& x, const InArray& ids, const InArray& w,
             const OutArray& rows, const OutArray& weights, const OutArray& indices,
             const std::optional<InArray>& a1, const std::optional<InArray>& a2,
             const std::optional<InArray>& nc, int workspace, uintptr_t stream,
             const std::optional<InArray>& ntok) {
            MegaLayer& layer = s.get();
            const ForwardInputs in = make_inputs(x, ids, w, a1, a2, nc, workspace, stream, ntok);
            const UnfinalizedViews o{to_view(rows, "rows"), to_view(weights, "weights"),
                                     to_view(indices, "indices")};
            nb::gil_scoped_release release;
            layer.forward_unfinalized(in, o);
          },
          "hidden_states"_a, "topk_ids"_a, "topk_weights"_a, "rows"_a, "weights"_a, "indices"_a,
          "fc1_alpha"_a.none(), "fc2_alpha"_a.none(), "fc1_norm_const"_a.none(), "workspace"_a,
          "stream"_a, "num_tokens"_a.none())
      .def(
          "warmup",
          [](PyLayer& s, int ws) {
            MegaLayer& layer = s.get();
            nb::gil_scoped_release release;
            layer.warmup(ws >= 0 ? std::optional<WorkspaceId>(WorkspaceId{ws}) : std::nullopt);
          },
          "workspace"_a)
      .def(
          "create_workspace",
          [](PyLayer& s, int capacity) {
            MegaLayer& layer = s.get();
            nb::gil_scoped_release release;
            return layer.create_workspace(capacity).index;
          },
          "capacity"_a)
      .def(
          "create_decode_workspace",
          [](PyLayer& s, int max_num_seqs, int num_speculative_tokens, int sp_size) {
            MegaLayer& layer = s.get();
            nb::gil_scoped_release release;
            return layer.create_decode_workspace(max_num_seqs, num_speculative_tokens, sp_size)
                .index;
          },
          "max_num_seqs"_a, "num_speculative_tokens"_a, "sp_size"_a)
      .def("workspace_capacity",
           [](PyLayer& s, int ws) { return s.get().workspace_capacity(WorkspaceId{ws}); })
      .def("workspace_bytes",
           [](PyLayer& s, int ws) { return s.get().workspace_bytes(WorkspaceId{ws}); })
      .def("plan", [](PyLayer& s, int tokens,
                      int ws) { return s.get().plan(tokens, WorkspaceId{ws}).to_string(); })
      .def("last_plan", [](PyLayer& s) { return s.get().last_plan().to_string(); })
      .def("select_workspace", [](PyLayer& s, int t) { return s.get().select_workspace(t).index; })
      .def("select_workspace_collective",
           [](PyLayer& s, int t) {
             MegaLayer& layer = s.get();
             nb::gil_scoped_release release;
             return layer.select_workspace_collective(t).index;
           })
      .def(
          "kernel_weights",
          [](PyLayer& s, int fw) {
            const KernelWeights k = s.get().kernel_weights();
            nb::handle owner = nb::find(&s);
            return nb::make_tuple(to_python(k.fc1_weight, owner, Framework(fw)),
                                  to_python(k.fc1_scale, owner, Framework(fw)),
                                  to_python(k.fc2_weight, owner, Framework(fw)),
                                  to_python(k.fc2_scale, owner, Framework(fw)));
          },
          "framework"_a)
      .def(
          "expert_weight_views",
          [](PyLayer& s, int fw) {
            const ExpertWeightViews e = s.get().expert_weight_views();
            nb::handle owner = nb::find(&s);
            const Framework f = Framework(fw);
            return nb::make_tuple(
                to_python(e.weights.fc1_weight, owner, f), to_python(e.weights.fc1_scale, owner, f),
                to_python(e.weights.fc2_weight, owner, f), to_python(e.weights.fc2_scale, owner, f),
                to_python(e.fc1_alpha, owner, f), to_python(e.fc2_alpha, owner, f),
                to_python(e.fc1_norm_const, owner, f), to_python(e.fc1_bias, owner, f),
                to_python(e.fc2_bias, owner, f));
          },
          "framework"_a)
      .def("destroy",
           [](PyLayer& s) {
             if (!s.layer) return;
             nb::gil_scoped_release release;  // collective
             s.layer->destroy();
           })
      .def_prop_ro("destroyed", [](PyLayer& s) { return !s.layer || s.layer->destroyed(); })
      .def_prop_ro("rank", [](PyLayer& s) { return s.get().rank(); })
      .def_prop_ro("world_size", [](PyLayer& s) { return s.get().world_size(); })
      .def_prop_ro("num_local_experts", [](PyLayer& s) { return s.get().num_local_experts(); })
      .def_prop_ro("backend",
                   [](PyLayer& s) { return std::string(backend_name(s.get().backend())); })
      .def_prop_ro(
          "recipe",
          [](PyLayer& s) { return std::string(recipe_name(s.get().config().recipe.recipe)); })
      .def_prop_ro("hidden_size", [](PyLayer& s) { return s.get().config().fleet.hidden_size; })
      .def_prop_ro("top_k", [](PyLayer& s) { return s.get().config().recipe.top_k; })
      .def_prop_ro("do_finalize", [](PyLayer& s) { return s.get().config().recipe.do_finalize; })
      .def_prop_ro("max_tokens_per_rank",
                   [](PyLayer& s) { return s.get().config().fleet.max_tokens_per_rank; })
      .def_prop_ro("output_is_reduced", [](PyLayer& s) { return s.get().output_is_reduced(); })
      .def_prop_ro("is_monolithic", [](PyLayer& s) { return s.get().is_monolithic(); })
      .def_prop_ro("uses_fp8_mma", [](PyLayer& s) { return s.get().uses_fp8_mma(); })
      .def_prop_ro("can_overlap_shared_experts",
                   [](PyLayer& s) { return s.get().can_overlap_shared_experts(); });

  m.def(
      "_pack_expert_weights",
      [](const std::string& recipe,
         nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu> w13,
         nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu> w2,
         float input_norm_const,
         std::optional<nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>>
             fc1_norm_const) {
        auto r = parse_recipe(recipe);
        if (!r) invalid("unknown recipe '" + recipe + "'");
        const int64_t E = int64_t(w13.shape(0)), I2 = int64_t(w13.shape(1)),
                      H = int64_t(w13.shape(2));
        if (I2 % 2 != 0) invalid("w13 has " + std::to_string(I2) + " rows, expected 2I (even)");
        const int64_t I = I2 / 2;
        if (int64_t(w2.shape(0)) != E || int64_t(w2.shape(1)) != H || int64_t(w2.shape(2)) != I)
          invalid("w2 has shape [" + std::to_string(w2.shape(0)) + ", " +
                  std::to_string(w2.shape(1)) + ", " + std::to_string(w2.shape(2)) +
                  "], expected [E, H, I] = [" + std::to_string(E) + ", " + std::to_string(H) +
                  ", " + std::to_string(I) + "]");
        if (fc1_norm_const && int64_t(fc1_norm_const->shape(0)) != E)
          invalid("fc1_norm_const has " + std::to_string(fc1_norm_const->shape(0)) +
                  " entries, expected E = " + std::to_string(E));
        const float* nc = fc1_norm_const ? fc1_norm_const->data() : nullptr;
        PackedExperts* pe;
        {
          nb::gil_scoped_release release;
          pe = new PackedExperts(pack_expert_weights(*r, w13.data(), w2.data(), int(E), int(H),
                                                     int(I), input_norm_const, nc));
        }
        nb::capsule owner(pe, [](void* p) noexcept { delete static_cast<PackedExperts*>(p); });
        const WeightPack wp = pe->view();
        const EpilogueVectors ev = pe->epilogue_view();
        return weights_dict(wp, ev, owner);
      },
      "recipe"_a, "w13"_a, "w2"_a, "input_norm_const"_a = 1.0f,
      "fc1_norm_const"_a.none() = nb::none());

  // Hugging Face checkpoints (include/moe_ep/checkpoint.h); moe_ep/checkpoint.py wraps them.
  nb::class_<Checkpoint>(m, "_Checkpoint")
      .def(
          "__init__",
          [](Checkpoint* self, const std::string& dir) {
            nb::gil_scoped_release release;
            new (self) Checkpoint(dir);
          },
          "dir"_a)
      .def("info",
           [](const Checkpoint& c) {
             const CheckpointInfo& i = c.info();
             nb::dict d;
             d["dir"] = i.dir;
             d["model_type"] = i.model_type;
             d["weight_format"] = i.weight_format;
             d["hidden_size"] = i.hidden_size;
             d["moe_intermediate_size"] = i.moe_intermediate_size;
             d["num_experts"] = i.num_experts;
             d["top_k"] = i.top_k;
             d["num_hidden_layers"] = i.num_hidden_layers;
             d["moe_layers"] = i.moe_layers;
             d["swiglu_limit"] = i.swiglu_limit;
             d["swiglu_alpha"] = i.swiglu_alpha;
             d["swiglu_beta"] = i.swiglu_beta;
             d["has_expert_bias"] = i.has_expert_bias;
             d["native_recipe"] = std::string(recipe_name(i.native_recipe));
             d["router"] = i.router;
             d["norm_topk_prob"] = i.norm_topk_prob;
             d["routed_scaling_factor"] = i.routed_scaling_factor;
             d["n_group"] = i.n_group;
             d["topk_group"] = i.topk_group;
             return d;
           })
      .def(
          "load_layer",
          [](const Checkpoint& c, int layer, std::optional<std::string> recipe, int world_size,
             int rank) {
            std::optional<Recipe> r;
            if (recipe) {
              r = parse_recipe(*recipe);
              if (!r) invalid("unknown recipe '" + *recipe + "'");
            }
            LayerCheckpoint* lc;
            {
              nb::gil_scoped_release release;
              lc = new LayerCheckpoint(c.load_layer(layer, r, world_size, rank));
            }
            nb::capsule owner(lc,
                              [](void* p) noexcept { delete static_cast<LayerCheckpoint*>(p); });
            const WeightPack wp = lc->weights();
            const EpilogueVectors ev = lc->epilogue();
            nb::dict d = weights_dict(wp, ev, owner);
            d["fc1_bias"] = to_python(ev.fc1_bias, owner, kNumpy);
            d["fc2_bias"] = to_python(ev.fc2_bias, owner, kNumpy);
            const LayerConfig& cfg = lc->config;
            nb::dict conf;
            conf["num_experts"] = cfg.fleet.num_experts;
            conf["hidden_size"] = cfg.fleet.hidden_size;
            conf["intermediate_size"] = cfg.recipe.intermediate_size;
            conf["top_k"] = cfg.recipe.top_k;
            conf["recipe"] = std::string(recipe_name(cfg.recipe.recipe));
            conf["swiglu_limit"] = cfg.recipe.swiglu_limit;
            conf["swiglu_alpha"] = cfg.recipe.swiglu_alpha;
            conf["swiglu_beta"] = cfg.recipe.swiglu_beta;
            conf["input_norm_const"] = cfg.recipe.input_norm_const;
            conf["has_expert_bias"] = cfg.recipe.has_expert_bias;
            conf["layer"] = lc->layer;
            conf["rank"] = lc->rank;
            conf["world_size"] = lc->world_size;
            d["config"] = conf;
            return d;
          },
          "layer"_a, "recipe"_a.none() = nb::none(), "world_size"_a = 1, "rank"_a = 0)
      .def(
          "route",
          [](const Checkpoint& c, int layer,
             nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu> x) {
            const int64_t T = int64_t(x.shape(0)), H = int64_t(x.shape(1));
            if (H != c.info().hidden_size)
              invalid("route: hidden_states has " + std::to_string(H) +
                      " columns, expected hidden_size " + std::to_string(c.info().hidden_size));
            const int64_t K = c.info().top_k;
            auto* ids = new std::vector<int32_t>(size_t(T * K));
            auto* w = new std::vector<float>(size_t(T * K));
            nb::capsule own_ids(
                ids, [](void* p) noexcept { delete static_cast<std::vector<int32_t>*>(p); });
            nb::capsule own_w(w,
                              [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
            {
              nb::gil_scoped_release release;
              c.route(layer, x.data(), int(T), ids->data(), w->data());
            }
            return nb::make_tuple(
                to_python(TensorView::contiguous(ids->data(), DType::kI32, {T, K}), own_ids,
                          kNumpy),
                to_python(TensorView::contiguous(w->data(), DType::kF32, {T, K}), own_w, kNumpy));
          },
          "layer"_a, "hidden_states"_a)
      .def("bytes_read", &Checkpoint::bytes_read);
}
