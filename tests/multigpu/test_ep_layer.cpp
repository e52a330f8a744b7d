// The CUDA backend at W = MOE_EP_TEST_WORLD ranks (2, 4 or 8; default 2; one forked process per
// GPU) through the public MegaLayer API:
// every recipe against the CPU backend (W = 1, the tolerance of docs/contract.md §7) and bit for
// bit against the single-GPU CUDA layer on the same inputs; T = 0 on one and both ranks, unequal /
// shrinking / growing T, all slots -1, all tokens to the next rank, a second workspace picked by
// select_workspace_collective, unfinalized outputs, CUDA graph replay with a device-side token
// count, an EPLB expert swap across ranks (bytes moved with ncclSend / ncclRecv), and a rank
// that skips a call. Outputs are poisoned (NaN) before every call. The EpLayer tests run the
// default combine path (fc2 stores into the sources' combine areas); Combine/EpLayerForced.*/
// Fused|Copy and EpLayerMixed repeat the main cases with PlanOptions::combine fused / copy on
// every rank / fused on rank 0 and copy on the others. Skips without W GPUs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "../edge_activations.h"
#include "moe_ep/formats.h"
#include "moe_ep/group.h"
#include "moe_ep/layer.h"
#include "moe_ep/weight_prep.h"
#include "rank_harness.h"

namespace moe_ep::mgtest {
namespace {

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }
#define REQUIRE(cond, msg)                                                          \
  do {                                                                              \
    if (!(cond))                                                                    \
      ::moe_ep::mgtest::fail(std::string(__FILE__ ":") + std::to_string(__LINE__) + \
                             ": " #cond " -- " + (msg));                            \
  } while (0)
#define CK(x)                                                                  \
  do {                                                                         \
    const cudaError_t e_ = (x);                                                \
    if (e_ != cudaSuccess)                                                     \
      ::moe_ep::mgtest::fail(std::string(#x) + ": " + cudaGetErrorString(e_)); \
  } while (0)

constexpr int kH = 1024, kI = 512, kE = 16, kK = 4;
// The world size (MOE_EP_TEST_WORLD, rank_harness.h) and the experts per rank.
const int kWorld = test_world(), kEl = kE / kWorld;
constexpr Recipe kRecipes[] = {Recipe::kNvfp4, Recipe::kMxfp4Mxfp8, Recipe::kMxfp4Bf16,
                               Recipe::kBf16, Recipe::kNvfp4Bf16};

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
float urand(uint64_t seed, uint64_t i) {
  return float(mix(seed * 0x100000001b3ull + i) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

struct Options {
  bool apply_topk_in_fc1 = false, random_fc1_norm = false, finalize = true;
  std::optional<float> limit;
  CombineMode combine = CombineMode::kFused;  // the layer's PlanOptions::combine
};

Options recipe_options(Recipe r) {
  Options o;
  if (r == Recipe::kNvfp4) o.random_fc1_norm = true;
  if (r == Recipe::kMxfp4Bf16) o.limit = 7.0f;
  if (r == Recipe::kBf16) o.apply_topk_in_fc1 = true;
  if (r == Recipe::kNvfp4Bf16) {
    o.limit = 7.0f;
    o.apply_topk_in_fc1 = true;
  }
  return o;
}

LayerConfig make_config(Recipe r, int capacity, const Options& o) {
  LayerConfig c;
  c.fleet.num_experts = kE;
  c.fleet.max_tokens_per_rank = capacity;
  c.fleet.hidden_size = kH;
  c.recipe.recipe = r;
  c.recipe.intermediate_size = kI;
  c.recipe.top_k = kK;
  c.recipe.swiglu_limit = o.limit;
  c.recipe.apply_topk_in_fc1 = o.apply_topk_in_fc1;
  c.recipe.do_finalize = o.finalize;
  c.plan_options.combine = o.combine;
  return c;
}

PackedExperts make_pack(Recipe r, const Options& o, uint64_t seed) {
  std::vector<float> w13(size_t(kE) * 2 * kI * kH), w2(size_t(kE) * kH * kI), nc(kE);
  for (size_t i = 0; i < w13.size(); ++i) w13[i] = 0.06f * urand(seed, i);
  for (size_t i = 0; i < w2.size(); ++i) w2[i] = 0.06f * urand(seed + 1, i);
  for (int e = 0; e < kE; ++e) nc[e] = std::ldexp(1.0f, int(mix(seed + e) % 3) - 1);
  return pack_expert_weights(r, w13.data(), w2.data(), kE, kH, kI, 1.0f,
                             o.random_fc1_norm && r == Recipe::kNvfp4 ? nc.data() : nullptr);
}

enum class Route { kUniform, kNone, kOther };

struct Inputs {
  int T = 0;
  std::vector<uint16_t> x;
  std::vector<int32_t> ids;
  std::vector<float> w;
};

// Distinct experts per token; every 5th token's last slot is empty. kOther: only experts of
// the next rank ((rank + 1) mod W). kNone: every slot -1.
Inputs make_inputs(int T, int rank, uint64_t seed, Route route) {
  Inputs in;
  in.T = T;
  in.x.resize(size_t(T) * kH);
  for (size_t i = 0; i < in.x.size(); ++i)
    in.x[i] = fmt::float_to_bf16((1.0f + 3.0f * float((i / kH) % 4)) * urand(seed, i));
  in.ids.assign(size_t(T) * kK, -1);
  in.w.resize(size_t(T) * kK);
  for (int t = 0; t < T; ++t) {
    std::vector<int> chosen;
    for (int k = 0; k < kK; ++k) {
      in.w[size_t(t) * kK + k] = 0.05f + 0.45f * (1.0f + urand(seed + 3, size_t(t) * kK + k));
      if (route == Route::kNone) continue;
      uint64_t r = mix(seed * 7919 + t * 131 + k);
      int e;
      do {
        e = route == Route::kOther ? (rank + 1) % kWorld * kEl + int(r % kEl) : int(r % kE);
        r = mix(r);
      } while (std::find(chosen.begin(), chosen.end(), e) != chosen.end());
      chosen.push_back(e);
      in.ids[size_t(t) * kK + k] = (t % 5 == 4 && k == kK - 1) ? -1 : e;
    }
  }
  return in;
}

struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  explicit DevBuf(size_t n) : bytes(n) { CK(cudaMalloc(&p, std::max<size_t>(n, 16))); }
  DevBuf(const void* src, size_t n) : DevBuf(n) {
    if (n) CK(cudaMemcpy(p, src, n, cudaMemcpyHostToDevice));
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p) cudaFree(p);
  }
};

struct DevInputs {
  int T;
  int device;
  DevBuf x, ids, w;
  DevInputs(const Inputs& h, int dev)
      : T(h.T),
        device(dev),
        x(h.x.data(), h.x.size() * 2),
        ids(h.ids.data(), h.ids.size() * 4),
        w(h.w.data(), h.w.size() * 4) {}
  ForwardInputs view() const {
    const Device d{DeviceKind::kCUDA, device};
    ForwardInputs f;
    f.hidden_states = TensorView::contiguous(x.p, DType::kBF16, {T, kH}, d);
    f.topk_ids = TensorView::contiguous(ids.p, DType::kI32, {T, kK}, d);
    f.topk_weights = TensorView::contiguous(w.p, DType::kF32, {T, kK}, d);
    return f;
  }
};

ForwardInputs host_view(Inputs& h) {
  ForwardInputs f;
  f.hidden_states = TensorView::contiguous(h.x.data(), DType::kBF16, {h.T, kH});
  f.topk_ids = TensorView::contiguous(h.ids.data(), DType::kI32, {h.T, kK});
  f.topk_weights = TensorView::contiguous(h.w.data(), DType::kF32, {h.T, kK});
  return f;
}

// Forward into a NaN-poisoned device buffer; returns the host copy.
std::vector<uint16_t> run(MegaLayer& layer, const ForwardInputs& in, int T, int dev,
                          cudaStream_t s = nullptr) {
  DevBuf out(size_t(T) * kH * 2);
  CK(cudaMemset(out.p, 0xff, std::max<size_t>(out.bytes, 16)));
  ForwardInputs f = in;
  f.stream = s;
  layer.forward(
      f, TensorView::contiguous(out.p, DType::kBF16, {T, kH}, Device{DeviceKind::kCUDA, dev}));
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> h(size_t(T) * kH);
  if (!h.empty()) CK(cudaMemcpy(h.data(), out.p, h.size() * 2, cudaMemcpyDeviceToHost));
  return h;
}

std::vector<uint16_t> run_cpu(MegaLayer& cpu, Inputs& h,
                              std::optional<WorkspaceId> ws = std::nullopt) {
  if (h.T == 0) return {};
  ForwardInputs f = host_view(h);
  f.workspace = ws;
  Tensor t = cpu.forward(f);
  const uint16_t* p = static_cast<const uint16_t*>(t.view().data);
  return std::vector<uint16_t>(p, p + size_t(h.T) * kH);
}

bool has_nan(const std::vector<uint16_t>& v) {
  for (uint16_t b : v)
    if ((b & 0x7fff) > 0x7f80) return true;
  return false;
}

double rel_l2(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = fmt::bf16_to_float(a[i]), y = fmt::bf16_to_float(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

ncclComm_t make_nccl(const NcclUniqueIdBytes& id, int rank, int world) {
  ncclUniqueId u;
  static_assert(sizeof(u) == sizeof(NcclUniqueIdBytes));
  std::memcpy(&u, id.data(), sizeof(u));
  ncclComm_t c = nullptr;
  const ncclResult_t r = ncclCommInitRank(&c, world, u, rank);
  REQUIRE(r == ncclSuccess, ncclGetErrorString(r));
  return c;
}

Bootstrap ep_boot(int rank, ncclComm_t comm, const NcclUniqueIdBytes* id) {
  Bootstrap b;
  b.world_size = kWorld;
  b.rank = rank;
  b.backend = Backend::kCUDA;
  b.device = rank;
  b.nccl_comm = comm;
  if (id) b.nccl_unique_id = *id;
  b.timeout_ms = 20000;
  b.warmup_timeout_ms = 60000;
  return b;
}

Bootstrap single_boot(int dev, Backend backend) {
  Bootstrap b;
  b.backend = backend;
  b.device = dev;
  return b;
}

// One call on every layer: EP output bitwise equal to the single-GPU CUDA layer, within
// docs/contract.md §7 of the CPU backend, no NaN. Returns rel L2 vs CPU (0 for T = 0).
double check_call(MegaLayer& ep, MegaLayer& one, MegaLayer& cpu, Inputs& h, int rank,
                  const std::string& what, std::optional<WorkspaceId> ws = std::nullopt,
                  std::optional<WorkspaceId> one_ws = std::nullopt,
                  std::optional<WorkspaceId> cpu_ws = std::nullopt) {
  DevInputs d(h, rank);
  ForwardInputs f = d.view();
  f.workspace = ws;
  const std::vector<uint16_t> y = run(ep, f, h.T, rank);
  ForwardInputs f1 = d.view();
  f1.workspace = one_ws;
  const std::vector<uint16_t> y1 = run(one, f1, h.T, rank);
  const std::vector<uint16_t> yc = run_cpu(cpu, h, cpu_ws);
  REQUIRE(!has_nan(y), what + ": NaN (or an unwritten poisoned element) in the EP output");
  size_t diff = 0;
  for (size_t i = 0; i < y.size(); ++i) diff += y[i] != y1[i];
  REQUIRE(diff == 0, what + ": " + std::to_string(diff) + " of " + std::to_string(y.size()) +
                         " elements differ from the single-GPU layer");
  const double rel = rel_l2(y, yc);
  REQUIRE(rel <= 5e-3, what + ": rel L2 vs CPU " + std::to_string(rel) + " > 5e-3");
  return rel;
}

// ---------------------------------------------------------------------------------------------

// The combine path of the CUDA backend (PlanOptions::combine, fixed per workspace at its
// creation; docs/protocol.md). The EpLayer tests run the default (fused); the EpLayerForced /
// EpLayerMixed tests choose it per rank.
enum class CombineCase { kFused, kCopy, kRank0Fused };
const char* combine_case_name(CombineCase m) {
  return m == CombineCase::kFused ? "Fused" : m == CombineCase::kCopy ? "Copy" : "Rank0Fused";
}
void PrintTo(CombineCase m, std::ostream* os) { *os << combine_case_name(m); }

// A rank's body with the combine path it runs.
using CombineBody = void (*)(int, int, const NcclUniqueIdBytes&, RankReport&, CombineMode);
RankBody in_mode(CombineCase m, CombineBody body) {
  return [m, body](int rank, int world, const NcclUniqueIdBytes& id, RankReport& rep) {
    const bool fused = m == CombineCase::kFused || (m == CombineCase::kRank0Fused && rank == 0);
    body(rank, world, id, rep, fused ? CombineMode::kFused : CombineMode::kCopy);
  };
}
RankBody fused(CombineBody body) { return in_mode(CombineCase::kFused, body); }

void every_recipe_body(int rank, int world, const NcclUniqueIdBytes& id, RankReport& rep,
                       CombineMode combine) {
  ncclComm_t comm = make_nccl(id, rank, world);
  for (Recipe r : kRecipes) {
    Options o = recipe_options(r);
    o.combine = combine;
    const PackedExperts p = make_pack(r, o, 11);
    const LayerConfig c = make_config(r, 64, o);
    MegaLayer ep(ep_boot(rank, comm, nullptr), c, p.view(rank * kEl, kEl),
                 p.epilogue_view(rank * kEl, kEl));
    MegaLayer one(single_boot(rank, Backend::kCUDA), c, p.view(), p.epilogue_view());
    MegaLayer cpu(single_boot(0, Backend::kCPU), c, p.view(), p.epilogue_view());
    ep.warmup();
    Inputs h = make_inputs(rank == 0 ? 64 : 37, rank, 100 + rank, Route::kUniform);
    rep.add(check_call(ep, one, cpu, h, rank, std::string(recipe_name(r)) + " T=64/37"));
    // The quantizers' special cases (edge_activations.h) through the EP source and unpack.
    Inputs he = make_inputs(rank == 0 ? 9 : 6, rank, 200 + rank, Route::kUniform);
    plant_edge_activations(he.x, he.T, kH, r);
    check_call(ep, one, cpu, he, rank, std::string(recipe_name(r)) + " edge activations");
    ep.destroy();
  }
  // Unfinalized outputs (nvfp4): rows / weights / indices equal to the single-GPU layer's.
  Options o = recipe_options(Recipe::kNvfp4);
  o.combine = combine;
  o.finalize = false;
  const PackedExperts p = make_pack(Recipe::kNvfp4, o, 11);
  const LayerConfig c = make_config(Recipe::kNvfp4, 64, o);
  MegaLayer ep(ep_boot(rank, comm, nullptr), c, p.view(rank * kEl, kEl),
               p.epilogue_view(rank * kEl, kEl));
  MegaLayer one(single_boot(rank, Backend::kCUDA), c, p.view(), p.epilogue_view());
  Inputs h = make_inputs(rank == 0 ? 20 : 45, rank, 300 + rank, Route::kUniform);
  DevInputs d(h, rank);
  UnfinalizedOutput a = ep.forward_unfinalized(d.view());
  UnfinalizedOutput b = one.forward_unfinalized(d.view());
  CK(cudaDeviceSynchronize());
  for (auto [x, y] : {std::pair{&a.rows, &b.rows}, std::pair{&a.weights, &b.weights},
                      std::pair{&a.indices, &b.indices}}) {
    const size_t n = x->view().nbytes();
    std::vector<uint8_t> hx(n), hy(n);
    CK(cudaMemcpy(hx.data(), x->view().data, n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hy.data(), y->view().data, n, cudaMemcpyDeviceToHost));
    REQUIRE(hx == hy, "unfinalized output differs from the single-GPU layer");
  }
  ep.destroy();
  ncclCommDestroy(comm);
}

TEST(EpLayer, EveryRecipeAgainstCpuAndSingleGpu) {
  SKIP_UNLESS_WORLD_GPUS();
  auto res = run_ranks(kWorld, 600, fused(every_recipe_body));
  expect_ranks_passed(res);
  for (int r = 0; r < kWorld; ++r) {
    std::printf("rank %d rel L2 vs CPU per recipe:", r);
    for (int i = 0; i < res.rep[r].nval; ++i) std::printf(" %.2e", res.rep[r].val[i]);
    std::printf("\n");
  }
}

// Token counts over one layer (unique-id bootstrap): T = 0 on one rank and on both, unequal,
// shrinking then growing, all slots -1, all tokens to the other rank; then a second workspace
// chosen by select_workspace_collective.
void token_counts_body(int rank, int world, const NcclUniqueIdBytes& id, RankReport& rep,
                       CombineMode combine) {
  const Recipe r = Recipe::kNvfp4;
  Options o = recipe_options(r);
  o.combine = combine;
  const PackedExperts p = make_pack(r, o, 23);
  const LayerConfig c = make_config(r, 128, o);
  MegaLayer ep(ep_boot(rank, nullptr, &id), c, p.view(rank * kEl, kEl),
               p.epilogue_view(rank * kEl, kEl));
  MegaLayer one(single_boot(rank, Backend::kCUDA), c, p.view(), p.epilogue_view());
  MegaLayer cpu(single_boot(0, Backend::kCPU), c, p.view(), p.epilogue_view());
  struct Step {
    int t0, t1;
    Route route;
    const char* what;
  };
  const Step steps[] = {
      {0, 9, Route::kUniform, "T=0 on rank 0"},  {9, 0, Route::kUniform, "T=0 on rank 1"},
      {0, 0, Route::kUniform, "T=0 on both"},    {128, 5, Route::kUniform, "unequal"},
      {128, 128, Route::kUniform, "full"},       {17, 2, Route::kUniform, "shrinking"},
      {1, 1, Route::kUniform, "one token each"}, {100, 128, Route::kUniform, "growing"},
      {64, 100, Route::kNone, "all slots -1"},   {50, 70, Route::kOther, "all to the other rank"},
      {3, 128, Route::kOther, "other, unequal"}};
  int i = 0;
  for (const Step& s : steps) {
    Inputs h = make_inputs(rank == 0 ? s.t0 : s.t1, rank, 500 + 10 * i++ + rank, s.route);
    rep.add(check_call(ep, one, cpu, h, rank, s.what));
    if (s.route == Route::kNone) {
      DevInputs d(h, rank);
      const std::vector<uint16_t> y = run(ep, d.view(), h.T, rank);
      for (uint16_t v : y) REQUIRE(v == 0, "all slots -1 must give zeros");
    }
  }
  const WorkspaceId small = ep.create_workspace(8);
  const int T = rank == 0 ? 3 : 8;
  const WorkspaceId sel = ep.select_workspace_collective(T);
  REQUIRE(sel == small, "select_workspace_collective picked workspace " +
                            std::to_string(sel.index) + ", expected " +
                            std::to_string(small.index));
  Inputs h = make_inputs(T, rank, 900 + rank, Route::kUniform);
  rep.add(check_call(ep, one, cpu, h, rank, "second workspace", sel));
  // The default workspace still works after the small one was used.
  Inputs h2 = make_inputs(rank == 0 ? 77 : 12, rank, 950 + rank, Route::kUniform);
  rep.add(check_call(ep, one, cpu, h2, rank, "back to the default workspace"));
  // A workspace of capacity 4 (a decode profile: W * 4 virtual tokens on the owner).
  const WorkspaceId tiny = ep.create_workspace(4);
  const Step tiny_steps[] = {{1, 1, Route::kUniform, "capacity 4, one token each"},
                             {4, 2, Route::kUniform, "capacity 4, unequal"},
                             {0, 3, Route::kUniform, "capacity 4, T=0 on rank 0"},
                             {4, 4, Route::kUniform, "capacity 4, full"},
                             {2, 3, Route::kOther, "capacity 4, all to the other rank"}};
  // Each step of `list` on workspace ws of the EP layer (and one_ws / cpu_ws of the others).
  auto run_steps = [&](const auto& list, uint64_t seed, WorkspaceId ws,
                       std::optional<WorkspaceId> one_ws = std::nullopt,
                       std::optional<WorkspaceId> cpu_ws = std::nullopt) {
    for (const Step& s : list) {
      Inputs h = make_inputs(rank == 0 ? s.t0 : s.t1, rank, seed + 10 * i++ + rank, s.route);
      rep.add(check_call(ep, one, cpu, h, rank, s.what, ws, one_ws, cpu_ws));
    }
  };
  run_steps(tiny_steps, 800, tiny);
  // A workspace of capacity 512. From 256 tokens per rank on, the owner's prepare routes over
  // many blocks (route_spread); with fewer than 2048 pairs on the device one block routes again
  // (rank 1's T = 0). Repeated calls check that the spread route leaves its counters at zero.
  const WorkspaceId wide = ep.create_workspace(512);
  const WorkspaceId one_wide = one.create_workspace(512), cpu_wide = cpu.create_workspace(512);
  const Step wide_steps[] = {{512, 300, Route::kUniform, "capacity 512, unequal"},
                             {512, 512, Route::kUniform, "capacity 512, full"},
                             {300, 0, Route::kUniform, "capacity 512, T=0 on rank 1"},
                             {400, 512, Route::kOther, "capacity 512, all to the other rank"},
                             {512, 512, Route::kUniform, "capacity 512, full again"}};
  run_steps(wide_steps, 1100, wide, one_wide, cpu_wide);
  // A workspace created with the other combine path (the mode is per workspace) holds the y
  // buffer [W*cap*K][H] bf16 exactly when it is unfused; the fused one holds a row pointer per
  // pair instead. Both serve calls on the same layer, bit for bit.
  const bool fused = combine != CombineMode::kCopy;
  PlanOptions other_path = c.plan_options;
  other_path.combine = fused ? CombineMode::kCopy : CombineMode::kFused;
  ep.set_plan_options(other_path);
  const WorkspaceId other = ep.create_workspace(8);
  ep.set_plan_options(c.plan_options);
  auto al = [](size_t v) { return (v + 255) / 256 * 256; };
  const size_t pairs = size_t(kWorld) * 8 * kK;
  const size_t y_bytes = al(pairs * kH * 2), ptr_bytes = al(pairs * sizeof(void*));
  const size_t b_small = ep.workspace_bytes(small), b_other = ep.workspace_bytes(other);
  const size_t b_fused = fused ? b_small : b_other, b_unfused = fused ? b_other : b_small;
  REQUIRE(b_unfused - b_fused == y_bytes - ptr_bytes,
          "unfused workspace " + std::to_string(b_unfused) + " bytes, fused " +
              std::to_string(b_fused) + ": expected the y buffer (" + std::to_string(y_bytes) +
              ") minus the row pointers (" + std::to_string(ptr_bytes) + ") between them");
  Inputs h3 = make_inputs(rank == 0 ? 8 : 5, rank, 970 + rank, Route::kUniform);
  rep.add(check_call(ep, one, cpu, h3, rank, "workspace of the other combine path", other));
  ep.destroy();
}

TEST(EpLayer, TokenCountsRoutingAndWorkspaces) {
  SKIP_UNLESS_WORLD_GPUS();
  auto res = run_ranks(kWorld, 600, fused(token_counts_body));
  expect_ranks_passed(res);
}

// A CUDA graph captured at T = 64 replays with device-side token counts (different per rank).
void graph_replay_body(int rank, int world, const NcclUniqueIdBytes& id, RankReport& rep,
                       CombineMode combine) {
  ncclComm_t comm = make_nccl(id, rank, world);
  const Recipe r = Recipe::kMxfp4Mxfp8;
  Options o = recipe_options(r);
  o.combine = combine;
  const PackedExperts p = make_pack(r, o, 31);
  const LayerConfig c = make_config(r, 64, o);
  MegaLayer ep(ep_boot(rank, comm, nullptr), c, p.view(rank * kEl, kEl),
               p.epilogue_view(rank * kEl, kEl));
  MegaLayer one(single_boot(rank, Backend::kCUDA), c, p.view(), p.epilogue_view());
  ep.warmup();
  Inputs h = make_inputs(64, rank, 40 + rank, Route::kUniform);
  DevInputs d(h, rank);
  const std::vector<uint16_t> full = run(one, d.view(), 64, rank);
  DevBuf count(4), out(size_t(64) * kH * 2);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ForwardInputs f = d.view();
  f.stream = s;
  f.num_tokens = static_cast<const int32_t*>(count.p);
  const TensorView ov =
      TensorView::contiguous(out.p, DType::kBF16, {64, kH}, Device{DeviceKind::kCUDA, rank});
  ep.forward(f, ov);  // eager once (loads modules), then capture
  CK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  ep.forward(f, ov);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  const int counts[] = {64, 10, 0, 33, 1, 64};
  for (int i = 0; i < 6; ++i) {
    const int n = counts[(i + rank) % 6];
    CK(cudaMemcpy(count.p, &n, 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(out.p, 0xff, out.bytes));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    std::vector<uint16_t> y(size_t(64) * kH);
    CK(cudaMemcpy(y.data(), out.p, y.size() * 2, cudaMemcpyDeviceToHost));
    for (size_t e = 0; e < y.size(); ++e) {
      const bool valid = int(e / kH) < n;
      REQUIRE(y[e] == (valid ? full[e] : 0),
              "replay " + std::to_string(i) + " with n = " + std::to_string(n) + ": element " +
                  std::to_string(e) + " is " + std::to_string(y[e]) + ", expected " +
                  std::to_string(valid ? full[e] : 0));
    }
  }
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  ep.destroy();
  CK(cudaStreamDestroy(s));
  ncclCommDestroy(comm);
}

TEST(EpLayer, GraphReplayWithVaryingTokenCounts) {
  SKIP_UNLESS_WORLD_GPUS();
  auto res = run_ranks(kWorld, 600, fused(graph_replay_body));
  expect_ranks_passed(res);
}

// The same checks with the combine path forced in every rank: fc2 storing straight into the
// sources' combine areas (Fused) or the copying combine kernel (Copy:
// fc2 writes the local y buffer and ep_combine_kernel moves the rows). Every recipe and the
// unfinalized output (wgmma tile 128), every token-count case (decode tile 8, mma.sync tile 16,
// wgmma; T = 0 on one and both ranks) and a graph replay with device-side counts.
class EpLayerForced : public ::testing::TestWithParam<CombineCase> {};

TEST_P(EpLayerForced, EveryRecipeAgainstCpuAndSingleGpu) {
  SKIP_UNLESS_WORLD_GPUS();
  expect_ranks_passed(run_ranks(kWorld, 600, in_mode(GetParam(), every_recipe_body)));
}

TEST_P(EpLayerForced, TokenCountsRoutingAndWorkspaces) {
  SKIP_UNLESS_WORLD_GPUS();
  expect_ranks_passed(run_ranks(kWorld, 600, in_mode(GetParam(), token_counts_body)));
}

TEST_P(EpLayerForced, GraphReplayWithVaryingTokenCounts) {
  SKIP_UNLESS_WORLD_GPUS();
  expect_ranks_passed(run_ranks(kWorld, 600, in_mode(GetParam(), graph_replay_body)));
}

INSTANTIATE_TEST_SUITE_P(Combine, EpLayerForced,
                         ::testing::Values(CombineCase::kFused, CombineCase::kCopy),
                         [](const ::testing::TestParamInfo<CombineCase>& i) {
                           return std::string(combine_case_name(i.param));
                         });

// Rank 0 fused, rank 1 unfused: both paths store the same rows into the same combine rows and
// publish the same epoch, so the ranks interoperate (and each path's rows are checked against
// the other's signal).
TEST(EpLayerMixed, TokenCountsRoutingAndWorkspaces) {
  SKIP_UNLESS_WORLD_GPUS();
  expect_ranks_passed(run_ranks(kWorld, 600, in_mode(CombineCase::kRank0Fused, token_counts_body)));
}

// EPLB across ranks: local expert 1 of rank 0 (global 1) and local expert 2 of rank 1 (global
// El + 2; local 1 where a rank holds 2) trade places through kernel_weights() /
// expert_weight_views(), the bytes moved with ncclSend / ncclRecv on the caller's communicator;
// remapped ids give bitwise the same output on every rank (ranks past 1 only run the forwards).
TEST(EpLayer, EplbSwapAcrossRanks) {
  SKIP_UNLESS_WORLD_GPUS();
  auto res =
      run_ranks(kWorld, 600, [](int rank, int world, const NcclUniqueIdBytes& id, RankReport&) {
        ncclComm_t comm = make_nccl(id, rank, world);
        for (Recipe r : {Recipe::kNvfp4, Recipe::kBf16}) {
          const Options o = recipe_options(r);
          const PackedExperts p = make_pack(r, o, 47);
          const LayerConfig c = make_config(r, 64, o);
          MegaLayer ep(ep_boot(rank, comm, nullptr), c, p.view(rank * kEl, kEl),
                       p.epilogue_view(rank * kEl, kEl));
          Inputs h = make_inputs(rank == 0 ? 48 : 31, rank, 70 + rank, Route::kUniform);
          const std::vector<uint16_t> before = run(ep, DevInputs(h, rank).view(), h.T, rank);
          const int lb = std::min(2, kEl - 1);  // rank 1's local expert
          const int mine = rank == 0 ? 1 : lb, peer = 1 - rank;
          const int ga = 1, gb = kEl + lb;
          ExpertWeightViews v = ep.expert_weight_views();
          cudaStream_t s;
          CK(cudaStreamCreate(&s));
          for (const TensorView* t :
               {&v.weights.fc1_weight, &v.weights.fc1_scale, &v.weights.fc2_weight,
                &v.weights.fc2_scale, &v.fc1_alpha, &v.fc2_alpha, &v.fc1_norm_const}) {
            if (!t->defined() || rank > 1) continue;
            const size_t row = size_t(t->nbytes() / t->shape[0]);
            uint8_t* base = static_cast<uint8_t*>(t->data) + size_t(mine) * row;
            DevBuf tmp(row);
            REQUIRE(ncclGroupStart() == ncclSuccess, "ncclGroupStart");
            REQUIRE(ncclSend(base, row, ncclUint8, peer, comm, s) == ncclSuccess, "ncclSend");
            REQUIRE(ncclRecv(tmp.p, row, ncclUint8, peer, comm, s) == ncclSuccess, "ncclRecv");
            REQUIRE(ncclGroupEnd() == ncclSuccess, "ncclGroupEnd");
            CK(cudaMemcpyAsync(base, tmp.p, row, cudaMemcpyDeviceToDevice, s));
            CK(cudaStreamSynchronize(s));
          }
          CK(cudaStreamDestroy(s));
          for (auto& e : h.ids) e = e == ga ? gb : (e == gb ? ga : e);
          const std::vector<uint16_t> after = run(ep, DevInputs(h, rank).view(), h.T, rank);
          REQUIRE(!has_nan(after), "NaN after the swap");
          REQUIRE(before == after,
                  std::string(recipe_name(r)) +
                      ": a cross-rank expert swap with remapped ids changed the output");
          ep.destroy();
        }
        ncclCommDestroy(comm);
      });
  expect_ranks_passed(res);
}

// Rank 1 skips a call: the next host call of every other rank throws kPeer naming rank 1 and
// the dispatch stage, within the forward timeout; nobody hangs.
TEST(EpLayer, SkippedCallIsReportedWithinTheTimeout) {
  SKIP_UNLESS_WORLD_GPUS();
  constexpr int64_t kTimeoutMs = 1500;
  auto res =
      run_ranks(kWorld, 180, [](int rank, int, const NcclUniqueIdBytes& id, RankReport& rep) {
        const Recipe r = Recipe::kNvfp4;
        const Options o = recipe_options(r);
        const PackedExperts p = make_pack(r, o, 5);
        const LayerConfig c = make_config(r, 32, o);
        Bootstrap b = ep_boot(rank, nullptr, &id);
        b.timeout_ms = kTimeoutMs;
        b.warmup_timeout_ms = 10000;
        MegaLayer ep(b, c, p.view(rank * kEl, kEl), p.epilogue_view(rank * kEl, kEl));
        ep.warmup();
        Inputs h = make_inputs(16, rank, 3 + rank, Route::kUniform);
        DevInputs d(h, rank);
        run(ep, d.view(), h.T, rank);  // one good call
        if (rank != 1) {
          const auto t0 = std::chrono::steady_clock::now();
          run(ep, d.view(), h.T, rank);  // rank 1 never joins this one
          std::string msg;
          ErrorCode code = ErrorCode::kBackend;
          try {
            run(ep, d.view(), h.T, rank);
          } catch (const Error& e) {
            msg = e.what();
            code = e.code();
          }
          const double waited =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          rep.add(waited);
          REQUIRE(code == ErrorCode::kPeer, "expected a kPeer error, got '" + msg + "'");
          REQUIRE(msg.find("peer rank 1") != std::string::npos &&
                      msg.find("dispatch") != std::string::npos,
                  "the error must name rank 1 and the dispatch stage: " + msg);
          REQUIRE(waited >= kTimeoutMs * 1e-3 * 0.9 && waited < kTimeoutMs * 1e-3 + 10.0,
                  "error after " + std::to_string(waited) + " s");
          std::printf("rank %d error after %.2f s: %s\n", rank, waited, msg.c_str());
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(3 * kTimeoutMs));
        }
        try {
          ep.destroy();
        } catch (const Error&) {
          // Tearing down after a fault may report it again; it must not hang.
        }
      });
  expect_ranks_passed(res);
}

// Rank 1 passes a bad shape: it throws kInvalidArgument at once and tells its peer, whose call
// of that round completes within a small fraction of the 20 s timeout; rank 0's next host call
// throws kPeer naming rank 1 as having abandoned the call (and the stage it was waiting at).
// The transport is then unusable on both ranks (kPeer), and both tear down without hanging.
TEST(EpLayer, RejectedCallReleasesPeersAtOnce) {
  SKIP_UNLESS_WORLD_GPUS();
  constexpr int64_t kTimeoutMs = 20000;
  auto res =
      run_ranks(kWorld, 180, [](int rank, int, const NcclUniqueIdBytes& id, RankReport& rep) {
        const Recipe r = Recipe::kNvfp4;
        const Options o = recipe_options(r);
        const PackedExperts p = make_pack(r, o, 5);
        const LayerConfig c = make_config(r, 32, o);
        Bootstrap b = ep_boot(rank, nullptr, &id);
        b.timeout_ms = kTimeoutMs;
        b.warmup_timeout_ms = 30000;
        MegaLayer ep(b, c, p.view(rank * kEl, kEl), p.epilogue_view(rank * kEl, kEl));
        ep.warmup();
        Inputs h = make_inputs(16, rank, 3 + rank, Route::kUniform);
        DevInputs d(h, rank);
        run(ep, d.view(), h.T, rank);  // one good call on both ranks
        auto call = [&](const ForwardInputs& f, std::string* msg) {
          try {
            run(ep, f, h.T, rank);
          } catch (const Error& e) {
            *msg = e.what();
            return e.code();
          }
          *msg = "(no error)";
          return ErrorCode::kBackend;
        };
        std::string msg;
        if (rank == 1) {
          ForwardInputs bad = d.view();
          bad.hidden_states = TensorView::contiguous(d.x.p, DType::kBF16, {h.T, kH - 8},
                                                     Device{DeviceKind::kCUDA, rank});
          const ErrorCode code = call(bad, &msg);
          REQUIRE(code == ErrorCode::kInvalidArgument,
                  "the bad shape must be rejected with kInvalidArgument: " + msg);
          // The rank that gave up cannot rejoin: the epochs no longer agree.
          const ErrorCode next = call(d.view(), &msg);
          REQUIRE(next == ErrorCode::kPeer && msg.find("abandoned") != std::string::npos,
                  "rank 1's next call must report the abandoned transport: " + msg);
          std::printf("rank 1 after abandoning: %s\n", msg.c_str());
        } else {
          const auto t0 = std::chrono::steady_clock::now();
          const ErrorCode first = call(d.view(), &msg);  // rank 1 rejects this round
          const double first_s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          REQUIRE(first == ErrorCode::kBackend || first == ErrorCode::kPeer,
                  "the abandoned round itself: " + msg);
          ErrorCode code = first;
          if (first != ErrorCode::kPeer) code = call(d.view(), &msg);
          const double waited =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          rep.add(first_s);
          rep.add(waited);
          REQUIRE(code == ErrorCode::kPeer, "expected a kPeer error, got '" + msg + "'");
          REQUIRE(msg.find("peer rank 1") != std::string::npos &&
                      msg.find("abandoned") != std::string::npos &&
                      msg.find("dispatch") != std::string::npos,
                  "the error must name rank 1, the abandon and the dispatch stage: " + msg);
          REQUIRE(waited < 2.0, "rank 0 learned of the abandon after " + std::to_string(waited) +
                                    " s; the forward timeout is " +
                                    std::to_string(kTimeoutMs / 1000) + " s");
          std::printf("rank 0: abandoned round done after %.4f s, error after %.4f s: %s\n",
                      first_s, waited, msg.c_str());
          // Sticky: a later call reports it again at once.
          REQUIRE(call(d.view(), &msg) == ErrorCode::kPeer, "the error must stay: " + msg);
        }
        try {
          ep.destroy();
        } catch (const Error&) {
          // Teardown after a fault may report it again; it must not hang.
        }
      });
  expect_ranks_passed(res);
  if (!res.hung && res.rep[0].nval >= 2)
    EXPECT_LT(res.rep[0].val[1], 2.0) << "rank 0 waited " << res.rep[0].val[1] << " s";
}

// docs/contract.md §4: every rank runs a call with the same workspace. Rank 1 runs a call with its
// small workspace while the others use the default one: each rank's dispatch wait sees a peer's
// announce of that call naming the other workspace (docs/protocol.md §3), records the sticky
// error at once instead of waiting for the 20 s timeout, and the next host call of both ranks
// throws kPeer naming the peer, both workspaces and the stage. As after any peer error (§6) the
// transport stays unusable (the next correct call throws the same), destroy() still meets the
// peer and reports it, and a call after destroy() throws kDestroyed. Before the fault, calls on
// the small workspace must equal the single-GPU layer bit for bit.
TEST(EpLayer, RanksWithDifferentWorkspacesAllFailNamingBoth) {
  SKIP_UNLESS_WORLD_GPUS();
  constexpr int64_t kTimeoutMs = 20000;
  auto res =
      run_ranks(kWorld, 180, [](int rank, int, const NcclUniqueIdBytes& id, RankReport& rep) {
        const Recipe r = Recipe::kNvfp4;
        const Options o = recipe_options(r);
        const PackedExperts p = make_pack(r, o, 7);
        const LayerConfig c = make_config(r, 32, o);
        Bootstrap b = ep_boot(rank, nullptr, &id);
        b.timeout_ms = kTimeoutMs;
        b.warmup_timeout_ms = 30000;
        MegaLayer ep(b, c, p.view(rank * kEl, kEl), p.epilogue_view(rank * kEl, kEl));
        MegaLayer one(single_boot(rank, Backend::kCUDA), c, p.view(), p.epilogue_view());
        const WorkspaceId small = ep.create_workspace(8);  // workspace 1
        ep.warmup(small);
        for (int T : {1, 3, 8, 0, 5}) {
          Inputs h = make_inputs(rank == 0 ? T : 8 - T, rank, 40 + 2 * T + rank, Route::kUniform);
          DevInputs d(h, rank);
          ForwardInputs f = d.view();
          f.workspace = small;
          const std::vector<uint16_t> y = run(ep, f, h.T, rank);
          const std::vector<uint16_t> y1 = run(one, d.view(), h.T, rank);
          REQUIRE(!has_nan(y), "small workspace, T " + std::to_string(h.T) + ": NaN");
          REQUIRE(y == y1, "small workspace, T " + std::to_string(h.T) +
                               ": differs from the single-GPU layer");
        }
        Inputs h = make_inputs(6, rank, 60 + rank, Route::kUniform);
        DevInputs d(h, rank);
        run(ep, d.view(), h.T, rank);  // one good call on the default workspace, both ranks
        auto call = [&](const ForwardInputs& f, std::string* msg) {
          try {
            run(ep, f, h.T, rank);
          } catch (const Error& e) {
            *msg = e.what();
            return e.code();
          }
          *msg = "(no error)";
          return ErrorCode::kBackend;
        };
        ForwardInputs mismatched = d.view();
        if (rank == 1) mismatched.workspace = small;  // the other ranks keep workspace 0
        std::string msg;
        const auto t0 = std::chrono::steady_clock::now();
        const ErrorCode first = call(mismatched, &msg);  // no host sync: returns, then the error
        const double first_s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        REQUIRE(first == ErrorCode::kBackend || first == ErrorCode::kPeer,
                "the mismatched call itself: " + msg);
        ErrorCode code = first;
        if (first != ErrorCode::kPeer) code = call(d.view(), &msg);  // the next correct call
        const double waited =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        rep.add(first_s);
        rep.add(waited);
        // Rank 1 (workspace 1) names a peer that ran workspace 0, every other rank names rank 1.
        const int mine = rank == 1 ? 1 : 0;
        const size_t at = msg.find("peer rank ");
        const int named = at == std::string::npos ? -1 : std::atoi(msg.c_str() + at + 10);
        REQUIRE(code == ErrorCode::kPeer, "expected a kPeer error, got '" + msg + "'");
        REQUIRE(
            (rank == 1 ? named >= 0 && named != 1 : named == 1) &&
                msg.find("workspace " + std::to_string(1 - mine)) != std::string::npos &&
                msg.find("this rank with workspace " + std::to_string(mine)) != std::string::npos &&
                msg.find("'dispatch'") != std::string::npos &&
                msg.find("capacities: workspace " + std::to_string(mine)) != std::string::npos,
            "the error must name the peer, both workspaces and the stage: " + msg);
        REQUIRE(waited < 2.0, "the mismatch was reported after " + std::to_string(waited) +
                                  " s; the forward timeout is " +
                                  std::to_string(kTimeoutMs / 1000) + " s");
        std::printf("rank %d: mismatched round done after %.4f s, error after %.4f s: %s\n", rank,
                    first_s, waited, msg.c_str());
        // Sticky: the next correct call (same workspace on both ranks) reports it again.
        std::string again;
        REQUIRE(call(d.view(), &again) == ErrorCode::kPeer, "the error must stay: " + again);
        ErrorCode at_destroy = ErrorCode::kBackend;
        try {
          ep.destroy();  // collective: meets the peer's destroy, frees the windows
          at_destroy = ErrorCode::kState;
        } catch (const Error& e) {
          at_destroy = e.code();
        }
        REQUIRE(at_destroy == ErrorCode::kPeer, "destroy() must report the peer error");
        REQUIRE(call(d.view(), &again) == ErrorCode::kDestroyed,
                "a call after destroy(): " + again);
      });
  expect_ranks_passed(res);
  for (int r = 0; r < kWorld && !res.hung; ++r)
    if (res.rep[r].nval >= 2) EXPECT_LT(res.rep[r].val[1], 2.0) << "rank " << r;
}

// Layers of one EP group (include/moe_ep/group.h) share the group's communicator and its pooled
// symmetric windows across the ranks: three layers (two nvfp4 with different weights, then an
// mxfp4_bf16 one whose larger activation rows make the pool re-make its window larger at its
// construction), called interleaved with unequal T, are bitwise equal to the single-GPU layers
// of the same weights; the pool holds one workspace set; a CUDA graph of two grouped layers in
// sequence replays bitwise; destroying a middle layer leaves the others working.
TEST(EpGroup, LayersShareWindowsAcrossRanks) {
  SKIP_UNLESS_WORLD_GPUS();
  auto res = run_ranks(kWorld, 600, [](int rank, int, const NcclUniqueIdBytes& id, RankReport&) {
    const Recipe recipes[] = {Recipe::kNvfp4, Recipe::kNvfp4, Recipe::kMxfp4Bf16};
    auto group = EpGroup::create(ep_boot(rank, nullptr, &id));
    std::vector<std::unique_ptr<MegaLayer>> ep, one;
    size_t largest = 0, sum = 0;
    for (int i = 0; i < 3; ++i) {
      const Options o = recipe_options(recipes[i]);
      const PackedExperts p = make_pack(recipes[i], o, 300 + i);
      const LayerConfig c = make_config(recipes[i], 64, o);
      ep.push_back(std::make_unique<MegaLayer>(group, c, p.view(rank * kEl, kEl),
                                               p.epilogue_view(rank * kEl, kEl)));
      one.push_back(std::make_unique<MegaLayer>(single_boot(rank, Backend::kCUDA), c, p.view(),
                                                p.epilogue_view()));
      const size_t b = ep.back()->workspace_bytes(ep.back()->default_workspace());
      largest = std::max(largest, b);
      sum += b;
    }
    REQUIRE(group->num_pooled_workspaces() == 1, "one pooled workspace");
    REQUIRE(group->pool_bytes() >= largest && group->pool_bytes() < sum,
            "pool " + std::to_string(group->pool_bytes()) + " bytes, largest layer " +
                std::to_string(largest) + ", all layers " + std::to_string(sum));
    for (auto& l : ep) l->warmup();
    const int order[] = {0, 2, 1, 1, 0, 2};
    for (int c = 0; c < 6; ++c) {
      const int i = order[c];
      const int T = rank == 0 ? 64 - 9 * c : 5 * c;
      Inputs h = make_inputs(T, rank, 400 + 10 * c + rank, Route::kUniform);
      DevInputs d(h, rank);
      const std::vector<uint16_t> y = run(*ep[i], d.view(), h.T, rank);
      const std::vector<uint16_t> y1 = run(*one[i], d.view(), h.T, rank);
      REQUIRE(!has_nan(y) && y == y1, "call " + std::to_string(c) + " (layer " + std::to_string(i) +
                                          ", T " + std::to_string(T) +
                                          "): differs from the single-GPU layer");
    }
    // A graph of layers 0 then 2 (layer 0's output is layer 2's input), replayed twice.
    {
      const int T = rank == 0 ? 40 : 17;
      Inputs h = make_inputs(T, rank, 500 + rank, Route::kUniform);
      DevInputs d(h, rank);
      const Device dev{DeviceKind::kCUDA, rank};
      DevBuf o0(size_t(T) * kH * 2), o2(size_t(T) * kH * 2), e0(size_t(T) * kH * 2);
      cudaStream_t s;
      CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      ForwardInputs f0 = d.view(), f2 = d.view();
      f0.stream = f2.stream = s;
      f2.hidden_states = TensorView::contiguous(o0.p, DType::kBF16, {T, kH}, dev);
      cudaGraph_t g = nullptr;
      cudaGraphExec_t ex = nullptr;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      ep[0]->forward(f0, TensorView::contiguous(o0.p, DType::kBF16, {T, kH}, dev));
      ep[2]->forward(f2, TensorView::contiguous(o2.p, DType::kBF16, {T, kH}, dev));
      CK(cudaStreamEndCapture(s, &g));
      CK(cudaGraphInstantiate(&ex, g, 0));
      one[0]->forward(d.view(), TensorView::contiguous(e0.p, DType::kBF16, {T, kH}, dev));
      ForwardInputs fe = d.view();
      fe.hidden_states = TensorView::contiguous(e0.p, DType::kBF16, {T, kH}, dev);
      const std::vector<uint16_t> want = run(*one[2], fe, T, rank);
      for (int replay = 0; replay < 2; ++replay) {
        CK(cudaMemset(o2.p, 0xff, o2.bytes));
        CK(cudaGraphLaunch(ex, s));
        CK(cudaStreamSynchronize(s));
        std::vector<uint16_t> got(size_t(T) * kH);
        CK(cudaMemcpy(got.data(), o2.p, got.size() * 2, cudaMemcpyDeviceToHost));
        REQUIRE(got == want, "graph replay " + std::to_string(replay) +
                                 " of layers 0 and 2 differs from the single-GPU layers");
      }
      cudaGraphExecDestroy(ex);
      cudaGraphDestroy(g);
      cudaStreamDestroy(s);
    }
    ep[1]->destroy();  // collective; the pool stays with layers 0 and 2
    Inputs h = make_inputs(rank == 0 ? 3 : 64, rank, 600 + rank, Route::kUniform);
    DevInputs d(h, rank);
    REQUIRE(run(*ep[2], d.view(), h.T, rank) == run(*one[2], d.view(), h.T, rank),
            "layer 2 after layer 1 was destroyed");
    ep.clear();
    REQUIRE(group->pool_bytes() == 0, "the last layer freed the pool");
    group->destroy();
  });
  expect_ranks_passed(res);
}

}  // namespace
}  // namespace moe_ep::mgtest
