// moe-ep: run, check and benchmark the MoE-EP layer.
//   moe-ep run    build a layer, run it on the best backend, check it, print a table
//   moe-ep check  compare the backend with the CPU reference for every recipe (exit 1 on failure)
//   moe-ep bench  time the layer (BENCH.md records as JSON)
#include <dirent.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench_cpu.h"
#include "moe_ep/formats.h"
#include "moe_ep/status.h"
#include "problem.h"
#include "safetensors.h"

namespace moe_ep::cli {
namespace {

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
  std::optional<float> swiglu_limit;
  bool topk_in_fc1 = false;
  bool help = false;
};

const char* kUsage =
    "usage: moe-ep <run|check|bench> [options]\n"
    "\n"
    "  run    build a layer of a named shape with random weights (quantized by moe_ep's own\n"
    "         packer) or load one (--load), run the forward on the best backend present, check\n"
    "         it against the CPU reference and float64 math, print a table\n"
    "  check  the reference comparison alone, for every recipe; exit status 1 on a failure\n"
    "  bench  time the forward (median of --iters) and, on the CPU, an OpenBLAS sgemm of the\n"
    "         same dequantized problem; writes BENCH.md records with --json\n"
    "\n"
    "options:\n"
    "  --shape NAME       tiny (default: H 512, I 256, E 16, K 4), qwen3-30b-a3b, dsv3,\n"
    "                     gpt-oss-120b, mixtral-8x7b\n"
    "  --experts E        use E experts instead of the shape's (keeps H, I and K)\n"
    "  --recipe LIST      all (default) or a comma list of nvfp4, mxfp4_mxfp8, mxfp4_bf16, bf16\n"
    "  --tokens LIST      tokens per rank; a comma list runs each (default run/check: 64;\n"
    "                     bench: 1,8,32,128)\n"
    "  --ranks W          EP ranks (CPU: threads in this process; default 1)\n"
    "  --gpus N           EP over N GPUs, one process per GPU started by this command (run\n"
    "                     without --gpus/--ranks/--backend uses every GPU present)\n"
    "                     (CUDA backend; rank r on GPU r; rank 0's outputs table)\n"
    "  --backend B        auto (default), cpu, cuda\n"
    "  --iters N          timed iterations (default 5; bench 20)\n"
    "  --routing R        uniform (default) or zipf\n"
    "  --swiglu-limit L   clamp limit of the activation (default: none)\n"
    "  --topk-in-fc1      apply the top-k weight inside fc1\n"
    "  --seed S           random seed (default 1)\n"
    "  --load FILE        safetensors with w13, w2[, w13_scale, w2_scale, fc1_alpha, fc2_alpha,\n"
    "                     fc1_norm_const], hidden_states [W,T,H], topk_ids, topk_weights [W,T,K]\n"
    "                     and metadata 'recipe'; an 'out' tensor, if present, is compared bitwise\n"
    "  --save FILE        write weights, inputs and outputs as safetensors (loadable by --load)\n"
    "  --json FILE        bench: write the records as JSON\n";

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

int to_int(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    const int r = std::stoi(v, &used);
    if (used == v.size()) return r;
  } catch (...) {
  }
  throw Error(ErrorCode::kInvalidArgument, flag + " wants an integer, got '" + v + "'");
}

Options parse(int argc, char** argv) {
  Options o;
  std::vector<std::string> a(argv + 1, argv + argc);
  size_t i = 0;
  if (!a.empty() && a[0][0] != '-') o.command = a[i++];
  auto value = [&](const std::string& flag) -> std::string {
    if (i + 1 >= a.size()) throw Error(ErrorCode::kInvalidArgument, flag + " needs a value");
    return a[++i];
  };
  for (; i < a.size(); ++i) {
    const std::string& f = a[i];
    if (f == "-h" || f == "--help")
      o.help = true;
    else if (f == "--shape")
      o.shape = value(f);
    else if (f == "--experts")
      o.experts = to_int(f, value(f));
    else if (f == "--recipe")
      o.recipes = value(f);
    else if (f == "--tokens")
      o.tokens = value(f);
    else if (f == "--ranks")
      o.ranks = to_int(f, value(f)), o.ranks_given = true;
    else if (f == "--backend")
      o.backend = value(f);
    else if (f == "--gpus")
      o.gpus = to_int(f, value(f));
    else if (f == "--iters")
      o.iters = to_int(f, value(f));
    else if (f == "--seed")
      o.seed = uint64_t(to_int(f, value(f)));
    else if (f == "--routing")
      o.routing = value(f);
    else if (f == "--load")
      o.load = value(f);
    else if (f == "--save")
      o.save = value(f);
    else if (f == "--json")
      o.json = value(f);
    else if (f == "--swiglu-limit")
      o.swiglu_limit = std::stof(value(f));
    else if (f == "--topk-in-fc1")
      o.topk_in_fc1 = true;
    else
      throw Error(ErrorCode::kInvalidArgument, "unknown option '" + f + "' (see --help)");
  }
  return o;
}

std::vector<Recipe> recipes_of(const std::string& list) {
  if (list == "all")
    return {Recipe::kNvfp4, Recipe::kMxfp4Mxfp8, Recipe::kMxfp4Bf16, Recipe::kBf16};
  std::vector<Recipe> out;
  for (auto& n : split(list)) {
    auto r = parse_recipe(n);
    if (!r)
      throw Error(ErrorCode::kInvalidArgument,
                  "recipe '" + n + "' is not one of: nvfp4, mxfp4_mxfp8, mxfp4_bf16, bf16");
    out.push_back(*r);
  }
  return out;
}

Backend backend_of(const std::string& b) {
  if (b == "auto") return Backend::kAuto;
  if (b == "cpu") return Backend::kCPU;
  if (b == "cuda") return Backend::kCUDA;
  throw Error(ErrorCode::kInvalidArgument, "backend '" + b + "' is not one of: auto, cpu, cuda");
}

ModelShape shape_of(const Options& o) {
  auto s = find_shape(o.shape);
  if (!s) {
    std::string names;
    for (auto& m : model_shapes()) names += (names.empty() ? "" : ", ") + m.name;
    throw Error(ErrorCode::kInvalidArgument, "shape '" + o.shape + "' is not one of: " + names);
  }
  if (o.experts > 0) s->E = o.experts;
  return *s;
}

std::vector<int> tokens_of(const Options& o, const char* fallback) {
  std::vector<int> out;
  for (auto& t : split(o.tokens.empty() ? fallback : o.tokens)) {
    out.push_back(to_int("--tokens", t));
    if (out.back() < 0) throw Error(ErrorCode::kInvalidArgument, "--tokens: " + t + " is negative");
  }
  if (out.empty()) throw Error(ErrorCode::kInvalidArgument, "--tokens: no token count given");
  return out;
}

// --- safetensors I/O of a whole problem -------------------------------------------------------

template <class T>
StTensor st(const std::string& dtype, std::vector<int64_t> shape, const T* data, size_t n) {
  StTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(n * sizeof(T));
  std::memcpy(t.data.data(), data, t.data.size());
  return t;
}

void save_problem(const std::string& path, const Problem& p, const RunResult* res) {
  StFile f;
  const int64_t E = p.shape.E, H = p.shape.H, I = p.shape.I, K = p.shape.K, W = p.world_size;
  const bool q4 = recipe_traits(p.recipe).weights_4bit;
  const int blk = recipe_traits(p.recipe).weight_block;
  const std::string sdt = recipe_traits(p.recipe).e4m3_scales ? "F8_E4M3" : "U8";
  if (q4) {
    f.tensors["w13"] = st("U8", {E, 2 * I, H / 2}, p.pack.w13.data(), p.pack.w13.size());
    f.tensors["w2"] = st("U8", {E, H, I / 2}, p.pack.w2.data(), p.pack.w2.size());
    f.tensors["w13_scale"] =
        st(sdt, {E, 2 * I, H / blk}, p.pack.w13_scale.data(), p.pack.w13_scale.size());
    f.tensors["w2_scale"] =
        st(sdt, {E, H, I / blk}, p.pack.w2_scale.data(), p.pack.w2_scale.size());
  } else {
    f.tensors["w13"] = st("BF16", {E, 2 * I, H}, p.pack.w13.data(), p.pack.w13.size());
    f.tensors["w2"] = st("BF16", {E, H, I}, p.pack.w2.data(), p.pack.w2.size());
  }
  f.tensors["fc1_alpha"] = st("F32", {E}, p.pack.fc1_alpha.data(), E);
  f.tensors["fc2_alpha"] = st("F32", {E}, p.pack.fc2_alpha.data(), E);
  f.tensors["fc1_norm_const"] = st("F32", {E}, p.pack.fc1_norm_const.data(), E);
  const int64_t T = p.tokens(0);
  for (int r = 1; r < W; ++r)
    if (p.tokens(r) != T)
      throw Error(ErrorCode::kInvalidArgument, "--save needs the same token count on every rank");
  std::vector<uint16_t> x;
  std::vector<int32_t> ids;
  std::vector<float> tw;
  std::vector<uint16_t> out;
  for (int r = 0; r < W; ++r) {
    x.insert(x.end(), p.x[r].begin(), p.x[r].end());
    ids.insert(ids.end(), p.ids[r].begin(), p.ids[r].end());
    tw.insert(tw.end(), p.topk_w[r].begin(), p.topk_w[r].end());
    if (res) out.insert(out.end(), res->out[r].begin(), res->out[r].end());
  }
  f.tensors["hidden_states"] = st("BF16", {W, T, H}, x.data(), x.size());
  f.tensors["topk_ids"] = st("I32", {W, T, K}, ids.data(), ids.size());
  f.tensors["topk_weights"] = st("F32", {W, T, K}, tw.data(), tw.size());
  if (res) f.tensors["out"] = st("BF16", {W, T, H}, out.data(), out.size());
  f.metadata["recipe"] = recipe_name(p.recipe);
  f.metadata["shape"] = p.shape.name;
  if (p.swiglu_limit) f.metadata["swiglu_limit"] = std::to_string(*p.swiglu_limit);
  f.metadata["apply_topk_in_fc1"] = p.apply_topk_in_fc1 ? "1" : "0";
  write_safetensors(path, f);
}

Problem load_problem(const std::string& path, std::vector<uint16_t>* saved_out) {
  StFile f = read_safetensors(path);
  auto need = [&](const char* name) -> StTensor& {
    auto it = f.tensors.find(name);
    if (it == f.tensors.end())
      throw Error(ErrorCode::kInvalidArgument, path + " has no tensor '" + name + "'");
    return it->second;
  };
  Problem p;
  auto rit = f.metadata.find("recipe");
  if (rit == f.metadata.end() || !parse_recipe(rit->second))
    throw Error(ErrorCode::kInvalidArgument, path + ": metadata 'recipe' is missing or unknown");
  p.recipe = *parse_recipe(rit->second);
  const bool q4 = recipe_traits(p.recipe).weights_4bit;
  StTensor& w13 = need("w13");
  StTensor& w2 = need("w2");
  StTensor& x = need("hidden_states");
  StTensor& ids = need("topk_ids");
  StTensor& tw = need("topk_weights");
  if (w13.shape.size() != 3 || w2.shape.size() != 3 || x.shape.size() != 3 ||
      ids.shape.size() != 3 || tw.shape.size() != 3)
    throw Error(ErrorCode::kInvalidArgument,
                path + ": w13, w2 must be 3-D; hidden_states, topk_ids, topk_weights [W, T, *]");
  p.shape.name = f.metadata.count("shape") ? f.metadata["shape"] : "loaded";
  p.shape.E = int(w13.shape[0]);
  p.shape.H = int(w2.shape[1]);
  p.shape.I = int(q4 ? w2.shape[2] * 2 : w2.shape[2]);
  p.shape.K = int(ids.shape[2]);
  p.world_size = int(x.shape[0]);
  const int T = int(x.shape[1]);
  p.capacity = std::max(1, T);
  if (f.metadata.count("swiglu_limit")) p.swiglu_limit = std::stof(f.metadata["swiglu_limit"]);
  p.apply_topk_in_fc1 =
      f.metadata.count("apply_topk_in_fc1") && f.metadata["apply_topk_in_fc1"] == "1";
  p.pack.recipe = p.recipe;
  p.pack.num_experts = p.shape.E;
  p.pack.hidden = p.shape.H;
  p.pack.inter = p.shape.I;
  p.pack.w13 = w13.data;
  p.pack.w2 = w2.data;
  if (q4) {
    p.pack.w13_scale = need("w13_scale").data;
    p.pack.w2_scale = need("w2_scale").data;
  }
  auto vec = [&](const char* name, std::vector<float>& dst) {
    dst.assign(p.shape.E, 1.0f);
    auto it = f.tensors.find(name);
    if (it != f.tensors.end()) {
      if (it->second.data.size() != size_t(p.shape.E) * 4)
        throw Error(ErrorCode::kInvalidArgument, path + ": " + name + " must be f32 [E]");
      std::memcpy(dst.data(), it->second.data.data(), it->second.data.size());
    }
  };
  vec("fc1_alpha", p.pack.fc1_alpha);
  vec("fc2_alpha", p.pack.fc2_alpha);
  vec("fc1_norm_const", p.pack.fc1_norm_const);
  const size_t H = p.shape.H, K = p.shape.K;
  if (x.dtype != "BF16" || ids.dtype != "I32" || tw.dtype != "F32")
    throw Error(ErrorCode::kInvalidArgument,
                path + ": hidden_states must be BF16, topk_ids I32, topk_weights F32");
  p.x.resize(p.world_size);
  p.ids.resize(p.world_size);
  p.topk_w.resize(p.world_size);
  for (int r = 0; r < p.world_size; ++r) {
    p.x[r].resize(T * H);
    std::memcpy(p.x[r].data(), x.data.data() + r * T * H * 2, T * H * 2);
    p.ids[r].resize(T * K);
    std::memcpy(p.ids[r].data(), ids.data.data() + r * T * K * 4, T * K * 4);
    p.topk_w[r].resize(T * K);
    std::memcpy(p.topk_w[r].data(), tw.data.data() + r * T * K * 4, T * K * 4);
  }
  auto oit = f.tensors.find("out");
  if (saved_out && oit != f.tensors.end()) {
    saved_out->resize(oit->second.data.size() / 2);
    std::memcpy(saved_out->data(), oit->second.data.data(), oit->second.data.size());
  }
  return p;
}

// --- commands ---------------------------------------------------------------------------------

struct Row {
  std::string backend, shape, recipe;
  int ranks, tokens;
  double ms, err_ref, err_fp64;
  bool nan;
  std::string note;
};

void print_table(const std::vector<Row>& rows) {
  std::printf("\n%-7s %-16s %-12s %5s %7s %10s %12s %12s  %s\n", "backend", "shape", "recipe",
              "ranks", "tokens", "time(ms)", "err_vs_ref", "err_vs_fp64", "note");
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
    std::printf("%-7s %-16s %-12s %5d %7d %10.3f %12s %12s  %s%s\n", r.backend.c_str(),
                r.shape.c_str(), r.recipe.c_str(), r.ranks, r.tokens, r.ms, e1, e2,
                r.nan ? "NaN! " : "", r.note.c_str());
  }
  std::printf(
      "\nerr_vs_ref: rel. L2 vs the CPU reference of the same recipe (W = 1); "
      "err_vs_fp64: vs float64 math on the unquantized weights.\n");
}

std::vector<uint16_t> concat(const std::vector<std::vector<uint16_t>>& v) {
  std::vector<uint16_t> o;
  for (auto& x : v) o.insert(o.end(), x.begin(), x.end());
  return o;
}

// Runs one problem on the chosen backend and on the reference; fills a table row.
Row run_one(const Problem& p, Backend backend, int iters, bool verbose, RunResult* keep) {
  if (verbose)
    std::fprintf(stderr, "[moe-ep] %s: forward on %d rank(s), %d token(s)/rank...\n",
                 recipe_name(p.recipe), p.world_size, p.tokens(0));
  RunResult res = run_layers(p, backend, iters);
  Row row{backend_name(res.backend),
          p.shape.name,
          recipe_name(p.recipe),
          p.world_size,
          p.tokens(0),
          res.median_ms,
          NAN,
          NAN,
          false,
          ""};
  std::vector<uint16_t> got = concat(res.out);
  row.nan = has_nan(got);
  const bool is_reference = res.backend == Backend::kCPU && p.world_size == 1;
  if (is_reference) {
    row.note = "(is the reference)";
  } else {
    // The reference: the CPU backend, all experts on one rank.
    Problem ref = p;
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
  if (keep) *keep = std::move(res);
  return row;
}

int cmd_run(const Options& o, bool check_only) {
  const Backend backend = backend_of(o.backend);
  std::vector<Row> rows;
  bool failed = false;
  if (!o.load.empty()) {
    std::vector<uint16_t> saved;
    Problem p = load_problem(o.load, &saved);
    RunResult res;
    Row row = run_one(p, backend, o.iters ? o.iters : 5, true, &res);
    if (!saved.empty()) {
      const bool same = concat(res.out) == saved;
      row.note += same ? " out == saved out (bitwise)" : " out != saved out";
      failed = failed || !same;
    }
    rows.push_back(row);
  } else {
    const ModelShape shape = shape_of(o);
    const std::vector<int> token_list = tokens_of(o, "64");
    for (Recipe r : recipes_of(o.recipes)) {
      for (int T : token_list) {
        Problem p = make_random_problem(shape, r, o.ranks, std::vector<int>(o.ranks, T), o.seed,
                                        o.routing, true);
        p.swiglu_limit = o.swiglu_limit;
        p.apply_topk_in_fc1 = o.topk_in_fc1;
        RunResult res;
        Row row = run_one(p, backend, check_only ? 1 : (o.iters ? o.iters : 5), true, &res);
        // Tolerances: SPEC §7 against the reference; against float64 a gross-error bound per
        // recipe (4-bit weights carry ~10% error, bf16 well under 1%).
        const double fp64_bound = r == Recipe::kBf16 ? 0.02 : 0.35;
        const bool ok = !row.nan && (std::isnan(row.err_ref) || row.err_ref <= 5e-3) &&
                        (std::isnan(row.err_fp64) || row.err_fp64 <= fp64_bound) &&
                        row.note != "DIFFERS";
        if (check_only) row.note += ok ? " PASS" : " FAIL";
        failed = failed || !ok;
        rows.push_back(row);
        if (!o.save.empty()) save_problem(o.save, p, &res);
      }
    }
  }
  print_table(rows);
  if (failed) std::printf("\nsome results are outside tolerance\n");
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

int main_impl(int argc, char** argv) {
  Options o = parse(argc, argv);
  // `moe-ep run` with no placement given uses every GPU present (the largest count that divides
  // the shape's experts), one process each; one GPU runs in this process.
  if (o.command == "run" && o.gpus == 0 && !o.ranks_given && o.backend == "auto" &&
      o.load.empty()) {
    int n = visible_gpu_count();
    if (auto shape = find_shape(o.shape)) {
      const int E = o.experts > 0 ? o.experts : shape->E;
      while (n > 1 && E % n != 0) --n;
    }
    if (n > 1) o.gpus = n;
  }
  if (o.command.empty() || (o.help && o.command.empty())) {
    std::fputs(kUsage, o.command.empty() && !o.help ? stderr : stdout);
    return o.help ? 0 : 2;
  }
  if (o.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (o.gpus > 0) {
    if (o.backend == "cpu")
      throw Error(ErrorCode::kInvalidArgument, "--gpus runs the CUDA backend, not --backend cpu");
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
  if (o.command == "bench") {
    const BenchOptions b{shape_of(o),
                         recipes_of(o.recipes),
                         tokens_of(o, "1,8,32,128"),
                         o.ranks,
                         o.iters ? o.iters : 20,
                         o.seed,
                         o.routing,
                         o.json};
    return cmd_bench(b);
  }
  std::fprintf(stderr, "moe-ep: unknown command '%s'\n\n%s", o.command.c_str(), kUsage);
  return 2;
}

}  // namespace moe_ep::cli

int main(int argc, char** argv) {
  try {
    return moe_ep::cli::main_impl(argc, argv);
  } catch (const moe_ep::Error& e) {
    std::fprintf(stderr, "moe-ep: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-ep: error: %s\n", e.what());
    return 2;
  }
}
