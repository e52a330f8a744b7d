// moe-ep: run, check and benchmark the MoE-EP layer.
//   moe-ep run    build a layer, run it on the best backend, check it, print a table
//   moe-ep check  compare the backend with the CPU reference for every recipe (exit 1 on failure)
//   moe-ep bench  time the layer (benchmark records (docs/benchmarks.md) as JSON)
#include "commands.h"

#include <dirent.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "bench_cpu.h"
#include "checkpoint/safetensors.h"
#include "checkpoint_problem.h"
#include "memory_budget.h"
#include "moe_ep/checkpoint.h"
#include "moe_ep/formats.h"
#include "moe_ep/status.h"
#include "problem.h"
#include "problem_io.h"

namespace moe_ep::cli {
namespace {

// Ranges of the numeric flags.
constexpr int kMaxExperts = kMaxLoadExperts;
constexpr int kMaxTokens = 1 << 24;  // per rank
constexpr int kMaxIters = 100000;

struct Options {
  std::string command;
  std::string shape = "tiny";
  int experts = 0;  // 0: the shape's own E
  std::string recipes = "all";
  std::string tokens = "";
  int ranks = 1;
  bool ranks_given = false;
  int gpus = 0;  // --gpus N: one process per GPU
  std::string backend = "auto";
  int iters = 0;  // 0: the command's default (run 5, bench 20)
  uint64_t seed = 1;
  std::string routing = "uniform";
  std::string load, save, json;
  std::string model;           // --model DIR: a Hugging Face checkpoint
  std::string layers = "all";  // --layers: its MoE layers to run
  std::optional<float> swiglu_limit;
  bool topk_in_fc1 = false;
  bool explain = false;
  uint64_t memory = 0;  // --memory BYTES: the budget of the memory check (0: this machine's)
  bool help = false;
  std::vector<std::string> given;  // the flags given, in order
};

const char* kUsage =
    "usage: moe-ep <run|check|bench> [options]\n"
    "\n"
    "  run    build a layer of a named shape with random weights (quantized by moe_ep's own\n"
    "         packer) or load one (--load), run the forward on the best backend present, check\n"
    "         it against the CPU reference and float64 math, print a table with PASS/FAIL\n"
    "  check  the reference comparison alone (one iteration), for every recipe\n"
    "  bench  time the forward (median of --iters) and, on the CPU, an OpenBLAS sgemm of the\n"
    "         same dequantized problem; writes benchmark records (docs/benchmarks.md) with --json\n"
    "\n"
    "exit status: 0 every result within its tolerance, 1 some result NaN, missing or outside\n"
    "its tolerance, 2 a bad argument, a bad input file or an error (the message says which)\n"
    "\n"
    "options:\n"
    "  --shape NAME       tiny (default: H 512, I 256, E 16, K 4), qwen3-30b-a3b, dsv3,\n"
    "                     gpt-oss-120b, mixtral-8x7b\n"
    "  --experts E        use E experts instead of the shape's (keeps H, I and K); 1..65536,\n"
    "                     at least K and a multiple of the ranks\n"
    "  --recipe LIST      all (default) or a comma list of nvfp4, mxfp4_mxfp8, mxfp4_bf16, bf16,\n"
    "                     nvfp4_bf16\n"
    "  --tokens LIST      tokens per rank, 0..16777216; a comma list runs each (default\n"
    "                     run/check: 64; bench: 1,8,32,128)\n"
    "  --ranks W          EP ranks, 1..64 (CPU: threads in this process; default 1)\n"
    "  --gpus N           EP over N GPUs (1..64), one process per GPU started by this command\n"
    "                     (run without --gpus/--ranks/--backend uses every GPU present)\n"
    "                     (CUDA backend; rank r on GPU r; rank 0's outputs table)\n"
    "  --backend B        auto (default), cpu, cuda\n"
    "  --iters N          timed iterations, 1..100000 (default 5; bench 20)\n"
    "  --routing R        uniform (default) or zipf\n"
    "  --swiglu-limit L   clamp limit of the activation, a finite number > 0 (default: none)\n"
    "  --topk-in-fc1      apply the top-k weight inside fc1\n"
    "  --seed S           random seed, 0..2^64-1 (default 1)\n"
    "  --load FILE        run/check a problem from a safetensors file: w13, w2[, w13_scale,\n"
    "                     w2_scale, fc1_alpha, fc2_alpha, fc1_norm_const], hidden_states [W,T,H],\n"
    "                     topk_ids, topk_weights [W,T,K] and metadata 'recipe'; an 'out' tensor,\n"
    "                     if present, is compared bitwise. Every field is checked first.\n"
    "  --save FILE        run/check: write weights, inputs and outputs as safetensors (loadable\n"
    "                     by --load); with several recipes or token counts, one file each\n"
    "                     (FILE with .<recipe>-t<T> before its extension)\n"
    "  --json FILE        bench: write the records as JSON\n"
    "  --memory BYTES     check the problem's host memory against BYTES instead of this\n"
    "                     machine's available memory (1..2^50)\n"
    "  --model DIR        run/check the MoE layers of a Hugging Face checkpoint directory\n"
    "                     (config.json, *.safetensors: bf16 Qwen3-MoE / Mixtral / DeepSeek-V3 /\n"
    "                     gpt-oss, gpt-oss MXFP4, ModelOpt NVFP4; docs/checkpoints.md): each\n"
    "                     rank loads its own experts; random bf16 inputs routed by the model's\n"
    "                     router; with DIR/goldens.safetensors also transformers' outputs on the\n"
    "                     golden inputs (rel. L2; <= 5e-3 in the native recipe where it keeps\n"
    "                     activations in bf16). --recipe defaults to the native one\n"
    "  --layers LIST      with --model: all (default) or a comma list of decoder layer indices\n"
    "  --explain          run/check: print the launch plan of each forward (rank 0; the kernels,\n"
    "                     tiles, grids and rings the CUDA backend chose)\n";

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

std::string range_str(int64_t lo, int64_t hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

// An integer flag value in [lo, hi], or an error naming the flag, the value and the range.
int64_t int_in(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  const long long r = v.empty() ? 0 : std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || end != v.c_str() + v.size() || std::isspace(static_cast<unsigned char>(v[0])))
    throw Error(ErrorCode::kInvalidArgument,
                flag + " wants an integer in " + range_str(lo, hi) + ", got '" + v + "'");
  if (errno == ERANGE || r < lo || r > hi)
    throw Error(ErrorCode::kInvalidArgument,
                flag + " " + v + " is outside the allowed range " + range_str(lo, hi));
  return r;
}

uint64_t seed_of(const std::string& v) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long r = v.empty() ? 0 : std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || !std::isdigit(static_cast<unsigned char>(v[0])) || end != v.c_str() + v.size() ||
      errno == ERANGE)
    throw Error(ErrorCode::kInvalidArgument,
                "--seed wants an integer in [0, 18446744073709551615], got '" + v + "'");
  return r;
}

float positive_float(const std::string& flag, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  const float r = v.empty() ? NAN : std::strtof(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size())
    throw Error(ErrorCode::kInvalidArgument, flag + " wants a number, got '" + v + "'");
  if (!std::isfinite(r) || r <= 0 || errno == ERANGE)
    throw Error(ErrorCode::kInvalidArgument,
                flag + " " + v + " is outside the allowed range: a finite number > 0");
  return r;
}

// The folder a file will be written to must exist and be writable: checked before the work,
// so that minutes of computing do not end in a failed write.
void check_writable(const std::string& flag, const std::string& path) {
  if (path.empty()) throw Error(ErrorCode::kInvalidArgument, flag + " needs a file name");
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  if (access(dir.c_str(), W_OK) != 0)
    throw Error(ErrorCode::kInvalidArgument, flag + " " + path + ": the folder " + dir +
                                                 " is not writable (" + std::strerror(errno) + ")");
}

Options parse(const std::vector<std::string>& a) {
  Options o;
  size_t i = 0;
  if (!a.empty() && !a[0].empty() && a[0][0] != '-') o.command = a[i++];
  auto value = [&](const std::string& flag) -> std::string {
    if (i + 1 >= a.size()) throw Error(ErrorCode::kInvalidArgument, flag + " needs a value");
    return a[++i];
  };
  for (; i < a.size(); ++i) {
    const std::string& f = a[i];
    if (f == "-h" || f == "--help") {
      o.help = true;
      continue;
    }
    if (f == "--shape")
      o.shape = value(f);
    else if (f == "--experts")
      o.experts = int(int_in(f, value(f), 1, kMaxExperts));
    else if (f == "--recipe")
      o.recipes = value(f);
    else if (f == "--tokens")
      o.tokens = value(f);
    else if (f == "--ranks")
      o.ranks = int(int_in(f, value(f), 1, kMaxRanks)), o.ranks_given = true;
    else if (f == "--backend")
      o.backend = value(f);
    else if (f == "--gpus")
      o.gpus = int(int_in(f, value(f), 1, kMaxRanks));
    else if (f == "--iters")
      o.iters = int(int_in(f, value(f), 1, kMaxIters));
    else if (f == "--seed")
      o.seed = seed_of(value(f));
    else if (f == "--routing")
      o.routing = value(f);
    else if (f == "--load")
      o.load = value(f);
    else if (f == "--save")
      o.save = value(f);
    else if (f == "--json")
      o.json = value(f);
    else if (f == "--model")
      o.model = value(f);
    else if (f == "--layers")
      o.layers = value(f);
    else if (f == "--swiglu-limit")
      o.swiglu_limit = positive_float(f, value(f));
    else if (f == "--topk-in-fc1")
      o.topk_in_fc1 = true;
    else if (f == "--explain")
      o.explain = true;
    else if (f == "--memory")
      o.memory = uint64_t(int_in(f, value(f), 1, int64_t(1) << 50));
    else
      throw Error(ErrorCode::kInvalidArgument, "unknown option '" + f + "' (see --help)");
    o.given.push_back(f);
  }
  auto given = [&](const char* f) {
    return std::find(o.given.begin(), o.given.end(), f) != o.given.end();
  };
  if (!o.load.empty()) {
    for (const char* f : {"--shape", "--experts", "--recipe", "--tokens", "--ranks", "--routing",
                          "--seed", "--swiglu-limit", "--topk-in-fc1"})
      if (given(f))
        throw Error(ErrorCode::kInvalidArgument,
                    std::string(f) +
                        " cannot be combined with --load: the file defines the "
                        "problem (its shape, recipe, ranks, tokens and routing)");
  }
  if (!o.model.empty()) {
    for (const char* f :
         {"--shape", "--experts", "--load", "--save", "--routing", "--swiglu-limit"})
      if (given(f))
        throw Error(ErrorCode::kInvalidArgument,
                    std::string(f) +
                        " cannot be combined with --model: the checkpoint defines the layer "
                        "(its shape, weights, activation and router)");
  } else if (given("--layers")) {
    throw Error(ErrorCode::kInvalidArgument, "--layers needs --model DIR");
  }
  if (o.command == "bench") {
    for (const char* f : {"--load", "--save", "--model"})
      if (given(f))
        throw Error(ErrorCode::kInvalidArgument,
                    std::string(f) + " is for run and check, not bench");
  } else if (given("--json")) {
    throw Error(ErrorCode::kInvalidArgument,
                "--json is for bench, not " + (o.command.empty() ? "this command" : o.command));
  }
  if (!o.json.empty()) check_writable("--json", o.json);
  if (!o.save.empty()) check_writable("--save", o.save);
  return o;
}

std::vector<Recipe> recipes_of(const std::string& list) {
  if (list == "all") return {std::begin(kAllRecipes), std::end(kAllRecipes)};
  std::vector<Recipe> out;
  for (auto& n : split(list)) {
    auto r = parse_recipe(n);
    if (!r)
      throw Error(ErrorCode::kInvalidArgument,
                  "--recipe '" + n +
                      "' is not one of: all, nvfp4, mxfp4_mxfp8, mxfp4_bf16, bf16, nvfp4_bf16");
    out.push_back(*r);
  }
  if (out.empty()) throw Error(ErrorCode::kInvalidArgument, "--recipe: no recipe given");
  return out;
}

Backend backend_of(const std::string& b) {
  if (b == "auto") return Backend::kAuto;
  if (b == "cpu") return Backend::kCPU;
  if (b == "cuda") return Backend::kCUDA;
  throw Error(ErrorCode::kInvalidArgument, "--backend '" + b + "' is not one of: auto, cpu, cuda");
}

void check_routing(const std::string& r) {
  if (r != "uniform" && r != "zipf")
    throw Error(ErrorCode::kInvalidArgument, "--routing '" + r + "' is not one of: uniform, zipf");
}

ModelShape shape_of(const Options& o) {
  auto s = find_shape(o.shape);
  if (!s) {
    std::string names;
    for (auto& m : model_shapes()) names += (names.empty() ? "" : ", ") + m.name;
    throw Error(ErrorCode::kInvalidArgument, "--shape '" + o.shape + "' is not one of: " + names);
  }
  if (o.experts > 0) {
    if (o.experts < s->K)
      throw Error(ErrorCode::kInvalidArgument,
                  "--experts " + std::to_string(o.experts) + " is outside the allowed range " +
                      range_str(s->K, kMaxExperts) + ": shape " + s->name +
                      " routes each token to K = " + std::to_string(s->K) + " experts");
    s->E = o.experts;
  }
  const int W = o.gpus > 0 ? o.gpus : o.ranks;
  if (s->E % W != 0)
    throw Error(ErrorCode::kInvalidArgument,
                "E = " + std::to_string(s->E) + " experts (" +
                    (o.experts > 0 ? "--experts" : "shape " + s->name) + ") is not divisible by " +
                    (o.gpus > 0 ? "--gpus " : "--ranks ") + std::to_string(W) +
                    ": every rank holds E / W experts");
  return *s;
}

std::vector<int> tokens_of(const Options& o, const char* fallback) {
  std::vector<int> out;
  for (auto& t : split(o.tokens.empty() ? fallback : o.tokens))
    out.push_back(int(int_in("--tokens", t, 0, kMaxTokens)));
  if (out.empty()) throw Error(ErrorCode::kInvalidArgument, "--tokens: no token count given");
  return out;
}

// --- commands ---------------------------------------------------------------------------------

struct Row {
  std::string backend, shape, recipe;
  int E, H, I, K, ranks, tokens;
  double ms, err_ref, err_fp64;
  bool nonfinite;
  std::string note;
  bool pass = true;
  std::string plan;  // the launch plan of the forward (rank 0)
};

// What PASS means (printed under the table).
constexpr double kTolRef = 5e-3;          // docs/contract.md §7: rel. L2 vs the CPU reference
constexpr double kTolFp64Bf16 = 0.02;     // bf16 weights vs float64 math
constexpr double kTolFp64FourBit = 0.35;  // 4-bit weights vs float64 math (gross-error bound)

void print_table(const std::vector<Row>& rows) {
  std::printf("\n%-7s %-14s %-12s %4s %5s %5s %2s %5s %8s %9s %10s %11s %-6s %s\n", "backend",
              "shape", "recipe", "E", "H", "I", "K", "ranks", "tok/rank", "time(ms)", "err_vs_ref",
              "err_vs_fp64", "result", "note");
  bool four_bit = false;
  for (auto& r : rows) {
    char e1[32], e2[32];
    if (std::isnan(r.err_ref))
      std::snprintf(e1, sizeof e1, "-");
    else
      std::snprintf(e1, sizeof e1, "%.3e", r.err_ref);
    if (std::isnan(r.err_fp64))
      std::snprintf(e2, sizeof e2, "-");
    else
      std::snprintf(e2, sizeof e2, "%.3e", r.err_fp64);
    std::printf("%-7s %-14s %-12s %4d %5d %5d %2d %5d %8d %9.3f %10s %11s %-6s %s%s\n",
                r.backend.c_str(), r.shape.c_str(), r.recipe.c_str(), r.E, r.H, r.I, r.K, r.ranks,
                r.tokens, r.ms, e1, e2, r.pass ? "PASS" : "FAIL",
                r.nonfinite ? "NaN/Inf in the output! " : "", r.note.c_str());
    four_bit = four_bit || r.recipe != "bf16";
  }
  std::printf(
      "\ntok/rank: tokens per rank (each of the W ranks routes this many; W x tok/rank in all).\n"
      "err_vs_ref: rel. L2 vs the CPU reference of the same recipe (all experts on one rank);\n"
      "err_vs_fp64: rel. L2 vs float64 math on the unquantized master weights.\n"
      "PASS: no NaN/Inf or missing output, err_vs_ref <= %.0e (docs/contract.md §7), the CPU "
      "backend at\n"
      "W > 1 bitwise equal to the reference, err_vs_fp64 <= %.2f (bf16) / %.2f (4-bit), and\n"
      "with --load the file's 'out' equal bitwise.\n",
      kTolRef, kTolFp64Bf16, kTolFp64FourBit);
  if (four_bit)
    std::printf(
        "err_vs_fp64 ~ 0.2 for 4-bit recipes is expected: E2M1 keeps 8 magnitudes per block of\n"
        "16/32 weights, which costs ~10%% per GEMM on random Gaussian weights (uncalibrated),\n"
        "and fc1 and fc2 add up; err_vs_ref is the check of the kernels themselves.\n");
}

std::vector<uint16_t> concat(const std::vector<std::vector<uint16_t>>& v) {
  std::vector<uint16_t> o;
  for (auto& x : v) o.insert(o.end(), x.begin(), x.end());
  return o;
}

// Runs one problem on the chosen backend and on the reference; fills a table row.
Row run_one(const Problem& p, Backend backend, int iters, bool verbose, RunResult* keep) {
  if (verbose)
    std::fprintf(stderr, "[moe-ep] %s: forward on %d rank(s), %d token(s) per rank...\n",
                 recipe_name(p.recipe), p.world_size, p.tokens(0));
  RunResult res = run_layers(p, backend, iters);
  Row row{backend_name(res.backend),
          p.shape.name,
          recipe_name(p.recipe),
          p.shape.E,
          p.shape.H,
          p.shape.I,
          p.shape.K,
          p.world_size,
          p.tokens(0),
          res.median_ms,
          NAN,
          NAN,
          false,
          ""};
  row.plan = res.plan;
  std::vector<uint16_t> got = concat(res.out);
  size_t expected = 0;
  for (int r = 0; r < p.world_size; ++r) expected += size_t(p.tokens(r)) * p.shape.H;
  if (got.size() != expected) {
    row.note = "output has " + std::to_string(got.size()) + " values, expected " +
               std::to_string(expected);
    row.pass = false;
    if (keep) *keep = std::move(res);
    return row;
  }
  // Outputs start as NaN (run_rank poisons them), so a row the layer did not write shows here.
  row.nonfinite = has_nonfinite(got);
  const bool is_reference = res.backend == Backend::kCPU && p.world_size == 1;
  if (is_reference) {
    row.note = "(is the reference)";
  } else {
    // The reference: the CPU backend, all experts on one rank (the packed weights only; the
    // fp32 master weights are not copied).
    Problem ref;
    ref.shape = p.shape;
    ref.recipe = p.recipe;
    ref.swiglu_limit = p.swiglu_limit;
    ref.apply_topk_in_fc1 = p.apply_topk_in_fc1;
    ref.swiglu_alpha = p.swiglu_alpha;
    ref.swiglu_beta = p.swiglu_beta;
    ref.input_norm_const = p.input_norm_const;
    ref.fc1_bias = p.fc1_bias;
    ref.fc2_bias = p.fc2_bias;
    ref.pack = p.pack;
    ref.world_size = 1;
    ref.x = {concat(p.x)};
    ref.ids.assign(1, {});
    ref.topk_w.assign(1, {});
    for (int r = 0; r < p.world_size; ++r) {
      ref.ids[0].insert(ref.ids[0].end(), p.ids[r].begin(), p.ids[r].end());
      ref.topk_w[0].insert(ref.topk_w[0].end(), p.topk_w[r].begin(), p.topk_w[r].end());
    }
    ref.capacity = std::max(1, int(ref.ids[0].size()) / p.shape.K);
    RunResult rr = run_layers(ref, Backend::kCPU, 1);
    row.err_ref = rel_l2(got, rr.out[0]);
    if (res.backend == Backend::kCPU) row.note = got == rr.out[0] ? "bitwise = ref" : "DIFFERS";
  }
  if (!p.w13.empty()) {
    std::vector<double> dense;
    for (int r = 0; r < p.world_size; ++r) {
      auto d = dense_reference(p, r);
      dense.insert(dense.end(), d.begin(), d.end());
    }
    row.err_fp64 = rel_l2(got, dense);
  }
  const double fp64_bound = p.recipe == Recipe::kBf16 ? kTolFp64Bf16 : kTolFp64FourBit;
  row.pass = !row.nonfinite && (std::isnan(row.err_ref) || row.err_ref <= kTolRef) &&
             (std::isnan(row.err_fp64) || row.err_fp64 <= fp64_bound) && row.note != "DIFFERS";
  if (keep) *keep = std::move(res);
  return row;
}

// --save FILE for one of several problems: FILE.<recipe>-t<T>.<ext>.
std::string save_path(const std::string& base, Recipe r, int T, bool several) {
  if (!several) return base;
  const size_t slash = base.find_last_of('/');
  const size_t dot = base.find_last_of('.');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  const std::string tag = std::string(".") + recipe_name(r) + "-t" + std::to_string(T);
  return has_ext ? base.substr(0, dot) + tag + base.substr(dot) : base + tag;
}

void saved(const std::string& path, const SaveSummary& s) {
  std::printf("wrote %s: %zu tensors, %llu bytes: %s\n", path.c_str(), s.tensors,
              static_cast<unsigned long long>(s.bytes), s.what.c_str());
  std::fflush(stdout);
}

// The decoder layers --layers names, each one of the checkpoint's MoE layers.
std::vector<int> layers_of(const std::string& list, const CheckpointInfo& info) {
  if (list == "all") return info.moe_layers;
  std::vector<int> out;
  for (auto& v : split(list)) {
    const int l = int(int_in("--layers", v, 0, info.num_hidden_layers - 1));
    if (std::find(info.moe_layers.begin(), info.moe_layers.end(), l) == info.moe_layers.end())
      throw Error(ErrorCode::kInvalidArgument,
                  "--layers " + v + ": decoder layer " + v + " of " + info.dir +
                      " has no routed experts (its first MoE layer is " +
                      std::to_string(info.moe_layers.front()) + ")");
    out.push_back(l);
  }
  if (out.empty()) throw Error(ErrorCode::kInvalidArgument, "--layers: no layer given");
  return out;
}

// Relative L2 error of bf16 values against a float64 reference; NaN when the sizes differ.
double golden_error(const std::vector<uint16_t>& got, const std::vector<double>& ref) {
  return got.size() == ref.size() ? rel_l2(got, ref) : NAN;
}

int cmd_run_model(const Options& o, bool check_only) {
  const Backend backend = backend_of(o.backend);
  const int iters = check_only ? 1 : (o.iters ? o.iters : 5);
  memory_stage("reading the headers of " + o.model);
  const Checkpoint ckpt(o.model);
  const CheckpointInfo& info = ckpt.info();
  std::printf("model %s: %s, %s weights, H %d, I %d, E %d, K %d, %zu MoE layers of %d\n",
              info.dir.c_str(), info.model_type.c_str(), info.weight_format.c_str(),
              info.hidden_size, info.moe_intermediate_size, info.num_experts, info.top_k,
              info.moe_layers.size(), info.num_hidden_layers);
  std::fflush(stdout);
  const std::vector<int> layers = layers_of(o.layers, info);
  const std::vector<Recipe> recipes =
      o.recipes == "all" ? std::vector<Recipe>{info.native_recipe} : recipes_of(o.recipes);
  const std::vector<int> token_list = tokens_of(o, "64");
  const int W = o.ranks;
  if (info.num_experts % W)
    throw Error(ErrorCode::kInvalidArgument,
                "E = " + std::to_string(info.num_experts) + " experts of " + info.dir +
                    " are not divisible by " + (o.gpus > 0 ? "--gpus " : "--ranks ") +
                    std::to_string(W) + ": every rank holds E / W experts");
  const ModelShape shape{info.model_type, info.hidden_size, info.moe_intermediate_size,
                         info.num_experts, info.top_k};
  for (Recipe r : recipes)
    for (int T : token_list) check_memory_for(shape, r, W, T, false, o.memory);
  const std::string goldens = info.dir + "/goldens.safetensors";
  const bool has_goldens = access(goldens.c_str(), R_OK) == 0;
  std::vector<Row> rows;
  std::vector<std::string> golden_lines;
  bool golden_bad = false;
  for (int l : layers) {
    for (Recipe r : recipes) {
      memory_stage("loading layer " + std::to_string(l) + " (" + recipe_name(r) + ")");
      Problem p = problem_from_checkpoint(ckpt, l, r, W);
      p.apply_topk_in_fc1 = o.topk_in_fc1;
      // float64 math on the checkpoint's own weights (err_vs_fp64) where they fit in memory.
      try {
        for (int T : token_list) check_memory_for(shape, r, W, T, true, o.memory);
        set_checkpoint_master_weights(ckpt, l, p);
      } catch (const Error&) {
        p.w13.clear();
        p.w2.clear();
      }
      for (int T : token_list) {
        std::string note;
        make_checkpoint_inputs(ckpt, l, p, T, o.seed, &note);
        memory_stage("running layer " + std::to_string(l) + " (" + recipe_name(r) + ", " +
                     std::to_string(T) + " tokens per rank)");
        Row row = run_one(p, backend, iters, true, nullptr);
        row.shape = info.model_type + " L" + std::to_string(l);
        if (!note.empty()) row.note += (row.note.empty() ? "" : " ") + note;
        rows.push_back(row);
      }
      if (has_goldens) {
        const auto g = read_golden_layer(goldens, l, info.hidden_size, info.top_k);
        if (!g) continue;
        set_golden_inputs(p, *g);
        const RunResult res = run_layers(p, backend, 1);
        std::vector<uint16_t> got = concat(res.out);
        const double err = golden_error(got, g->routed_output);
        // The checkpoint's own weights with bf16 activations (its native recipe, when that
        // keeps x and h in bf16) leave only the recipe's bf16 roundings: contract §7's bound.
        // Other recipes quantize the weights or activations further; their error is printed.
        const bool bf16_activations =
            r == Recipe::kBf16 || r == Recipe::kMxfp4Bf16 || r == Recipe::kNvfp4Bf16;
        const bool bounded = r == info.native_recipe && bf16_activations;
        const bool ok = !std::isnan(err) && !has_nonfinite(got) && (!bounded || err <= kTolRef);
        golden_bad = golden_bad || !ok;
        char line[320];
        std::snprintf(line, sizeof line,
                      "layer %-3d %-12s %d tokens on %d rank(s), %s: rel. L2 vs transformers' "
                      "routed_output %.3e %s",
                      l, recipe_name(r), g->tokens, W, backend_name(res.backend), err,
                      !ok       ? "FAIL"
                      : bounded ? "PASS (<= 5e-3)"
                                : "(no bound: quantized further)");
        golden_lines.push_back(line);
      }
    }
  }
  print_table(rows);
  if (!golden_lines.empty()) {
    std::printf("\ngoldens (%s: transformers' MoE block on its own inputs and router):\n",
                goldens.c_str());
    for (auto& g : golden_lines) std::printf("  %s\n", g.c_str());
  }
  if (o.explain) {
    std::printf("\nlaunch plans (rank 0):\n");
    for (auto& r : rows)
      std::printf("  %-12s T=%-6d %s\n", r.recipe.c_str(), r.tokens, r.plan.c_str());
  }
  size_t failed = golden_bad ? 1 : 0;
  for (auto& r : rows) failed += r.pass ? 0 : 1;
  if (failed)
    std::printf("\n%zu result(s) FAIL (NaN/Inf, missing or outside tolerance): exit status 1\n",
                failed);
  return failed ? 1 : 0;
}

int cmd_run(const Options& o, bool check_only) {
  if (!o.model.empty()) return cmd_run_model(o, check_only);
  const Backend backend = backend_of(o.backend);
  const int iters = check_only ? 1 : (o.iters ? o.iters : 5);
  std::vector<Row> rows;
  std::vector<std::pair<std::string, SaveSummary>> writes;
  if (!o.load.empty()) {
    std::vector<uint16_t> saved_out;
    memory_stage("reading and checking " + o.load);
    Problem p = load_problem(o.load, &saved_out);
    check_memory_for(p.shape, p.recipe, p.world_size, p.tokens(0), false, o.memory);
    RunResult res;
    Row row = run_one(p, backend, iters, true, &res);
    if (!saved_out.empty()) {
      const bool same = concat(res.out) == saved_out;
      row.note += same ? " out == the file's out (bitwise)" : " out != the file's out";
      row.pass = row.pass && same;
    }
    rows.push_back(row);
    if (!o.save.empty()) writes.push_back({o.save, save_problem(o.save, p, &res)});
  } else {
    const ModelShape shape = shape_of(o);
    const std::vector<int> token_list = tokens_of(o, "64");
    const std::vector<Recipe> recipes = recipes_of(o.recipes);
    check_routing(o.routing);
    const int W = o.ranks;
    for (Recipe r : recipes)
      for (int T : token_list) check_memory_for(shape, r, W, T, true, o.memory);
    const bool several = recipes.size() * token_list.size() > 1;
    for (Recipe r : recipes) {
      for (int T : token_list) {
        Problem p =
            make_random_problem(shape, r, W, std::vector<int>(W, T), o.seed, o.routing, true);
        p.swiglu_limit = o.swiglu_limit;
        p.apply_topk_in_fc1 = o.topk_in_fc1;
        RunResult res;
        memory_stage("running the forward (" + std::string(recipe_name(r)) + ", " +
                     std::to_string(T) + " tokens per rank)");
        Row row = run_one(p, backend, iters, true, &res);
        rows.push_back(row);
        if (!o.save.empty()) {
          const std::string path = save_path(o.save, r, T, several);
          writes.push_back({path, save_problem(path, p, &res)});
        }
      }
    }
  }
  print_table(rows);
  if (o.explain) {
    std::printf("\nlaunch plans (rank 0):\n");
    for (auto& r : rows)
      std::printf("  %-12s T=%-6d %s\n", r.recipe.c_str(), r.tokens, r.plan.c_str());
  }
  if (!writes.empty()) std::printf("\n");
  for (auto& [path, s] : writes) saved(path, s);
  size_t failed = 0;
  for (auto& r : rows) failed += r.pass ? 0 : 1;
  if (failed)
    std::printf(
        "\n%zu of %zu results FAIL (NaN/Inf, missing or outside tolerance): exit status 1\n",
        failed, rows.size());
  return failed ? 1 : 0;
}

}  // namespace

// GPUs visible to this process, counted without initializing CUDA (the per-GPU processes are
// forked from this one): the driver's /proc entries, narrowed by CUDA_VISIBLE_DEVICES.
int visible_gpu_count() {
#if defined(MOE_EP_HAVE_CUDA)
  int n = 0;
  if (DIR* d = opendir("/proc/driver/nvidia/gpus")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    int listed = *v ? 1 : 0;
    for (const char* c = v; *c; ++c) listed += *c == ',';
    n = std::min(n, listed);
  }
  return n;
#else
  return 0;
#endif
}

int main_impl(const std::vector<std::string>& args) {
  Options o = parse(std::vector<std::string>(args.begin() + (args.empty() ? 0 : 1), args.end()));
  if (o.command.empty() || (o.help && o.command.empty())) {
    std::fputs(kUsage, o.command.empty() && !o.help ? stderr : stdout);
    return o.help ? 0 : 2;
  }
  if (o.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (o.command != "run" && o.command != "check" && o.command != "bench") {
    std::fprintf(stderr, "moe-ep: unknown command '%s'\n\n%s", o.command.c_str(), kUsage);
    return 2;
  }
  backend_of(o.backend);  // a bad name is an error before anything runs
  // `moe-ep run` with no placement given uses every GPU present (the largest count that divides
  // the shape's experts), one process each; one GPU runs in this process.
  if (o.command == "run" && o.gpus == 0 && !o.ranks_given && o.backend == "auto" &&
      o.load.empty()) {
    int n = visible_gpu_count();
    if (!o.model.empty()) {
      const int E = Checkpoint(o.model).info().num_experts;
      while (n > 1 && E % n != 0) --n;
    } else if (auto shape = find_shape(o.shape)) {
      const int E = o.experts > 0 ? o.experts : shape->E;
      while (n > 1 && E % n != 0) --n;
    }
    if (n > 1) o.gpus = n;
  }
  if (o.gpus > 0) {
    if (o.backend == "cpu")
      throw Error(ErrorCode::kInvalidArgument, "--gpus runs the CUDA backend, not --backend cpu");
    if (o.ranks_given && o.ranks != o.gpus)
      throw Error(ErrorCode::kInvalidArgument, "--ranks " + std::to_string(o.ranks) +
                                                   " and --gpus " + std::to_string(o.gpus) +
                                                   " disagree (--gpus N runs N ranks)");
    o.ranks = o.gpus;
    o.backend = "cuda";
    set_gpu_processes(true);
    // This process must not initialize CUDA: the per-GPU processes are forked from it.
    std::printf("moe-ep: backend cuda, %d GPU processes, %d CPU threads\n", o.gpus,
                omp_get_max_threads());
  } else {
    std::printf("moe-ep: backend %s (requested %s), %d CPU threads\n",
                backend_name(resolve_backend(backend_of(o.backend))), o.backend.c_str(),
                omp_get_max_threads());
  }
  std::fflush(stdout);
  if (o.command == "run") return cmd_run(o, false);
  if (o.command == "check") return cmd_run(o, true);
  check_routing(o.routing);
  const BenchOptions b{shape_of(o),
                       recipes_of(o.recipes),
                       tokens_of(o, "1,8,32,128"),
                       o.ranks,
                       o.iters ? o.iters : 20,
                       o.seed,
                       o.routing,
                       o.json};
  for (Recipe r : b.recipes)
    check_memory_for(b.shape, r, b.ranks, *std::max_element(b.tokens.begin(), b.tokens.end()), true,
                     o.memory);
  return cmd_bench(b);
}

int main_impl(int argc, char** argv) {
  return main_impl(std::vector<std::string>(argv, argv + argc));
}

int run_main(int argc, char** argv) {
  try {
    return main_impl(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "moe-ep: error: %s\n", out_of_memory_message().c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-ep: error: %s\n", e.what());
    return 2;
  }
}

}  // namespace moe_ep::cli
