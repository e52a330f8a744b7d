// Benchmark of the layer as docs/benchmarks.md describes: DeepSeek-V3 shape by default, every
// recipe, tokens 1..4096, uniform and Zipf routing. `--ep N` runs EP over N GPUs (one forked
// process per GPU, NCCL unique id through a shared mapping, each rank holds E/N experts, a
// workspace sized to each token count; Zipf with one expert order for every rank); the record is
// the slowest rank's median, weight bytes per rank. Random checkpoint-layout weights are made on
// the GPU (valid, non-zero scale bytes) and go through the layer's own preprocessing. Each case:
// warm-up, then
// >= 20 CUDA-graph replays timed with events, alternating 2 input sets; per-stage times from eager
// forwards with the stage-event hook. One JSON record per case.
// Every record names the launch plan its forwards ran (MegaLayer::last_plan); --explain prints
// it per case. MOE_EP_COMMIT names the tree's commit in the records. --gpt-oss-experts gives the
// layer gpt-oss's expert semantics (clamp 7, activation slope 1.702 and offset 1, expert biases),
// single GPU; the records' plans then say epilogue=extended. --tile N forces the plan's tile
// (PlanOptions::tile_n), --route-spread 0|1 the route over one block or many
// (PlanOptions::route_spread), --m64-split 0|1 the narrow m64 kernel for the narrow tiles of 160
// (PlanOptions::m64_split).
//   bench_layer [--json PATH] [--shape dsv3|qwen3|gpt-oss] [--recipes a,b] [--tokens 1,8,...]
//               [--iters N] [--experts E] [--routing uniform|zipf|both] [--ep N] [--fp8-mma]
//               [--explain] [--gpt-oss-experts] [--tile N] [--route-spread 0|1]
//               [--m64-split 0|1]
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.cuh"
#include "cuda_check.h"
#include "layer/diagnostics.h"
#include "moe_ep/formats.h"
#include "moe_ep/layer.h"

using namespace moe_ep;
using namespace moe_ep::bench;

namespace {

constexpr double kHbmTBps = 4.22, kBf16Tflops = 755.0, kFp8Tflops = 1352.0,
                 kNvlinkGBps = 367.0;  // docs/benchmarks.md

struct Shape {
  std::string name;
  int H, I, E, K;
};

uint64_t mix_host(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Top-k ids without repeats: uniform, or Zipf(1) over a shuffled expert order (shuffled by
// perm_seed, the draws by seed).
std::vector<int32_t> make_ids(int T, int K, int E, bool zipf, uint64_t seed, uint64_t perm_seed) {
  std::vector<double> cdf(E);
  std::vector<int> perm(E);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = E - 1; i > 0; --i) std::swap(perm[i], perm[mix_host(perm_seed + i) % (i + 1)]);
  double acc = 0;
  for (int i = 0; i < E; ++i) cdf[i] = (acc += zipf ? 1.0 / (i + 1) : 1.0);
  std::vector<int32_t> ids(size_t(T) * K);
  uint64_t r = seed * 1000003;
  for (int t = 0; t < T; ++t) {
    for (int k = 0; k < K; ++k) {
      int e;
      bool dup;
      do {
        r = mix_host(r);
        const double u = double(r >> 11) / 9007199254740992.0 * acc;
        const int i = int(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
        e = perm[std::min(i, E - 1)];
        dup = false;
        for (int j = 0; j < k; ++j) dup |= ids[size_t(t) * K + j] == e;
      } while (dup);
      ids[size_t(t) * K + k] = e;
    }
  }
  return ids;
}
std::vector<int32_t> make_ids(int T, int K, int E, bool zipf, uint64_t seed) {
  return make_ids(T, K, E, zipf, seed, seed);
}

// The ids of input set k of `rank` at EP: uniform as before Zipf was added (seeds 1000 T +
// 10 rank + k); Zipf with one expert order for every rank (the popular experts of a model are
// popular on every rank), each rank drawing its own tokens.
std::vector<int32_t> ep_ids(int T, int K, int E, bool zipf, int rank, int k) {
  const uint64_t seed = 1000ull * T + 10ull * rank + k;
  return zipf ? make_ids(T, K, E, true, seed + 5, 1000ull * T + 7) : make_ids(T, K, E, false, seed);
}

// One input set on the device: host_ids (set first), weights 0.1 + 0.01 (i % 13) and random
// bf16 activations from x_seed.
struct InputSet {
  void *x = nullptr, *ids = nullptr, *w = nullptr;
  std::vector<int32_t> host_ids;

  void upload(int T, const Shape& s, uint64_t x_seed) {
    std::vector<float> wt(size_t(T) * s.K);
    for (size_t i = 0; i < wt.size(); ++i) wt[i] = 0.1f + 0.01f * float(i % 13);
    CK(cudaMalloc(&x, std::max<size_t>(16, size_t(T) * s.H * 2)));
    CK(cudaMalloc(&ids, std::max<size_t>(16, wt.size() * 4)));
    CK(cudaMalloc(&w, std::max<size_t>(16, wt.size() * 4)));
    fill(x, size_t(T) * s.H * 2, x_seed, 4);
    CK(cudaMemcpy(ids, host_ids.data(), wt.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w, wt.data(), wt.size() * 4, cudaMemcpyHostToDevice));
  }
  void release() {
    cudaFree(x);
    cudaFree(ids);
    cudaFree(w);
  }
  // The forward's inputs for T tokens on `st` (the default workspace unless one is set after).
  ForwardInputs inputs(int T, const Shape& s, Device gpu, cudaStream_t st) const {
    ForwardInputs f;
    f.hidden_states = TensorView::contiguous(x, DType::kBF16, {T, s.H}, gpu);
    f.topk_ids = TensorView::contiguous(ids, DType::kI32, {T, s.K}, gpu);
    f.topk_weights = TensorView::contiguous(w, DType::kF32, {T, s.K}, gpu);
    f.stream = st;
    return f;
  }
};

// With EP > 1, a barrier of the ranks before each timed iteration (ep_rank: a forward of 0
// tokens), so the ranks start each replay together.
constexpr bool kReplayBarrier = true;

// The timing of docs/benchmarks.md: one forward per input set captured into a CUDA graph, 6 warm-up
// replays, then `iters` replays alternating the sets, each between two events. Returns their µs.
// `barrier` (EP > 1): enqueues a barrier of every rank before each timed replay, outside its
// events, so the ranks start each replay together (docs/benchmarks.md); null: replays back to back.
template <class MakeInputs>
std::vector<float> time_graph_replays(MegaLayer& layer, const MakeInputs& inputs,
                                      const InputSet (&sets)[2], const TensorView& out,
                                      cudaStream_t st, int iters,
                                      const std::function<void()>* barrier = nullptr,
                                      int rank = -1) {
  cudaGraphExec_t exec[2];
  for (int k = 0; k < 2; ++k) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    layer.forward(inputs(sets[k]), out);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&exec[k], g, 0));
    CK(cudaGraphDestroy(g));
  }
  for (int it = 0; it < 6; ++it) CK(cudaGraphLaunch(exec[it & 1], st));
  const std::vector<float> us = time_between_events(
      st, iters,
      [&](int) {
        if (barrier) (*barrier)();
      },
      [&](int it) { CK(cudaGraphLaunch(exec[it & 1], st)); });
  for (auto& x : exec) CK(cudaGraphExecDestroy(x));
  return us;
}

// --- EP over several GPUs: one process per rank -----------------------------------------------
constexpr int kMaxCases = 64, kMaxEp = 8;
constexpr int kEpStageEvents = 7;  // MegaLayer::set_stage_events at W > 1
struct EpCase {
  int recipe_index, tokens;
  double median_us, min_us, max_us, weight_bytes;
  int64_t pairs;
  // NVLink bytes this rank sends (input set 0): dispatch rows (activation row + metadata, once
  // per token and other owner rank) and result rows back to other sources (H bf16 per pair).
  double dispatch_bytes, combine_bytes;
  int zipf;
  double stage_us[kEpStageEvents - 1];  // graph replays with captured stage events
};
struct EpShared {
  SharedUniqueId uid;
  char device[256];
  struct Rank {
    int done, failed, ncases;
    char msg[1024];
    char where[128];  // the step this rank was in (named on failure)
    EpCase cases[kMaxCases];
  } rank[kMaxEp];
};

void ep_rank(EpShared* sh, int rank, int world, const Shape& s, const std::vector<std::string>& rn,
             const std::vector<int>& tokens, const std::vector<int>& routings, int iters) {
  CK(cudaSetDevice(rank));
  if (rank == 0) {
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    std::snprintf(sh->device, sizeof sh->device, "%s", prop.name);
  }
  const NcclUniqueIdBytes uid = sh->uid.exchange(rank);
  auto& me = sh->rank[rank];
  const bool use_barrier = kReplayBarrier;
  const Device gpu{DeviceKind::kCUDA, rank};
  const int El = s.E / world;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (size_t ri = 0; ri < rn.size(); ++ri) {
    const Recipe recipe = *parse_recipe(rn[ri]);
    const RecipeTraits tr = recipe_traits(recipe);
    const DeviceWeights dw(recipe, s.H, s.I, El, uint64_t(rank) * 10, gpu);
    const WeightPack& wp = dw.pack;
    // Capacity 1: each token count gets its own workspace below.
    const LayerConfig cfg = layer_config(recipe, s.E, 1, s.H, s.I, s.K);
    Bootstrap boot;
    boot.backend = Backend::kCUDA;
    boot.device = rank;
    boot.world_size = world;
    boot.rank = rank;
    boot.nccl_unique_id = uid;
    std::snprintf(me.where, sizeof me.where, "%s: construction", rn[ri].c_str());
    auto layer = std::make_unique<MegaLayer>(boot, cfg, wp, EpilogueVectors{});
    const size_t expert_bytes = dw.bytes_per_expert;
    auto step = [&](int T, const char* what) {
      std::snprintf(me.where, sizeof me.where, "%s, T=%d: %s", rn[ri].c_str(), T, what);
    };
    for (int T : tokens) {
      step(T, "create_workspace");
      const WorkspaceId ws = layer->create_workspace(std::max(1, T));
      step(T, "warmup");
      layer->warmup(ws);
      for (const int zipf : routings) {
        step(T, "inputs and eager forwards");
        InputSet sets[2];
        for (int k = 0; k < 2; ++k) {
          InputSet& in = sets[k];
          in.host_ids = ep_ids(T, s.K, s.E, zipf != 0, rank, k);
          in.upload(T, s, 77 + k + rank);
        }
        void* out = nullptr;
        CK(cudaMalloc(&out, std::max<size_t>(16, size_t(T) * s.H * 2)));
        auto inputs = [&](const InputSet& in) {
          ForwardInputs f = in.inputs(T, s, gpu, st);
          f.workspace = ws;
          return f;
        };
        const TensorView ov = TensorView::contiguous(out, DType::kBF16, {T, s.H}, gpu);
        for (int it = 0; it < 4; ++it) layer->forward(inputs(sets[it & 1]), ov);
        CK(cudaStreamSynchronize(st));
        step(T, "timed graph replays");
        // The barrier: a forward of 0 tokens on every rank, enqueued eagerly on the stream. Every
        // rank takes part in every call, and its dispatch and combine wait for every peer's
        // signals, so each rank leaves it within a signal's latency of the others. (An LSA barrier
        // on a second NCCL communicator of the benchmark's own failed at construction once, so
        // the benchmark keeps to the layer's own.)
        const std::function<void()> barrier = [&] {
          ForwardInputs z = sets[0].inputs(0, s, gpu, st);
          z.workspace = ws;
          layer->forward(z, TensorView::contiguous(out, DType::kBF16, {0, s.H}, gpu));
        };
        const std::vector<float> us = time_graph_replays(*layer, inputs, sets, ov, st, iters,
                                                         use_barrier ? &barrier : nullptr, rank);
        step(T, "stage-event graph");
        // Input set 0 of every rank (its ids regenerated from the same seeds): the weight bytes
        // this rank streams (its experts that any rank's tokens touch), its pairs, and the NVLink
        // bytes it sends (dispatch rows to other owners, result rows to other sources).
        std::vector<char> touched(s.E, 0);
        int64_t pairs = 0;
        const int row_bytes = dispatch_row_bytes(cfg);
        double dispatch_bytes = 0, combine_bytes = 0;
        for (int r = 0; r < world; ++r) {
          const std::vector<int32_t> ids = ep_ids(T, s.K, s.E, zipf != 0, r, 0);
          for (int t = 0; t < T; ++t) {
            uint64_t owners = 0;
            for (int k = 0; k < s.K; ++k) {
              const int32_t id = ids[size_t(t) * s.K + k];
              if (id < 0) continue;
              owners |= 1ull << (id / El);
              if (id / El != rank) continue;
              touched[id] = 1;
              ++pairs;
              if (r != rank) combine_bytes += 2.0 * s.H;
            }
            if (r == rank)
              for (int o = 0; o < world; ++o)
                if (o != rank && ((owners >> o) & 1)) dispatch_bytes += row_bytes;
          }
        }
        const int64_t n_touched = std::count(touched.begin(), touched.end(), 1);
        if (me.ncases < kMaxCases) {
          EpCase& c = me.cases[me.ncases++];
          c.dispatch_bytes = dispatch_bytes;
          c.combine_bytes = combine_bytes;
          c.zipf = zipf;
          c.recipe_index = int(ri);
          c.tokens = T;
          c.median_us = median(us);
          c.min_us = *std::min_element(us.begin(), us.end());
          c.max_us = *std::max_element(us.begin(), us.end());
          c.weight_bytes = double(n_touched) * expert_bytes;
          c.pairs = pairs;
        }
        // Per-stage times inside a replayed CUDA graph: the stage events are captured as event
        // nodes of a third graph (same kernels as the timed ones).
        cudaEvent_t sev[kEpStageEvents];
        for (auto& e : sev) CK(cudaEventCreate(&e));
        std::vector<float> stage[kEpStageEvents - 1];
        layer->set_stage_events(reinterpret_cast<void* const*>(sev));
        cudaGraphExec_t staged;
        {
          cudaGraph_t g;
          CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
          layer->forward(inputs(sets[0]), ov);
          CK(cudaStreamEndCapture(st, &g));
          CK(cudaGraphInstantiate(&staged, g, 0));
          CK(cudaGraphDestroy(g));
        }
        for (int it = 0; it < std::max(5, iters / 2); ++it) {
          if (use_barrier) {
            // The stage events are nodes of the staged graph: the eager barrier must not record
            // them (cudaErrorIllegalState).
            layer->set_stage_events(nullptr);
            barrier();
            layer->set_stage_events(reinterpret_cast<void* const*>(sev));
          }
          CK(cudaGraphLaunch(staged, st));
          CK(cudaStreamSynchronize(st));
          for (int j = 0; j + 1 < kEpStageEvents; ++j) {
            float ms = 0;
            // Stage times are extra information: a driver without event nodes gives NaN.
            if (cudaEventElapsedTime(&ms, sev[j], sev[j + 1]) != cudaSuccess) {
              cudaGetLastError();
              ms = std::nanf("");
            }
            stage[j].push_back(ms * 1000);
          }
        }
        cudaGraphExecDestroy(staged);
        layer->set_stage_events(nullptr);
        for (auto& e : sev) cudaEventDestroy(e);
        if (me.ncases > 0 && me.cases[me.ncases - 1].tokens == T)
          for (int j = 0; j + 1 < kEpStageEvents; ++j)
            me.cases[me.ncases - 1].stage_us[j] = median(stage[j]);
        cudaFree(out);
        for (auto& in : sets) in.release();
      }
    }
    step(tokens.empty() ? 0 : tokens.back(), "destroy after the last T");
    layer->destroy();
  }
  cudaStreamDestroy(st);
}

int run_ep(int world, const Shape& s, const std::vector<std::string>& rn,
           const std::vector<int>& tokens, const std::vector<int>& routings, int iters,
           const std::string& json_path) {
  if (world > kMaxEp || rn.size() != 1 || tokens.size() * routings.size() > size_t(kMaxCases)) {
    std::fprintf(stderr, "--ep: at most %d ranks, one recipe, %d cases (token counts x routings)\n",
                 kMaxEp, kMaxCases);
    return 1;
  }
  void* mem =
      mmap(nullptr, sizeof(EpShared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 1;
  auto* sh = new (mem) EpShared();
  std::fflush(stdout);
  std::vector<pid_t> pids;
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // NVLink SHARP off; the ranks inherit it
  // One recipe per run: the unique id serves one communicator (one layer per rank).
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int rc = 0;
      try {
        ep_rank(sh, r, world, s, rn, tokens, routings, iters);
      } catch (const std::exception& e) {
        std::snprintf(sh->rank[r].msg, sizeof sh->rank[r].msg, "%s", e.what());
        sh->rank[r].failed = 1;
        rc = 1;
      }
      sh->rank[r].done = 1;
      std::fflush(stdout);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  int st = 0;
  for (size_t i = 0; i < pids.size(); ++i) waitpid(-1, &st, 0);
  bool failed = false;
  for (int r = 0; r < world; ++r)
    if (sh->rank[r].failed || !sh->rank[r].done) {
      std::fprintf(stderr, "rank %d failed (at %s): %s\n", r, sh->rank[r].where, sh->rank[r].msg);
      failed = true;
    }
  if (failed) return 1;
  const char* commit = std::getenv("MOE_EP_COMMIT");
  const char* combine = combine_mode_name(CombineMode::kFused);
  std::printf("combine: %s\n", combine);
  const char* timing = kReplayBarrier
                           ? "cuda graph replay after a forward of 0 tokens on every rank (a "
                             "barrier), slowest rank's median"
                           : "cuda graph replays back to back, slowest rank's median";
  std::printf("timing: %s\n", timing);
  FILE* js = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "w");
  if (js) std::fprintf(js, "[\n");
  std::printf("%-8s %-12s %4s %6s %-7s %12s %12s %12s %14s %s\n", "shape", "recipe", "ep", "tokens",
              "routing", "median_us", "min_us", "max_us", "GB/rank(max)", "per-rank medians");
  for (int c = 0; c < sh->rank[0].ncases; ++c) {
    double med = 0, mn = 1e30, mx = 0, bytes = 0;
    int64_t pairs = 0;
    std::string per;
    for (int r = 0; r < world; ++r) {
      const EpCase& e = sh->rank[r].cases[c];
      med = std::max(med, e.median_us);
      mn = std::min(mn, e.min_us);
      mx = std::max(mx, e.max_us);
      bytes = std::max(bytes, e.weight_bytes);
      pairs = std::max(pairs, e.pairs);
      char b[32];
      std::snprintf(b, sizeof b, "%s%.1f", r ? "/" : "", e.median_us);
      per += b;
    }
    const int T = sh->rank[0].cases[c].tokens;
    const char* routing = sh->rank[0].cases[c].zipf ? "zipf" : "uniform";
    const double hbm = bytes / (med * 1e-6) / (kHbmTBps * 1e12);
    const double tflops = 6.0 * s.H * s.I * double(pairs) / (med * 1e-6) / 1e12;
    std::printf("%-8s %-12s %4d %6d %-7s %12.1f %12.1f %12.1f %14.3f %s\n", s.name.c_str(),
                rn[0].c_str(), world, T, routing, med, mn, mx, bytes / 1e9, per.c_str());
    // Stages of every rank (events captured in a replayed graph): a rank that waits long in
    // combine waits for a slower peer.
    for (int r = 0; r < world; ++r) {
      const double* sg = sh->rank[r].cases[c].stage_us;
      std::printf(
          "    stages us (rank %d, graph): quantize %.1f, dispatch+wait %.1f, unpack %.1f, "
          "route+fc1+fc2 %.1f, combine+wait %.1f, finalize %.1f\n",
          r, sg[0], sg[1], sg[2], sg[3], sg[4], sg[5]);
    }
    const double* sg = sh->rank[0].cases[c].stage_us;  // rank 0's in the JSON
    // nvlink_GBps (docs/benchmarks.md): the bytes rank 0's dispatch sends over its dispatch + wait
    // stage in a replayed graph (the wait for the peers' rows included). With the fused combine
    // (the default) the result rows leave from inside fc2, so no stage times them alone; their
    // bytes are recorded.
    const EpCase& c0 = sh->rank[0].cases[c];
    const double nvlink = sg[1] > 0 ? c0.dispatch_bytes / (sg[1] * 1e3) : 0.0;
    std::printf(
        "    NVLink (rank 0): dispatch %.2f MB in %.1f us = %.1f GB/s (%.0f%% of %.0f); "
        "combine %.2f MB (%s)\n",
        c0.dispatch_bytes / 1e6, sg[1], nvlink, 100 * nvlink / kNvlinkGBps, kNvlinkGBps,
        c0.combine_bytes / 1e6, combine);
    if (js)
      std::fprintf(js,
                   "%s  {\"commit\": \"%s\", \"device\": \"%d x %s\", \"ep\": %d, "
                   "\"rank_count\": %d, \"shape\": \"%s\", \"H\": %d, \"I\": %d, "
                   "\"E\": %d, \"K\": %d, \"recipe\": \"%s\", \"tokens_per_rank\": %d, "
                   "\"routing\": \"%s\", \"median_us\": %.2f, \"min_us\": %.2f, "
                   "\"max_us\": %.2f, \"median_us_per_rank\": \"%s\", "
                   "\"weight_bytes_read\": %.0f, \"weight_bytes_per_rank_max\": %.0f, "
                   "\"hbm_fraction\": %.4f, \"tflops\": %.2f, \"mma_fraction\": %.4f, "
                   "\"mma_type\": \"bf16\", \"iterations\": %d, \"dispatch_bytes\": %.0f, "
                   "\"combine_bytes\": %.0f, \"nvlink_GBps\": %.1f, "
                   "\"nvlink_stage\": \"dispatch+wait of rank 0 in a replayed graph\", "
                   "\"stages_us_rank0_graph\": {\"quantize\": %.2f, \"dispatch_wait\": %.2f, "
                   "\"unpack\": %.2f, \"route_fc1_fc2\": %.2f, \"combine_wait\": %.2f, "
                   "\"finalize\": %.2f}, \"combine\": \"%s\", "
                   "\"timing\": \"%s\"}",
                   c ? ",\n" : "", commit ? commit : "unknown", world, sh->device, world, world,
                   s.name.c_str(), s.H, s.I, s.E, s.K, rn[0].c_str(), T, routing, med, mn, mx,
                   per.c_str(), bytes, bytes, hbm, tflops, tflops / kBf16Tflops, iters,
                   c0.dispatch_bytes, c0.combine_bytes, nvlink, sg[0], sg[1], sg[2], sg[3], sg[4],
                   sg[5], combine, timing);
  }
  if (js) {
    std::fprintf(js, "\n]\n");
    std::fclose(js);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, shape_name = "dsv3",
                         recipes_arg = "nvfp4,mxfp4_mxfp8,mxfp4_bf16,bf16,nvfp4_bf16";
  std::vector<int> tokens = {1, 8, 32, 128, 512, 1024, 2048, 4096};
  int iters = 30, ep = 1, experts = 0, hidden = 0, inter = 0, tile = 0, route_spread = -1,
      m64_split = -1;
  std::string routing = "both";
  bool fp8_mma = false, explain = false, gpt_oss_experts = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--json")
      json_path = next();
    else if (a == "--shape")
      shape_name = next();
    else if (a == "--recipes")
      recipes_arg = next();
    else if (a == "--tokens")
      tokens = parse_ints(next());
    else if (a == "--iters")
      iters = std::max(20, std::stoi(next()));
    else if (a == "--ep")
      ep = std::stoi(next());
    else if (a == "--experts")
      experts = std::stoi(next());
    else if (a == "--hidden")
      hidden = std::stoi(next());
    else if (a == "--inter")
      inter = std::stoi(next());
    else if (a == "--routing")
      routing = next();
    else if (a == "--fp8-mma")
      fp8_mma = true;
    else if (a == "--explain")
      explain = true;
    else if (a == "--gpt-oss-experts")
      gpt_oss_experts = true;
    else if (a == "--tile")
      tile = std::stoi(next());
    else if (a == "--route-spread")
      route_spread = std::stoi(next());
    else if (a == "--m64-split")
      m64_split = std::stoi(next());
    else {
      std::fprintf(stderr,
                   "bench_layer: unknown option '%s' (--json --shape --recipes --tokens --iters "
                   "--ep --experts --hidden --inter --routing --fp8-mma --explain "
                   "--gpt-oss-experts --tile --route-spread --m64-split)\n",
                   a.c_str());
      return 2;
    }
  }
  const std::vector<Shape> shapes = {
      {"dsv3", 7168, 2048, 256, 8}, {"qwen3", 2048, 768, 128, 8}, {"gpt-oss", 2880, 2880, 128, 4}};
  auto it = std::find_if(shapes.begin(), shapes.end(),
                         [&](const Shape& c) { return c.name == shape_name; });
  if (it == shapes.end()) {
    std::fprintf(stderr, "bench_layer: unknown --shape '%s' (dsv3, qwen3, gpt-oss)\n",
                 shape_name.c_str());
    return 2;
  }
  Shape s = *it;
  if (experts > 0) s.E = experts;
  // Probe shapes: the named shape with H or I replaced (the records keep H and I beside the name).
  if (hidden > 0) {
    s.H = hidden;
    s.name += "-h" + std::to_string(hidden);
  }
  if (inter > 0) {
    s.I = inter;
    s.name += "-i" + std::to_string(inter);
  }
  if (routing != "uniform" && routing != "zipf" && routing != "both") {
    std::fprintf(stderr, "bench_layer: unknown --routing '%s' (uniform, zipf, both)\n",
                 routing.c_str());
    return 2;
  }
  std::vector<int> routings;  // 0 uniform, 1 Zipf
  if (routing != "zipf") routings.push_back(0);
  if (routing != "uniform") routings.push_back(1);
  if (ep > 1) {
    // The parent never touches CUDA: the ranks are forked from it.
    std::vector<std::string> rn;
    std::stringstream rs0(recipes_arg);
    std::string n;
    while (std::getline(rs0, n, ',')) rn.push_back(n);
    return run_ep(ep, s, rn, tokens, routings, iters, json_path);
  }
  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  const char* commit = std::getenv("MOE_EP_COMMIT");
  const int cap = *std::max_element(tokens.begin(), tokens.end());

  FILE* js = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "w");
  if (js) std::fprintf(js, "[\n");
  bool first_record = true;
  std::printf("%-8s %-12s %6s %-7s %10s %10s %10s %8s %8s %8s  stages us (prep/fc1/fc2/fin)\n",
              "shape", "recipe", "tokens", "routing", "median_us", "min_us", "max_us", "GB_read",
              "hbm_frac", "mma_frac");

  std::stringstream rs(recipes_arg);
  std::string rname;
  while (std::getline(rs, rname, ',')) {
    const auto recipe = parse_recipe(rname);
    if (!recipe) {
      std::fprintf(stderr, "unknown recipe %s\n", rname.c_str());
      return 1;
    }
    const RecipeTraits tr = recipe_traits(*recipe);
    // Checkpoint-layout weights on the GPU.
    const Device gpu{DeviceKind::kCUDA, dev};
    const DeviceWeights dw(*recipe, s.H, s.I, s.E, 0, gpu);
    const WeightPack& wp = dw.pack;
    LayerConfig cfg = layer_config(*recipe, s.E, cap, s.H, s.I, s.K);
    cfg.recipe.fp8_mma = fp8_mma && *recipe == Recipe::kMxfp4Mxfp8;
    cfg.plan_options.tile_n = tile;                // 0: the plan's policy
    cfg.plan_options.route_spread = route_spread;  // -1: the plan's policy
    cfg.plan_options.m64_split = m64_split;        // -1: the plan's policy
    // gpt-oss's expert semantics (the extended epilogue): clamp 7, slope 1.702, offset 1 and
    // random expert biases.
    std::vector<float> b13, b2;
    EpilogueVectors ev;
    if (gpt_oss_experts) {
      cfg.recipe.swiglu_limit = 7.0f;
      cfg.recipe.swiglu_alpha = 1.702f;
      cfg.recipe.swiglu_beta = 1.0f;
      cfg.recipe.has_expert_bias = true;
      b13.resize(size_t(s.E) * 2 * s.I);
      b2.resize(size_t(s.E) * s.H);
      for (size_t i = 0; i < b13.size(); ++i) b13[i] = 0.01f * float(int(i % 201) - 100);
      for (size_t i = 0; i < b2.size(); ++i) b2[i] = 0.01f * float(int(i % 101) - 50);
      ev.fc1_bias = TensorView::contiguous(b13.data(), DType::kF32, {s.E, 2 * s.I});
      ev.fc2_bias = TensorView::contiguous(b2.data(), DType::kF32, {s.E, s.H});
    }
    Bootstrap boot;
    boot.backend = Backend::kCUDA;
    boot.device = dev;
    auto layer = std::make_unique<MegaLayer>(boot, cfg, wp, ev);
    layer->warmup();
    // mma_fraction against the peak of the MMA type the kernels use: fp8 where the layer takes
    // the fp8 path (--fp8-mma with mxfp4_mxfp8), bf16 otherwise.
    const bool fp8 = layer->uses_fp8_mma();
    const double mma_peak = fp8 ? kFp8Tflops : kBf16Tflops;
    const size_t expert_bytes = dw.bytes_per_expert;
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

    for (int T : tokens) {
      for (const int zipf : routings) {
        InputSet sets[2];
        for (int k = 0; k < 2; ++k) {
          InputSet& in = sets[k];
          in.host_ids = make_ids(T, s.K, s.E, zipf != 0, 1000 * T + 10 * zipf + k);
          in.upload(T, s, 77 + k);
        }
        void* out = nullptr;
        CK(cudaMalloc(&out, size_t(T) * s.H * 2));
        auto inputs = [&](const InputSet& in) { return in.inputs(T, s, gpu, st); };
        const TensorView ov = TensorView::contiguous(out, DType::kBF16, {T, s.H}, gpu);
        // Per-stage times (eager forwards with the event hook).
        cudaEvent_t sev[5];
        for (auto& e : sev) CK(cudaEventCreate(&e));
        std::vector<float> stage[4];
        layer->set_stage_events(reinterpret_cast<void* const*>(sev));
        for (int it = 0; it < 12; ++it) {
          layer->forward(inputs(sets[it & 1]), ov);
          CK(cudaStreamSynchronize(st));
          if (it < 2) continue;
          for (int j = 0; j < 4; ++j) {
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, sev[j], sev[j + 1]));
            stage[j].push_back(ms * 1000);
          }
        }
        layer->set_stage_events(nullptr);
        // Whole forward: graph replays.
        const std::vector<float> us = time_graph_replays(*layer, inputs, sets, ov, st, iters);
        const double med = median(us);
        const double mn = *std::min_element(us.begin(), us.end());
        const double mx = *std::max_element(us.begin(), us.end());
        // Bytes and flops of input set 0 (set 1 has the same routing law).
        std::vector<char> touched(s.E, 0);
        int64_t pairs = 0;
        for (int32_t id : sets[0].host_ids)
          if (id >= 0) {
            touched[id] = 1;
            ++pairs;
          }
        const int64_t n_touched = std::count(touched.begin(), touched.end(), 1);
        const double bytes = double(n_touched) * expert_bytes;
        const double hbm = bytes / (med * 1e-6) / (kHbmTBps * 1e12);
        const double tflops = 2.0 * 3.0 * s.H * s.I * double(pairs) / (med * 1e-6) / 1e12;
        const ForwardPlan plan = layer->last_plan();
        const int tile_n = plan.tile_n;
        std::printf(
            "%-8s %-12s %6d %-7s %10.1f %10.1f %10.1f %8.3f %8.3f %8.3f  %.1f/%.1f/%.1f/%.1f\n",
            s.name.c_str(), rname.c_str(), T, zipf ? "zipf" : "uniform", med, mn, mx, bytes / 1e9,
            hbm, tflops / mma_peak, median(stage[0]), median(stage[1]), median(stage[2]),
            median(stage[3]));
        if (explain) std::printf("  plan: %s\n", plan.to_string().c_str());
        std::fflush(stdout);
        if (js) {
          std::fprintf(
              js,
              "%s  {\"commit\": \"%s\", \"device\": \"%s\", \"ep\": 1, \"rank_count\": 1, "
              "\"shape\": \"%s\", \"H\": %d, \"I\": %d, \"E\": %d, \"K\": %d, "
              "\"recipe\": \"%s\", \"tokens_per_rank\": %d, \"routing\": \"%s\", "
              "\"median_us\": %.2f, \"min_us\": %.2f, \"max_us\": %.2f, "
              "\"weight_bytes_read\": %.0f, \"hbm_fraction\": %.4f, \"tflops\": %.2f, "
              "\"mma_fraction\": %.4f, \"mma_type\": \"%s\", \"dispatch_bytes\": 0, "
              "\"nvlink_GBps\": null, \"iterations\": %d, \"timing\": \"cuda graph replay\", "
              "\"stages_us\": {\"prepare\": %.2f, \"fc1\": %.2f, "
              "\"fc2\": %.2f, "
              "\"finalize\": %.2f}, \"config\": {\"tile_n\": %d, \"tile_m\": %d, "
              "\"k_chunk\": 64, \"mma\": \"%s\"}, \"plan\": \"%s\"}",
              first_record ? "" : ",\n", commit ? commit : "unknown", prop.name, s.name.c_str(),
              s.H, s.I, s.E, s.K, rname.c_str(), T, zipf ? "zipf" : "uniform", med, mn, mx, bytes,
              hbm, tflops, tflops / mma_peak, fp8 ? "fp8" : "bf16", iters, median(stage[0]),
              median(stage[1]), median(stage[2]), median(stage[3]), tile_n,
              tile_n == 256 ? 64 : 128,
              fp8            ? "wgmma.m64nNk32.e4m3 (A regs, B smem)"
              : tile_n <= 32 ? "mma.sync.m16n8k16.bf16"
                             : "wgmma.m64nNk16.bf16 (A regs, B smem)",
              plan.to_string().c_str());
          first_record = false;
        }
        for (auto& e : sev) cudaEventDestroy(e);
        cudaFree(out);
        for (auto& in : sets) in.release();
      }
    }
    cudaStreamDestroy(st);
    layer.reset();
  }
  if (js) {
    std::fprintf(js, "\n]\n");
    std::fclose(js);
  }
  return 0;
}
