#include "problem_io.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "moe_ep/config.h"
#include "moe_ep/status.h"

namespace moe_ep::cli {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t d = 0; d < s.size(); ++d) o += (d ? ", " : "") + std::to_string(s[d]);
  return o + "]";
}

// Error helpers that name the file, the tensor, the field, the value found and the one expected.
struct Check {
  const StFile& f;
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(ErrorCode::kInvalidArgument, "--load " + f.label + ": " + why);
  }
  const StTensor& need(const std::string& name, const std::string& role) const {
    auto it = f.tensors.find(name);
    if (it == f.tensors.end()) fail("tensor '" + name + "' is missing (" + role + ")");
    return it->second;
  }
  const StTensor* maybe(const std::string& name) const {
    auto it = f.tensors.find(name);
    return it == f.tensors.end() ? nullptr : &it->second;
  }
  void dtype(const std::string& name, const StTensor& t, std::initializer_list<const char*> ok,
             const std::string& why) const {
    for (const char* d : ok)
      if (t.dtype == d) return;
    std::string list;
    for (const char* d : ok) list += (list.empty() ? "" : " or ") + std::string(d);
    fail("tensor '" + name + "' field dtype is " + t.dtype + ", expected " + list + " (" + why +
         ")");
  }
  void ndim(const std::string& name, const StTensor& t, size_t n, const std::string& layout) const {
    if (t.shape.size() != n)
      fail("tensor '" + name + "' field shape " + shape_str(t.shape) + " has " +
           std::to_string(t.shape.size()) + " dimensions, expected " + std::to_string(n) + " " +
           layout);
  }
  // Dimension d of `name` must equal `want` (what `symbol` is, according to `source`).
  void dim(const std::string& name, const StTensor& t, size_t d, int64_t want,
           const std::string& symbol, const std::string& source) const {
    if (t.shape[d] != want)
      fail("tensor '" + name + "' field shape " + shape_str(t.shape) + ": dimension " +
           std::to_string(d) + " is " + std::to_string(t.shape[d]) + ", expected " + symbol +
           " = " + std::to_string(want) + " (" + source + ")");
  }
  int range(const std::string& what, int64_t v, int64_t lo, int64_t hi,
            const std::string& source) const {
    if (v < lo || v > hi)
      fail(what + " = " + std::to_string(v) + " (" + source + ") is outside [" +
           std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return int(v);
  }
};

const std::set<std::string>& known_tensors() {
  static const std::set<std::string> k = {"w13",
                                          "w2",
                                          "w13_scale",
                                          "w2_scale",
                                          "fc1_alpha",
                                          "fc2_alpha",
                                          "fc1_norm_const",
                                          "hidden_states",
                                          "topk_ids",
                                          "topk_weights",
                                          "out"};
  return k;
}

}  // namespace

ProblemLayout check_problem_header(const StFile& f) {
  const Check c{f};
  ProblemLayout L;
  for (auto& [name, t] : f.tensors)
    if (!known_tensors().count(name))
      c.fail("tensor '" + name +
             "' is not part of a problem file (expected w13, w2, w13_scale, w2_scale, "
             "fc1_alpha, fc2_alpha, fc1_norm_const, hidden_states, topk_ids, topk_weights, out)");

  // Metadata: the recipe and the recipe options.
  auto rit = f.metadata.find("recipe");
  if (rit == f.metadata.end())
    c.fail(
        "metadata 'recipe' is missing (expected one of nvfp4, mxfp4_mxfp8, mxfp4_bf16, bf16, "
        "nvfp4_bf16)");
  const auto recipe = parse_recipe(rit->second);
  if (!recipe)
    c.fail("metadata 'recipe' is '" + rit->second +
           "', expected one of nvfp4, mxfp4_mxfp8, mxfp4_bf16, bf16, nvfp4_bf16");
  L.recipe = *recipe;
  if (auto it = f.metadata.find("swiglu_limit"); it != f.metadata.end()) {
    float v = NAN;
    size_t used = 0;
    try {
      v = std::stof(it->second, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != it->second.size() || !std::isfinite(v) || v <= 0)
      c.fail("metadata 'swiglu_limit' is '" + it->second + "', expected a finite number > 0");
    L.swiglu_limit = v;
  }
  if (auto it = f.metadata.find("apply_topk_in_fc1"); it != f.metadata.end()) {
    if (it->second != "0" && it->second != "1")
      c.fail("metadata 'apply_topk_in_fc1' is '" + it->second + "', expected 0 or 1");
    L.apply_topk_in_fc1 = it->second == "1";
  }
  if (auto it = f.metadata.find("shape"); it != f.metadata.end()) {
    if (it->second.size() > 64)
      c.fail("metadata 'shape' is " + std::to_string(it->second.size()) +
             " characters long, expected at most 64");
    for (char ch : it->second)
      if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f)
        c.fail("metadata 'shape' holds a non-printable character");
    L.shape_name = it->second;
  } else {
    L.shape_name = "loaded";
  }

  // Weights: E, I and H come from w13; w2 and the scales must agree.
  const RecipeTraits rt = recipe_traits(L.recipe);
  const bool q4 = rt.weights_4bit;
  const std::string rname = recipe_name(L.recipe);
  const int pack = q4 ? 2 : 1;  // elements per stored element along the reduction dimension
  const StTensor& w13 = c.need("w13", "fc1 weights [E, 2I, H]");
  const StTensor& w2 = c.need("w2", "fc2 weights [E, H, I]");
  c.dtype(
      "w13", w13,
      q4 ? std::initializer_list<const char*>{"U8"} : std::initializer_list<const char*>{"BF16"},
      "recipe " + rname);
  c.dtype(
      "w2", w2,
      q4 ? std::initializer_list<const char*>{"U8"} : std::initializer_list<const char*>{"BF16"},
      "recipe " + rname);
  const std::string w13_layout = q4 ? "[E, 2I, H/2] (packed E2M1)" : "[E, 2I, H]";
  const std::string w2_layout = q4 ? "[E, H, I/2] (packed E2M1)" : "[E, H, I]";
  c.ndim("w13", w13, 3, w13_layout);
  c.ndim("w2", w2, 3, w2_layout);
  const std::string from13 = "from w13 " + shape_str(w13.shape) + " = " + w13_layout;
  L.E = c.range("E (experts)", w13.shape[0], 1, kMaxLoadExperts, from13);
  if (w13.shape[1] % 2 != 0)
    c.fail("tensor 'w13' field shape " + shape_str(w13.shape) + ": dimension 1 is " +
           std::to_string(w13.shape[1]) + ", expected 2I (an even number: gate and up rows)");
  L.I = c.range("I (intermediate size)", w13.shape[1] / 2, 1, kMaxLoadDim, from13);
  L.H = c.range("H (hidden size)", w13.shape[2] * pack, 1, kMaxLoadDim, from13);
  c.dim("w2", w2, 0, L.E, "E", from13);
  c.dim("w2", w2, 1, L.H, "H", from13);
  c.dim("w2", w2, 2, q4 ? L.I / 2 : L.I, q4 ? "I/2" : "I", from13);
  if (q4) {
    const int blk = rt.weight_block;
    const char* sdt = rt.e4m3_scales ? "F8_E4M3" : "F8_E8M0";
    const std::string why = "recipe " + rname + " scale bytes";
    for (const char* n : {"w13_scale", "w2_scale"}) {
      const StTensor& s = c.need(n, std::string("block scales of recipe ") + rname);
      c.dtype(n, s, {sdt, "U8"}, why);
      c.ndim(n, s, 3,
             std::string(n) == "w13_scale" ? "[E, 2I, H/" + std::to_string(blk) + "]"
                                           : "[E, H, I/" + std::to_string(blk) + "]");
    }
    if (L.H % blk != 0)
      c.fail("H (hidden size) = " + std::to_string(L.H) + " (" + from13 +
             ") is not a multiple of recipe " + rname + "'s scale block " + std::to_string(blk));
    if (L.I % blk != 0)
      c.fail("I (intermediate size) = " + std::to_string(L.I) + " (" + from13 +
             ") is not a multiple of recipe " + rname + "'s scale block " + std::to_string(blk));
    const StTensor& s13 = c.need("w13_scale", "");
    const StTensor& s2 = c.need("w2_scale", "");
    c.dim("w13_scale", s13, 0, L.E, "E", from13);
    c.dim("w13_scale", s13, 1, 2 * int64_t(L.I), "2I", from13);
    c.dim("w13_scale", s13, 2, L.H / blk, "H/" + std::to_string(blk), from13);
    c.dim("w2_scale", s2, 0, L.E, "E", from13);
    c.dim("w2_scale", s2, 1, L.H, "H", from13);
    c.dim("w2_scale", s2, 2, L.I / blk, "I/" + std::to_string(blk), from13);
  } else {
    for (const char* n : {"w13_scale", "w2_scale"})
      if (c.maybe(n))
        c.fail("tensor '" + std::string(n) + "' is present, but recipe bf16 has no scales");
  }
  for (const char* n : {"fc1_alpha", "fc2_alpha", "fc1_norm_const"})
    if (const StTensor* v = c.maybe(n)) {
      c.dtype(n, *v, {"F32"}, "per-expert epilogue vector");
      c.ndim(n, *v, 1, "[E]");
      c.dim(n, *v, 0, L.E, "E", from13);
    }

  // Inputs: W and T from hidden_states, K from topk_ids.
  const StTensor& x = c.need("hidden_states", "inputs [W, T, H]");
  const StTensor& ids = c.need("topk_ids", "routing [W, T, K]");
  const StTensor& tw = c.need("topk_weights", "routing weights [W, T, K]");
  c.dtype("hidden_states", x, {"BF16"}, "activations are bf16");
  c.dtype("topk_ids", ids, {"I32"}, "expert ids are int32");
  c.dtype("topk_weights", tw, {"F32"}, "routing weights are float32");
  c.ndim("hidden_states", x, 3, "[W, T, H]");
  c.ndim("topk_ids", ids, 3, "[W, T, K]");
  c.ndim("topk_weights", tw, 3, "[W, T, K]");
  const std::string fromx = "from hidden_states " + shape_str(x.shape) + " = [W, T, H]";
  L.W = c.range("W (ranks)", x.shape[0], 1, kMaxRanks, fromx);
  L.T = c.range("T (tokens per rank)", x.shape[1], 0, kMaxLoadTokens, fromx);
  c.dim("hidden_states", x, 2, L.H, "H", from13);
  const std::string fromids = "from topk_ids " + shape_str(ids.shape) + " = [W, T, K]";
  c.dim("topk_ids", ids, 0, L.W, "W", fromx);
  c.dim("topk_ids", ids, 1, L.T, "T", fromx);
  L.K =
      c.range("K (top-k)", ids.shape[2], 1, L.E, fromids + "; at most E = " + std::to_string(L.E));
  c.dim("topk_weights", tw, 0, L.W, "W", fromx);
  c.dim("topk_weights", tw, 1, L.T, "T", fromx);
  c.dim("topk_weights", tw, 2, L.K, "K", fromids);
  if (L.E % L.W != 0)
    c.fail("E (experts) = " + std::to_string(L.E) + " (" + from13 +
           ") is not divisible by W (ranks) = " + std::to_string(L.W) + " (" + fromx + ")");
  if (const StTensor* o = c.maybe("out")) {
    c.dtype("out", *o, {"BF16"}, "outputs are bf16");
    c.ndim("out", *o, 3, "[W, T, H]");
    c.dim("out", *o, 0, L.W, "W", fromx);
    c.dim("out", *o, 1, L.T, "T", fromx);
    c.dim("out", *o, 2, L.H, "H", from13);
    L.has_out = true;
  }

  // The library's own rules for this configuration (H and I multiples of 64, K <= 8, ...).
  LayerConfig cfg;
  cfg.fleet.num_experts = L.E;
  cfg.fleet.hidden_size = L.H;
  cfg.fleet.max_tokens_per_rank = std::max(1, L.T);
  cfg.recipe.recipe = L.recipe;
  cfg.recipe.intermediate_size = L.I;
  cfg.recipe.top_k = L.K;
  cfg.recipe.swiglu_limit = L.swiglu_limit;
  cfg.recipe.apply_topk_in_fc1 = L.apply_topk_in_fc1;
  const auto reasons = unsupported_reasons(cfg, L.W, Backend::kCPU);
  if (!reasons.empty()) {
    std::string all;
    for (auto& r : reasons) all += "\n  - " + r;
    c.fail("the file describes a layer moe_ep cannot build (E " + std::to_string(L.E) + ", H " +
           std::to_string(L.H) + ", I " + std::to_string(L.I) + ", K " + std::to_string(L.K) +
           ", W " + std::to_string(L.W) + ", recipe " + rname + "):" + all);
  }
  return L;
}

Problem problem_from_safetensors(StFile& f, const std::function<void(StTensor&)>& read,
                                 std::vector<uint16_t>* saved_out) {
  const ProblemLayout L = check_problem_header(f);
  const Check c{f};
  auto get = [&](const char* name) -> StTensor& {
    StTensor& t = f.tensors.at(name);
    read(t);
    if (t.data.size() != t.nbytes())
      c.fail("tensor '" + std::string(name) + "' has " + std::to_string(t.data.size()) +
             " bytes after reading, expected " + std::to_string(t.nbytes()));
    return t;
  };
  Problem p;
  p.shape = ModelShape{L.shape_name, L.H, L.I, L.E, L.K};
  p.recipe = L.recipe;
  p.world_size = L.W;
  p.capacity = std::max(1, L.T);
  p.swiglu_limit = L.swiglu_limit;
  p.apply_topk_in_fc1 = L.apply_topk_in_fc1;
  p.pack.recipe = L.recipe;
  p.pack.num_experts = L.E;
  p.pack.hidden = L.H;
  p.pack.inter = L.I;

  // Routing first (small): every id in [-1, E), every weight finite.
  const size_t W = L.W, T = L.T, K = L.K, H = L.H;
  const StTensor& ids = get("topk_ids");
  const StTensor& tw = get("topk_weights");
  p.ids.assign(W, std::vector<int32_t>(T * K));
  p.topk_w.assign(W, std::vector<float>(T * K));
  for (size_t r = 0; r < W; ++r) {
    std::memcpy(p.ids[r].data(), ids.data.data() + r * T * K * 4, T * K * 4);
    std::memcpy(p.topk_w[r].data(), tw.data.data() + r * T * K * 4, T * K * 4);
    for (size_t i = 0; i < T * K; ++i) {
      const std::string at = "[" + std::to_string(r) + ", " + std::to_string(i / K) + ", " +
                             std::to_string(i % K) + "]";
      if (p.ids[r][i] < -1 || p.ids[r][i] >= L.E)
        c.fail("tensor 'topk_ids'" + at + " = " + std::to_string(p.ids[r][i]) +
               ", expected an expert id in [-1, E = " + std::to_string(L.E) + ")");
      if (p.ids[r][i] >= 0 && !std::isfinite(p.topk_w[r][i]))  // empty slots: never read
        c.fail("tensor 'topk_weights'" + at + " = " + std::to_string(p.topk_w[r][i]) +
               ", expected a finite number");
    }
  }
  const StTensor& x = get("hidden_states");
  p.x.assign(W, std::vector<uint16_t>(T * H));
  for (size_t r = 0; r < W; ++r)
    std::memcpy(p.x[r].data(), x.data.data() + r * T * H * 2, T * H * 2);

  p.pack.w13 = get("w13").data;
  p.pack.w2 = get("w2").data;
  if (recipe_traits(L.recipe).weights_4bit) {
    p.pack.w13_scale = get("w13_scale").data;
    p.pack.w2_scale = get("w2_scale").data;
  }
  auto vec = [&](const char* name, std::vector<float>& dst) {
    dst.assign(L.E, 1.0f);
    if (!f.tensors.count(name)) return;
    const StTensor& v = get(name);
    std::memcpy(dst.data(), v.data.data(), size_t(L.E) * 4);
    for (int e = 0; e < L.E; ++e)
      if (!std::isfinite(dst[e]))
        c.fail("tensor '" + std::string(name) + "'[" + std::to_string(e) +
               "] = " + std::to_string(dst[e]) + ", expected a finite number");
  };
  vec("fc1_alpha", p.pack.fc1_alpha);
  vec("fc2_alpha", p.pack.fc2_alpha);
  vec("fc1_norm_const", p.pack.fc1_norm_const);
  if (saved_out && L.has_out) {
    const StTensor& o = get("out");
    saved_out->resize(o.data.size() / 2);
    std::memcpy(saved_out->data(), o.data.data(), o.data.size());
  }
  return p;
}

Problem load_problem(const std::string& path, std::vector<uint16_t>* saved_out) {
  StFile f = read_safetensors_header(path);
  return problem_from_safetensors(
      f, [&](StTensor& t) { read_tensor_data(path, f, t); }, saved_out);
}

namespace {

template <class T>
StTensor st(const std::string& dtype, std::vector<int64_t> shape, const T* data, size_t n) {
  StTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(n * sizeof(T));
  if (n) std::memcpy(t.data.data(), data, t.data.size());
  t.loaded = true;
  return t;
}

}  // namespace

SaveSummary save_problem(const std::string& path, const Problem& p, const RunResult* res) {
  StFile f;
  const int64_t E = p.shape.E, H = p.shape.H, I = p.shape.I, K = p.shape.K, W = p.world_size;
  const RecipeTraits rt = recipe_traits(p.recipe);
  const bool q4 = rt.weights_4bit;
  const int blk = rt.weight_block;
  const std::string sdt = rt.e4m3_scales ? "F8_E4M3" : "F8_E8M0";
  if (q4) {
    f.tensors["w13"] = st("U8", {E, 2 * I, H / 2}, p.pack.w13.data(), p.pack.w13.size());
    f.tensors["w2"] = st("U8", {E, H, I / 2}, p.pack.w2.data(), p.pack.w2.size());
    f.tensors["w13_scale"] =
        st(sdt, {E, 2 * I, H / blk}, p.pack.w13_scale.data(), p.pack.w13_scale.size());
    f.tensors["w2_scale"] =
        st(sdt, {E, H, I / blk}, p.pack.w2_scale.data(), p.pack.w2_scale.size());
  } else {
    f.tensors["w13"] =
        st("BF16", {E, 2 * I, H}, reinterpret_cast<const uint16_t*>(p.pack.w13.data()),
           p.pack.w13.size() / 2);
    f.tensors["w2"] = st("BF16", {E, H, I}, reinterpret_cast<const uint16_t*>(p.pack.w2.data()),
                         p.pack.w2.size() / 2);
  }
  f.tensors["fc1_alpha"] = st("F32", {E}, p.pack.fc1_alpha.data(), E);
  f.tensors["fc2_alpha"] = st("F32", {E}, p.pack.fc2_alpha.data(), E);
  f.tensors["fc1_norm_const"] = st("F32", {E}, p.pack.fc1_norm_const.data(), E);
  const int64_t T = p.tokens(0);
  for (int r = 1; r < W; ++r)
    if (p.tokens(r) != T)
      throw Error(ErrorCode::kInvalidArgument,
                  "--save " + path + ": rank " + std::to_string(r) + " has " +
                      std::to_string(p.tokens(r)) + " tokens, rank 0 " + std::to_string(T) +
                      "; the file format needs the same token count on every rank");
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
  if (p.swiglu_limit) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", double(*p.swiglu_limit));  // round-trips a float
    f.metadata["swiglu_limit"] = buf;
  }
  f.metadata["apply_topk_in_fc1"] = p.apply_topk_in_fc1 ? "1" : "0";
  SaveSummary s;
  s.bytes = write_safetensors(path, f);
  s.tensors = f.tensors.size();
  s.what = std::string("weights (") + recipe_name(p.recipe) + ", E " + std::to_string(E) + ", H " +
           std::to_string(H) + ", I " + std::to_string(I) + ", K " + std::to_string(K) +
           "), inputs (W " + std::to_string(W) + " x T " + std::to_string(T) + " tokens)" +
           (res ? ", outputs" : "");
  return s;
}

}  // namespace moe_ep::cli
