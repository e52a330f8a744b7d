#include "checkpoint_problem.h"

#include <algorithm>
#include <cstring>

#include "checkpoint/safetensors.h"
#include "moe_ep/formats.h"
#include "moe_ep/status.h"

namespace moe_ep::cli {

Problem problem_from_checkpoint(const Checkpoint& ckpt, int layer, Recipe recipe, int world_size) {
  const CheckpointInfo& info = ckpt.info();
  Problem p;
  p.shape = ModelShape{info.model_type, info.hidden_size, info.moe_intermediate_size,
                       info.num_experts, info.top_k};
  p.recipe = recipe;
  p.world_size = world_size;
  p.pack.recipe = recipe;
  p.pack.num_experts = info.num_experts;
  p.pack.hidden = info.hidden_size;
  p.pack.inter = info.moe_intermediate_size;
  auto append = [](auto& dst, const auto& src) { dst.insert(dst.end(), src.begin(), src.end()); };
  for (int r = 0; r < world_size; ++r) {
    const LayerCheckpoint lc = ckpt.load_layer(layer, recipe, world_size, r);
    append(p.pack.w13, lc.experts.w13);
    append(p.pack.w2, lc.experts.w2);
    append(p.pack.w13_scale, lc.experts.w13_scale);
    append(p.pack.w2_scale, lc.experts.w2_scale);
    append(p.pack.fc1_alpha, lc.experts.fc1_alpha);
    append(p.pack.fc2_alpha, lc.experts.fc2_alpha);
    append(p.pack.fc1_norm_const, lc.experts.fc1_norm_const);
    append(p.fc1_bias, lc.fc1_bias);
    append(p.fc2_bias, lc.fc2_bias);
    const RecipeConfig& rc = lc.config.recipe;
    p.swiglu_limit = rc.swiglu_limit;
    p.swiglu_alpha = rc.swiglu_alpha;
    p.swiglu_beta = rc.swiglu_beta;
    p.input_norm_const = rc.input_norm_const;
  }
  return p;
}

void set_checkpoint_master_weights(const Checkpoint& ckpt, int layer, Problem& p) {
  const CheckpointInfo& info = ckpt.info();
  const int E = info.num_experts, H = info.hidden_size, I = info.moe_intermediate_size;
  const size_t n13 = size_t(2) * I * H, n2 = size_t(H) * I;
  p.w13.assign(size_t(E) * n13, 0.0f);
  p.w2.assign(size_t(E) * n2, 0.0f);
  const Recipe native = info.native_recipe;
  const LayerCheckpoint lc = ckpt.load_layer(layer, native, 1, 0);
  const float in_nc = lc.config.recipe.input_norm_const;
  for (int e = 0; e < E; ++e) {
    float* w13 = p.w13.data() + size_t(e) * n13;
    float* w2 = p.w2.data() + size_t(e) * n2;
    dequantize_expert(lc.experts, e, w13, w2);
    if (native == Recipe::kNvfp4 || native == Recipe::kNvfp4Bf16) {
      // alpha = input_scale * weight_scale_2 and input_norm_const = 1 / input_scale, so the
      // weights' global scale is alpha * norm const (fc2: fc2_alpha * fc1_norm_const).
      const float s13 = lc.experts.fc1_alpha[size_t(e)] * in_nc;
      const float s2 = lc.experts.fc2_alpha[size_t(e)] * lc.experts.fc1_norm_const[size_t(e)];
      for (size_t i = 0; i < n13; ++i) w13[i] *= s13;
      for (size_t i = 0; i < n2; ++i) w2[i] *= s2;
    }
  }
}

void make_checkpoint_inputs(const Checkpoint& ckpt, int layer, Problem& p, int tokens_per_rank,
                            uint64_t seed, std::string* note) {
  make_random_inputs(p, std::vector<int>(size_t(p.world_size), tokens_per_rank), seed, "uniform");
  p.capacity = std::max(1, tokens_per_rank);
  const int K = p.shape.K;
  try {
    for (int r = 0; r < p.world_size; ++r) {
      const int T = p.tokens(r);
      std::vector<float> x(p.x[size_t(r)].size());
      for (size_t i = 0; i < x.size(); ++i) x[i] = fmt::bf16_to_float(p.x[size_t(r)][i]);
      std::vector<int32_t> ids(size_t(T) * K);
      std::vector<float> w(size_t(T) * K);
      ckpt.route(layer, x.data(), T, ids.data(), w.data());
      p.ids[size_t(r)] = std::move(ids);
      p.topk_w[size_t(r)] = std::move(w);
    }
    if (note) *note = "";
  } catch (const Error& e) {
    if (note) *note = std::string("uniform routing (the model's router: ") + e.what() + ")";
  }
}

std::optional<GoldenLayer> read_golden_layer(const std::string& path, int layer, int H, int K) {
  io::StFile f = io::read_safetensors_header(path);
  const std::string p = "layer" + std::to_string(layer) + ".";
  if (!f.tensors.count(p + "hidden_states")) return std::nullopt;
  auto need = [&](const std::string& name, const char* dtype, int64_t cols) -> io::StTensor& {
    auto it = f.tensors.find(p + name);
    if (it == f.tensors.end())
      throw Error(ErrorCode::kInvalidArgument,
                  "goldens file " + path + ": tensor '" + p + name + "' is missing");
    io::StTensor& t = it->second;
    if (t.dtype != dtype || t.shape.size() != 2 || t.shape[1] != cols)
      throw Error(ErrorCode::kInvalidArgument,
                  "goldens file " + path + ": tensor '" + p + name + "' is " + t.dtype + " [" +
                      (t.shape.empty() ? "" : std::to_string(t.shape[0])) + ", ...], expected " +
                      dtype + " [T, " + std::to_string(cols) + "]");
    return t;
  };
  io::StTensor& hs = need("hidden_states", "F32", H);
  const int64_t T = hs.shape[0];
  io::StTensor& ids = need("topk_ids", "I32", K);
  io::StTensor& w = need("topk_weights", "F32", K);
  io::StTensor& out = need("routed_output", "F32", H);
  for (io::StTensor* t : {&ids, &w, &out})
    if (t->shape[0] != T)
      throw Error(ErrorCode::kInvalidArgument,
                  "goldens file " + path + ": layer " + std::to_string(layer) + " tensors have " +
                      std::to_string(t->shape[0]) + " and " + std::to_string(T) + " rows");
  for (io::StTensor* t : {&hs, &ids, &w, &out}) io::read_tensor_data(path, f, *t);
  GoldenLayer g;
  g.tokens = int(T);
  g.x.resize(size_t(T) * H);
  for (size_t i = 0; i < g.x.size(); ++i) {
    float v;
    std::memcpy(&v, hs.data.data() + 4 * i, 4);
    g.x[i] = fmt::float_to_bf16(v);
  }
  g.ids.resize(size_t(T) * K);
  std::memcpy(g.ids.data(), ids.data.data(), ids.data.size());
  g.weights.resize(size_t(T) * K);
  std::memcpy(g.weights.data(), w.data.data(), w.data.size());
  g.routed_output.resize(size_t(T) * H);
  for (size_t i = 0; i < g.routed_output.size(); ++i) {
    float v;
    std::memcpy(&v, out.data.data() + 4 * i, 4);
    g.routed_output[i] = v;
  }
  return g;
}

void set_golden_inputs(Problem& p, const GoldenLayer& g) {
  const int W = p.world_size, H = p.shape.H, K = p.shape.K;
  p.x.assign(size_t(W), {});
  p.ids.assign(size_t(W), {});
  p.topk_w.assign(size_t(W), {});
  int most = 1;
  for (int r = 0; r < W; ++r) {
    const size_t a = size_t(int64_t(r) * g.tokens / W), b = size_t(int64_t(r + 1) * g.tokens / W);
    p.x[size_t(r)].assign(g.x.begin() + long(a * H), g.x.begin() + long(b * H));
    p.ids[size_t(r)].assign(g.ids.begin() + long(a * K), g.ids.begin() + long(b * K));
    p.topk_w[size_t(r)].assign(g.weights.begin() + long(a * K), g.weights.begin() + long(b * K));
    most = std::max(most, int(b - a));
  }
  p.capacity = most;
}

}  // namespace moe_ep::cli
