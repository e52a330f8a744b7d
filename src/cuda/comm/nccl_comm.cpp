#include "cuda/comm/nccl_comm.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "cuda/comm/nccl_dev_comm.h"
#include "kernels/ep/ep_launch.h"
#include "moe_ep/status.h"

namespace moe_ep {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclUniqueIdBytes), "ncclUniqueId size");

namespace {

void nccl_check(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  std::string msg = what + " failed: " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') msg += std::string(" (") + last + ")";
  throw Error(ErrorCode::kBackend, msg);
}

void cuda_check(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  throw Error(ErrorCode::kBackend, what + " failed: " + cudaGetErrorString(e));
}

std::string nccl_release(int code) {  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
}
}  // namespace

std::string ep_nccl_mismatch(int runtime_code, int build_code, const std::string& library) {
  if (runtime_code == build_code) return {};
  std::string m = "NCCL " + nccl_release(runtime_code) + " (" + library + ") is loaded, but ";
  m += "moe_ep was built against NCCL " + nccl_release(build_code);
  m += " and compiles its device API into the kernels, so the two must be the same release: ";
  m += "put the folder of the build's NCCL first on LD_LIBRARY_PATH, or rebuild with NCCL_ROOT ";
  m += "naming the loaded one";
  return m;
}

void ep_check_nccl_runtime() {
  int v = 0;
  nccl_check(ncclGetVersion(&v), nullptr, "ncclGetVersion");
  std::string library = "libnccl.so.2";
  Dl_info info{};
  if (void* f = dlsym(RTLD_DEFAULT, "ncclGetVersion");
      f != nullptr && dladdr(f, &info) != 0 && info.dli_fname != nullptr)
    library = info.dli_fname;
  const std::string why = ep_nccl_mismatch(v, NCCL_VERSION_CODE, library);
  if (!why.empty()) throw Error(ErrorCode::kUnsupported, why);
}

NcclUniqueIdBytes ep_create_unique_id() {
  ncclUniqueId id;
  nccl_check(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId");
  NcclUniqueIdBytes out;
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

std::string ep_unique_id_to_hex(const NcclUniqueIdBytes& id) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  s.reserve(id.size() * 2);
  for (char c : id) {
    const auto b = static_cast<unsigned char>(c);
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

NcclUniqueIdBytes ep_unique_id_from_hex(const std::string& hex) {
  NcclUniqueIdBytes out{};
  if (hex.size() != out.size() * 2)
    throw Error(ErrorCode::kInvalidArgument, "NCCL unique id: " + std::to_string(hex.size()) +
                                                 " hex digits, expected " +
                                                 std::to_string(out.size() * 2));
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw Error(ErrorCode::kInvalidArgument,
                std::string("NCCL unique id: '") + c + "' is not a hex digit");
  };
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<char>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  return out;
}

NcclUniqueIdBytes SharedUniqueId::exchange(int rank, int64_t timeout_ms) {
  if (rank == 0) {
    id = ep_create_unique_id();
    ready.store(1, std::memory_order_release);  // publishes `id` to the ranks that acquire it
    return id;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (ready.load(std::memory_order_acquire) == 0) {
    if (std::chrono::steady_clock::now() > deadline)
      throw Error(ErrorCode::kPeer, "rank " + std::to_string(rank) +
                                        ": rank 0 never published the NCCL unique id (waited " +
                                        std::to_string(timeout_ms) + " ms)");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return id;
}

std::string ep_error_message(const EpErrorRecord& r) {
  const auto stage = static_cast<EpStage>(r.stage);
  if (r.cause == uint32_t(EpErrorCause::kWorkspaceMismatch))
    return "rank " + std::to_string(r.rank) + ": peer rank " + std::to_string(r.peer) +
           " ran forward call " + std::to_string(r.call) + " with workspace " +
           std::to_string(r.peer_workspace) + " and this rank with workspace " +
           std::to_string(r.workspace) + " (seen at stage '" + ep_stage_name(stage) + "' after " +
           std::to_string(r.waited_ns / 1000) +
           " us); every rank must run a call with the same workspace; the transport is unusable "
           "until destroyed";
  if (stage == EpStage::kAbandon)
    return "rank " + std::to_string(r.rank) +
           " abandoned a call (it rejected the call's arguments and told its peers); the "
           "transport is unusable until destroyed";
  if ((r.observed & kEpAbandonBit) != 0)
    return "rank " + std::to_string(r.rank) + ": peer rank " + std::to_string(r.peer) +
           " abandoned call " + std::to_string(r.call) + " (it rejected that call's arguments), " +
           "seen at stage '" + ep_stage_name(stage) + "' after " +
           std::to_string(r.waited_ns / 1000) + " us; the transport is unusable until destroyed";
  std::string msg = "rank " + std::to_string(r.rank) + ": peer rank " + std::to_string(r.peer) +
                    " did not arrive at stage '" + ep_stage_name(stage) + "'";
  if (stage != EpStage::kBarrier) msg += " of call " + std::to_string(r.call);
  msg += " within " + std::to_string(r.waited_ns / 1000000) + " ms (signal expected " +
         std::to_string(r.expected) + ", last seen " + std::to_string(r.observed) +
         "); the transport is unusable until destroyed";
  return msg;
}

struct EpComm::Impl {
  ncclComm_t comm = nullptr;
  bool owns_comm = false;
  int rank = 0, world = 1, device = 0;
  EpCommOptions opt;
  EpDevComm* dev_comm = nullptr;
  std::string abandoned_why;            // this rank's rejected call (abandon)
  EpErrorRecord* error_host = nullptr;  // pinned, mapped
  EpErrorRecord* error_dev = nullptr;   // its device alias
  EpState* comm_state = nullptr;        // state of the barrier's error mirror
  cudaStream_t stream = nullptr;        // setup / teardown work
  int* scratch = nullptr;               // allreduce_max
  std::vector<EpWorkspace> workspaces;
  bool destroyed = false;
  // Workspace announce (ep_params.h): one small symmetric window per communicator, [W] uint64
  // per rank, and the forward counter the dispatch kernels keep in device memory.
  uint8_t* announce_base = nullptr;
  ncclWindow_t announce_win = nullptr;
  std::vector<uint8_t*> announce_peer;
  uint64_t* calls = nullptr;

  void init() {
    int n = 0, r = 0;
    nccl_check(ncclCommCount(comm, &n), comm, "ncclCommCount");
    nccl_check(ncclCommUserRank(comm, &r), comm, "ncclCommUserRank");
    world = n;
    rank = r;
    if (world > kEpMaxRanks)
      throw Error(ErrorCode::kUnsupported, "EP world size " + std::to_string(world) +
                                               " exceeds the transport's limit of " +
                                               std::to_string(kEpMaxRanks) + " ranks");
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaHostAlloc(reinterpret_cast<void**>(&error_host), sizeof(EpErrorRecord),
                             cudaHostAllocMapped),
               "cudaHostAlloc(error record)");
    std::memset(error_host, 0, sizeof(EpErrorRecord));
    cuda_check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&error_dev), error_host, 0),
               "cudaHostGetDevicePointer(error record)");
    cuda_check(cudaMalloc(&comm_state, sizeof(EpState)), "cudaMalloc(state)");
    cuda_check(cudaMemset(comm_state, 0, sizeof(EpState)), "cudaMemset(state)");
    cuda_check(cudaMalloc(&scratch, sizeof(int)), "cudaMalloc(scratch)");
    EpDevCommInfo info;
    nccl_check(ep_dev_comm_create(comm, opt.lsa_barriers, &dev_comm, &info), comm,
               "ncclDevCommCreate");
    if (info.lsa_size != info.num_ranks)
      throw Error(
          ErrorCode::kUnsupported,
          "EP world of " + std::to_string(info.num_ranks) +
              " ranks spans more than one "
              "NVLink (LSA) domain (LSA size " +
              std::to_string(info.lsa_size) +
              "); inter-node EP over NCCL GIN is designed (docs/protocol.md) but not built");
    cuda_check(cudaMalloc(&calls, sizeof(uint64_t)), "cudaMalloc(forward counter)");
    cuda_check(cudaMemsetAsync(calls, 0, sizeof(uint64_t), stream), "cudaMemset(counter)");
    const size_t abytes = WorkspaceLayout::align_up(size_t(world) * 8, NCCL_WIN_REQUIRED_ALIGNMENT);
    void* a = nullptr;
    nccl_check(ncclMemAlloc(&a, abytes), comm, "ncclMemAlloc(announce window)");
    announce_base = static_cast<uint8_t*>(a);
    nccl_check(ncclCommWindowRegister(comm, a, abytes, &announce_win, NCCL_WIN_COLL_SYMMETRIC),
               comm, "ncclCommWindowRegister(announce window)");
    // Zero before any peer announces: peers write here only from a dispatch, which follows the
    // barrier of create_workspace (enqueued on `stream` after this memset).
    cuda_check(cudaMemsetAsync(a, 0, abytes, stream), "cudaMemset(announce window)");
    announce_peer.assign(size_t(world), nullptr);
    cuda_check(ep_query_lsa_bases(dev_comm, announce_win, world, announce_peer.data(), stream),
               "LSA base pointers of the announce window");
    for (int r = 0; r < world; ++r)
      if (announce_peer[size_t(r)] == nullptr)
        throw Error(ErrorCode::kBackend,
                    "no LSA pointer for rank " + std::to_string(r) + "'s announce window");
  }

  EpTransport make_transport(const EpWorkspace* ws, bool warmup) const {
    EpTransport tp;
    if (ws != nullptr) {
      tp.layout = ws->layout;
      for (int r = 0; r < world; ++r) tp.peer_base[r] = ws->peer_base[r];
      tp.state = ws->state;
      tp.workspace = int(ws - workspaces.data());
      tp.calls = calls;
      for (int r = 0; r < world && r < int(announce_peer.size()); ++r)
        tp.announce[r] = reinterpret_cast<uint64_t*>(announce_peer[size_t(r)]);
    } else {
      tp.state = comm_state;
    }
    tp.rank = rank;
    tp.world_size = world;
    tp.error = error_dev;
    tp.timeout_ns = uint64_t(warmup ? opt.warmup_timeout_ms : opt.timeout_ms) * 1000000ull;
    return tp;
  }

  // Bounded barrier; a timeout lands in the sticky record (the caller decides to throw).
  void barrier_nothrow_peer() {
    cuda_check(ep_launch_lsa_barrier(dev_comm, make_transport(nullptr, true), stream),
               "LSA barrier launch");
    cuda_check(cudaStreamSynchronize(stream), "LSA barrier");
  }

  std::optional<EpErrorRecord> read_error() const {
    if (error_host == nullptr) return std::nullopt;
    const volatile EpErrorRecord* r = error_host;
    if (r->flag == 0u) return std::nullopt;
    EpErrorRecord out;
    out.flag = r->flag;
    out.stage = r->stage;
    out.peer = r->peer;
    out.rank = r->rank;
    out.call = r->call;
    out.expected = r->expected;
    out.observed = r->observed;
    out.waited_ns = r->waited_ns;
    out.cause = r->cause;
    out.workspace = r->workspace;
    out.peer_workspace = r->peer_workspace;
    out.pad = 0;
    return out;
  }

  // Allocates, registers and zeroes `w`'s window of `bytes` and its epoch state, resolves the
  // peers' LSA bases, then meets the peers: no peer signals into it before it is zero.
  void allocate_window(EpWorkspace& w, size_t bytes) {
    w.bytes = bytes;
    void* base = nullptr;
    nccl_check(ncclMemAlloc(&base, w.bytes), comm,
               "ncclMemAlloc(" + std::to_string(w.bytes) + " bytes)");
    w.base = static_cast<uint8_t*>(base);
    nccl_check(ncclCommWindowRegister(comm, base, w.bytes, &w.window, NCCL_WIN_COLL_SYMMETRIC),
               comm, "ncclCommWindowRegister(SYMMETRIC)");
    cuda_check(cudaMalloc(&w.state, sizeof(EpState)), "cudaMalloc(state)");
    cuda_check(cudaMemsetAsync(w.state, 0, sizeof(EpState), stream), "cudaMemset(state)");
    // Zero signals and counts; the barrier below orders it before any peer's first signal.
    cuda_check(cudaMemsetAsync(w.base, 0, w.bytes, stream), "cudaMemset(window)");
    w.peer_base.assign(size_t(world), nullptr);
    cuda_check(ep_query_lsa_bases(dev_comm, w.window, world, w.peer_base.data(), stream),
               "LSA base pointers");
    for (int r = 0; r < world; ++r)
      if (w.peer_base[size_t(r)] == nullptr)
        throw Error(ErrorCode::kBackend, "no LSA pointer for rank " + std::to_string(r));
    barrier_nothrow_peer();
  }

  // Deregisters and frees one window and its state; collects the first failure into `first`.
  void free_window(EpWorkspace& ws, std::string* first) {
    auto note_nccl = [&](ncclResult_t r, const char* what) {
      if (r != ncclSuccess && first->empty())
        *first = std::string(what) + " failed: " + ncclGetErrorString(r);
    };
    if (ws.window != nullptr) note_nccl(ncclCommWindowDeregister(comm, ws.window), "deregister");
    if (ws.base != nullptr) note_nccl(ncclMemFree(ws.base), "ncclMemFree");
    if (ws.state != nullptr) {
      const cudaError_t e = cudaFree(ws.state);
      if (e != cudaSuccess && first->empty())
        *first = std::string("cudaFree(state) failed: ") + cudaGetErrorString(e);
    }
    ws.window = nullptr;
    ws.base = nullptr;
    ws.state = nullptr;
    ws.peer_base.clear();
  }

  // Frees everything; collects the first failure into `first`.
  void release(std::string* first) {
    auto note_nccl = [&](ncclResult_t r, const char* what) {
      if (r != ncclSuccess && first->empty())
        *first = std::string(what) + " failed: " + ncclGetErrorString(r);
    };
    auto note_cuda = [&](cudaError_t e, const char* what) {
      if (e != cudaSuccess && first->empty())
        *first = std::string(what) + " failed: " + cudaGetErrorString(e);
    };
    for (auto& ws : workspaces) free_window(ws, first);
    workspaces.clear();
    if (announce_win != nullptr)
      note_nccl(ncclCommWindowDeregister(comm, announce_win), "deregister(announce)");
    announce_win = nullptr;
    if (announce_base != nullptr) note_nccl(ncclMemFree(announce_base), "ncclMemFree(announce)");
    announce_base = nullptr;
    announce_peer.clear();
    if (calls != nullptr) note_cuda(cudaFree(calls), "cudaFree(counter)");
    calls = nullptr;
    if (dev_comm != nullptr) note_nccl(ep_dev_comm_destroy(comm, dev_comm), "ncclDevCommDestroy");
    dev_comm = nullptr;
    if (comm_state != nullptr) note_cuda(cudaFree(comm_state), "cudaFree(state)");
    comm_state = nullptr;
    if (scratch != nullptr) note_cuda(cudaFree(scratch), "cudaFree(scratch)");
    scratch = nullptr;
    if (error_host != nullptr) note_cuda(cudaFreeHost(error_host), "cudaFreeHost");
    error_host = nullptr;
    error_dev = nullptr;
    if (stream != nullptr) note_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
    stream = nullptr;
    if (owns_comm && comm != nullptr) note_nccl(ncclCommDestroy(comm), "ncclCommDestroy");
    comm = nullptr;
  }
};

EpComm::EpComm(ncclComm_t comm, const EpCommOptions& options) : impl_(std::make_unique<Impl>()) {
  if (comm == nullptr) throw Error(ErrorCode::kInvalidArgument, "EpComm: null ncclComm_t");
  ep_check_nccl_runtime();
  impl_->opt = options;
  if (options.device >= 0) cuda_check(cudaSetDevice(options.device), "cudaSetDevice");
  cuda_check(cudaGetDevice(&impl_->device), "cudaGetDevice");
  impl_->comm = comm;
  try {
    impl_->init();
  } catch (...) {
    std::string ignored;
    impl_->release(&ignored);
    throw;
  }
}

EpComm::EpComm(const NcclUniqueIdBytes& id, int rank, int world_size, const EpCommOptions& options)
    : impl_(std::make_unique<Impl>()) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw Error(ErrorCode::kInvalidArgument, "EpComm: rank " + std::to_string(rank) +
                                                 " is outside the world [0, " +
                                                 std::to_string(world_size) + ")");
  ep_check_nccl_runtime();
  impl_->opt = options;
  if (options.device >= 0) cuda_check(cudaSetDevice(options.device), "cudaSetDevice");
  cuda_check(cudaGetDevice(&impl_->device), "cudaGetDevice");
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof(uid));
  nccl_check(ncclCommInitRank(&impl_->comm, world_size, uid, rank), nullptr, "ncclCommInitRank");
  impl_->owns_comm = true;
  try {
    impl_->init();
  } catch (...) {
    std::string ignored;
    impl_->release(&ignored);
    throw;
  }
}

EpComm::~EpComm() {
  try {
    destroy();
  } catch (...) {
    // The destructor never throws; destroy() reports to callers that ask.
  }
}

int EpComm::rank() const { return impl_->rank; }
int EpComm::world_size() const { return impl_->world; }
int EpComm::device() const { return impl_->device; }
ncclComm_t EpComm::nccl() const { return impl_->comm; }
bool EpComm::destroyed() const { return impl_->destroyed; }
int EpComm::num_workspaces() const { return int(impl_->workspaces.size()); }

const EpWorkspace& EpComm::workspace(int ws) const {
  if (ws < 0 || ws >= num_workspaces() || impl_->workspaces[size_t(ws)].base == nullptr)
    throw Error(ErrorCode::kInvalidArgument,
                "workspace " + std::to_string(ws) + " does not exist (have " +
                    std::to_string(num_workspaces()) + ", freed ones included)");
  return impl_->workspaces[size_t(ws)];
}

namespace {
void check_window_layout(const WorkspaceLayout& layout, int world) {
  if (layout.world_size != world)
    throw Error(ErrorCode::kInvalidArgument,
                "workspace layout for " + std::to_string(layout.world_size) +
                    " ranks, communicator has " + std::to_string(world));
  if (layout.top_k < 1 || layout.top_k > kEpMaxTopK || layout.capacity < 1 ||
      layout.capacity >= (1 << 23) || layout.hidden % 8 != 0 || layout.act_row_bytes % 16 != 0)
    throw Error(ErrorCode::kInvalidArgument,
                "workspace layout: top_k " + std::to_string(layout.top_k) + " (1.." +
                    std::to_string(kEpMaxTopK) + "), capacity " + std::to_string(layout.capacity) +
                    " (1..2^23), hidden " + std::to_string(layout.hidden) + " (multiple of 8)");
}
}  // namespace

int EpComm::create_workspace(const WorkspaceLayout& layout) {
  check();
  Impl& m = *impl_;
  check_window_layout(layout, m.world);
  EpWorkspace ws;
  ws.layout = layout;
  m.workspaces.push_back(ws);  // owned from here on, so destroy() frees partial work
  m.allocate_window(m.workspaces.back(),
                    WorkspaceLayout::align_up(layout.total_bytes, NCCL_WIN_REQUIRED_ALIGNMENT));
  check();
  return num_workspaces() - 1;
}

void EpComm::regrow_workspace(int ws, const WorkspaceLayout& layout) {
  check();
  Impl& m = *impl_;
  check_window_layout(layout, m.world);
  workspace(ws);  // throws for an unknown or freed index
  const size_t bytes =
      std::max(m.workspaces[size_t(ws)].bytes,
               WorkspaceLayout::align_up(layout.total_bytes, NCCL_WIN_REQUIRED_ALIGNMENT));
  // Our forwards in the old window are done (device sync), then the peers' (barrier).
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before re-making a window");
  m.barrier_nothrow_peer();
  check();
  std::string first;
  m.free_window(m.workspaces[size_t(ws)], &first);
  if (!first.empty()) throw Error(ErrorCode::kBackend, "re-making a window: " + first);
  if (layout.total_bytes > m.workspaces[size_t(ws)].layout.total_bytes)
    m.workspaces[size_t(ws)].layout = layout;
  m.allocate_window(m.workspaces[size_t(ws)], bytes);
  check();
}

void EpComm::free_workspace(int ws) {
  Impl& m = *impl_;
  if (m.destroyed || ws < 0 || ws >= num_workspaces() || m.workspaces[size_t(ws)].base == nullptr)
    return;
  std::string first;
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) first = std::string("cudaDeviceSynchronize: ") + cudaGetErrorString(e);
  if (e == cudaSuccess && !m.read_error()) {
    try {
      m.barrier_nothrow_peer();  // no peer still writes into the window
    } catch (const Error& err) {
      first = err.what();
    }
  }
  m.free_window(m.workspaces[size_t(ws)], &first);
  if (!first.empty()) throw Error(ErrorCode::kBackend, "EpComm::free_workspace: " + first);
}

EpTransport EpComm::transport(int ws, bool warmup) const {
  return impl_->make_transport(&workspace(ws), warmup);
}

EpTransport EpComm::transport(int ws, const WorkspaceLayout& layout, bool warmup) const {
  const EpWorkspace& w = workspace(ws);
  if (layout.total_bytes > w.bytes || layout.world_size != impl_->world ||
      layout.signals_off != w.layout.signals_off)
    throw Error(ErrorCode::kInvalidArgument, "workspace " + std::to_string(ws) + ": a layout of " +
                                                 std::to_string(layout.total_bytes) +
                                                 " bytes for " + std::to_string(layout.world_size) +
                                                 " ranks does not fit its window of " +
                                                 std::to_string(w.bytes) + " bytes");
  EpTransport tp = impl_->make_transport(&w, warmup);
  tp.layout = layout;
  return tp;
}

void EpComm::set_timeouts(int64_t timeout_ms, int64_t warmup_timeout_ms) {
  if (timeout_ms <= 0 || warmup_timeout_ms <= 0)
    throw Error(ErrorCode::kInvalidArgument, "timeouts must be > 0 ms (got " +
                                                 std::to_string(timeout_ms) + ", " +
                                                 std::to_string(warmup_timeout_ms) + ")");
  impl_->opt.timeout_ms = timeout_ms;
  impl_->opt.warmup_timeout_ms = warmup_timeout_ms;
}

int64_t EpComm::timeout_ms(bool warmup) const {
  return warmup ? impl_->opt.warmup_timeout_ms : impl_->opt.timeout_ms;
}

std::optional<EpErrorRecord> EpComm::error() const { return impl_->read_error(); }

void EpComm::check() const {
  if (impl_->destroyed) throw Error(ErrorCode::kDestroyed, "the EP communicator was destroyed");
  if (auto r = impl_->read_error()) {
    std::string msg = ep_error_message(*r);
    if (r->stage == int32_t(EpStage::kAbandon) && !impl_->abandoned_why.empty())
      msg += " (the rejected call: " + impl_->abandoned_why + ")";
    if (r->cause == uint32_t(EpErrorCause::kWorkspaceMismatch)) {
      // Workspaces are made collectively in the same order, so index i has one capacity.
      std::string caps;
      for (int w : {r->workspace, r->peer_workspace})
        caps += std::string(caps.empty() ? "" : ", ") + "workspace " + std::to_string(w) + " = " +
                (w >= 0 && w < num_workspaces()
                     ? std::to_string(impl_->workspaces[size_t(w)].layout.capacity) + " tokens"
                     : std::string("unknown"));
      msg += " (capacities: " + caps + ")";
    }
    throw Error(ErrorCode::kPeer, msg);
  }
}

void EpComm::abandon(const std::string& why, cudaStream_t stream) {
  Impl& m = *impl_;
  if (m.destroyed || m.error_host == nullptr) return;
  // A capturing stream would record the marker into the caller's graph instead of sending it.
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess) {
    cudaGetLastError();
    cs = cudaStreamCaptureStatusActive;
  }
  if (cs != cudaStreamCaptureStatusNone) stream = m.stream;
  for (const EpWorkspace& ws : m.workspaces)
    if (ws.base != nullptr)
      cuda_check(launch_ep_abandon(m.make_transport(&ws, false), stream), "abandon launch");
  if (m.abandoned_why.empty()) m.abandoned_why = why;
  // The sticky record of this rank, unless a wait already wrote one (fields before the flag).
  volatile EpErrorRecord* r = m.error_host;
  if (r->flag != 0u) return;
  r->stage = int32_t(EpStage::kAbandon);
  r->peer = m.rank;
  r->rank = m.rank;
  r->call = 0;
  r->expected = 0;
  r->observed = kEpAbandonBit;
  r->waited_ns = 0;
  r->cause = uint32_t(EpErrorCause::kWait);
  r->workspace = -1;
  r->peer_workspace = -1;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  r->flag = 1u;
}

void EpComm::barrier() {
  check();
  impl_->barrier_nothrow_peer();
  check();
}

void EpComm::barrier_async(cudaStream_t stream) {
  check();
  cuda_check(ep_launch_lsa_barrier(impl_->dev_comm, impl_->make_transport(nullptr, true), stream),
             "LSA barrier launch");
}

int EpComm::allreduce_max(int value) {
  check();
  Impl& m = *impl_;
  cuda_check(cudaMemcpyAsync(m.scratch, &value, sizeof(int), cudaMemcpyHostToDevice, m.stream),
             "cudaMemcpy");
  nccl_check(ncclAllReduce(m.scratch, m.scratch, 1, ncclInt32, ncclMax, m.comm, m.stream), m.comm,
             "ncclAllReduce(max)");
  int out = 0;
  cuda_check(cudaMemcpyAsync(&out, m.scratch, sizeof(int), cudaMemcpyDeviceToHost, m.stream),
             "cudaMemcpy");
  cuda_check(cudaStreamSynchronize(m.stream), "allreduce_max");
  return out;
}

void EpComm::destroy() {
  Impl& m = *impl_;
  if (m.destroyed) return;
  m.destroyed = true;
  std::string first;
  // Our forwards are done (device sync), then the peers' (barrier): nobody writes into a window
  // after this point, so deregistering cannot pull memory from under a peer's store.
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) first = std::string("cudaDeviceSynchronize: ") + cudaGetErrorString(e);
  if (m.dev_comm != nullptr && e == cudaSuccess) {
    try {
      m.barrier_nothrow_peer();
    } catch (const Error& err) {
      first = err.what();
    }
  }
  m.release(&first);
  if (!first.empty()) throw Error(ErrorCode::kBackend, "EpComm::destroy: " + first);
}

}  // namespace moe_ep
