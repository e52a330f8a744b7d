// Writes the fuzz target's seed corpus: small valid problem files (every recipe, one and two
// ranks, with and without outputs, with the recipe options set) as `moe-ep --save` writes them,
// and the files of issue 43 that crashed or over-read the old reader (regressions, each to be
// rejected: their names start with "reject-").
//   moe_ep_fuzz_seeds CORPUS_DIR REGRESSIONS_DIR
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "moe_ep/status.h"
#include "problem.h"
#include "problem_io.h"

int main(int argc, char** argv) {
  using namespace moe_ep;
  using namespace moe_ep::cli;
  if (argc != 3) {
    std::fprintf(stderr, "usage: moe_ep_fuzz_seeds CORPUS_DIR REGRESSIONS_DIR\n");
    return 2;
  }
  const std::string reg = argv[2];
  const std::string dir = argv[1];
  const ModelShape shape{"seed", 64, 64, 2, 2};
  int n = 0;
  for (Recipe r : kAllRecipes) {
    for (int W : {1, 2}) {
      const int T = W == 1 ? 3 : 1;
      Problem p =
          make_random_problem(shape, r, W, std::vector<int>(W, T), 11 + W, "uniform", false);
      if (W == 2) {
        p.swiglu_limit = 7.0f;
        p.apply_topk_in_fc1 = true;
        p.ids[0][1] = -1;  // an empty slot
      }
      const RunResult res = run_layers(p, Backend::kCPU, 1);
      const std::string path = dir + "/" + recipe_name(r) + "-w" + std::to_string(W) +
                               (W == 1 ? "-out" : "") + ".safetensors";
      const SaveSummary s = save_problem(path, p, W == 1 ? &res : nullptr);
      std::printf("wrote %s (%llu bytes)\n", path.c_str(), (unsigned long long)s.bytes);
      ++n;
    }
  }
  // Issue 43's files: consistent safetensors, inconsistent problems.
  auto reshape = [](StFile& f, const std::string& name, std::vector<int64_t> shape) {
    StTensor& t = f.tensors.at(name);
    t.shape = std::move(shape);
    t.data.resize(size_t(t.numel()) * st_dtype_bytes(t.dtype));
  };
  auto variant = [&](Recipe r, const ModelShape& s, int T, const char* name,
                     const std::function<void(StFile&)>& change) {
    Problem p = make_random_problem(s, r, 1, {T}, 5, "uniform", false);
    const std::string tmp = reg + "/tmp.safetensors";
    save_problem(tmp, p, nullptr);
    StFile f = read_safetensors(tmp);
    std::remove(tmp.c_str());
    change(f);
    const std::string path = reg + "/" + name + ".safetensors";
    write_safetensors(path, f);
    std::printf("wrote %s\n", path.c_str());
  };
  variant(Recipe::kNvfp4, shape, 2, "reject-w13-half-rows", [&](StFile& f) {
    reshape(f, "w13", {2, 64, 32});
  });
  variant(Recipe::kBf16, ModelShape{"h512", 512, 64, 2, 2}, 2, "reject-hidden-h256-vs-h512",
          [&](StFile& f) {
            reshape(f, "hidden_states", {1, 2, 256});
          });
  variant(Recipe::kBf16, ModelShape{"k4", 64, 64, 4, 4}, 64, "reject-topk-weights-vs-ids",
          [&](StFile& f) {
            reshape(f, "topk_ids", {64, 4});
            reshape(f, "topk_weights", {1, 64, 2});
          });
  return n > 0 ? 0 : 1;
}
