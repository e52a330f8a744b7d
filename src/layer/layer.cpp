// MegaLayer: argument checks and the API surface; the work is done by a LayerBackend.
#include "moe_ep/layer.h"

#include <algorithm>
#include <exception>
#include <string>

#include "common/workspace_layout.h"
#include "layer/backend.h"
#include "layer/diagnostics.h"
#include "layer/group_pool.h"
#include "reference/cpu_math.h"

namespace moe_ep {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

[[noreturn]] void invalid(const std::string& msg) { throw Error(ErrorCode::kInvalidArgument, msg); }

void expect_tensor(const TensorView& t, const char* name, DType dtype,
                   std::initializer_list<int64_t> shape, Device device, bool contiguous) {
  if (!t.defined()) invalid(std::string(name) + " is missing");
  if (t.dtype != dtype)
    invalid(std::string(name) + " has dtype " + dtype_name(t.dtype) + ", expected " +
            dtype_name(dtype));
  if (t.ndim != int(shape.size()))
    invalid(std::string(name) + " has " + str(t.ndim) + " dims (" + t.describe() + "), expected " +
            str(int64_t(shape.size())));
  int d = 0;
  for (int64_t s : shape) {
    if (t.shape[d] != s)
      invalid(std::string(name) + " has shape " + t.describe() + ": dim " + str(d) + " is " +
              str(t.shape[d]) + ", expected " + str(s));
    ++d;
  }
  if (!(t.device == device))
    invalid(std::string(name) + " is on " + t.describe() + ", the layer runs on " +
            (device.kind == DeviceKind::kCPU ? std::string("cpu")
                                             : "cuda:" + std::to_string(device.index)));
  if (t.numel() > 0 && t.data == nullptr) invalid(std::string(name) + " has a null data pointer");
  if (contiguous && !t.is_contiguous())
    invalid(std::string(name) + " must be contiguous (strides " + str(t.strides[0]) + ", " +
            str(t.ndim > 1 ? t.strides[1] : 1) + ")");
}

}  // namespace

void validate_epilogue_vector(const TensorView& v, int num_local_experts, const char* name) {
  if (!v.defined()) return;
  expect_tensor(v, name, DType::kF32, {num_local_experts}, v.device, true);
}

namespace {
[[noreturn]] void refuse(const std::vector<std::string>& reasons) {
  std::string msg = "moe_ep: configuration not supported:";
  for (auto& r : reasons) msg += "\n  - " + r;
  throw Error(ErrorCode::kUnsupported, msg);
}
}  // namespace

MegaLayer::MegaLayer(const Bootstrap& boot, const LayerConfig& config, const WeightPack& weights,
                     const EpilogueVectors& epilogue)
    : config_(config), rank_(boot.rank), world_size_(boot.world_size) {
  backend_kind_ = resolve_backend(boot.backend);
  auto reasons = unsupported_reasons(config, boot.world_size, backend_kind_);
  if (boot.rank < 0 || boot.rank >= boot.world_size)
    reasons.push_back("rank " + str(boot.rank) + " is not in [0, W = " + str(boot.world_size) +
                      ")");
  if (!reasons.empty()) refuse(reasons);
  owns_group_ = true;
  build(EpGroup::create(boot), weights, epilogue);
}

MegaLayer::MegaLayer(std::shared_ptr<EpGroup> group, const LayerConfig& config,
                     const WeightPack& weights, const EpilogueVectors& epilogue)
    : config_(config) {
  if (!group) invalid("MegaLayer: the EP group is null");
  group->impl().check_live("building a layer");
  rank_ = group->rank();
  world_size_ = group->world_size();
  backend_kind_ = group->backend();
  const auto reasons = unsupported_reasons(config, world_size_, backend_kind_);
  if (!reasons.empty()) refuse(reasons);
  build(std::move(group), weights, epilogue);
}

void MegaLayer::build(std::shared_ptr<EpGroup> group, const WeightPack& weights,
                      const EpilogueVectors& epilogue) {
  const LayerConfig& config = config_;
  if (backend_kind_ == Backend::kCUDA) {
    validate_weight_pack(config, world_size_, weights);
    const int el = config.fleet.num_experts / world_size_;
    validate_epilogue_vector(epilogue.fc1_alpha, el, "fc1_alpha");
    validate_epilogue_vector(epilogue.fc2_alpha, el, "fc2_alpha");
    validate_epilogue_vector(epilogue.fc1_norm_const, el, "fc1_norm_const");
    if ((epilogue.fc1_bias.defined() || epilogue.fc2_bias.defined()) &&
        !cuda_runs_extended_epilogue(config))
      throw Error(ErrorCode::kUnsupported, "moe_ep: configuration not supported:\n  - " +
                                               extended_epilogue_reason(config, "expert bias"));
    impl_ = make_cuda_backend(*group, config, weights, epilogue);
  } else {
    impl_ = make_cpu_backend(*group, config, weights, epilogue);  // checks inside its collective
  }
  group_ = std::move(group);
  ++group_->impl().live_layers;
}

MegaLayer::~MegaLayer() {
  try {
    destroy();
  } catch (...) {
  }
}

LayerBackend& MegaLayer::live(const char* what) {
  if (!impl_)
    throw Error(ErrorCode::kDestroyed,
                std::string("moe_ep: ") + what + " called after destroy() on rank " + str(rank_));
  return *impl_;
}

bool MegaLayer::destroyed() const { return !impl_; }

bool MegaLayer::uses_fp8_mma() const { return impl_ && impl_->fp8_mma(); }

ForwardPlan MegaLayer::plan(int tokens, std::optional<WorkspaceId> ws) const {
  if (!impl_) throw Error(ErrorCode::kDestroyed, "moe_ep: plan() after destroy()");
  if (tokens < 0)
    throw Error(ErrorCode::kInvalidArgument,
                "moe_ep: plan(tokens = " + std::to_string(tokens) + "): tokens must be >= 0");
  const int w = ws ? ws->index : 0;
  if (w < 0 || w >= impl_->num_workspaces())
    throw Error(ErrorCode::kInvalidArgument, "moe_ep: workspace " + std::to_string(w) +
                                                 " does not exist (the layer has " +
                                                 std::to_string(impl_->num_workspaces()) + ")");
  return impl_->plan(tokens, w);
}

ForwardPlan MegaLayer::last_plan() const { return impl_ ? impl_->last_plan() : ForwardPlan{}; }

void MegaLayer::set_plan_options(const PlanOptions& options) {
  LayerBackend& b = live("set_plan_options");
  const std::vector<std::string> why = plan_options_reasons(options, config_.recipe.recipe);
  if (!why.empty()) {
    std::string msg = "moe_ep: set_plan_options:";
    for (const auto& w : why) msg += " " + w + ";";
    throw Error(ErrorCode::kInvalidArgument, msg);
  }
  b.set_plan_options(options);
  config_.plan_options = options;
}

void MegaLayer::set_stage_events(void* const* events) {
  if (impl_) impl_->set_stage_events(events);
}

void MegaLayer::destroy() {
  if (!impl_) return;
  auto impl = std::move(impl_);
  auto group = std::move(group_);
  --group->impl().live_layers;
  std::exception_ptr first;
  try {
    impl->destroy();
  } catch (...) {
    first = std::current_exception();
  }
  impl.reset();  // gives back its pooled workspaces: the group's last user frees each
  if (owns_group_) {
    try {
      group->destroy();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

WorkspaceId MegaLayer::default_workspace() const { return WorkspaceId{0}; }

WorkspaceId MegaLayer::create_workspace(int capacity) {
  auto& b = live("create_workspace");
  if (capacity < 1) invalid("create_workspace: capacity " + str(capacity) + " must be >= 1");
  return WorkspaceId{b.create_workspace(capacity)};
}

WorkspaceId MegaLayer::create_decode_workspace(int max_num_seqs, int num_speculative_tokens,
                                               int sp_size) {
  auto& b = live("create_decode_workspace");
  if (max_num_seqs < 1)
    invalid("create_decode_workspace: max_num_seqs " + str(max_num_seqs) + " must be >= 1");
  if (num_speculative_tokens < 0)
    invalid("create_decode_workspace: num_speculative_tokens " + str(num_speculative_tokens) +
            " must be >= 0");
  if (sp_size < 1) invalid("create_decode_workspace: sp_size " + str(sp_size) + " must be >= 1");
  const int64_t tokens = int64_t(max_num_seqs) * (1 + int64_t(num_speculative_tokens));
  const int64_t capacity = (tokens + sp_size - 1) / sp_size;
  if (capacity > config_.fleet.max_tokens_per_rank)
    invalid(
        "create_decode_workspace: cdiv(" + str(max_num_seqs) + " x (1 + " +
        str(num_speculative_tokens) + "), " + str(sp_size) + ") = " + str(capacity) +
        " tokens per rank exceed max_tokens_per_rank = " + str(config_.fleet.max_tokens_per_rank));
  for (int i = 0; i < b.num_workspaces(); ++i)
    if (b.workspace_capacity(i) == capacity) return WorkspaceId{i};
  const int ws = b.create_workspace(int(capacity));
  b.warmup(ws);
  return WorkspaceId{ws};
}

int MegaLayer::workspace_capacity(WorkspaceId ws) const {
  if (!impl_) throw Error(ErrorCode::kDestroyed, "moe_ep: workspace_capacity after destroy()");
  return impl_->workspace_capacity(ws.index);
}

size_t MegaLayer::workspace_bytes(WorkspaceId ws) const {
  if (!impl_) throw Error(ErrorCode::kDestroyed, "moe_ep: workspace_bytes after destroy()");
  return impl_->workspace_bytes(ws.index);
}

WorkspaceId MegaLayer::select_workspace(int max_tokens_any_rank) const {
  if (!impl_) throw Error(ErrorCode::kDestroyed, "moe_ep: select_workspace after destroy()");
  if (max_tokens_any_rank < 0)
    invalid("select_workspace: T = " + str(max_tokens_any_rank) + " must be >= 0");
  int best = -1, largest = 0;
  for (int i = 0; i < impl_->num_workspaces(); ++i) {
    const int cap = impl_->workspace_capacity(i);
    largest = std::max(largest, cap);
    if (cap >= max_tokens_any_rank && (best < 0 || cap < impl_->workspace_capacity(best))) best = i;
  }
  if (best < 0)
    throw Error(ErrorCode::kCapacity, "select_workspace: T = " + str(max_tokens_any_rank) +
                                          " tokens exceed every workspace (largest capacity " +
                                          str(largest) + ")");
  return WorkspaceId{best};
}

WorkspaceId MegaLayer::select_workspace_collective(int local_tokens) {
  auto& b = live("select_workspace_collective");
  const int largest = b.allreduce_max(local_tokens);  // first: the peers are not left waiting
  if (local_tokens < 0)
    invalid("select_workspace_collective: this rank's T = " + str(local_tokens) + " must be >= 0");
  return select_workspace(largest);
}

void MegaLayer::warmup(std::optional<WorkspaceId> ws) {
  auto& b = live("warmup");
  const int idx = ws ? ws->index : 0;
  b.workspace_capacity(idx);  // throws for an unknown workspace
  b.warmup(idx);
}

namespace {

ValidatedForward validate_inputs(const MegaLayer& layer, LayerBackend& b, const ForwardInputs& in) {
  const auto& cfg = layer.config();
  const int H = cfg.fleet.hidden_size, K = cfg.recipe.top_k;
  const Device dev = b.device();
  ValidatedForward v;
  v.workspace = in.workspace ? in.workspace->index : 0;
  const int cap = b.workspace_capacity(v.workspace);  // throws for an unknown workspace
  const TensorView& x = in.hidden_states;
  if (!x.defined()) invalid("hidden_states is missing");
  if (x.ndim != 2) invalid("hidden_states must be 2-D [T, H], got " + x.describe());
  const int64_t T = x.shape[0];
  if (T > cap)
    throw Error(ErrorCode::kCapacity, "hidden_states has T = " + str(T) +
                                          " tokens, more than the workspace capacity " + str(cap));
  expect_tensor(x, "hidden_states", DType::kBF16, {T, H}, dev, false);
  if (T > 0 && (x.strides[1] != 1 || x.strides[0] < H))
    invalid("hidden_states rows must be unit-stride with row stride >= H = " + str(H) +
            " (strides " + str(x.strides[0]) + ", " + str(x.strides[1]) + ")");
  expect_tensor(in.topk_ids, "topk_ids", DType::kI32, {T, K}, dev, true);
  expect_tensor(in.topk_weights, "topk_weights", DType::kF32, {T, K}, dev, true);
  const int el = layer.num_local_experts();
  validate_epilogue_vector(in.epilogue.fc1_alpha, el, "fc1_alpha");
  validate_epilogue_vector(in.epilogue.fc2_alpha, el, "fc2_alpha");
  validate_epilogue_vector(in.epilogue.fc1_norm_const, el, "fc1_norm_const");
  if (in.epilogue.fc1_bias.defined() || in.epilogue.fc2_bias.defined())
    invalid("fc1_bias and fc2_bias are the layer's, given at construction, not per call");
  for (const TensorView* e :
       {&in.epilogue.fc1_alpha, &in.epilogue.fc2_alpha, &in.epilogue.fc1_norm_const})
    if (e->defined() && !(e->device == dev))
      invalid("epilogue vector " + e->describe() + " is not on the layer's device");
  v.x = x;
  v.ids = in.topk_ids;
  v.weights = in.topk_weights;
  v.epilogue = in.epilogue;
  v.tokens = int(T);
  v.stream = in.stream;
  v.num_tokens = in.num_tokens;
  return v;
}

}  // namespace

// The checks every forward form runs before the backend takes part. A rank that rejects its
// call tells the peers (abandon_call), so they fail at once instead of waiting for it.
static ValidatedForward check_call(const MegaLayer& layer, LayerBackend& b, const ForwardInputs& in,
                                   bool finalized, const TensorView* out) {
  try {
    const bool do_finalize = layer.config().recipe.do_finalize;
    if (finalized && !do_finalize)
      throw Error(
          ErrorCode::kState,
          "forward() on a layer built with do_finalize = false; call forward_unfinalized()");
    if (!finalized && do_finalize)
      throw Error(ErrorCode::kState,
                  "forward_unfinalized() on a layer built with do_finalize = true; call forward()");
    ValidatedForward v = validate_inputs(layer, b, in);
    if (out)
      expect_tensor(*out, "out", DType::kBF16, {v.tokens, layer.config().fleet.hidden_size},
                    b.device(), true);
    return v;
  } catch (const Error& e) {
    b.abandon_call(e.what());
    throw;
  }
}

void MegaLayer::forward(const ForwardInputs& in, const TensorView& out) {
  auto& b = live("forward");
  const ValidatedForward v = check_call(*this, b, in, true, &out);
  ForwardTargets t;
  t.out = out;
  b.forward(v, t);
}

Tensor MegaLayer::forward(const ForwardInputs& in) {
  auto& b = live("forward");
  const int64_t T = in.hidden_states.ndim == 2 ? in.hidden_states.shape[0] : 0;
  Tensor out = b.allocate(DType::kBF16, {T, config_.fleet.hidden_size});
  forward(in, out.view());
  return out;
}

TensorView MegaLayer::forward_view(const ForwardInputs& in) {
  auto& b = live("forward");
  const int ws = in.workspace ? in.workspace->index : 0;
  const int64_t T = in.hidden_states.ndim == 2 ? in.hidden_states.shape[0] : 0;
  TensorView out;
  try {
    const int cap = b.workspace_capacity(ws);  // throws for an unknown workspace
    if (T > cap)
      throw Error(ErrorCode::kCapacity, "hidden_states has T = " + str(T) +
                                            " tokens, more than the workspace capacity " +
                                            str(cap));
    out = b.workspace_output(ws, int(T));
  } catch (const Error& e) {
    b.abandon_call(e.what());
    throw;
  }
  forward(in, out);
  return out;
}

UnfinalizedOutput MegaLayer::forward_unfinalized(const ForwardInputs& in) {
  auto& b = live("forward_unfinalized");
  const int64_t T = in.hidden_states.ndim == 2 ? in.hidden_states.shape[0] : 0;
  const int64_t K = config_.recipe.top_k, H = config_.fleet.hidden_size;
  UnfinalizedOutput o;
  o.rows = b.allocate(DType::kBF16, {T * K, H});
  o.weights = b.allocate(DType::kF32, {T, K});
  o.indices = b.allocate(DType::kI32, {T, K});
  forward_unfinalized(in, UnfinalizedViews{o.rows.view(), o.weights.view(), o.indices.view()});
  return o;
}

void MegaLayer::forward_unfinalized(const ForwardInputs& in, const UnfinalizedViews& out) {
  auto& b = live("forward_unfinalized");
  const ValidatedForward v = check_call(*this, b, in, false, nullptr);
  const int64_t T = v.tokens, K = config_.recipe.top_k, H = config_.fleet.hidden_size;
  try {
    expect_tensor(out.rows, "rows", DType::kBF16, {T * K, H}, b.device(), true);
    expect_tensor(out.weights, "weights", DType::kF32, {T, K}, b.device(), true);
    expect_tensor(out.indices, "indices", DType::kI32, {T, K}, b.device(), true);
  } catch (const Error& e) {
    b.abandon_call(e.what());
    throw;
  }
  ForwardTargets t;
  t.rows = out.rows;
  t.weights = out.weights;
  t.indices = out.indices;
  b.forward(v, t);
}

KernelWeights MegaLayer::kernel_weights() { return live("kernel_weights").kernel_weights(); }
ExpertWeightViews MegaLayer::expert_weight_views() {
  return live("expert_weight_views").expert_weight_views();
}

// ---------------------------------------------------------------------------------------------

ExpertBytes expert_bytes(const LayerConfig& c) {
  const size_t H = c.fleet.hidden_size, I = c.recipe.intermediate_size;
  const RecipeTraits t = recipe_traits(c.recipe.recipe);
  if (!t.weights_4bit) return {2 * I * H * 2, H * I * 2, 0, 0};
  return {2 * I * H / 2, H * I / 2, 2 * I * H / t.weight_block, H * I / t.weight_block};
}

void validate_weight_pack(const LayerConfig& c, int world_size, const WeightPack& w) {
  const int64_t el = c.fleet.num_experts / world_size, H = c.fleet.hidden_size,
                I = c.recipe.intermediate_size;
  const RecipeTraits t = recipe_traits(c.recipe.recipe);
  const Device dev = w.w13.device;
  auto bytes = [](const TensorView& v) {
    return v.dtype == DType::kU8 || v.dtype == DType::kF8E4M3 || v.dtype == DType::kF8E8M0;
  };
  auto check = [&](const TensorView& v, const char* name, std::initializer_list<int64_t> shape,
                   bool is_bytes) {
    if (!v.defined()) invalid(std::string("weight tensor ") + name + " is missing");
    if (is_bytes && !bytes(v))
      invalid(std::string(name) + " has dtype " + dtype_name(v.dtype) +
              ", expected uint8 bytes (or float8)");
    expect_tensor(v, name, is_bytes ? v.dtype : DType::kBF16, shape, dev, true);
  };
  if (t.weights_4bit) {
    check(w.w13, "w13", {el, 2 * I, H / 2}, true);
    check(w.w2, "w2", {el, H, I / 2}, true);
    check(w.w13_scale, "w13_scale", {el, 2 * I, H / t.weight_block}, true);
    check(w.w2_scale, "w2_scale", {el, H, I / t.weight_block}, true);
  } else {
    check(w.w13, "w13", {el, 2 * I, H}, false);
    check(w.w2, "w2", {el, H, I}, false);
    if (w.w13_scale.defined() || w.w2_scale.defined())
      invalid("the bf16 recipe takes no weight scales");
  }
}

int dispatch_row_bytes(const LayerConfig& c) {
  const ActFormat act = act_format(c.recipe.recipe, c.fleet.hidden_size);
  const WorkspaceLayout l = WorkspaceLayout::make(1, 1, c.fleet.hidden_size, c.recipe.top_k,
                                                  act.data_bytes, act.scale_bytes);
  return l.act_row_bytes + l.meta_row_bytes;
}

}  // namespace moe_ep
