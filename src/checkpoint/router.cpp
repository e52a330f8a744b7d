// The routers of the four model families (Checkpoint::route), in fp32 as transformers writes
// them (docs/checkpoints.md §routers):
//   softmax_topk        Qwen3-MoE, Mixtral: p = softmax(x W^T); the k largest; divided by their
//                       sum when norm_topk_prob (Mixtral always)
//   topk_softmax        gpt-oss: l = x W^T + b; the k largest logits; softmax over those k
//   sigmoid_group_topk  DeepSeek-V3: s = sigmoid(x W^T); c = s + e_score_correction_bias; the
//                       topk_group groups (of n_group) with the largest sum of their two best c;
//                       the k largest c within them; weights s of those, divided by their sum
//                       (+1e-20) when norm_topk_prob, times routed_scaling_factor
// Ties go to the lower expert index; the ids come in decreasing order of the score chosen by.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "checkpoint/expert_loaders.h"
#include "moe_ep/status.h"

namespace moe_ep {
namespace io {
namespace {

// The k indices of the largest v (ties: lower index first), in decreasing order.
std::vector<int> top_indices(const std::vector<float>& v, int k) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
    return v[size_t(a)] > v[size_t(b)] || (v[size_t(a)] == v[size_t(b)] && a < b);
  });
  idx.resize(size_t(k));
  return idx;
}

}  // namespace

void route_tokens(const ModelDir& dir, const CheckpointInfo& info, int layer, const float* x,
                  int tokens, int32_t* ids, float* weights) {
  const int64_t E = info.num_experts, H = info.hidden_size;
  const int K = info.top_k;
  const std::string l = "model.layers." + std::to_string(layer) + ".";
  const std::string why = "the router of layer " + std::to_string(layer) +
                          ", E = " + std::to_string(E) + ", H = " + std::to_string(H);
  std::string wname = l + (info.model_type == "gpt_oss" ? "mlp.router.weight" : "mlp.gate.weight");
  if (info.model_type == "mixtral" && !dir.find(wname)) wname = l + "block_sparse_moe.gate.weight";
  const std::vector<float> w = dir.read_floats(dir.require(wname, {"BF16", "F32"}, {E, H}, why));
  std::vector<float> bias;
  if (info.model_type == "gpt_oss")
    bias = dir.read_floats(dir.require(l + "mlp.router.bias", {"BF16", "F32"}, {E}, why));
  if (info.router == "sigmoid_group_topk")
    bias = dir.read_floats(
        dir.require(l + "mlp.gate.e_score_correction_bias", {"BF16", "F32"}, {E}, why));

  std::vector<float> logits(static_cast<size_t>(E));
  for (int t = 0; t < tokens; ++t) {
    const float* xt = x + size_t(t) * size_t(H);
    for (int64_t e = 0; e < E; ++e) {
      double acc = 0;
      const float* we = w.data() + size_t(e) * size_t(H);
      for (int64_t h = 0; h < H; ++h) acc += double(xt[h]) * double(we[h]);
      logits[size_t(e)] = float(acc);
    }
    int32_t* id = ids + size_t(t) * size_t(K);
    float* wt = weights + size_t(t) * size_t(K);
    if (info.router == "softmax_topk") {
      const float m = *std::max_element(logits.begin(), logits.end());
      std::vector<float> p(static_cast<size_t>(E));
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(logits[size_t(e)] - m);
      for (auto& v : p) v /= sum;
      const auto top = top_indices(p, K);
      float s = 0;
      for (int k = 0; k < K; ++k) s += p[size_t(top[size_t(k)])];
      for (int k = 0; k < K; ++k) {
        id[k] = top[size_t(k)];
        wt[k] = info.norm_topk_prob ? p[size_t(top[size_t(k)])] / s : p[size_t(top[size_t(k)])];
      }
    } else if (info.router == "topk_softmax") {
      for (int64_t e = 0; e < E; ++e) logits[size_t(e)] += bias[size_t(e)];
      const auto top = top_indices(logits, K);
      const float m = logits[size_t(top[0])];
      float sum = 0;
      for (int k = 0; k < K; ++k) sum += wt[k] = std::exp(logits[size_t(top[size_t(k)])] - m);
      for (int k = 0; k < K; ++k) id[k] = top[size_t(k)], wt[k] /= sum;
    } else {  // sigmoid_group_topk
      std::vector<float> s(static_cast<size_t>(E)), c(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) {
        s[size_t(e)] = 1.0f / (1.0f + std::exp(-logits[size_t(e)]));
        c[size_t(e)] = s[size_t(e)] + bias[size_t(e)];
      }
      const int G = info.n_group;
      const int64_t per = E / G;
      std::vector<float> group_score(static_cast<size_t>(G));
      for (int g = 0; g < G; ++g) {
        std::vector<float> members(c.begin() + g * per, c.begin() + (g + 1) * per);
        const auto best = top_indices(members, int(std::min<int64_t>(2, per)));
        float sc = 0;
        for (int b : best) sc += members[size_t(b)];
        group_score[size_t(g)] = sc;
      }
      const auto groups = top_indices(group_score, info.topk_group);
      std::vector<float> masked(static_cast<size_t>(E), 0.0f);
      for (int g : groups)
        for (int64_t j = 0; j < per; ++j) masked[size_t(g * per + j)] = c[size_t(g * per + j)];
      const auto top = top_indices(masked, K);
      float sum = 0;
      for (int k = 0; k < K; ++k) sum += s[size_t(top[size_t(k)])];
      for (int k = 0; k < K; ++k) {
        id[k] = top[size_t(k)];
        float v = s[size_t(top[size_t(k)])];
        if (info.norm_topk_prob) v /= sum + 1e-20f;
        wt[k] = v * info.routed_scaling_factor;
      }
    }
  }
}

}  // namespace io
}  // namespace moe_ep
