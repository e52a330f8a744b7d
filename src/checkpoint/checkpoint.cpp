// moe_ep::Checkpoint (include/moe_ep/checkpoint.h): config.json of the four model families, the
// weight format, and the choice of loader; docs/checkpoints.md says what each field means.
#include "moe_ep/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "checkpoint/expert_loaders.h"
#include "checkpoint/model_dir.h"
#include "moe_ep/formats.h"
#include "moe_ep/status.h"

namespace moe_ep {
namespace io {

void checkpoint_error(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, what); }

ExpertNames expert_names(const CheckpointInfo& info, int layer) {
  const std::string l = "model.layers." + std::to_string(layer) + ".";
  ExpertNames n;
  n.fused = l + "mlp.experts.";
  if (info.model_type == "mixtral") {
    n.per_expert = l + "block_sparse_moe.experts.";
    n.gate = "w1", n.up = "w3", n.down = "w2";
  } else {
    n.per_expert = l + "mlp.experts.";
    n.gate = "gate_proj", n.up = "up_proj", n.down = "down_proj";
  }
  return n;
}

void reject_unexpected(const ModelDir& dir, const std::vector<std::string>& prefixes,
                       const std::set<std::string>& expected, const std::string& what) {
  std::vector<std::string> extra;
  for (size_t p = 0; p < prefixes.size(); ++p) {
    if (std::find(prefixes.begin(), prefixes.begin() + long(p), prefixes[p]) !=
        prefixes.begin() + long(p))
      continue;  // the same prefix twice
    for (auto& name : dir.names_with_prefix(prefixes[p]))
      if (!expected.count(name)) extra.push_back(name);
  }
  if (extra.empty()) return;
  std::string list;
  for (size_t i = 0; i < extra.size() && i < 4; ++i) list += (i ? ", '" : "'") + extra[i] + "'";
  if (extra.size() > 4) list += " and " + std::to_string(extra.size() - 4) + " more";
  checkpoint_error("checkpoint " + dir.dir() + ": unexpected tensor(s) " + list + " beside " +
                   what + " (a different format or a corrupt index?)");
}

}  // namespace io

namespace {

using io::checkpoint_error;
using io::JsonFields;

constexpr int64_t kMaxDim = 1 << 20;  // H, I
constexpr int64_t kMaxExperts = 1 << 16;
constexpr int64_t kMaxLayers = 1 << 12;

int bounded(const JsonFields& f, const std::string& key, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    f.bad(key, std::to_string(v) + " is outside [" + std::to_string(lo) + ", " +
                   std::to_string(hi) + "]");
  return int(v);
}

int required_int(const JsonFields& f, const std::string& key, int64_t lo, int64_t hi) {
  return bounded(f, key, f.integer(key), lo, hi);
}

// The first of `keys` present (transformers' attribute_map aliases), required.
int required_int_any(const JsonFields& f, std::initializer_list<const char*> keys, int64_t lo,
                     int64_t hi) {
  for (const char* k : keys)
    if (f.has(k)) return required_int(f, k, lo, hi);
  std::string names;
  for (const char* k : keys) names += (names.empty() ? "" : " or ") + std::string(k);
  f.bad(*keys.begin(), "missing (" + names + " is required)");
}

// The checkpoint's weight format from hf_quant_config.json / config.json quantization_config.
std::string weight_format_of(const io::ModelDir& dir, const JsonFields& cfg,
                             const CheckpointInfo& info) {
  auto modelopt = [&](const JsonFields& q) {
    const std::string algo = q.string("quant_algo");
    if (algo != "NVFP4")
      q.bad("quant_algo", "'" + algo + "' is not supported (this loader reads ModelOpt NVFP4)");
    if (auto g = q.integer_or("group_size"); g && *g != 16)
      q.bad("group_size", std::to_string(*g) + ", expected 16 (NVFP4 blocks)");
    return std::string("nvfp4");
  };
  if (const auto& qc = dir.quant_config()) {
    JsonFields top(*qc, dir.quant_config_path());
    const io::JsonValue* q = top.get("quantization");
    if (!q)
      top.bad("quantization",
              "missing (ModelOpt writes {\"quantization\": {\"quant_algo\": ...}})");
    return modelopt(JsonFields(*q, dir.quant_config_path() + " field 'quantization'"));
  }
  if (const io::JsonValue* q = cfg.get("quantization_config")) {
    JsonFields qf(*q, cfg.source() + " field 'quantization_config'");
    const std::string method = qf.string("quant_method");
    if (method == "mxfp4") {
      if (info.model_type != "gpt_oss")
        qf.bad("quant_method",
               "mxfp4 is read for gpt_oss checkpoints, this one is " + info.model_type);
      return "mxfp4";
    }
    if (method == "modelopt") return modelopt(qf);
    qf.bad("quant_method",
           "'" + method + "' is not supported (bf16, gpt-oss mxfp4 and ModelOpt nvfp4 are)");
  }
  return "bf16";
}

CheckpointInfo parse_config(const io::ModelDir& dir) {
  JsonFields f(dir.config(), dir.config_path());
  CheckpointInfo info;
  info.dir = dir.dir();
  info.model_type = f.string("model_type");
  const std::string& mt = info.model_type;
  info.hidden_size = required_int(f, "hidden_size", 1, kMaxDim);
  info.num_hidden_layers = required_int(f, "num_hidden_layers", 1, kMaxLayers);
  const int L = info.num_hidden_layers;
  if (mt == "qwen3_moe") {
    info.moe_intermediate_size = required_int(f, "moe_intermediate_size", 1, kMaxDim);
    // Qwen3-MoE names E num_experts; transformers 5 writes it as num_local_experts too.
    info.num_experts = required_int_any(f, {"num_experts", "num_local_experts"}, 1, kMaxExperts);
    info.top_k = required_int(f, "num_experts_per_tok", 1, info.num_experts);
    const int step =
        f.has("decoder_sparse_step") ? required_int(f, "decoder_sparse_step", 1, kMaxLayers) : 1;
    const std::vector<int64_t> mlp_only = f.int_list_or_empty("mlp_only_layers");
    for (int l = 0; l < L; ++l)
      if (std::find(mlp_only.begin(), mlp_only.end(), l) == mlp_only.end() && (l + 1) % step == 0)
        info.moe_layers.push_back(l);
    info.router = "softmax_topk";
    info.norm_topk_prob = f.boolean_or("norm_topk_prob").value_or(false);
  } else if (mt == "mixtral") {
    info.moe_intermediate_size = required_int(f, "intermediate_size", 1, kMaxDim);
    info.num_experts = required_int(f, "num_local_experts", 1, kMaxExperts);
    info.top_k = required_int(f, "num_experts_per_tok", 1, info.num_experts);
    for (int l = 0; l < L; ++l) info.moe_layers.push_back(l);
    info.router = "softmax_topk";
    info.norm_topk_prob = true;  // Mixtral always renormalizes its top-k weights
  } else if (mt == "deepseek_v3") {
    info.moe_intermediate_size = required_int(f, "moe_intermediate_size", 1, kMaxDim);
    info.num_experts = required_int(f, "n_routed_experts", 1, kMaxExperts);
    info.top_k = required_int(f, "num_experts_per_tok", 1, info.num_experts);
    const int first_dense =
        f.has("first_k_dense_replace") ? required_int(f, "first_k_dense_replace", 0, L) : 3;
    for (int l = first_dense; l < L; ++l) info.moe_layers.push_back(l);
    info.router = "sigmoid_group_topk";
    info.norm_topk_prob = f.boolean_or("norm_topk_prob").value_or(true);
    info.routed_scaling_factor = float(f.number_or("routed_scaling_factor").value_or(2.5));
    info.n_group = f.has("n_group") ? required_int(f, "n_group", 1, info.num_experts) : 8;
    info.topk_group = f.has("topk_group") ? required_int(f, "topk_group", 1, info.n_group) : 4;
    if (info.num_experts % info.n_group)
      f.bad("n_group", std::to_string(info.n_group) + " does not divide n_routed_experts " +
                           std::to_string(info.num_experts));
    if (info.topk_group > info.n_group)
      f.bad("topk_group",
            std::to_string(info.topk_group) + " exceeds n_group " + std::to_string(info.n_group));
    if (auto s = f.string_or("scoring_func"); s && *s != "sigmoid")
      f.bad("scoring_func", "'" + *s + "', expected 'sigmoid' (DeepSeek-V3's router)");
    info.has_expert_bias = false;
  } else if (mt == "gpt_oss") {
    info.moe_intermediate_size = required_int(f, "intermediate_size", 1, kMaxDim);
    info.num_experts = required_int(f, "num_local_experts", 1, kMaxExperts);
    info.top_k =
        required_int_any(f, {"num_experts_per_tok", "experts_per_token"}, 1, info.num_experts);
    for (int l = 0; l < L; ++l) info.moe_layers.push_back(l);
    const double limit = f.number_or("swiglu_limit").value_or(7.0);
    if (!(limit > 0) || !std::isfinite(limit))
      f.bad("swiglu_limit", std::to_string(limit) + ", expected a finite number > 0");
    info.swiglu_limit = float(limit);
    info.swiglu_alpha = 1.702f;  // transformers' GptOssExperts: alpha 1.702, (up + 1)
    info.swiglu_beta = 1.0f;
    info.has_expert_bias = true;
    info.router = "topk_softmax";
  } else {
    f.bad("model_type", "'" + mt + "' is not one of qwen3_moe, mixtral, deepseek_v3, gpt_oss");
  }
  if (info.moe_layers.empty())
    checkpoint_error(dir.config_path() + ": no decoder layer has routed experts");
  info.weight_format = weight_format_of(dir, f, info);
  info.native_recipe = info.weight_format == "mxfp4"   ? Recipe::kMxfp4Bf16
                       : info.weight_format == "nvfp4" ? Recipe::kNvfp4Bf16
                                                       : Recipe::kBf16;
  if (mt == "gpt_oss" && info.weight_format == "nvfp4")
    checkpoint_error(dir.config_path() + ": a ModelOpt NVFP4 gpt_oss checkpoint is not supported");
  return info;
}

// Recipes a checkpoint of `format` loads into.
bool loads_into(const std::string& format, Recipe r) {
  if (format == "bf16") return true;
  if (format == "mxfp4") return r == Recipe::kMxfp4Bf16 || r == Recipe::kMxfp4Mxfp8;
  return r == Recipe::kNvfp4Bf16 || r == Recipe::kNvfp4;  // nvfp4_experts.cpp's epilogue
}

}  // namespace

struct Checkpoint::Impl {
  explicit Impl(const std::string& d) : dir(d), info(parse_config(dir)) {}
  io::ModelDir dir;
  CheckpointInfo info;
};

Checkpoint::Checkpoint(const std::string& dir) : impl_(std::make_unique<Impl>(dir)) {}
Checkpoint::~Checkpoint() = default;
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;

const CheckpointInfo& Checkpoint::info() const { return impl_->info; }
uint64_t Checkpoint::bytes_read() const { return impl_->dir.bytes_read(); }

LayerCheckpoint Checkpoint::load_layer(int layer, std::optional<Recipe> recipe_opt, int world_size,
                                       int rank) const {
  const CheckpointInfo& info = impl_->info;
  const std::string where = "Checkpoint(" + info.dir + ").load_layer: ";
  if (std::find(info.moe_layers.begin(), info.moe_layers.end(), layer) == info.moe_layers.end()) {
    std::string list;
    for (size_t i = 0; i < info.moe_layers.size() && i < 8; ++i)
      list += (i ? ", " : "") + std::to_string(info.moe_layers[i]);
    if (info.moe_layers.size() > 8) list += ", ...";
    checkpoint_error(where + "layer " + std::to_string(layer) +
                     " has no routed experts; the MoE layers are " + list);
  }
  if (world_size < 1)
    checkpoint_error(where + "world_size " + std::to_string(world_size) + " must be >= 1");
  if (rank < 0 || rank >= world_size)
    checkpoint_error(where + "rank " + std::to_string(rank) + " is outside [0, " +
                     std::to_string(world_size) + ")");
  if (info.num_experts % world_size)
    checkpoint_error(where + "E = " + std::to_string(info.num_experts) +
                     " experts are not divisible by world_size " + std::to_string(world_size) +
                     ": every rank holds E / W experts");
  const Recipe recipe = recipe_opt.value_or(info.native_recipe);
  if (!loads_into(info.weight_format, recipe))
    checkpoint_error(where + "a " + info.weight_format + " checkpoint (" + info.model_type +
                     ") does not load into the " + recipe_name(recipe) + " recipe" +
                     (info.weight_format == "mxfp4" ? " (mxfp4_bf16 or mxfp4_mxfp8)"
                                                    : " (nvfp4_bf16 or nvfp4)"));
  const int El = info.num_experts / world_size;
  const io::ExpertRange range{layer, rank * El, El};

  io::LoadedExperts loaded;
  if (info.weight_format == "mxfp4") {
    loaded = io::load_mxfp4_experts(impl_->dir, info, range);
    loaded.pack.recipe = recipe;  // mxfp4_bf16 and mxfp4_mxfp8 share the layout
  } else if (info.weight_format == "nvfp4") {
    loaded = io::load_nvfp4_experts(impl_->dir, info, range, recipe);
  } else {
    loaded = io::load_bf16_experts(impl_->dir, info, range);
    if (recipe != Recipe::kBf16) {
      // Quantized by the library's packer from the bf16 values (exact in fp32).
      const int H = info.hidden_size, I = info.moe_intermediate_size;
      std::vector<float> w13(loaded.pack.w13.size() / 2), w2(loaded.pack.w2.size() / 2);
      auto widen = [](const std::vector<uint8_t>& b, std::vector<float>& f) {
        for (size_t i = 0; i < f.size(); ++i) {
          uint16_t v;
          std::memcpy(&v, b.data() + 2 * i, 2);
          f[i] = fmt::bf16_to_float(v);
        }
      };
      widen(loaded.pack.w13, w13);
      widen(loaded.pack.w2, w2);
      loaded.pack = pack_expert_weights(recipe, w13.data(), w2.data(), El, H, I);
    }
  }

  LayerCheckpoint out;
  out.layer = layer;
  out.rank = rank;
  out.world_size = world_size;
  LayerConfig& c = out.config;
  c.fleet.num_experts = info.num_experts;
  c.fleet.hidden_size = info.hidden_size;
  c.recipe.recipe = recipe;
  c.recipe.intermediate_size = info.moe_intermediate_size;
  c.recipe.top_k = info.top_k;
  c.recipe.swiglu_limit = info.swiglu_limit;
  c.recipe.swiglu_alpha = info.swiglu_alpha;
  c.recipe.swiglu_beta = info.swiglu_beta;
  c.recipe.input_norm_const = loaded.input_norm_const;
  c.recipe.has_expert_bias = !loaded.fc1_bias.empty() || !loaded.fc2_bias.empty();
  out.experts = std::move(loaded.pack);
  out.fc1_bias = std::move(loaded.fc1_bias);
  out.fc2_bias = std::move(loaded.fc2_bias);
  return out;
}

void Checkpoint::route(int layer, const float* hidden, int tokens, int32_t* ids,
                       float* weights) const {
  const CheckpointInfo& info = impl_->info;
  if (std::find(info.moe_layers.begin(), info.moe_layers.end(), layer) == info.moe_layers.end())
    checkpoint_error("Checkpoint(" + info.dir + ").route: layer " + std::to_string(layer) +
                     " has no routed experts");
  if (tokens < 0)
    checkpoint_error("Checkpoint(" + info.dir + ").route: tokens " + std::to_string(tokens) +
                     " must be >= 0");
  if (tokens == 0) return;
  io::route_tokens(impl_->dir, info, layer, hidden, tokens, ids, weights);
}

WeightPack LayerCheckpoint::weights() const { return experts.view(); }

EpilogueVectors LayerCheckpoint::epilogue() const {
  EpilogueVectors ep = experts.epilogue_view();
  const int64_t El = experts.num_experts, H = experts.hidden, I = experts.inter;
  if (!fc1_bias.empty())
    ep.fc1_bias =
        TensorView::contiguous(const_cast<float*>(fc1_bias.data()), DType::kF32, {El, 2 * I});
  if (!fc2_bias.empty())
    ep.fc2_bias = TensorView::contiguous(const_cast<float*>(fc2_bias.data()), DType::kF32, {El, H});
  return ep;
}

}  // namespace moe_ep
