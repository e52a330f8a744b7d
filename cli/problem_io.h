// A whole problem (weights, inputs, optionally outputs) as one safetensors file: what
// `moe-ep --save` writes and `--load` reads.
//
// Loading checks every tensor's dtype and shape against every other tensor's and against the
// metadata (recipe, swiglu_limit, apply_topk_in_fc1) and the library's own configuration rules
// before a single tensor byte is read; the values that need the data (topk_ids in range,
// finite topk_weights) are checked right after reading, before anything runs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "problem.h"

namespace moe_ep::cli {

// The safetensors reader and writer of the core library (src/checkpoint/safetensors.h).
using io::parse_safetensors_buffer;
using io::read_safetensors;
using io::read_safetensors_header;
using io::read_tensor_data;
using io::st_dtype_bytes;
using io::StFile;
using io::StTensor;
using io::write_safetensors;

// The problem's dimensions as the header of a file says them (checked for consistency).
struct ProblemLayout {
  Recipe recipe = Recipe::kBf16;
  int E = 0, H = 0, I = 0, K = 0, W = 0, T = 0;
  std::optional<float> swiglu_limit;
  bool apply_topk_in_fc1 = false;
  std::string shape_name;
  bool has_out = false;
};

// Limits of what --load accepts (beyond the library's own rules).
constexpr int kMaxLoadExperts = 1 << 16;
constexpr int kMaxLoadDim = 1 << 20;     // H and I
constexpr int kMaxLoadTokens = 1 << 24;  // T per rank
constexpr int kMaxRanks = 64;

// Checks the header of a problem file; throws moe_ep::Error naming the file, the tensor, the
// field, the value found and the value expected.
ProblemLayout check_problem_header(const StFile& f);

// Builds the problem from a checked header; `read` fills a tensor's bytes (from the file or a
// buffer). `saved_out` (may be null) receives the file's 'out' tensor if it has one.
Problem problem_from_safetensors(StFile& f, const std::function<void(StTensor&)>& read,
                                 std::vector<uint16_t>* saved_out);

Problem load_problem(const std::string& path, std::vector<uint16_t>* saved_out);

struct SaveSummary {
  uint64_t bytes = 0;
  size_t tensors = 0;
  std::string what;  // e.g. "weights (nvfp4, E 16, H 512, I 256), inputs [W 1, T 64], out"
};
SaveSummary save_problem(const std::string& path, const Problem& p, const RunResult* res);

}  // namespace moe_ep::cli
