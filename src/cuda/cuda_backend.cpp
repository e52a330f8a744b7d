// The CUDA layer backend (docs/gpu_kernels.md): weights preprocessed once into the resident
// layout of src/kernels/moe, one workspace allocation per capacity, and a forward of
// stream-ordered launches with no host synchronization (graph-capturable).
//
// EP = 1: prepare (quantize + route), fc1, fc2, finalize. W > 1 (docs/protocol.md §8): the
// workspace is an EpComm symmetric window plus local scratch; source quantize -> ep dispatch
// (with its wait fused) -> unpack the received rows into virtual tokens -> the same route / GEMM
// kernels -> ep combine (wait fused) -> finalize from the local combine area. By default fc2
// stores straight into the sources' combine areas and the combine kernel only signals and waits
// (MOE_EP_FUSED_COMBINE=0: fc2 writes a local y buffer that the combine kernel copies). Sticky
// transport errors (a peer that never arrived, abandoned the call or ran it in another
// workspace) are thrown as kPeer by the next host call; a call this rank rejects is abandoned
// towards its peers (abandon_call).
//
// Bad ids cannot be found on the host without a sync: the forward skips such a slot and sets a
// sticky error word in host-mapped memory; the next host call on the layer (forward, warmup,
// create_workspace, kernel_weights, destroy) throws it as kInvalidArgument once the faulty
// forward has finished on the device.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/env_switch.h"
#include "common/workspace_layout.h"
#include "cuda/comm/nccl_comm.h"
#include "cuda/stage_timing.h"
#include "kernels/ep/ep_launch.h"
#include "kernels/moe/moe_launch.h"
#include "layer/backend.h"
#include "moe_ep/status.h"
#include "reference/cpu_math.h"

namespace moe_ep {
namespace debug {
namespace {
cudaEvent_t* g_stage_events = nullptr;
}
void set_stage_events(cudaEvent_t* events) { g_stage_events = events; }
namespace {
cudaEvent_t* g_ep_stage_events = nullptr;
}
void set_ep_stage_events(cudaEvent_t* events) { g_ep_stage_events = events; }
}  // namespace debug

namespace {

constexpr int kMaxLocalExperts = 1024;
static_assert(kern::kEpUnpackMaxRanks == kEpMaxRanks, "unpack addresses every transport rank");

// The combine path, read per workspace at creation (the fused workspace has no y buffer).
// MOE_EP_FUSED_COMBINE unset, empty or 1 (the default; measured faster on the H200x2 at 1, 128
// and 4096 tokens, docs/protocol.md §10): fc2 stores its rows straight into the sources' combine
// areas and a signal-only combine kernel publishes them (docs/protocol.md §8); 2: the same, each
// storing fc2 thread also fencing system-wide after its rows (the §5 fallback); 0: fc2 writes
// the local y buffer, which ep_combine_kernel copies. Any other value keeps the default with a
// note on stderr (it is read after the collective window exists, where throwing would leave the
// peers' windows behind). Ranks may differ: both paths store the same rows and publish the same
// epoch, so they interoperate.
int fused_combine_from_env() {
  const char* v = std::getenv("MOE_EP_FUSED_COMBINE");
  if (v == nullptr || v[0] == '\0') return 1;
  const std::string s(v);
  if (s == "0" || s == "1" || s == "2") return s[0] - '0';
  std::fprintf(stderr,
               "moe_ep: MOE_EP_FUSED_COMBINE='%s' is not one of 0 (copy), 1 (fused), 2 "
               "(fused+fence); using 1\n",
               v);
  return 1;
}

[[noreturn]] void cuda_fail(cudaError_t err, const std::string& what) {
  throw Error(ErrorCode::kBackend, "moe_ep cuda: " + what + " failed: " + cudaGetErrorName(err) +
                                       " (" + cudaGetErrorString(err) + ")");
}

void check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) cuda_fail(err, what);
}

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  void allocate(size_t n, const char* what) {
    release();
    if (n == 0) return;
    check(cudaMalloc(&ptr, n),
          std::string("cudaMalloc of ") + std::to_string(n) + " bytes for " + what);
    bytes = n;
  }
  void release() {
    if (ptr) cudaFree(ptr);
    ptr = nullptr;
    bytes = 0;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

struct Workspace {
  int capacity = 0;
  WorkspaceLayout layout;
  DeviceBuffer mem;  // W = 1: layout + scratch; W > 1: scratch only (layout is the window)
  size_t xq_off = 0, h_off = 0, pairs_off = 0, tiles_off = 0, num_tiles_off = 0, counts_off = 0;
  size_t ranks_off = 0;
  // Decode split-K partials + counters: 4-bit recipes on the decode kernel only (bf16 weights
  // and the fp8 path never run it); without them the kernels do not split.
  bool splitk = false;
  size_t splitk_off = 0, splitk_counters_off = 0;
  size_t xq8_off = 0, xref_off = 0, h8_off = 0, href_off = 0;  // the fp8 path (fp8_)
  size_t h8map_off = 0;      // h8's tensor map (kern::encode_fp8_h_tensor_map), 128 bytes
  size_t fp8_sched_off = 0;  // the fp8 kernel's item ticket and exit count (ForwardArgs)
  // W > 1
  int ep_index = -1;  // EpComm workspace
  size_t act_off = 0, vids_off = 0, vweights_off = 0, y_off = 0;
  int fused_combine = 0;  // 1, 2: y_dst_off: [W*cap*K] row pointers instead of y [W*cap*K][H]
  size_t y_dst_off = 0;
};

// The fp8 MMA path of mxfp4_mxfp8 (weights in the fp8 resident layout, every tile on
// sm90_moe_fp8_ws_kernel; docs/gpu_kernels.md §8), for prefill: faster than the recipe's default
// path from 512 tokens on DSV3 and at 2048 and 4096 on Qwen3, slower at decode sizes; not bitwise
// equal to the CPU, and where a token has one slot its error can pass SPEC §7's 5e-3 (up to
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

// RecipeConfig::fp8_mma (refused by cuda_backend_unsupported_reasons where it cannot run), or
// MOE_EP_FP8=1 read at construction (ignored where it cannot).
bool fp8_path(const LayerConfig& c, int world_size) {
  if (c.recipe.fp8_mma) return true;
  const char* v = std::getenv("MOE_EP_FP8");
  return v && v[0] == '1' && c.recipe.recipe == Recipe::kMxfp4Mxfp8 &&
         fp8_mma_reasons(c, world_size).empty();
}

class CudaBackend final : public LayerBackend {
 public:
  CudaBackend(const Bootstrap& boot, const LayerConfig& cfg, const WeightPack& w,
              const EpilogueVectors& epi)
      : cfg_(cfg), dev_{DeviceKind::kCUDA, boot.device} {
    check(cudaSetDevice(boot.device), "cudaSetDevice(" + std::to_string(boot.device) + ")");
    const int H = cfg.fleet.hidden_size, I = cfg.recipe.intermediate_size;
    W_ = boot.world_size;
    rank_ = boot.rank;
    El_ = cfg.fleet.num_experts / boot.world_size;
    rs_ = kern::resident_shape(cfg.recipe.recipe, H, I);
    fp8_ = fp8_path(cfg, W_);
    check(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, boot.device),
          "reading the SM count");
    try {
      if (W_ > 1) {
        EpCommOptions o;
        o.device = boot.device;
        o.timeout_ms = boot.timeout_ms;
        o.warmup_timeout_ms = boot.warmup_timeout_ms;
        if (boot.nccl_comm) {
          comm_ = std::make_unique<EpComm>(static_cast<ncclComm_t>(boot.nccl_comm), o);
        } else if (boot.nccl_unique_id) {
          NcclUniqueIdBytes id;
          std::memcpy(id.data(), boot.nccl_unique_id->data(), id.size());
          comm_ = std::make_unique<EpComm>(id, boot.rank, boot.world_size, o);
        } else {
          throw Error(ErrorCode::kInvalidArgument,
                      "moe_ep cuda: W = " + std::to_string(W_) +
                          " needs Bootstrap::nccl_comm or Bootstrap::nccl_unique_id");
        }
        if (comm_->rank() != rank_ || comm_->world_size() != W_)
          throw Error(ErrorCode::kInvalidArgument,
                      "moe_ep cuda: the NCCL communicator is rank " +
                          std::to_string(comm_->rank()) + " of " +
                          std::to_string(comm_->world_size()) + ", the bootstrap says rank " +
                          std::to_string(rank_) + " of " + std::to_string(W_));
      }
      try {
        load_weights(w);
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
  ~CudaBackend() override { release(); }

  Device device() const override { return dev_; }

  int create_workspace(int capacity) override {
    check_host_errors();
    select_device();
    auto ws = std::make_unique<Workspace>();
    ws->capacity = capacity;
    const int H = cfg_.fleet.hidden_size, K = cfg_.recipe.top_k, I = cfg_.recipe.intermediate_size;
    const ActFormat act = act_format(cfg_.recipe.recipe, H);
    ws->layout = WorkspaceLayout::make(W_, capacity, H, K, act.data_bytes, act.scale_bytes);
    auto al = [](size_t v) { return WorkspaceLayout::align_up(v, WorkspaceLayout::kAlign); };
    size_t off = 0;
    // The expert side sees up to W * capacity received rows (virtual tokens).
    const size_t vtok = size_t(W_) * capacity;
    const size_t rows = vtok * K;
    if (W_ == 1) {
      off = ws->layout.total_bytes;
    } else {
      ws->ep_index = comm_->create_workspace(ws->layout);  // collective, same order everywhere
      ws->act_off = off;
      off = al(off + size_t(capacity) * ws->layout.act_row_bytes);
      ws->vids_off = off;
      off = al(off + rows * 4);
      ws->vweights_off = off;
      off = al(off + rows * 4);
      ws->fused_combine = fused_combine_from_env();
      if (ws->fused_combine) {
        ws->y_dst_off = off;
        off = al(off + rows * sizeof(uint16_t*));
      } else {
        ws->y_off = off;
        off = al(off + rows * H * 2);
      }
    }
    ws->xq_off = off;
    off = al(off + vtok * H * 2);
    ws->h_off = off;
    off = al(off + rows * I * 2);
    ws->pairs_off = off;
    off = al(off + rows * 4);
    ws->tiles_off = off;
    off =
        al(off + size_t(kern::max_tiles(int(rows), El_, kern::kMinTileN)) * sizeof(kern::TileInfo));
    ws->num_tiles_off = off;
    off = al(off + 8);  // the tile count, then the narrow ones' (ForwardArgs::tile_split)
    ws->counts_off = off;
    off = al(off + size_t(El_ + 1) * 4);  // + the spread route's ticket
    ws->ranks_off = off;
    off = al(off + rows * 4);
    ws->splitk = recipe_traits(cfg_.recipe.recipe).weights_4bit && !fp8_;  // decode kernel only
    if (ws->splitk) {
      ws->splitk_off = off;
      off = al(off + kern::splitk_partial_bytes());
      ws->splitk_counters_off = off;
      off = al(off + kern::splitk_counter_bytes());
    }
    if (fp8_) {
      ws->xq8_off = off;
      off = al(off + vtok * H);
      ws->xref_off = off;
      off = al(off + vtok);
      ws->h8_off = off;
      off = al(off + rows * I);
      ws->href_off = off;
      off = al(off + rows);
      ws->h8map_off = off;
      off = al(off + 128);
      ws->fp8_sched_off = off;
      off = al(off + 8);
    }
    ws->mem.allocate(off, "a workspace");
    if (fp8_)
      check(kern::encode_fp8_h_tensor_map(ws->mem.as<unsigned char>() + ws->h8map_off,
                                          ws->mem.as<uint8_t>() + ws->h8_off, rows, I),
            "encoding the tensor map of h8");
    // The spread route's counts and ticket start at zero; each forward leaves them at zero.
    check(cudaMemset(ws->mem.as<unsigned char>() + ws->counts_off, 0, size_t(El_ + 1) * 4),
          "zeroing the route counts");
    if (fp8_)  // the fp8 kernel's item ticket and exit count: each launch leaves them at zero
      check(cudaMemset(ws->mem.as<unsigned char>() + ws->fp8_sched_off, 0, 8),
            "zeroing the fp8 item tickets");
    if (ws->splitk) {
      // The split-K arrival counters start at zero; each kernel leaves them at zero.
      check(cudaMemset(ws->mem.as<unsigned char>() + ws->splitk_counters_off, 0,
                       kern::splitk_counter_bytes()),
            "zeroing the split-K counters");
    }
    check(cudaDeviceSynchronize(), "zeroing the workspace's counters");
    workspaces_.push_back(std::move(ws));
    return int(workspaces_.size()) - 1;
  }

  int num_workspaces() const override { return int(workspaces_.size()); }
  int workspace_capacity(int ws) const override { return get_ws(ws).capacity; }
  bool fp8_mma() const override { return fp8_; }
  size_t workspace_bytes(int ws) const override {
    const Workspace& w = get_ws(ws);
    return w.mem.bytes + (w.ep_index >= 0 ? comm_->workspace(w.ep_index).bytes : 0);
  }

  void warmup(int ws) override {
    check_host_errors();
    select_device();
    get_ws(ws);
    check(kern::set_kernel_attributes(cfg_.recipe.recipe), "loading the kernels");
    check(cudaDeviceSynchronize(), "warmup synchronize");
    if (comm_) comm_->barrier();
    check_host_errors();
  }

  void forward(const ValidatedForward& in, const ForwardTargets& out) override {
    check_host_errors();
    select_device();
    const Workspace& ws = get_ws(in.workspace);
    if (W_ > 1) return forward_ep(in, out, ws);
    unsigned char* base = ws.mem.as<unsigned char>();
    kern::ForwardArgs a = common_args(in);
    a.expert_base = 0;
    a.tokens = in.tokens;
    a.num_tokens = in.num_tokens;
    a.x = in.x.ptr<uint16_t>();
    a.x_stride = in.x.strides[0];
    a.ids = in.ids.ptr<int32_t>();
    a.topk_weights = in.weights.ptr<float>();
    a.xq = reinterpret_cast<uint16_t*>(base + ws.xq_off);
    a.h = reinterpret_cast<uint16_t*>(base + ws.h_off);
    a.sorted_pairs = reinterpret_cast<int32_t*>(base + ws.pairs_off);
    a.tiles = reinterpret_cast<kern::TileInfo*>(base + ws.tiles_off);
    a.num_tiles = reinterpret_cast<int32_t*>(base + ws.num_tiles_off);
    a.counts = reinterpret_cast<int32_t*>(base + ws.counts_off);
    a.pair_rank = reinterpret_cast<int32_t*>(base + ws.ranks_off);
    set_splitk(a, base, ws);
    if (fp8_) {
      a.fp8 = true;
      a.xq8 = base + ws.xq8_off;
      a.xref = base + ws.xref_off;
      a.h8 = base + ws.h8_off;
      a.href = base + ws.href_off;
      a.h8_tmap = base + ws.h8map_off;
      a.fp8_sched = reinterpret_cast<int32_t*>(base + ws.fp8_sched_off);
    }
    if (out.out.defined()) {
      a.y_rows = reinterpret_cast<uint16_t*>(base + ws.layout.combine_off);
      a.out = out.out.ptr<uint16_t>();
    } else {
      a.y_rows = out.rows.ptr<uint16_t>();
      a.weights_out = out.weights.ptr<float>();
      a.indices_out = out.indices.ptr<int32_t>();
    }
    a.tile_n = kern::choose_layer_tile_n(in.tokens, a.K, El_, a.recipe, a.I);
    check(kern::launch_forward(a, static_cast<cudaStream_t>(in.stream), debug::g_stage_events),
          "launching the forward");
  }

  TensorView workspace_output(int ws, int tokens) override {
    const Workspace& w = get_ws(ws);
    unsigned char* base =
        w.ep_index >= 0 ? comm_->workspace(w.ep_index).base : w.mem.as<unsigned char>();
    return TensorView::contiguous(base + w.layout.out_off, DType::kBF16,
                                  {tokens, cfg_.fleet.hidden_size}, dev_);
  }

  KernelWeights kernel_weights() override {
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

  ExpertWeightViews expert_weight_views() override {
    ExpertWeightViews v;
    v.weights = kernel_weights();
    v.fc1_alpha = TensorView::contiguous(fc1_alpha_.ptr, DType::kF32, {El_}, dev_);
    v.fc2_alpha = TensorView::contiguous(fc2_alpha_.ptr, DType::kF32, {El_}, dev_);
    v.fc1_norm_const = TensorView::contiguous(fc1_nc_.ptr, DType::kF32, {El_}, dev_);
    return v;
  }

  int allreduce_max(int value) override {
    if (!comm_) return value;
    check_host_errors();
    select_device();
    return comm_->allreduce_max(value);
  }

  Tensor allocate(DType dtype, std::initializer_list<int64_t> shape) override {
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

  // This rank rejected a call's arguments: its peers' waits of that call fail at once, naming
  // this rank, instead of timing out (docs/protocol.md §6). Ordered after this rank's earlier
  // forwards (their stream), so none of those is reported as abandoned.
  void abandon_call(const std::string& why) override {
    if (!comm_ || comm_->destroyed()) return;
    try {
      select_device();
      comm_->abandon(why, static_cast<cudaStream_t>(last_stream_));
    } catch (const Error&) {
      // Nothing more to do: the peers time out and name this rank, as before.
    }
  }

  void destroy() override {
    select_device();
    const cudaError_t err = cudaDeviceSynchronize();
    std::string pending;
    if (err_host_ && err_host_->code) pending = device_error_message();
    std::string peer;
    if (comm_ && !comm_->destroyed())
      if (auto r = comm_->error()) peer = ep_error_message(*r);
    std::string comm_err;
    try {
      if (comm_) comm_->destroy();  // collective: barrier with the peers, frees the windows
    } catch (const Error& e) {
      comm_err = e.what();
    }
    release();
    check(err, "synchronize at destroy");
    if (!peer.empty()) throw Error(ErrorCode::kPeer, peer);
    if (!comm_err.empty()) throw Error(ErrorCode::kBackend, comm_err);
    if (!pending.empty()) throw Error(ErrorCode::kInvalidArgument, pending);
  }

 private:
  // Sticky transport error first (kPeer, names the peer and stage), then a bad id.
  void check_host_errors() {
    if (comm_) comm_->check();
    check_device_error();
  }

  kern::ForwardArgs common_args(const ValidatedForward& in) const {
    kern::ForwardArgs a;
    const auto& rc = cfg_.recipe;
    a.recipe = rc.recipe;
    a.H = cfg_.fleet.hidden_size;
    a.I = rc.intermediate_size;
    a.K = rc.top_k;
    a.local_experts = El_;
    a.num_sms = num_sms_;
    a.num_experts = cfg_.fleet.num_experts;
    a.input_norm_const = rc.input_norm_const;
    a.swiglu_limit = rc.swiglu_limit ? *rc.swiglu_limit : -1.0f;
    a.weight_in_fc1 = applies_weight_in_fc1(rc);
    a.fc1_alpha = in.epilogue.fc1_alpha.defined() ? in.epilogue.fc1_alpha.ptr<float>()
                                                  : fc1_alpha_.as<float>();
    a.fc2_alpha = in.epilogue.fc2_alpha.defined() ? in.epilogue.fc2_alpha.ptr<float>()
                                                  : fc2_alpha_.as<float>();
    a.fc1_norm_const = in.epilogue.fc1_norm_const.defined()
                           ? in.epilogue.fc1_norm_const.ptr<float>()
                           : fc1_nc_.as<float>();
    a.w1 = w1_.as<uint8_t>();
    a.s1 = s1_.as<uint8_t>();
    a.w2 = w2_.as<uint8_t>();
    a.s2 = s2_.as<uint8_t>();
    a.rs = rs_;
    a.error = err_dev_;
    return a;
  }

  // W > 1, every rank (T = 0 too), one stream, no host sync (docs/protocol.md §8).
  void forward_ep(const ValidatedForward& in, const ForwardTargets& out, const Workspace& ws) {
    const cudaStream_t s = static_cast<cudaStream_t>(in.stream);
    last_stream_ = in.stream;
    const EpWorkspace& ew = comm_->workspace(ws.ep_index);
    const EpTransport tp = comm_->transport(ws.ep_index);
    const WorkspaceLayout& L = ws.layout;
    unsigned char* scratch = ws.mem.as<unsigned char>();
    const int H = cfg_.fleet.hidden_size, K = cfg_.recipe.top_k;
    const ActFormat act = act_format(cfg_.recipe.recipe, H);
    uint8_t* act_rows = scratch + ws.act_off;
    cudaEvent_t* ev = debug::g_ep_stage_events;
    auto mark = [&](int i) {
      // External: inside a stream capture the record becomes an event node of the graph.
      if (ev) check(cudaEventRecordWithFlags(ev[i], s, cudaEventRecordExternal), "stage event");
    };
    mark(0);

    // 1. Source: check ids, quantize x into activation rows.
    kern::EpSourceArgs sa;
    sa.recipe = cfg_.recipe.recipe;
    sa.H = H;
    sa.K = K;
    sa.num_experts = cfg_.fleet.num_experts;
    sa.tokens = in.tokens;
    sa.num_tokens = in.num_tokens;
    sa.x = in.x.ptr<uint16_t>();
    sa.x_stride = in.x.strides[0];
    sa.ids = in.ids.ptr<int32_t>();
    sa.input_norm_const = cfg_.recipe.input_norm_const;
    sa.act = act_rows;
    sa.act_row_bytes = L.act_row_bytes;
    sa.act_data_bytes = act.data_bytes;
    sa.error = err_dev_;
    kern::attach_timeline(sa);
    check(kern::launch_ep_source(sa, s), "launching the EP quantize");
    mark(1);

    // 2. Dispatch (each token once per owner rank) and wait for every source.
    EpDispatchParams dp;
    dp.tp = tp;
    dp.act = act_rows;
    dp.act_stride = L.act_row_bytes;
    dp.topk_ids = in.ids.ptr<int32_t>();
    dp.topk_weights = in.weights.ptr<float>();
    dp.num_tokens = in.tokens;
    dp.num_tokens_dev = in.num_tokens;
    dp.num_local_experts = El_;
    // One token per warp (16 a block), at most one block per SM (measured: 64 to 264 blocks
    // within 5% at 4096 tokens, 132 the fastest).
    dp.num_blocks = ep_blocks_for(num_sms_, in.tokens, 16);
    dp.fused_wait = true;  // the last block waits for every source (no wait launch)
    // Rows at the owners in tile order (per-tile atomics, the default), or in token order after
    // a count pass with MOE_EP_ORDERED_ROWS=1 (benchmark knob; same outputs either way).
    static const bool ordered_rows = env_switch("MOE_EP_ORDERED_ROWS", false);
    dp.ordered_rows = ordered_rows;
    // A one-block dispatch / signal-only combine (decode sizes) publishes with one system fence and
    // no global atomics (EpDispatchParams::solo); MOE_EP_SOLO_BLOCK=0 (benchmark knob) takes the
    // general path. Same rows, counts and outputs either way.
    static const bool solo = env_switch("MOE_EP_SOLO_BLOCK", true);
    dp.solo = solo;
    // The source quantize above is a plain launch, so the caller's ids, weights and count are
    // complete when the dispatch starts: it reads them before its wait for the quantize grid.
    // MOE_EP_EARLY_INPUTS=0 (benchmark knob) reads them after it.
    static const bool early = env_switch("MOE_EP_EARLY_INPUTS", true);
    dp.early_inputs = early;
    kern::attach_timeline(dp);
    check(launch_ep_dispatch(dp, s), "launching EP dispatch");
    mark(2);

    // 3. Expert compute over the received rows (virtual tokens src * capacity + row).
    kern::ForwardArgs a = common_args(in);
    const int vtok = W_ * ws.capacity;
    kern::EpUnpackArgs ua;
    ua.recipe = cfg_.recipe.recipe;
    ua.window = ew.base;
    ua.world = W_;
    ua.capacity = ws.capacity;
    ua.H = H;
    ua.K = K;
    ua.recv_act_off = L.recv_act_off;
    ua.recv_meta_off = L.recv_meta_off;
    ua.recv_count_off = L.recv_count_off;
    ua.act_row_bytes = L.act_row_bytes;
    ua.act_data_bytes = act.data_bytes;
    ua.meta_row_bytes = L.meta_row_bytes;
    ua.expert_base = rank_ * El_;
    ua.local_experts = El_;
    ua.xq = reinterpret_cast<uint16_t*>(scratch + ws.xq_off);
    ua.ids = reinterpret_cast<int32_t*>(scratch + ws.vids_off);
    ua.weights = reinterpret_cast<float*>(scratch + ws.vweights_off);
    ua.ep_error = &tp.state->error;  // a failed wait of this call: route nothing
    kern::attach_timeline(ua);
    if (ws.fused_combine) {
      ua.y_dst = reinterpret_cast<uint16_t**>(scratch + ws.y_dst_off);
      for (int r = 0; r < W_; ++r)
        ua.peer_combine[r] = reinterpret_cast<uint16_t*>(tp.peer_base[r] + L.combine_off);
    }
    check(kern::launch_ep_unpack(ua, s), "launching the EP unpack");
    mark(3);
    a.expert_base = rank_ * El_;
    a.tokens = vtok;
    a.owner_pairs = in.tokens * K;
    a.ids = ua.ids;
    a.topk_weights = ua.weights;
    a.xq = ua.xq;
    a.xq_ready = true;
    a.h = reinterpret_cast<uint16_t*>(scratch + ws.h_off);
    a.sorted_pairs = reinterpret_cast<int32_t*>(scratch + ws.pairs_off);
    a.tiles = reinterpret_cast<kern::TileInfo*>(scratch + ws.tiles_off);
    a.num_tiles = reinterpret_cast<int32_t*>(scratch + ws.num_tiles_off);
    a.counts = reinterpret_cast<int32_t*>(scratch + ws.counts_off);
    a.pair_rank = reinterpret_cast<int32_t*>(scratch + ws.ranks_off);
    set_splitk(a, scratch, ws);
    if (ws.fused_combine) {
      a.y_dst = ua.y_dst;  // fc2 stores into the sources' combine areas (NVLink)
      a.y_dst_fence = ws.fused_combine == 2;
    } else {
      a.y_rows = reinterpret_cast<uint16_t*>(scratch + ws.y_off);
    }
    // Tile width from T*W "tokens" (every rank's T about ours; choose_owner_tile_n).
    a.tile_n = kern::choose_owner_tile_n(in.tokens, W_, K, El_);
    check(kern::launch_forward(a, s, nullptr), "launching the expert compute");
    mark(4);

    // 4. Combine (y rows dense in receive order) and wait for every owner. Fused: fc2 already
    //    stored the rows at the sources; one block fences, signals 2n and waits for every owner.
    EpCombineParams cp;
    cp.tp = tp;
    cp.num_local_experts = El_;
    if (ws.fused_combine) {
      cp.signal_only = true;
      cp.num_blocks = 1;
      cp.num_threads = 64;  // one waiting thread per peer (W <= kEpMaxRanks = 64)
    } else {
      cp.y = a.y_rows;
      cp.y_stride = H;
      // Rows received ~ W * T (peers' T about ours); at small T each (row, slot, 4 KB piece) is
      // a warp's work, 16 warps a block. Two blocks per SM from ~8K received pairs on (measured
      // 3% faster than one at 4096 tokens).
      cp.num_blocks = ep_blocks_for(2 * num_sms_, int64_t(W_) * in.tokens * K * 4, 16);
    }
    cp.fused_wait = true;
    cp.solo = solo;
    kern::attach_timeline(cp);
    check(launch_ep_combine(cp, s), "launching EP combine");
    mark(5);

    // 5. Finalize from the local combine area, in slot order.
    kern::ForwardArgs f = common_args(in);
    f.tokens = in.tokens;
    f.num_tokens = in.num_tokens;
    f.ids = in.ids.ptr<int32_t>();
    f.topk_weights = in.weights.ptr<float>();
    f.y_rows = reinterpret_cast<uint16_t*>(ew.base + L.combine_off);
    uint16_t* rows = nullptr;
    if (out.out.defined()) {
      f.out = out.out.ptr<uint16_t>();
    } else {
      rows = out.rows.ptr<uint16_t>();
      f.weights_out = out.weights.ptr<float>();
      f.indices_out = out.indices.ptr<int32_t>();
    }
    check(kern::launch_finalize(f, rows, s), "launching the finalize");
    mark(6);
  }

  // The workspace's split-K buffers (base = its scratch), or none.
  static void set_splitk(kern::ForwardArgs& a, unsigned char* base, const Workspace& ws) {
    if (!ws.splitk) return;
    a.splitk_partials = reinterpret_cast<float*>(base + ws.splitk_off);
    a.splitk_counters = reinterpret_cast<int32_t*>(base + ws.splitk_counters_off);
  }

  void select_device() {
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != dev_.index)
      check(cudaSetDevice(dev_.index), "cudaSetDevice");
  }

  const Workspace& get_ws(int ws) const {
    if (ws < 0 || ws >= int(workspaces_.size()))
      throw Error(ErrorCode::kInvalidArgument, "workspace " + std::to_string(ws) +
                                                   " does not exist (the layer has " +
                                                   std::to_string(workspaces_.size()) + ")");
    return *workspaces_[ws];
  }

  TensorView bytes_view(const DeviceBuffer& b, size_t per_expert) const {
    return TensorView::contiguous(b.ptr, DType::kU8, {El_, int64_t(per_expert)}, dev_);
  }

  std::string device_error_message() const {
    const volatile kern::DeviceError* e = err_host_;
    const int K = cfg_.recipe.top_k;
    return "moe_ep cuda: an earlier forward on cuda:" + std::to_string(dev_.index) +
           " saw topk_ids[" + std::to_string(e->index / K) + ", " + std::to_string(e->index % K) +
           "] = " + std::to_string(e->value) +
           ", out of range [-1, E = " + std::to_string(e->limit) +
           "); that slot was skipped, so that call's output is wrong";
  }

  void check_device_error() {
    if (!err_host_) return;
    volatile kern::DeviceError* e = err_host_;
    if (e->code == 0) return;
    const std::string msg = device_error_message();
    e->code = 0;
    throw Error(ErrorCode::kInvalidArgument, msg);
  }

  // Host or device checkpoint tensor -> device pointer (copies host data into `tmp`).
  const uint8_t* on_device(const TensorView& v, DeviceBuffer& tmp, const char* name) {
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

  void load_weights(const WeightPack& w) {
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

  void load_vector(const TensorView& v, DeviceBuffer& dst, const char* name) {
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

  void release() {
    for (auto& ws : workspaces_) ws->mem.release();
    workspaces_.clear();
    if (comm_) {
      try {
        comm_->destroy();  // idempotent; collective when still live
      } catch (...) {
      }
      comm_.reset();
    }
    for (DeviceBuffer* b : {&w1_, &w2_, &s1_, &s2_, &fc1_alpha_, &fc2_alpha_, &fc1_nc_})
      b->release();
    if (err_host_) cudaFreeHost(err_host_);
    err_host_ = nullptr;
    err_dev_ = nullptr;
  }

  LayerConfig cfg_;
  Device dev_;
  int W_ = 1, rank_ = 0;
  int El_ = 0;
  std::unique_ptr<EpComm> comm_;
  void* last_stream_ =
      nullptr;  // W > 1: the stream of the latest forward (abandon orders after it)
  int num_sms_ = 1;
  std::string weight_error_;  // W > 1: this rank's weight rejection, agreed on collectively
  kern::ResidentShape rs_{};
  bool fp8_ = false;  // the fp8 MMA path of mxfp4_mxfp8 (fp8_path)
  DeviceBuffer w1_, w2_, s1_, s2_, fc1_alpha_, fc2_alpha_, fc1_nc_;
  kern::DeviceError* err_host_ = nullptr;
  kern::DeviceError* err_dev_ = nullptr;
  std::vector<std::unique_ptr<Workspace>> workspaces_;
};

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

std::unique_ptr<LayerBackend> make_cuda_backend(const Bootstrap& boot, const LayerConfig& config,
                                                const WeightPack& weights,
                                                const EpilogueVectors& epilogue) {
  return std::make_unique<CudaBackend>(boot, config, weights, epilogue);
}

}  // namespace moe_ep
