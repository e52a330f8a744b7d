// Multi-GPU tests of the EP transport (EpComm + dispatch / wait / combine kernels): one forked
// process per GPU, the NCCL unique id shared through an anonymous shared mapping. Data movement is
// checked bitwise with self-describing payloads: activation bytes encode (source, token, byte),
// y rows written by owners encode (owner, source, token, slot). W = MOE_EP_TEST_WORLD ranks (2, 4
// or 8; default 2; per-rank token lists written for 2 ranks repeat); skips without W GPUs.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda/comm/nccl_comm.h"
#include "ep_test_kernels.h"
#include "kernels/ep/ep_launch.h"
#include "moe_ep/formats.h"
#include "moe_ep/status.h"
#include "rank_harness.h"

namespace moe_ep {
namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Process harness

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

#define REQUIRE(cond, msg)                                                                      \
  do {                                                                                          \
    if (!(cond))                                                                                \
      ::moe_ep::fail(std::string(__FILE__ ":") + std::to_string(__LINE__) + ": " #cond " -- " + \
                     (msg));                                                                    \
  } while (0)

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(e));
}
#define CK(x) ck((x), #x)

using mgtest::run_ranks;
const int kW = mgtest::test_world();  // MOE_EP_TEST_WORLD ranks (rank_harness.h)
using Report = mgtest::RankReport;
using RunResult = mgtest::RanksResult;

void expect_all_passed(const RunResult& r) { mgtest::expect_ranks_passed(r); }

// ---------------------------------------------------------------------------------------------
// Inputs, one forward, and its bitwise checks

struct Geometry {
  int world = 2, E = 16, K = 4, H = 512, capacity = 256, act_bytes = 288;
  int El() const { return E / world; }
};

enum class Routing { kUniform, kNone, kOther, kSkewed };

struct Inputs {
  int T = 0;
  std::vector<int32_t> ids;  // [T][K]
  std::vector<float> w;      // [T][K]
};

// Deterministic in (seed, src): every rank regenerates every other rank's inputs.
Inputs make_inputs(const Geometry& g, int src, int T, Routing routing, uint64_t seed) {
  Inputs in;
  in.T = T;
  in.ids.assign(size_t(T) * g.K, -1);
  in.w.assign(size_t(T) * g.K, 0.0f);
  std::mt19937_64 rng(seed * 1000003ull + uint64_t(src) * 7919ull + uint64_t(T));
  std::uniform_real_distribution<float> uw(0.1f, 1.0f), u01(0.0f, 1.0f);
  for (int t = 0; t < T; ++t) {
    std::vector<int> chosen;
    for (int k = 0; k < g.K; ++k) {
      int e = -1;
      for (int attempt = 0; attempt < 1000 && e < 0; ++attempt) {
        int c = -1;
        switch (routing) {
          case Routing::kUniform:
            c = int(rng() % uint64_t(g.E));
            break;
          case Routing::kNone:
            break;
          case Routing::kOther: {
            const int o = (src + 1) % g.world;
            c = o * g.El() + int(rng() % uint64_t(g.El()));
            break;
          }
          case Routing::kSkewed: {
            const float u = u01(rng);
            c = std::min(g.E - 1, int(float(g.E) * u * u * u * u));
            break;
          }
        }
        if (c < 0) break;
        if (std::find(chosen.begin(), chosen.end(), c) == chosen.end()) e = c;
      }
      if (routing == Routing::kUniform && rng() % 8 == 0) e = -1;  // some empty slots
      if (e >= 0) chosen.push_back(e);
      in.ids[size_t(t) * g.K + k] = e;
      in.w[size_t(t) * g.K + k] = uw(rng);
    }
  }
  return in;
}

std::vector<uint8_t> make_act(const Geometry& g, int src, int T) {
  std::vector<uint8_t> a(size_t(std::max(T, 1)) * g.act_bytes);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < g.act_bytes; ++j)
      a[size_t(t) * g.act_bytes + j] = test::act_byte(src, t, j);
  return a;
}

bool has_slot_on(const Geometry& g, const Inputs& in, int t, int owner) {
  for (int k = 0; k < g.K; ++k) {
    const int id = in.ids[size_t(t) * g.K + k];
    if (id >= 0 && id / g.El() == owner) return true;
  }
  return false;
}

struct RankCtx {
  Geometry g;
  EpComm* comm = nullptr;
  int ws = 0;
  int rank = 0;
  cudaStream_t stream = nullptr;
  uint8_t* act = nullptr;
  int32_t* ids = nullptr;
  float* w = nullptr;
  uint16_t* y = nullptr;
  int32_t* y_index = nullptr;
  uint16_t* out = nullptr;
  int32_t* ntok = nullptr;
  int blocks = 0, threads = 512;
  bool fused = false;        // waits fused into the last block of dispatch / combine
  bool signal_only = false;  // experts store into the sources' combine areas; combine signals
  bool ordered = false;      // dispatch rows in increasing token order (ordered_rows)
  bool solo = true;          // one-block grids publish on one fence (EpDispatchParams::solo)
  bool early = false;        // dispatch reads ids / weights / count before its wait (early_inputs)
  int check_stride = 1;      // result rows checked: every check_stride-th token (large cases)

  // This rank's buffers and one workspace of geometry g on `c` (activation rows of act_data
  // data bytes and act_scales scale bytes).
  void open(EpComm& c, int r, int act_data, int act_scales) {
    comm = &c;
    rank = r;
    alloc();
    ws = c.create_workspace(
        WorkspaceLayout::make(g.world, g.capacity, g.H, g.K, act_data, act_scales));
  }
  void open(EpComm& c, int r) { open(c, r, g.act_bytes, 0); }

  void alloc() {
    const size_t cap = size_t(g.capacity);
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CK(cudaMalloc(&act, cap * g.act_bytes));
    CK(cudaMalloc(&ids, cap * g.K * 4));
    CK(cudaMalloc(&w, cap * g.K * 4));
    CK(cudaMalloc(&y, size_t(g.world) * cap * g.K * g.H * 2));
    CK(cudaMalloc(&y_index, size_t(g.world) * cap * g.K * 4));
    CK(cudaMalloc(&out, cap * g.H * 2));
    CK(cudaMalloc(&ntok, 4));
  }
  void free_all() {
    for (void* p :
         {(void*)act, (void*)ids, (void*)w, (void*)y, (void*)y_index, (void*)out, (void*)ntok})
      cudaFree(p);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  void upload(const Inputs& in, const std::vector<uint8_t>& a) {
    if (in.T == 0) return;
    CK(cudaMemcpyAsync(act, a.data(), size_t(in.T) * g.act_bytes, cudaMemcpyHostToDevice, stream));
    CK(cudaMemcpyAsync(ids, in.ids.data(), in.ids.size() * 4, cudaMemcpyHostToDevice, stream));
    CK(cudaMemcpyAsync(w, in.w.data(), in.w.size() * 4, cudaMemcpyHostToDevice, stream));
  }

  // Enqueues one forward (no host sync). num_tokens_dev: graph replay with varying T.
  void enqueue(int T, bool use_index, bool dev_count, bool do_dispatch = true,
               bool do_combine = true) {
    const EpWorkspace& W = comm->workspace(ws);
    const WorkspaceLayout& L = W.layout;
    const EpTransport tp = comm->transport(ws);
    // Poison our combine area: rows of empty slots must stay untouched.
    CK(cudaMemsetAsync(W.base + L.combine_off, 0xFF, size_t(L.capacity) * L.top_k * L.hidden * 2,
                       stream));
    if (do_dispatch) {
      EpDispatchParams dp;
      dp.tp = tp;
      dp.act = act;
      dp.act_stride = g.act_bytes;
      dp.topk_ids = ids;
      dp.topk_weights = w;
      dp.num_tokens = dev_count ? g.capacity : T;
      dp.num_tokens_dev = dev_count ? ntok : nullptr;
      dp.num_local_experts = g.El();
      dp.num_blocks = blocks;
      dp.num_threads = threads;
      dp.fused_wait = fused;
      dp.ordered_rows = ordered;
      dp.solo = solo;
      dp.early_inputs = early;  // the inputs come from memcpys before a memset: complete
      CK(launch_ep_dispatch(dp, stream));
      EpWaitParams wp{tp, EpStage::kDispatch};
      if (!fused) CK(launch_ep_wait(wp, stream));
    }
    if (do_combine) {
      CK(test::launch_fake_experts(tp, g.El(), y, y_index, use_index, stream, signal_only));
      EpCombineParams cp;
      cp.tp = tp;
      cp.y = signal_only ? nullptr : y;
      cp.y_stride = g.H;
      cp.y_index = use_index ? y_index : nullptr;
      cp.num_local_experts = g.El();
      cp.num_blocks = blocks;
      cp.num_threads = threads;
      cp.signal_only = signal_only;
      cp.fused_wait = fused;
      cp.solo = solo;
      CK(launch_ep_combine(cp, stream));
      EpWaitParams wp{tp, EpStage::kCombine};
      if (!fused) CK(launch_ep_wait(wp, stream));
      EpFinalizeParams fp;
      fp.tp = tp;
      fp.topk_ids = ids;
      fp.topk_weights = w;
      fp.out = out;
      fp.num_tokens = dev_count ? g.capacity : T;
      fp.num_tokens_dev = dev_count ? ntok : nullptr;
      CK(launch_ep_finalize_reference(fp, stream));
    }
  }

  // Everything this rank can see after a forward, bitwise.
  void verify(const std::vector<Inputs>& all, const std::string& what) {
    comm->check();
    const EpWorkspace& W = comm->workspace(ws);
    const WorkspaceLayout& L = W.layout;
    const int me = rank;
    // Owner side: rows received from each source.
    for (int s = 0; s < g.world; ++s) {
      const Inputs& in = all[size_t(s)];
      std::vector<int> expect;
      for (int t = 0; t < in.T; ++t)
        if (has_slot_on(g, in, t, me)) expect.push_back(t);
      int32_t count = -1;
      CK(cudaMemcpy(&count, W.base + L.recv_count(s), 4, cudaMemcpyDeviceToHost));
      REQUIRE(count == int(expect.size()), what + ": recv_count[" + std::to_string(s) +
                                               "] = " + std::to_string(count) + ", expected " +
                                               std::to_string(expect.size()));
      if (count == 0) continue;
      std::vector<uint8_t> rows(size_t(count) * L.act_row_bytes),
          meta(size_t(count) * L.meta_row_bytes);
      CK(cudaMemcpy(rows.data(), W.base + L.recv_act(s, 0), rows.size(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(meta.data(), W.base + L.recv_meta(s, 0), meta.size(), cudaMemcpyDeviceToHost));
      // Each expected token exactly once, in any order (in increasing order with ordered rows);
      // every row is self-describing: its bytes, ids and weights are those of its meta token.
      std::vector<int> slot_of(size_t(in.T), -1);
      for (size_t i = 0; i < expect.size(); ++i) slot_of[size_t(expect[i])] = int(i);
      std::vector<bool> seen(expect.size(), false);
      for (int i = 0; i < count; ++i) {
        RecvMetaRow m{meta.data() + size_t(i) * L.meta_row_bytes, g.K};
        const int t = *m.token();
        REQUIRE(t >= 0 && t < in.T && slot_of[size_t(t)] >= 0 && !seen[size_t(slot_of[size_t(t)])],
                what + ": recv_meta[src " + std::to_string(s) + "][row " + std::to_string(i) +
                    "] names token " + std::to_string(t) +
                    ", which is not a token with a slot here or came twice");
        seen[size_t(slot_of[size_t(t)])] = true;
        if (ordered)
          REQUIRE(t == expect[size_t(i)], what + ": ordered row " + std::to_string(i) +
                                              " holds token " + std::to_string(t) + ", expected " +
                                              std::to_string(expect[size_t(i)]));
        for (int j = 0; j < g.act_bytes; ++j)
          REQUIRE(rows[size_t(i) * L.act_row_bytes + j] == test::act_byte(s, t, j),
                  what + ": recv_act[src " + std::to_string(s) + "][row " + std::to_string(i) +
                      "] byte " + std::to_string(j) + " is not token " + std::to_string(t) + "'s");
        REQUIRE(std::memcmp(m.ids(), in.ids.data() + size_t(t) * g.K, 4 * g.K) == 0,
                what + ": recv_meta ids of token " + std::to_string(t));
        REQUIRE(std::memcmp(m.weights(), in.w.data() + size_t(t) * g.K, 4 * g.K) == 0,
                what + ": recv_meta weights of token " + std::to_string(t));
      }
    }
    // Source side: y rows came back to t*K+k from the right owner; empty slots untouched.
    const Inputs& mine = all[size_t(me)];
    const int T = mine.T;
    if (T == 0) return;
    std::vector<uint16_t> comb(size_t(T) * g.K * g.H), out_h(size_t(T) * g.H);
    CK(cudaMemcpy(comb.data(), W.base + L.combine_off, comb.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(out_h.data(), out, out_h.size() * 2, cudaMemcpyDeviceToHost));
    for (int t = 0; t < T; t += check_stride) {
      for (int k = 0; k < g.K; ++k) {
        const int id = mine.ids[size_t(t) * g.K + k];
        const uint16_t* row = comb.data() + (size_t(t) * g.K + k) * g.H;
        for (int h = 0; h < g.H; ++h) {
          const uint16_t want = id >= 0 ? test::y_bits(id / g.El(), me, t, k, h) : uint16_t(0xFFFF);
          if (row[h] != want)
            fail(what + ": combine row (token " + std::to_string(t) + ", slot " +
                 std::to_string(k) + ", expert " + std::to_string(id) + ") element " +
                 std::to_string(h) + " = " + std::to_string(row[h]) + ", expected " +
                 std::to_string(want));
        }
      }
      for (int h = 0; h < g.H; ++h) {
        float acc = 0.0f;
        for (int k = 0; k < g.K; ++k) {
          const int id = mine.ids[size_t(t) * g.K + k];
          if (id < 0) continue;
          acc = fmt::add_rn(
              acc, fmt::mul_rn(mine.w[size_t(t) * g.K + k],
                               fmt::bf16_to_float(test::y_bits(id / g.El(), me, t, k, h))));
        }
        const uint16_t want = fmt::float_to_bf16(acc);
        if (out_h[size_t(t) * g.H + h] != want)
          fail(what + ": finalized out[" + std::to_string(t) + "][" + std::to_string(h) + "]");
      }
    }
  }
};

// Rank s's token count in a per-rank list written for 2 ranks: the list repeats over W ranks.
int t_of(const std::vector<int>& T, int s) { return T[size_t(s) % T.size()]; }

// One forward with per-rank T and routing, then the bitwise checks.
void forward_and_verify(RankCtx& c, const std::vector<int>& T, Routing routing, uint64_t seed,
                        bool use_index, const std::string& what) {
  std::vector<Inputs> all;
  for (int s = 0; s < c.g.world; ++s) all.push_back(make_inputs(c.g, s, t_of(T, s), routing, seed));
  c.upload(all[size_t(c.rank)], make_act(c.g, c.rank, t_of(T, c.rank)));
  c.enqueue(t_of(T, c.rank), use_index, false);
  CK(cudaStreamSynchronize(c.stream));
  c.verify(all, what);
  // Peers may start the next dispatch (into our receive rows) as soon as our combine signal is
  // out; the test reads those rows on the host, so it meets the peers before moving on.
  c.comm->barrier();
}

EpCommOptions opts(int rank, int64_t timeout_ms = 10000) {
  EpCommOptions o;
  o.device = rank;
  o.timeout_ms = timeout_ms;
  o.warmup_timeout_ms = 15000;
  return o;
}

// ---------------------------------------------------------------------------------------------
// Host-only checks (no GPU needed).

TEST(EpHost, UniqueIdHexRoundTrip) {
  NcclUniqueIdBytes id;
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 37 + 11);
  const std::string hex = ep_unique_id_to_hex(id);
  EXPECT_EQ(hex.size(), 256u);
  EXPECT_EQ(ep_unique_id_from_hex(hex), id);
  EXPECT_THROW(ep_unique_id_from_hex(hex.substr(1)), Error);
  std::string bad = hex;
  bad[10] = 'g';
  EXPECT_THROW(ep_unique_id_from_hex(bad), Error);
}

// The NCCL release check: the same codes pass; another release is refused with both releases
// and the library named; this process runs the NCCL it was built against.
TEST(EpHost, NcclRuntimeMustBeTheBuildsRelease) {
  EXPECT_EQ(ep_nccl_mismatch(22809, 22809, "/x/libnccl.so.2"), "");
  const std::string m = ep_nccl_mismatch(22803, 22809, "/usr/lib/libnccl.so.2");
  EXPECT_NE(m.find("NCCL 2.28.3 (/usr/lib/libnccl.so.2)"), std::string::npos) << m;
  EXPECT_NE(m.find("NCCL 2.28.9"), std::string::npos) << m;
  EXPECT_NE(m.find("LD_LIBRARY_PATH"), std::string::npos) << m;
  EXPECT_NE(ep_nccl_mismatch(22900, 22809, "l"), "");  // newer is refused too
  EXPECT_NO_THROW(ep_check_nccl_runtime());
}

TEST(EpHost, ErrorMessageNamesPeerStageAndCall) {
  EpErrorRecord r{};
  r.flag = 1;
  r.stage = int32_t(EpStage::kCombine);
  r.peer = 3;
  r.rank = 1;
  r.call = 17;
  r.expected = 34;
  r.observed = 33;
  r.waited_ns = 2500000000ull;
  const std::string m = ep_error_message(r);
  EXPECT_NE(m.find("rank 1: peer rank 3"), std::string::npos) << m;
  EXPECT_NE(m.find("'combine' of call 17"), std::string::npos) << m;
  EXPECT_NE(m.find("2500 ms"), std::string::npos) << m;
  // The peer's abandon marker below the target: it gave up that call.
  r.stage = int32_t(EpStage::kDispatch);
  r.expected = 35;
  r.observed = kEpAbandonBit | 34;
  r.waited_ns = 12000;
  const std::string a = ep_error_message(r);
  EXPECT_NE(a.find("rank 1: peer rank 3 abandoned call 17"), std::string::npos) << a;
  EXPECT_NE(a.find("stage 'dispatch' after 12 us"), std::string::npos) << a;
  // The abandoning rank's own record.
  r.stage = int32_t(EpStage::kAbandon);
  r.peer = r.rank = 2;
  const std::string own = ep_error_message(r);
  EXPECT_NE(own.find("rank 2 abandoned a call"), std::string::npos) << own;
  // A peer that runs the same forward call in another workspace (announce window).
  r.stage = int32_t(EpStage::kDispatch);
  r.peer = 0;
  r.rank = 1;
  r.call = 5;
  r.cause = uint32_t(EpErrorCause::kWorkspaceMismatch);
  r.workspace = 1;
  r.peer_workspace = 0;
  r.observed = ep_announce(5, 0);
  const std::string ws = ep_error_message(r);
  EXPECT_NE(ws.find("rank 1: peer rank 0 ran forward call 5 with workspace 0 and this rank with "
                    "workspace 1 (seen at stage 'dispatch' after 12 us)"),
            std::string::npos)
      << ws;
}

// The announce word keeps the call above the workspace bits, so an atomic max keeps the newest
// call, and both fields come back.
TEST(EpHost, AnnounceWordCarriesCallAndWorkspace) {
  EXPECT_EQ(ep_announce_call(ep_announce(123456789, 3)), 123456789u);
  EXPECT_EQ(ep_announce_workspace(ep_announce(123456789, 3)), 3);
  EXPECT_GT(ep_announce(8, 0), ep_announce(7, 65535));
  EXPECT_NE(ep_announce_workspace(ep_announce(9, 2)), ep_announce_workspace(ep_announce(9, 1)));
}

// The marker sorts above every epoch (atomic-max slots keep it) and carries the last epoch.
TEST(EpHost, AbandonMarkerOutranksEveryEpoch) {
  const uint64_t marker = kEpAbandonBit | ep_combine_signal(41);
  EXPECT_GT(marker, ep_dispatch_signal(1ull << 40));
  EXPECT_LT(marker & ~kEpAbandonBit, ep_dispatch_signal(42));  // call 42 was abandoned
  EXPECT_GE(marker & ~kEpAbandonBit, ep_combine_signal(41));   // call 41 had completed
}

TEST(EpHost, EpochSignalsGrowAcrossStagesAndCalls) {
  for (uint64_t n = 1; n < 100; ++n) {
    EXPECT_LT(ep_dispatch_signal(n), ep_combine_signal(n));
    EXPECT_LT(ep_combine_signal(n), ep_dispatch_signal(n + 1));
  }
}

// Launchers reject bad parameters on the host, before anything reaches a device.
TEST(EpHost, LaunchersRejectBadParameters) {
  EpDispatchParams dp;  // world 1, rank 0, no state, no peer pointers
  EXPECT_EQ(launch_ep_dispatch(dp, nullptr), cudaErrorInvalidValue);
  EpCombineParams cp;
  EXPECT_EQ(launch_ep_combine(cp, nullptr), cudaErrorInvalidValue);
  EpWaitParams wp;
  wp.stage = EpStage::kBarrier;
  EXPECT_EQ(launch_ep_wait(wp, nullptr), cudaErrorInvalidValue);
  // A transport with a peer pointer missing.
  EpState fake_state{};
  uint8_t fake_window[16];
  dp.tp.world_size = 2;
  dp.tp.state = &fake_state;
  dp.tp.layout = WorkspaceLayout::make(2, 8, 64, 2, 32, 0);
  dp.tp.peer_base[0] = fake_window;
  EXPECT_EQ(launch_ep_dispatch(dp, nullptr), cudaErrorInvalidValue);
  // Every pointer there, but a row stride that is not a multiple of 16.
  dp.tp.peer_base[1] = fake_window;
  dp.act_stride = 40;
  EXPECT_EQ(launch_ep_dispatch(dp, nullptr), cudaErrorInvalidValue);
  // A combine that copies needs its y rows (only a signal-only combine may leave y null).
  cp.tp = dp.tp;
  cp.y_stride = 64;
  EXPECT_EQ(launch_ep_combine(cp, nullptr), cudaErrorInvalidValue);
}

// ---------------------------------------------------------------------------------------------

TEST(MultiGpu, DataMovementBitwise) {
  SKIP_UNLESS_WORLD_GPUS();
  auto r = run_ranks(kW, 90, [](int rank, int world, const NcclUniqueIdBytes& id, Report&) {
    EpComm comm(id, rank, world, opts(rank));
    RankCtx c;
    c.g.world = world;
    c.open(comm, rank);
    struct Case {
      std::vector<int> T;
      Routing routing;
      bool use_index;
      const char* name;
    };
    const std::vector<Case> cases = {
        {{100, 100}, Routing::kUniform, false, "uniform T=100"},
        {{0, 100}, Routing::kUniform, false, "T=0 on rank 0"},
        {{100, 0}, Routing::kUniform, false, "T=0 on rank 1"},
        {{0, 0}, Routing::kUniform, false, "T=0 on both"},
        {{1, 256}, Routing::kUniform, false, "unequal T (1, capacity)"},
        {{50, 70}, Routing::kNone, false, "all slots -1"},
        {{128, 128}, Routing::kOther, false, "all tokens to the other rank"},
        {{200, 30}, Routing::kSkewed, false, "skewed routing"},
        {{256, 255}, Routing::kUniform, true, "y through y_index"},
    };
    uint64_t seed = 1;
    for (const Case& cs : cases)
      forward_and_verify(c, cs.T, cs.routing, seed++, cs.use_index, cs.name);
    // Another grid shape gives the same bytes.
    c.blocks = 3;
    c.threads = 64;
    forward_and_verify(c, {256, 180}, Routing::kUniform, 77, false, "3 blocks x 64 threads");
    // Rows in increasing token order (the count pass), on both grids.
    c.ordered = true;
    forward_and_verify(c, {256, 180}, Routing::kSkewed, 90, false, "ordered rows, 3 x 64");
    c.blocks = 0;
    c.threads = 512;
    forward_and_verify(c, {100, 256}, Routing::kUniform, 91, true, "ordered rows, default grid");
    c.ordered = false;
    // Waits fused into dispatch / combine, 1024 threads, and the few-block grids of small calls.
    c.fused = true;
    c.blocks = 0;
    c.threads = 1024;
    forward_and_verify(c, {100, 100}, Routing::kUniform, 78, false, "fused waits, 1024 threads");
    forward_and_verify(c, {0, 0}, Routing::kUniform, 79, false, "fused waits, T=0 on both");
    c.blocks = 1;
    c.threads = 512;
    forward_and_verify(c, {1, 3}, Routing::kUniform, 80, false, "fused waits, 1 block, T 1/3");
    forward_and_verify(c, {256, 255}, Routing::kSkewed, 81, true, "fused waits, 1 block, full");
    // One block: the general arrival path (solo off: row counters and arrival atomics), and the
    // dispatch's early reads of the caller's inputs (the layer's setting) over the block's 16
    // tiles and over one.
    c.solo = false;
    forward_and_verify(c, {256, 255}, Routing::kSkewed, 92, true, "1 block, general arrival");
    c.solo = true;
    c.early = true;
    forward_and_verify(c, {256, 255}, Routing::kSkewed, 93, true, "1 block, early inputs, full");
    forward_and_verify(c, {1, 3}, Routing::kUniform, 94, false, "1 block, early inputs, T 1/3");
    c.early = false;
    // Fused combine: the experts kernel stores into the sources' combine areas, a signal-only
    // combine (1 block, as the CUDA backend launches it) publishes them; with the fused wait and
    // with the wait kernel; empty ranks and every routing.
    c.signal_only = true;
    c.blocks = 1;
    c.threads = 64;
    forward_and_verify(c, {256, 180}, Routing::kUniform, 84, false, "signal-only, fused wait");
    c.solo = false;
    forward_and_verify(c, {200, 256}, Routing::kUniform, 95, false, "signal-only, general arrival");
    c.solo = true;
    forward_and_verify(c, {0, 0}, Routing::kUniform, 85, false, "signal-only, T=0 on both");
    forward_and_verify(c, {0, 77}, Routing::kSkewed, 86, false, "signal-only, T=0 on rank 0");
    forward_and_verify(c, {128, 128}, Routing::kOther, 87, false, "signal-only, all to the other");
    c.fused = false;
    forward_and_verify(c, {256, 256}, Routing::kUniform, 88, false, "signal-only, wait kernel");
    forward_and_verify(c, {50, 70}, Routing::kNone, 89, false, "signal-only, all slots -1");
    c.signal_only = false;
    // Rows longer than the 4 KB prefetched head (9008 bytes) and 8 KB result rows (combine
    // pieces), with tiles of 2 warps and with the default grid.
    RankCtx wide;
    wide.g = Geometry{world, 16, 4, 4096, 64, 9008};
    wide.open(comm, rank);
    forward_and_verify(wide, {64, 17}, Routing::kUniform, 82, false, "9008-byte rows");
    wide.fused = true;
    wide.blocks = 2;
    wide.threads = 64;
    forward_and_verify(wide, {5, 64}, Routing::kSkewed, 83, true, "9008-byte rows, 2 x 64");
    wide.free_all();
    c.free_all();
    comm.destroy();
    comm.destroy();  // idempotent
    bool threw = false;
    try {
      comm.check();
    } catch (const Error& e) {
      threw = e.code() == ErrorCode::kDestroyed;
    }
    REQUIRE(threw, "check() after destroy() must fail with kDestroyed");
  });
  expect_all_passed(r);
}

TEST(MultiGpu, EpochsShrinkGrowTwoWorkspaces) {
  SKIP_UNLESS_WORLD_GPUS();
  auto r = run_ranks(kW, 90, [](int rank, int world, const NcclUniqueIdBytes& id, Report&) {
    EpComm comm(id, rank, world, opts(rank));
    RankCtx big, small;
    big.g.world = small.g.world = world;
    small.g.capacity = 32;
    small.fused = true;    // one workspace with fused waits, one without, interleaved
    big.open(comm, rank);  // collective: the same order on every rank
    small.open(comm, rank);
    const std::vector<std::vector<int>> seq = {{256, 256}, {200, 256}, {150, 7},
                                               {50, 0},    {1, 128},   {0, 1},
                                               {64, 200},  {255, 256}, {256, 3}};
    uint64_t seed = 100;
    for (size_t i = 0; i < seq.size(); ++i) {
      forward_and_verify(big, seq[i], Routing::kUniform, seed++, false,
                         "big ws call " + std::to_string(i));
      // Interleave the small workspace: its epochs are its own.
      const std::vector<int> ts = {int(i * 5) % 33, int(32 - i * 3)};
      forward_and_verify(small, ts, Routing::kUniform, seed++, false,
                         "small ws call " + std::to_string(i));
    }
    big.free_all();
    small.free_all();
    comm.destroy();
  });
  expect_all_passed(r);
}

TEST(MultiGpu, GraphReplayVaryingT) {
  SKIP_UNLESS_WORLD_GPUS();
  auto r = run_ranks(kW, 90, [](int rank, int world, const NcclUniqueIdBytes& id, Report&) {
    EpComm comm(id, rank, world, opts(rank));
    RankCtx c;
    c.g.world = world;
    c.open(comm, rank);
    // Capture one forward with the token count read on the device.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal));
    c.enqueue(0, false, /*dev_count=*/true);
    CK(cudaStreamEndCapture(c.stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    const std::vector<std::vector<int>> seq = {{256, 3}, {17, 256}, {0, 100}, {200, 0}, {5, 5}};
    uint64_t seed = 500;
    for (size_t i = 0; i < seq.size(); ++i) {
      std::vector<Inputs> all;
      for (int s = 0; s < world; ++s)
        all.push_back(make_inputs(c.g, s, t_of(seq[i], s), Routing::kUniform, seed));
      ++seed;
      const int T = t_of(seq[i], rank);
      c.upload(all[size_t(rank)], make_act(c.g, rank, T));
      CK(cudaMemcpyAsync(c.ntok, &T, 4, cudaMemcpyHostToDevice, c.stream));
      CK(cudaGraphLaunch(exec, c.stream));
      CK(cudaStreamSynchronize(c.stream));
      c.verify(all, "graph replay " + std::to_string(i));
      comm.barrier();
    }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    c.free_all();
    comm.destroy();
  });
  expect_all_passed(r);
}

// Rank 1 skips a call (or only its combine); every other rank must come back within the timeout
// with a sticky error naming that peer and stage, and none may hang or trap.
void fault_case(bool skip_whole_call) {
  const int64_t timeout_ms = 300;
  auto r = run_ranks(kW, 60, [&](int rank, int world, const NcclUniqueIdBytes& id, Report& rep) {
    EpComm comm(id, rank, world, opts(rank, timeout_ms));
    RankCtx c;
    c.g.world = world;
    c.open(comm, rank);
    forward_and_verify(c, {64, 64}, Routing::kUniform, 9, false, "call before the fault");
    if (rank == 1) {
      if (!skip_whole_call) {  // dispatch and its wait, then walk away before combine
        const Inputs in = make_inputs(c.g, 1, 64, Routing::kUniform, 10);
        c.upload(in, make_act(c.g, 1, 64));
        c.enqueue(64, false, false, true, false);
        CK(cudaStreamSynchronize(c.stream));
        comm.check();  // rank 1 saw no fault
      }
    } else {
      const Inputs in = make_inputs(c.g, rank, 64, Routing::kUniform, 10);
      c.upload(in, make_act(c.g, rank, 64));
      const auto t0 = Clock::now();
      c.enqueue(64, false, false);
      CK(cudaStreamSynchronize(c.stream));  // must return: the wait is bounded
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      rep.val[0] = ms;
      rep.nval = 1;
      REQUIRE(ms < timeout_ms + 3000, "the faulty call took " + std::to_string(ms) + " ms");
      const auto err = comm.error();
      REQUIRE(err.has_value(), "no sticky error after the peer skipped the call");
      const EpStage want = skip_whole_call ? EpStage::kDispatch : EpStage::kCombine;
      REQUIRE(err->peer == 1, "error names peer " + std::to_string(err->peer));
      REQUIRE(err->stage == int32_t(want),
              std::string("error stage ") + ep_stage_name(EpStage(err->stage)));
      REQUIRE(err->call == 2, "error call " + std::to_string(err->call));
      std::string msg;
      try {
        comm.check();
      } catch (const Error& e) {
        REQUIRE(e.code() == ErrorCode::kPeer, "error code");
        msg = e.what();
      }
      std::printf("rank %d reported after %.0f ms: %s\n", rank, ms, msg.c_str());
      REQUIRE(msg.find("peer rank 1") != std::string::npos, "message: " + msg);
      REQUIRE(msg.find(std::string("'") + ep_stage_name(want) + "'") != std::string::npos,
              "message: " + msg);
      // Sticky: a later call runs to completion at once (kernels stand down) and still reports.
      const auto t1 = Clock::now();
      c.enqueue(64, false, false);
      CK(cudaStreamSynchronize(c.stream));
      const double ms2 = std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
      REQUIRE(ms2 < 1000, "a call after the error took " + std::to_string(ms2) + " ms");
      REQUIRE(comm.error().has_value(), "sticky error was cleared");
    }
    c.free_all();
    comm.destroy();  // both ranks meet at the teardown barrier
  });
  expect_all_passed(r);
}

TEST(MultiGpu, FaultPeerSkipsCall) {
  SKIP_UNLESS_WORLD_GPUS();
  fault_case(true);
}

TEST(MultiGpu, FaultPeerSkipsCombine) {
  SKIP_UNLESS_WORLD_GPUS();
  fault_case(false);
}

// DeepSeek-V3 transfer sizes: H 7168, 4096 tokens per rank, K 8 of E 256, NVFP4 rows of 4032
// bytes (3584 data + 448 scales), bf16 combine rows of 14336 bytes. Checks the bytes of one call,
// then times dispatch (+ its wait) and combine (+ its wait) per grid size and prints NVLink GB/s
// against the 367 GB/s per direction measured for SM stores on the H200s.
TEST(MultiGpu, DsV3TransferBandwidth) {
  SKIP_UNLESS_WORLD_GPUS();
  constexpr double kCeilingGBps = 367.0;
  struct TransferConfig {
    int blocks, threads;
    bool fused, ordered = false;
  };
  const std::vector<TransferConfig> configs = {
      {16, 512, true},        {64, 512, true},   {132, 512, false}, {132, 512, true},
      {132, 512, true, true}, {132, 1024, true}, {264, 512, false}, {264, 512, true},
      {264, 512, true, true}, {256, 512, true}};
  // Dispatch alone at fewer tokens per rank (132 x 512, fused, device start): the time against
  // the bytes separates a per-call fixed cost from the rate.
  const std::vector<int> sweep_tokens = {1, 128, 512, 1024, 2048};
  auto r = run_ranks(kW, 120, [&](int rank, int world, const NcclUniqueIdBytes& id, Report& rep) {
    EpComm comm(id, rank, world, opts(rank));
    RankCtx c;
    c.g = Geometry{world, 256, 8, 7168, 4096, 4032};
    c.open(comm, rank, 3584, 448);
    const int T = 4096;
    std::vector<Inputs> all;
    for (int s = 0; s < world; ++s) all.push_back(make_inputs(c.g, s, T, Routing::kUniform, 4242));
    // Uniform routing here means no empty slots: redo without the 1-in-8 -1s.
    for (auto& in : all)
      for (size_t i = 0; i < in.ids.size(); ++i)
        if (in.ids[i] < 0) {
          // a free expert of the token, deterministic
          const size_t t = i / size_t(c.g.K);
          for (int e = int(i % size_t(c.g.K)) * 31;; e = (e + 1) % c.g.E) {
            bool used = false;
            for (int k = 0; k < c.g.K; ++k) used |= in.ids[t * c.g.K + k] == e;
            if (!used) {
              in.ids[i] = e;
              break;
            }
          }
        }
    c.upload(all[size_t(rank)], make_act(c.g, rank, T));
    c.enqueue(T, false, false);
    CK(cudaStreamSynchronize(c.stream));
    c.check_stride = 7;  // all received rows, every 7th token's results
    c.verify(all, "DSV3 call");

    // Bytes that cross NVLink from this rank (a copy of the layout: the workspace table may
    // move when the experiment below creates another workspace).
    const WorkspaceLayout L = comm.workspace(c.ws).layout;
    const double row_bytes = double(L.act_row_bytes + L.meta_row_bytes);
    auto dispatch_bytes_of = [&](int tokens) {
      double b = 0;
      for (int t = 0; t < tokens; ++t)
        for (int o = 0; o < world; ++o)
          if (o != rank && has_slot_on(c.g, all[size_t(rank)], t, o)) b += row_bytes;
      return b;
    };
    const double dispatch_bytes = dispatch_bytes_of(T);
    double combine_bytes = 0;
    for (int s = 0; s < world; ++s) {
      if (s == rank) continue;
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < c.g.K; ++k) {
          const int id = all[size_t(s)].ids[size_t(t) * c.g.K + k];
          if (id >= 0 && id / c.g.El() == rank) combine_bytes += double(c.g.H) * 2;
        }
    }
    const EpTransport tp = comm.transport(c.ws);
    cudaEvent_t ev[6];
    for (auto& e : ev) CK(cudaEventCreate(&e));
    auto stats = [](std::vector<float> v, double* out) {
      std::sort(v.begin(), v.end());
      out[0] = v[v.size() / 2] * 1000.0;
      out[1] = v.front() * 1000.0;
      out[2] = v.back() * 1000.0;
    };
    auto dispatch = [&](int tokens, int blocks, int threads, bool fused, bool ordered = false) {
      EpDispatchParams dp;
      dp.tp = tp;
      dp.act = c.act;
      dp.act_stride = c.g.act_bytes;
      dp.topk_ids = c.ids;
      dp.topk_weights = c.w;
      dp.num_tokens = tokens;
      dp.num_local_experts = c.g.El();
      dp.num_blocks = blocks;
      dp.num_threads = threads;
      dp.fused_wait = fused;
      dp.ordered_rows = ordered;
      CK(launch_ep_dispatch(dp, c.stream));
      if (!fused) CK(launch_ep_wait(EpWaitParams{tp, EpStage::kDispatch}, c.stream));
    };
    auto combine = [&](int blocks, int threads, bool fused) {
      EpCombineParams cp;
      cp.tp = tp;
      cp.y = c.y;
      cp.y_stride = c.g.H;
      cp.num_local_experts = c.g.El();
      cp.num_blocks = blocks;
      cp.num_threads = threads;
      cp.fused_wait = fused;
      CK(launch_ep_combine(cp, c.stream));
      if (!fused) CK(launch_ep_wait(EpWaitParams{tp, EpStage::kCombine}, c.stream));
    };
    auto ms = [&](int a, int b) {
      float v = 0;
      CK(cudaEventElapsedTime(&v, ev[a], ev[b]));
      return v;
    };
    int nv = 0;
    rep.val[nv++] = dispatch_bytes;
    rep.val[nv++] = combine_bytes;
    rep.val[nv++] = double(configs.size());
    for (const TransferConfig& cf : configs) {
      // start 0: the host barrier returns, then the launches (includes the launch latency and
      // the ranks' host skew). start 1: an LSA barrier kernel
      // enqueued right before, so both GPUs enter the stage together with the kernel already
      // queued, as inside a forward.
      std::vector<float> t[2][2];
      for (int start = 0; start < 2; ++start) {
        for (int it = 0; it < 25; ++it) {
          comm.barrier();
          if (start == 1) comm.barrier_async(c.stream);
          CK(cudaEventRecord(ev[0], c.stream));
          dispatch(T, cf.blocks, cf.threads, cf.fused, cf.ordered);
          CK(cudaEventRecord(ev[1], c.stream));
          CK(cudaStreamSynchronize(c.stream));
          comm.barrier();
          if (start == 1) comm.barrier_async(c.stream);
          CK(cudaEventRecord(ev[2], c.stream));
          combine(cf.blocks, cf.threads, cf.fused);
          CK(cudaEventRecord(ev[3], c.stream));
          CK(cudaStreamSynchronize(c.stream));
          if (it >= 5) {  // warmup
            t[start][0].push_back(ms(0, 1));
            t[start][1].push_back(ms(2, 3));
          }
        }
      }
      comm.check();
      rep.val[nv++] = cf.blocks;
      rep.val[nv++] = cf.threads;
      rep.val[nv++] = int(cf.fused) + 2 * int(cf.ordered);
      for (int start = 0; start < 2; ++start)
        for (int st = 0; st < 2; ++st) {
          stats(t[start][st], rep.val + nv);
          nv += 3;
        }
    }
    // Experiment: the same payload in rows padded to 4096 bytes (every row 128-byte aligned;
    // the layer's rows are 4032 bytes apart). Dispatch only, 264 x 512, fused, device start.
    {
      const int ws2 = comm.create_workspace(
          WorkspaceLayout::make(world, c.g.capacity, c.g.H, c.g.K, 4096 - 448, 448));
      uint8_t* act2 = nullptr;
      CK(cudaMalloc(&act2, size_t(T) * 4096));
      CK(cudaMemset(act2, 0x5a, size_t(T) * 4096));
      EpDispatchParams dp;
      dp.tp = comm.transport(ws2);
      dp.act = act2;
      dp.act_stride = 4096;
      dp.topk_ids = c.ids;
      dp.topk_weights = c.w;
      dp.num_tokens = T;
      dp.num_local_experts = c.g.El();
      dp.num_blocks = 264;
      dp.num_threads = 512;
      dp.fused_wait = true;
      EpCombineParams cp;
      cp.tp = dp.tp;
      cp.y = c.y;
      cp.y_stride = c.g.H;
      cp.num_local_experts = c.g.El();
      cp.num_blocks = 264;
      cp.fused_wait = true;
      std::vector<float> ta;
      for (int it = 0; it < 25; ++it) {
        comm.barrier();
        comm.barrier_async(c.stream);
        CK(cudaEventRecord(ev[0], c.stream));
        CK(launch_ep_dispatch(dp, c.stream));
        CK(cudaEventRecord(ev[1], c.stream));
        CK(launch_ep_combine(cp, c.stream));  // keeps the workspace's epochs in step
        CK(cudaStreamSynchronize(c.stream));
        if (it >= 5) ta.push_back(ms(0, 1));
      }
      comm.check();
      CK(cudaFree(act2));
      stats(ta, rep.val + nv);
      nv += 3;
    }
    // The token sweep: bytes and the median per token count.
    for (const int Ts : sweep_tokens) {
      rep.val[nv++] = dispatch_bytes_of(Ts);
      std::vector<float> ts;
      for (int it = 0; it < 25; ++it) {
        comm.barrier();
        comm.barrier_async(c.stream);
        CK(cudaEventRecord(ev[0], c.stream));
        dispatch(Ts, 132, 512, true);
        CK(cudaEventRecord(ev[1], c.stream));
        combine(132, 512, true);  // keeps the workspace's epochs in step
        CK(cudaStreamSynchronize(c.stream));
        if (it >= 5) ts.push_back(ms(0, 1));
      }
      comm.check();
      stats(ts, rep.val + nv);
      nv += 3;
    }
    // Decode: one token per rank, dispatch + wait + combine + wait, launched one by one and as
    // a replayed CUDA graph (what a captured forward sees). Mode 0: 16 blocks each and separate
    // wait kernels (for comparison); mode 1: what the layer launches now (fused
    // waits, ep_blocks_for grids).
    for (int mode = 0; mode < 2; ++mode) {
      const int db = mode == 0 ? 16 : ep_blocks_for(264, 1, 16);
      const int cb = mode == 0 ? 16 : ep_blocks_for(264, int64_t(world) * 1 * c.g.K * 4, 16);
      const bool fused = mode == 1;
      std::vector<float> tl, tg;
      for (int it = 0; it < 40; ++it) {
        comm.barrier();
        CK(cudaEventRecord(ev[0], c.stream));
        dispatch(1, db, 512, fused);
        combine(cb, 512, fused);
        CK(cudaEventRecord(ev[1], c.stream));
        CK(cudaStreamSynchronize(c.stream));
        if (it >= 10) tl.push_back(ms(0, 1));
      }
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CK(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal));
      dispatch(1, db, 512, fused);
      combine(cb, 512, fused);
      CK(cudaStreamEndCapture(c.stream, &graph));
      CK(cudaGraphInstantiate(&exec, graph, 0));
      for (int it = 0; it < 40; ++it) {
        comm.barrier();
        CK(cudaEventRecord(ev[0], c.stream));
        CK(cudaGraphLaunch(exec, c.stream));
        CK(cudaEventRecord(ev[1], c.stream));
        CK(cudaStreamSynchronize(c.stream));
        if (it >= 10) tg.push_back(ms(0, 1));
      }
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(graph));
      comm.check();
      stats(tl, rep.val + nv);
      nv += 3;
      stats(tg, rep.val + nv);
      nv += 3;
    }
    rep.nval = nv;
    for (auto& e : ev) cudaEventDestroy(e);
    c.free_all();
    comm.destroy();
  });
  expect_all_passed(r);
  if (r.hung || r.rep[0].failed || r.rep[1].failed) return;

  // Report: per config, the slowest rank's numbers (a stage ends when both ranks are done).
  auto worst = [&](int i) { return std::max(r.rep[0].val[i], r.rep[1].val[i]); };
  const double db = worst(0), cb = worst(1);
  const int ng = int(r.rep[0].val[2]);
  std::printf(
      "DSV3 EP=2 transfer (H 7168, 4096 tokens/rank, K 8, nvfp4 rows 4032 B, bf16 rows "
      "14336 B); bytes per direction: dispatch %.1f MB, combine %.1f MB; NVLink ceiling "
      "%.0f GB/s per direction. Times: median us of the slowest rank, each stage with its wait "
      "(fused or a wait kernel); host start = after a host barrier (launch latency and host "
      "skew included), device start = after an LSA barrier kernel on the same stream\n",
      db / 1e6, cb / 1e6, kCeilingGBps);
  std::printf(
      "rows: atomic = each tile takes its rows from a per-owner counter (the default), "
      "ordered = a count pass first, rows in token order\n");
  std::printf("%6s %7s %5s %7s | %10s %6s | %10s %6s %6s | %10s %6s | %10s %6s %6s\n", "blocks",
              "threads", "fused", "rows", "disp_host", "GB/s", "disp_dev", "GB/s", "frac",
              "comb_host", "GB/s", "comb_dev", "GB/s", "frac");
  std::string json = "[\n";
  char buf[1024];
  const char* names[2] = {"dispatch+wait", "combine+wait"};
  for (int gi = 0; gi < ng; ++gi) {
    const int base = 3 + gi * 15;
    const int blocks = int(r.rep[0].val[base]), threads = int(r.rep[0].val[base + 1]);
    const int fused = int(r.rep[0].val[base + 2]) & 1;
    const bool ordered = (int(r.rep[0].val[base + 2]) & 2) != 0;
    // [start][stage] medians at base + 3 + (start * 2 + stage) * 3
    auto med = [&](int start, int st) { return worst(base + 3 + (start * 2 + st) * 3); };
    auto gbps = [&](int st, double us) { return (st == 0 ? db : cb) / (us * 1e3); };
    std::printf(
        "%6d %7d %5s %7s | %10.1f %6.1f | %10.1f %6.1f %5.0f%% | %10.1f %6.1f | %10.1f %6.1f "
        "%5.0f%%\n",
        blocks, threads, fused ? "yes" : "no", ordered ? "ordered" : "atomic", med(0, 0),
        gbps(0, med(0, 0)), med(1, 0), gbps(0, med(1, 0)), 100 * gbps(0, med(1, 0)) / kCeilingGBps,
        med(0, 1), gbps(1, med(0, 1)), med(1, 1), gbps(1, med(1, 1)),
        100 * gbps(1, med(1, 1)) / kCeilingGBps);
    for (int start = 0; start < 2; ++start)
      for (int st = 0; st < 2; ++st) {
        const int o = base + 3 + (start * 2 + st) * 3;
        const double bytes = st == 0 ? db : cb;
        const double m = worst(o);
        std::snprintf(buf, sizeof(buf),
                      "  {\"device\": \"2x H200 NVLink\", \"ep\": 2, \"shape\": \"dsv3\", "
                      "\"tokens_per_rank\": 4096, \"top_k\": 8, \"stage\": \"%s\", "
                      "\"start\": \"%s\", \"routing\": \"uniform\", \"median_us\": %.2f, "
                      "\"min_us\": %.2f, \"max_us\": %.2f, \"bytes_per_direction\": %.0f, "
                      "\"nvlink_GBps\": %.1f, \"ceiling_GBps\": %.0f, \"fraction\": %.3f, "
                      "\"config\": {\"blocks\": %d, \"threads\": %d, \"fused_wait\": %s, "
                      "\"rows\": \"%s\"}},\n",
                      names[st], start ? "device_barrier" : "host_barrier", m, worst(o + 1),
                      worst(o + 2), bytes, bytes / (m * 1e3), kCeilingGBps,
                      bytes / (m * 1e3) / kCeilingGBps, blocks, threads, fused ? "true" : "false",
                      ordered ? "ordered" : "atomic");
        json += buf;
      }
  }
  const int al = 3 + ng * 15;
  std::printf(
      "dispatch+wait with rows padded to 4096 B (128-byte aligned), 264 x 512, fused, device "
      "start: %.1f us = %.1f GB/s of the same payload (%.0f%%)\n",
      worst(al), db / (worst(al) * 1e3), 100 * db / (worst(al) * 1e3) / kCeilingGBps);
  std::snprintf(buf, sizeof(buf),
                "  {\"device\": \"2x H200 NVLink\", \"ep\": 2, \"shape\": \"dsv3\", "
                "\"tokens_per_rank\": 4096, \"stage\": \"dispatch+wait\", \"start\": "
                "\"device_barrier\", \"rows\": \"padded to 4096 B\", \"median_us\": %.2f, "
                "\"min_us\": %.2f, \"max_us\": %.2f, \"nvlink_GBps\": %.1f, "
                "\"config\": {\"blocks\": 264, \"threads\": 512, \"fused_wait\": true}},\n",
                worst(al), worst(al + 1), worst(al + 2), db / (worst(al) * 1e3));
  json += buf;
  int sw = al + 3;
  for (const int Ts : sweep_tokens) {
    const double bytes = worst(sw), m = worst(sw + 1);
    std::printf(
        "dispatch+wait at %d tokens/rank (%.2f MB per direction), 132 x 512, fused, device "
        "start: %.1f us = %.1f GB/s (%.0f%%)\n",
        Ts, bytes / 1e6, m, bytes / (m * 1e3), 100 * bytes / (m * 1e3) / kCeilingGBps);
    std::snprintf(buf, sizeof(buf),
                  "  {\"device\": \"2x H200 NVLink\", \"ep\": 2, \"shape\": \"dsv3\", "
                  "\"tokens_per_rank\": %d, \"stage\": \"dispatch+wait\", \"start\": "
                  "\"device_barrier\", \"routing\": \"uniform\", \"median_us\": %.2f, "
                  "\"min_us\": %.2f, \"max_us\": %.2f, \"bytes_per_direction\": %.0f, "
                  "\"nvlink_GBps\": %.1f, \"config\": {\"blocks\": 132, \"threads\": 512, "
                  "\"fused_wait\": true}},\n",
                  Ts, m, worst(sw + 2), worst(sw + 3), bytes, bytes / (m * 1e3));
    json += buf;
    sw += 4;
  }
  const int lb = sw;
  for (int mode = 0; mode < 2; ++mode) {
    const int o = lb + mode * 6;
    std::printf(
        "decode round trip (1 token/rank, dispatch+wait+combine+wait, %s): stream launches "
        "median %.1f us (min %.1f, max %.1f); CUDA graph median %.1f us (min %.1f, max %.1f)\n",
        mode == 0 ? "16 blocks, wait kernels" : "fused waits, small grids", worst(o), worst(o + 1),
        worst(o + 2), worst(o + 3), worst(o + 4), worst(o + 5));
    for (int gmode = 0; gmode < 2; ++gmode) {
      const int q = o + 3 * gmode;
      std::snprintf(buf, sizeof(buf),
                    "  {\"device\": \"2x H200 NVLink\", \"ep\": 2, \"shape\": \"dsv3\", "
                    "\"tokens_per_rank\": 1, \"stage\": \"dispatch+wait+combine+wait\", "
                    "\"launch\": \"%s\", \"median_us\": %.2f, \"min_us\": %.2f, \"max_us\": %.2f, "
                    "\"config\": \"%s\"}%s\n",
                    gmode == 0 ? "stream" : "graph", worst(q), worst(q + 1), worst(q + 2),
                    mode == 0 ? "16 blocks, wait kernels" : "fused waits, small grids",
                    mode == 1 && gmode == 1 ? "" : ",");
      json += buf;
    }
  }
  json += "]\n";
  if (const char* path = std::getenv("MOE_EP_BENCH_JSON")) {
    std::ofstream(path) << json;
    std::printf("wrote %s\n", path);
  }
}

}  // namespace
}  // namespace moe_ep
