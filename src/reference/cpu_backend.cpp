// The CPU backend: exact, multi-threaded, and the oracle of every test. It follows the protocol
// the GPUs follow (docs/protocol.md): a forward is
//   A. dispatch: each source rank quantizes its tokens to the recipe's activation format and
//      writes each token once per owner rank into that owner's receive area (with the token
//      index, its K expert ids and K weights); barrier;
//   B. expert compute: each owner runs its local experts over what it received and writes
//      y[t,k] as bf16 into the source rank's combine area at row t*K+k; barrier;
//   C. finalize: each source sums its rows in slot order (or hands them out unfinalized).
// Every number a rank computes is computed by one thread in a fixed order, so the result does
// not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "common/workspace_layout.h"
#include "layer/backend.h"
#include "moe_ep/formats.h"
#include "moe_ep/status.h"
#include "reference/cpu_fleet.h"
#include "reference/cpu_group.h"
#include "reference/cpu_math.h"

namespace moe_ep {
namespace {

// Stages of one collective op; tickets are seq * kStages + stage.
enum Stage : uint64_t { kStageDispatch = 1, kStageCompute = 2, kStageDone = 3, kStages = 4 };

// One of the layer's workspaces: its layout, in the group's pooled memory of its capacity.
struct Workspace {
  WorkspaceLayout layout;
  std::shared_ptr<PooledWorkspace> pool;
  uint8_t* data() const { return static_cast<CpuPooledWorkspace&>(*pool).mem.get(); }
};

class CpuBackend final : public LayerBackend {
 public:
  CpuBackend(EpGroup& group, const LayerConfig& cfg, const WeightPack& w, const EpilogueVectors& ep)
      : boot_(group.bootstrap()),
        cfg_(cfg),
        shape_(ExpertShape::of(cfg, group.world_size())),
        group_(&group.impl()) {
    const Bootstrap& boot = boot_;
    transport_ = std::static_pointer_cast<CpuGroupTransport>(group_->transport);
    fleet_ = transport_->fleet();
    channel_ = fleet_->open_channel(boot.rank);
    threads_ = std::max(1, omp_get_max_threads() / boot.world_size);

    // Copy the weights (the CPU kernels read the checkpoint layout as it is) and check scales.
    // Argument checks of this rank run inside the construction collective, so a rejection on one
    // rank reaches every rank instead of leaving the fleet out of step.
    std::string bad;
    try {
      validate_weight_pack(cfg, boot.world_size, w);
      validate_epilogue_vector(ep.fc1_alpha, shape_.El, "fc1_alpha");
      validate_epilogue_vector(ep.fc2_alpha, shape_.El, "fc2_alpha");
      validate_epilogue_vector(ep.fc1_norm_const, shape_.El, "fc1_norm_const");
      copy_weights(w);
      copy_vector(ep.fc1_alpha, fc1_alpha_);
      copy_vector(ep.fc2_alpha, fc2_alpha_);
      copy_vector(ep.fc1_norm_const, fc1_nc_);
      copy_bias(ep.fc1_bias, 2 * shape_.I, "fc1_bias", fc1_bias_);
      copy_bias(ep.fc2_bias, shape_.H, "fc2_bias", fc2_bias_);
      bad = find_nan_scales();
    } catch (const Error& e) {
      bad = e.what();
    }
    // Construction is collective: every rank learns whether every rank accepted its weights.
    const auto ok = run_collective([&] {
      return fleet_->allgather(channel_, rank(), bad.empty() ? 0 : 1, next_ticket(1), seq_,
                               "construct", boot_.warmup_timeout_ms);
    });
    if (!bad.empty()) throw Error(ErrorCode::kInvalidArgument, bad);
    for (int r = 0; r < boot.world_size; ++r)
      if (ok[r])
        throw Error(ErrorCode::kPeer, "moe_ep: peer rank " + std::to_string(r) +
                                          " rejected its weights; the layer was not built");
    create_workspace(cfg.fleet.max_tokens_per_rank);
  }

  Device device() const override { return Device{}; }
  int rank() const { return boot_.rank; }
  int W() const { return boot_.world_size; }

  int create_workspace(int capacity) override {
    check_usable();
    auto ws = std::make_unique<Workspace>();
    const ActFormat act = act_format(cfg_.recipe.recipe, shape_.H);
    ws->layout =
        WorkspaceLayout::make(W(), capacity, shape_.H, shape_.K, act.data_bytes, act.scale_bytes);
    PoolNeeds needs;
    needs.window = ws->layout;
    // Collective: the group makes (or re-makes larger) its pooled workspace of this capacity and
    // publishes it; peers address it once every rank has.
    ws->pool = group_->acquire(capacity, needs);
    const int idx = int(workspaces_.size());
    workspaces_.push_back(std::move(ws));
    collective_barrier("create_workspace", boot_.warmup_timeout_ms);
    return idx;
  }

  int num_workspaces() const override { return int(workspaces_.size()); }
  int workspace_capacity(int ws) const override { return get_ws(ws).layout.capacity; }
  size_t workspace_bytes(int ws) const override { return get_ws(ws).layout.total_bytes; }

  void warmup(int ws) override {
    check_usable();
    get_ws(ws);  // nothing lazy on the CPU
  }

  TensorView workspace_output(int ws, int tokens) override {
    const Workspace& w = get_ws(ws);
    return TensorView::contiguous(w.data() + w.layout.out_off, DType::kBF16, {tokens, shape_.H});
  }

  KernelWeights kernel_weights() override {
    const int64_t el = shape_.El;
    const ExpertBytes b = expert_bytes(cfg_);
    KernelWeights k;
    k.fc1_weight = TensorView::contiguous(w13_.data(), DType::kU8, {el, int64_t(b.w13)});
    k.fc2_weight = TensorView::contiguous(w2_.data(), DType::kU8, {el, int64_t(b.w2)});
    if (b.w13_scale) {
      k.fc1_scale = TensorView::contiguous(w13s_.data(), DType::kU8, {el, int64_t(b.w13_scale)});
      k.fc2_scale = TensorView::contiguous(w2s_.data(), DType::kU8, {el, int64_t(b.w2_scale)});
    }
    return k;
  }

  ExpertWeightViews expert_weight_views() override {
    ExpertWeightViews v;
    v.weights = kernel_weights();
    v.fc1_alpha = TensorView::contiguous(fc1_alpha_.data(), DType::kF32, {shape_.El});
    v.fc2_alpha = TensorView::contiguous(fc2_alpha_.data(), DType::kF32, {shape_.El});
    v.fc1_norm_const = TensorView::contiguous(fc1_nc_.data(), DType::kF32, {shape_.El});
    if (!fc1_bias_.empty())
      v.fc1_bias = TensorView::contiguous(fc1_bias_.data(), DType::kF32, {shape_.El, 2 * shape_.I});
    if (!fc2_bias_.empty())
      v.fc2_bias = TensorView::contiguous(fc2_bias_.data(), DType::kF32, {shape_.El, shape_.H});
    return v;
  }

  int allreduce_max(int value) override {
    check_usable();
    const auto all = run_collective([&] {
      return fleet_->allgather(channel_, rank(), value, next_ticket(1), seq_, "allreduce_max",
                               boot_.timeout_ms);
    });
    return int(*std::max_element(all.begin(), all.end()));
  }

  Tensor allocate(DType dtype, std::initializer_list<int64_t> shape) override {
    return Tensor::empty(dtype, shape);
  }

  void abandon_call(const std::string& why) override {
    if (!broken_.empty()) return;
    ++seq_;
    fleet_->abandon(channel_, rank(), seq_, why);
  }

  void destroy() override {
    if (broken_.empty()) {
      try {
        collective_barrier("destroy", boot_.warmup_timeout_ms);
      } catch (const Error&) {
        // A peer is gone: it may still hold our window pointers, so the fleet keeps the memory.
        retain_workspaces();
        throw;
      }
    } else {
      retain_workspaces();
    }
  }

  void forward(const ValidatedForward& in, const ForwardTargets& out) override;
  ForwardPlan last_plan() const override {
    ForwardPlan p;  // the reference launches nothing: its plan names T alone
    p.tokens = last_tokens_;
    return p;
  }

 private:
  // Peers may still address the pooled memory after a fault: the fleet keeps it.
  void retain_workspaces() {
    for (auto& ws : workspaces_)
      fleet_->retain(std::shared_ptr<void>(static_cast<CpuPooledWorkspace&>(*ws->pool).mem));
  }

  // --- collectives -------------------------------------------------------------------------
  uint64_t next_ticket(uint64_t stage) const { return uint64_t(seq_) * kStages + stage; }

  void check_usable() const {
    if (!broken_.empty())
      throw Error(ErrorCode::kPeer,
                  "moe_ep: the layer is unusable after an earlier failure: " + broken_);
  }

  // Runs a collective body; a peer failure (timeout) leaves the fleet out of step, so it marks
  // the layer broken (sticky) and every later call reports it.
  template <class Fn>
  std::invoke_result_t<Fn> run_collective(Fn&& fn) {
    ++seq_;
    try {
      return fn();
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kPeer &&
          std::string(e.what()).find("abandoned") == std::string::npos)
        broken_ = e.what();
      throw;
    }
  }

  void collective_barrier(const char* stage, int64_t timeout_ms) {
    run_collective([&] {
      fleet_->barrier(channel_, rank(), next_ticket(1), seq_, stage, timeout_ms);
      return 0;
    });
  }

  const Workspace& get_ws(int ws) const {
    if (ws < 0 || ws >= int(workspaces_.size()))
      throw Error(ErrorCode::kInvalidArgument, "workspace " + std::to_string(ws) +
                                                   " does not exist (the layer has " +
                                                   std::to_string(workspaces_.size()) + ")");
    return *workspaces_[ws];
  }
  uint8_t* peer_ws(int peer, int ws) {
    return static_cast<uint8_t*>(
        fleet_->peer_ptr(transport_->pool_channel(), peer, get_ws(ws).pool->key));
  }

  // --- weights ------------------------------------------------------------------------------
  void copy_weights(const WeightPack& w) {
    auto copy = [](const TensorView& v, std::vector<uint8_t>& dst) {
      if (!v.defined()) return;
      if (v.device.kind != DeviceKind::kCPU)
        throw Error(ErrorCode::kInvalidArgument,
                    "the CPU backend takes weights in host memory, got " + v.describe());
      dst.resize(v.nbytes());
      if (!dst.empty()) std::memcpy(dst.data(), v.data, dst.size());
    };
    copy(w.w13, w13_);
    copy(w.w2, w2_);
    copy(w.w13_scale, w13s_);
    copy(w.w2_scale, w2s_);
  }

  void copy_vector(const TensorView& v, std::vector<float>& dst) {
    dst.assign(shape_.El, 1.0f);
    if (!v.defined()) return;
    if (v.device.kind != DeviceKind::kCPU)
      throw Error(ErrorCode::kInvalidArgument,
                  "the CPU backend takes epilogue vectors in host memory, got " + v.describe());
    std::memcpy(dst.data(), v.data, dst.size() * 4);
  }

  // An expert bias: absent (empty), or f32 [E_local, n] contiguous in host memory, finite.
  void copy_bias(const TensorView& v, int n, const char* name, std::vector<float>& dst) {
    dst.clear();
    if (!v.defined()) return;
    if (v.device.kind != DeviceKind::kCPU)
      throw Error(ErrorCode::kInvalidArgument, std::string("the CPU backend takes ") + name +
                                                   " in host memory, got " + v.describe());
    if (v.dtype != DType::kF32 || v.ndim != 2 || v.shape[0] != shape_.El || v.shape[1] != n ||
        !v.is_contiguous())
      throw Error(ErrorCode::kInvalidArgument, std::string(name) + " is " + v.describe() +
                                                   ", expected f32 [" + std::to_string(shape_.El) +
                                                   ", " + std::to_string(n) + "] contiguous");
    dst.assign(static_cast<const float*>(v.data), static_cast<const float*>(v.data) + v.numel());
    for (size_t i = 0; i < dst.size(); ++i)
      if (!std::isfinite(dst[i]))
        throw Error(ErrorCode::kInvalidArgument,
                    std::string(name) + "[" + std::to_string(i / n) + ", " + std::to_string(i % n) +
                        "] = " + std::to_string(dst[i]) + " is not finite");
  }

  std::string find_nan_scales() const {
    const RecipeTraits t = recipe_traits(cfg_.recipe.recipe);
    if (!t.weights_4bit) return {};
    auto scan = [&](const std::vector<uint8_t>& s, const char* name, int64_t rows,
                    int64_t blocks) -> std::string {
      for (size_t i = 0; i < s.size(); ++i) {
        const uint8_t b = s[i];
        const bool nan = t.e4m3_scales ? (b & 0x7f) == 0x7f : b == 0xff;
        if (nan) {
          const int64_t e = int64_t(i) / (rows * blocks), r = int64_t(i) / blocks % rows;
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", b);
          return std::string(name) + " has a NaN scale byte " + hex + " at local expert " +
                 std::to_string(e) + ", row " + std::to_string(r) + ", block " +
                 std::to_string(int64_t(i) % blocks);
        }
      }
      return {};
    };
    auto why = scan(w13s_, "w13_scale", 2 * shape_.I, shape_.H / t.weight_block);
    if (why.empty()) why = scan(w2s_, "w2_scale", shape_.H, shape_.I / t.weight_block);
    return why;
  }

  Bootstrap boot_;
  LayerConfig cfg_;
  int last_tokens_ = 0;  // T of the latest forward (last_plan)
  ExpertShape shape_;
  EpGroup::Impl* group_;  // outlives the backend (MegaLayer holds the group)
  std::shared_ptr<CpuGroupTransport> transport_;
  std::shared_ptr<CpuFleet> fleet_;
  int channel_ = 0;  // the layer's own barriers; its workspaces are on the group's channel
  int threads_ = 1;
  int64_t seq_ = 0;
  std::string broken_;
  std::vector<uint8_t> w13_, w2_, w13s_, w2s_;
  std::vector<float> fc1_alpha_, fc2_alpha_, fc1_nc_;
  std::vector<float> fc1_bias_, fc2_bias_;  // [E_local][2I], [E_local][H]; empty: none
  std::vector<std::unique_ptr<Workspace>> workspaces_;
};

void CpuBackend::forward(const ValidatedForward& in, const ForwardTargets& out) {
  last_tokens_ = in.tokens;
  check_usable();
  const int H = shape_.H, K = shape_.K, E = cfg_.fleet.num_experts, El = shape_.El;
  const int T_rows = in.tokens;
  int T = T_rows;
  if (in.num_tokens) T = std::clamp(*in.num_tokens, 0, T_rows);
  const int32_t* ids = in.ids.ptr<int32_t>();
  const float* tw = in.weights.ptr<float>();

  // Ids are checked before this rank takes part, so a bad call changes nothing anywhere.
  for (int64_t i = 0; i < int64_t(T) * K; ++i) {
    if (ids[i] < -1 || ids[i] >= E) {
      const std::string why = "topk_ids[" + std::to_string(i / K) + ", " + std::to_string(i % K) +
                              "] = " + std::to_string(ids[i]) +
                              " is out of range [-1, E = " + std::to_string(E) + ")";
      abandon_call(why);
      throw Error(ErrorCode::kInvalidArgument, why);
    }
    // Non-finite routing weights of routed slots are rejected here, where the check is one
    // pass over T*K floats (an empty slot's weight is never read); the CUDA backend does not
    // check (docs/python.md says what it does with them).
    if (ids[i] >= 0 && !std::isfinite(tw[i])) {
      const std::string why = "topk_weights[" + std::to_string(i / K) + ", " +
                              std::to_string(i % K) + "] = " + std::to_string(tw[i]) +
                              " is not finite (NaN and Inf routing weights are rejected)";
      abandon_call(why);
      throw Error(ErrorCode::kInvalidArgument, why);
    }
  }

  EpilogueParams ep;
  ep.fc1_alpha =
      in.epilogue.fc1_alpha.defined() ? in.epilogue.fc1_alpha.ptr<float>() : fc1_alpha_.data();
  ep.fc2_alpha =
      in.epilogue.fc2_alpha.defined() ? in.epilogue.fc2_alpha.ptr<float>() : fc2_alpha_.data();
  ep.fc1_norm_const = in.epilogue.fc1_norm_const.defined() ? in.epilogue.fc1_norm_const.ptr<float>()
                                                           : fc1_nc_.data();
  ep.fc1_bias = fc1_bias_.empty() ? nullptr : fc1_bias_.data();
  ep.fc2_bias = fc2_bias_.empty() ? nullptr : fc2_bias_.data();

  const int ws_idx = in.workspace;
  const WorkspaceLayout& L = get_ws(ws_idx).layout;
  uint8_t* mine = get_ws(ws_idx).data();
  const ActFormat act = act_format(cfg_.recipe.recipe, H);
  const bool weight_in_fc1 = applies_weight_in_fc1(cfg_.recipe);

  run_collective([&] {
    // ---- A. dispatch ---------------------------------------------------------------------
    std::vector<uint8_t*> peers(W());
    for (int p = 0; p < W(); ++p) peers[p] = peer_ws(p, ws_idx);
    // Rows per owner, in token order; a token with several slots on one owner travels once.
    std::vector<std::vector<int>> rows_for(W());
    for (int t = 0; t < T; ++t) {
      for (int k = 0; k < K; ++k) {
        if (ids[t * K + k] < 0) continue;
        const int owner = ids[t * K + k] / El;
        const bool dup = !rows_for[owner].empty() && rows_for[owner].back() == t;
        if (!dup) rows_for[owner].push_back(t);
      }
    }
    // Quantize each token once, in parallel, then copy it to its owners.
    std::vector<uint8_t> packed(size_t(T) * L.act_row_bytes);
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int t = 0; t < T; ++t) {
      const uint16_t* x = in.x.ptr<uint16_t>() + int64_t(t) * in.x.strides[0];
      encode_activation(cfg_.recipe, act, x, H, packed.data() + size_t(t) * L.act_row_bytes);
    }
    for (int o = 0; o < W(); ++o) {
      const auto& rows = rows_for[o];
      for (size_t i = 0; i < rows.size(); ++i) {
        const int t = rows[i];
        std::memcpy(peers[o] + L.recv_act(rank(), int(i)),
                    packed.data() + size_t(t) * L.act_row_bytes, L.act_row_bytes);
        RecvMetaRow meta{peers[o] + L.recv_meta(rank(), int(i)), K};
        *meta.token() = t;
        std::memcpy(meta.ids(), ids + t * K, 4 * K);
        std::memcpy(meta.weights(), tw + t * K, 4 * K);
      }
      *reinterpret_cast<int32_t*>(peers[o] + L.recv_count(rank())) = int32_t(rows.size());
    }
    // Release: everything written above is visible to the owners after this barrier. It also
    // gathers every rank's workspace: peers address each other's buffers at equal offsets, so
    // a call where ranks use different workspaces fails on every rank (the rows written above
    // went to the peers' receive areas of a workspace of the same capacity; nothing else
    // changes) and the fleet stays in step.
    const std::vector<int64_t> used = fleet_->allgather(
        channel_, rank(), ws_idx, next_ticket(kStageDispatch), seq_, "dispatch", boot_.timeout_ms);
    for (int p = 1; p < W(); ++p)
      if (used[p] != used[0])
        throw Error(ErrorCode::kInvalidArgument,
                    "rank 0 called forward with workspace " + std::to_string(used[0]) +
                        " and rank " + std::to_string(p) + " with workspace " +
                        std::to_string(used[p]) +
                        ": every rank must run a call with the same workspace");

    // ---- B. expert compute on what this rank received ------------------------------------
    std::vector<std::vector<Pair>> pairs(El);
    for (int s = 0; s < W(); ++s) {
      const int n = *reinterpret_cast<const int32_t*>(mine + L.recv_count(s));
      for (int i = 0; i < n; ++i) {
        RecvMetaRow meta{mine + L.recv_meta(s, i), K};
        for (int k = 0; k < K; ++k) {
          const int e = meta.ids()[k];
          if (e >= 0 && e / El == rank())
            pairs[e % El].push_back(
                Pair{s, *meta.token(), k, mine + L.recv_act(s, i), meta.weights()[k]});
        }
      }
    }
    ExpertWeights wts{w13_.data(), w2_.data(), w13s_.data(), w2s_.data()};
    run_experts(cfg_, shape_, wts, ep, pairs, weight_in_fc1, threads_, [&](const Pair& p) {
      return reinterpret_cast<uint16_t*>(peers[p.src] + L.combine_row(p.token, p.slot));
    });
    // Release: y rows are in the sources' combine areas after this barrier.
    fleet_->barrier(channel_, rank(), next_ticket(kStageCompute), seq_, "combine",
                    boot_.timeout_ms);
    return 0;
  });

  // ---- C. finalize (local) -----------------------------------------------------------------
  const uint16_t* rows = reinterpret_cast<const uint16_t*>(mine + L.combine_off);
  if (out.out.defined()) {
    uint16_t* o = out.out.ptr<uint16_t>();
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int t = 0; t < T_rows; ++t) {
      if (t >= T) {
        std::memset(o + size_t(t) * H, 0, size_t(H) * 2);
        continue;
      }
      finalize_token(rows + size_t(t) * K * H, ids + t * K, tw + t * K, K, H, weight_in_fc1,
                     o + size_t(t) * H);
    }
  } else {
    uint16_t* r = out.rows.ptr<uint16_t>();
    float* wo = out.weights.ptr<float>();
    int32_t* io = out.indices.ptr<int32_t>();
    for (int t = 0; t < T_rows; ++t) {
      for (int k = 0; k < K; ++k) {
        const size_t row = size_t(t) * K + k;
        const bool live = t < T && ids[row] >= 0;
        if (live)
          std::memcpy(r + row * H, rows + row * H, size_t(H) * 2);
        else
          std::memset(r + row * H, 0, size_t(H) * 2);
        wo[row] = t < T ? (weight_in_fc1 ? 1.0f : tw[row]) : 0.0f;
        io[row] = live ? int32_t(row) : -1;
      }
    }
  }
}

}  // namespace

std::unique_ptr<LayerBackend> make_cpu_backend(EpGroup& group, const LayerConfig& config,
                                               const WeightPack& weights,
                                               const EpilogueVectors& epilogue) {
  return std::make_unique<CpuBackend>(group, config, weights, epilogue);
}

}  // namespace moe_ep
