// `moe-ep run --model DIR` on tiny checkpoints written here: every rank loads its own experts,
// the model's router routes random inputs, the CPU fleet at W = 2 equals the reference bitwise,
// and goldens.safetensors is compared when present.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "checkpoint_problem.h"
#include "checkpoint_test_util.h"
#include "cli_test_util.h"
#include "moe_ep/checkpoint.h"

namespace moe_ep::cli::test {
namespace {

using moe_ep::test::ModelDirWriter;

void write_qwen3(ModelDirWriter& w) {
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
    for (int e = 0; e < 4; ++e) {
      const std::string x = p + "experts." + std::to_string(e) + ".";
      w.add_bf16(x + "gate_proj.weight", {64, 64});
      w.add_bf16(x + "up_proj.weight", {64, 64});
      w.add_bf16(x + "down_proj.weight", {64, 64});
    }
    w.add_bf16(p + "gate.weight", {4, 64}, 1.0f);
  }
  w.write(R"({"model_type":"qwen3_moe","hidden_size":64,"moe_intermediate_size":64,)"
          R"("num_experts":4,"num_experts_per_tok":2,"num_hidden_layers":2,"norm_topk_prob":true})",
          2);
}

void write_gpt_oss(ModelDirWriter& w) {
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
    w.add_bytes(p + "gate_up_proj_blocks", "U8", {4, 128, 2, 16});
    w.add_bytes(p + "gate_up_proj_scales", "U8", {4, 128, 2}, 120, 124);
    w.add_bf16(p + "gate_up_proj_bias", {4, 128});
    w.add_bytes(p + "down_proj_blocks", "U8", {4, 64, 2, 16});
    w.add_bytes(p + "down_proj_scales", "U8", {4, 64, 2}, 120, 124);
    w.add_bf16(p + "down_proj_bias", {4, 64});
  }
  // No router tensors: the command routes uniformly and says so.
  w.write(R"({"model_type":"gpt_oss","hidden_size":64,"intermediate_size":64,)"
          R"("num_local_experts":4,"num_experts_per_tok":2,"num_hidden_layers":2,)"
          R"("quantization_config":{"quant_method":"mxfp4"}})");
}

TEST(CliModel, RunsEveryLayerOfABf16CheckpointOnTwoRanksBitwiseEqualToTheReference) {
  ModelDirWriter w;
  write_qwen3(w);
  const CliResult r = run_cli({"run", "--model", w.dir, "--ranks", "2", "--tokens", "5",
                               "--backend", "cpu", "--recipe", "bf16,nvfp4"});
  EXPECT_EQ(r.status, 0) << r.error << r.out;
  EXPECT_MENTIONS(r.out, "qwen3_moe, bf16 weights", "qwen3_moe L0", "qwen3_moe L1", "nvfp4",
                  "bitwise = ref");
  EXPECT_EQ(r.out.find("uniform routing"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
}

TEST(CliModel, GptOssMxfp4WithBiasesRunsAndSaysItRoutesUniformlyWithoutARouter) {
  ModelDirWriter w;
  write_gpt_oss(w);
  const CliResult r = run_cli({"run", "--model", w.dir, "--ranks", "2", "--tokens", "3",
                               "--backend", "cpu", "--layers", "1"});
  EXPECT_EQ(r.status, 0) << r.error << r.out;
  EXPECT_MENTIONS(r.out, "gpt_oss, mxfp4 weights", "gpt_oss L1", "mxfp4_bf16", "bitwise = ref",
                  "uniform routing", "mlp.router.weight' is missing");
  EXPECT_EQ(r.out.find("gpt_oss L0"), std::string::npos);
  // err_vs_fp64 is float64 gpt-oss math (biases, alpha, +1, clamp) on the dequantized weights.
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("PASS   bitwise"), r.out.find("e-03 PASS   bitwise") + 5) << r.out;
}

TEST(CliModel, ModelOptNvfp4MatchesFloat64MathOnItsOwnWeights) {
  // Random E2M1 bytes and E4M3 block scales; global scales as ModelOpt calibrates them
  // (input_scale = amax / (6 * 448) for inputs of amax ~ 4). A wrong epilogue constant (alpha,
  // norm constant) would put err_vs_fp64 near 1; activation quantization alone keeps it ~0.1.
  ModelDirWriter w;
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 4; ++e)
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        const std::string b =
            "model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e) + "." + proj;
        w.add_bytes(b + ".weight", "U8", {64, 32});
        w.add_bytes(b + ".weight_scale", "F8_E4M3", {64, 4}, 0x28, 0x40);
        w.add_f32(b + ".weight_scale_2", {}, {0.01f});
        const bool down = std::string(proj) == "down_proj";
        w.add_f32(b + ".input_scale", {}, {(down ? 3.0f : 4.0f) / 2688.0f * (1 + 0.1f * e)});
      }
  w.write(R"({"model_type":"qwen3_moe","hidden_size":64,"moe_intermediate_size":64,)"
          R"("num_experts":4,"num_experts_per_tok":2,"num_hidden_layers":2})");
  w.write_text("hf_quant_config.json",
               R"({"quantization":{"quant_algo":"NVFP4","group_size":16}})");
  const CliResult r =
      run_cli({"run", "--model", w.dir, "--ranks", "2", "--tokens", "16", "--backend", "cpu"});
  EXPECT_EQ(r.status, 0) << r.error << r.out;
  EXPECT_MENTIONS(r.out, "qwen3_moe, nvfp4 weights", "nvfp4", "bitwise = ref");
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
}

TEST(CliModel, ComparesWithGoldensWhenTheDirectoryHasThem) {
  ModelDirWriter w;
  write_qwen3(w);
  // Goldens made by the library itself at W = 1 (so the error is 0): the plumbing, not the math.
  const Checkpoint ckpt(w.dir);
  Problem p = problem_from_checkpoint(ckpt, 1, Recipe::kBf16, 1);
  make_checkpoint_inputs(ckpt, 1, p, 6, 3, nullptr);
  const RunResult res = run_layers(p, Backend::kCPU, 1);
  ModelDirWriter g;
  std::vector<float> x(p.x[0].size()), out(res.out[0].size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = fmt::bf16_to_float(p.x[0][i]);
  for (size_t i = 0; i < out.size(); ++i) out[i] = fmt::bf16_to_float(res.out[0][i]);
  g.add_f32("layer1.hidden_states", {6, 64}, x);
  g.add_f32("layer1.topk_weights", {6, 2}, p.topk_w[0]);
  g.add_f32("layer1.routed_output", {6, 64}, out);
  std::vector<uint8_t> ids(p.ids[0].size() * 4);
  std::memcpy(ids.data(), p.ids[0].data(), ids.size());
  g.add("layer1.topk_ids", "I32", {6, 2}, ids);
  io::StFile f;
  f.tensors = g.tensors;
  io::write_safetensors(w.file("goldens.safetensors"), f);
  const CliResult r =
      run_cli({"run", "--model", w.dir, "--ranks", "2", "--tokens", "4", "--backend", "cpu"});
  EXPECT_EQ(r.status, 0) << r.error << r.out;
  EXPECT_MENTIONS(r.out, "goldens (", "layer 1   bf16         6 tokens on 2 rank(s)",
                  "routed_output 0.000e+00");
  EXPECT_EQ(r.out.find("layer 0   bf16"), std::string::npos) << r.out;  // no goldens for it
}

TEST(CliModel, CommittedModelsMatchTransformersOnTwoRanks) {
  // tests/data/models (docs/goldens.md): every MoE layer of every committed model, W = 2,
  // bitwise the reference, and within 5e-3 of transformers' routed output in the native recipe.
  const std::vector<std::pair<std::string, int>> models = {{"qwen3_moe", 2},
                                                           {"mixtral", 2},
                                                           {"deepseek_v3", 1},
                                                           {"gpt_oss_mxfp4", 2},
                                                           {"qwen3_moe_nvfp4", 2}};
  for (const auto& [name, layers] : models) {
    SCOPED_TRACE(name);
    const CliResult r = run_cli({"run", "--model", std::string(MOE_EP_MODELS_DIR) + "/" + name,
                                 "--ranks", "2", "--tokens", "3", "--backend", "cpu"});
    EXPECT_EQ(r.status, 0) << r.error << r.out;
    EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("uniform routing"), std::string::npos) << r.out;  // the model's router
    int passed = 0;
    for (size_t at = r.out.find("PASS (<= 5e-3)"); at != std::string::npos;
         at = r.out.find("PASS (<= 5e-3)", at + 1))
      ++passed;
    EXPECT_EQ(passed, layers) << r.out;
  }
}

TEST(CliModel, RefusesBadArguments) {
  ModelDirWriter w;
  write_qwen3(w);
  EXPECT_MENTIONS(run_cli({"run", "--model", w.dir, "--ranks", "3", "--backend", "cpu"}).error,
                  "E = 4", "--ranks 3");
  EXPECT_MENTIONS(run_cli({"run", "--model", w.dir, "--layers", "7", "--backend", "cpu"}).error,
                  "--layers 7");
  EXPECT_MENTIONS(run_cli({"run", "--model", w.dir, "--shape", "tiny"}).error,
                  "--shape cannot be combined with --model");
  EXPECT_MENTIONS(run_cli({"run", "--layers", "1"}).error, "--layers needs --model");
  EXPECT_MENTIONS(run_cli({"run", "--model", w.dir + "/nope", "--backend", "cpu"}).error,
                  "not a directory");
  EXPECT_MENTIONS(run_cli({"run", "--model", w.dir, "--memory", "1000", "--backend", "cpu"}).error,
                  "qwen3_moe (E 4, H 64, I 64, K 2)", "--memory allows");
}

}  // namespace
}  // namespace moe_ep::cli::test
