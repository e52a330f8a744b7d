// The fuzz target's work on one input, shared by the libFuzzer target (fuzz_load.cpp) and the
// unit test that replays the seed corpus and every crash found (tests/unit/test_fuzz_replay.cpp).
//
// Every input goes through both paths the command has: the in-memory parser
// (parse_safetensors_buffer + problem_from_safetensors) and the file reader that --load uses
// (read_safetensors_header + read_tensor_data via load_problem), which must agree: both reject
// it with a moe_ep::Error, or both accept it with the same problem. A small accepted problem is
// then run on the CPU backend, whose output must have every value. Anything else (another
// exception, a disagreement, a sanitizer report) is a crash.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "moe_ep/status.h"
#include "problem.h"
#include "problem_io.h"

namespace moe_ep::cli::fuzz {

inline std::string temp_path() {
  static const std::string p = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/moe_ep_fuzz_" + std::to_string(getpid()) +
           ".safetensors";
  }();
  return p;
}

[[noreturn]] inline void disagree(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_load: %s: %s\n", what, detail.c_str());
  std::abort();
}

// Bitwise: a NaN weight of an empty slot (never read, so accepted) is not == itself.
template <class T>
inline bool same_bits(const std::vector<std::vector<T>>& a, const std::vector<std::vector<T>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() ||
        (!a[i].empty() && std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(T)) != 0))
      return false;
  return true;
}

inline bool same_problem(const Problem& a, const Problem& b) {
  return a.recipe == b.recipe && a.world_size == b.world_size && a.shape.E == b.shape.E &&
         a.shape.H == b.shape.H && a.shape.I == b.shape.I && a.shape.K == b.shape.K && a.x == b.x &&
         a.ids == b.ids && same_bits(a.topk_w, b.topk_w) && a.pack.w13 == b.pack.w13 &&
         a.pack.w2 == b.pack.w2 && a.pack.w13_scale == b.pack.w13_scale &&
         a.pack.w2_scale == b.pack.w2_scale && a.pack.fc1_alpha == b.pack.fc1_alpha &&
         a.pack.fc2_alpha == b.pack.fc2_alpha && a.pack.fc1_norm_const == b.pack.fc1_norm_const &&
         a.swiglu_limit == b.swiglu_limit && a.apply_topk_in_fc1 == b.apply_topk_in_fc1;
}

// One input; returns true when it was accepted as a problem. Aborts on a finding.
inline bool load_one(const uint8_t* data, size_t size) {
  // Path 1: from memory.
  std::string mem_error;
  Problem mem;
  std::vector<uint16_t> mem_out;
  try {
    StFile f = parse_safetensors_buffer(data, size, "fuzz", true);
    mem = problem_from_safetensors(
        f, [](StTensor&) {}, &mem_out);
  } catch (const Error& e) {
    mem_error = e.what();
  }

  // Path 2: the file reader of --load.
  {
    std::ofstream o(temp_path(), std::ios::binary | std::ios::trunc);
    o.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  std::string file_error;
  Problem file;
  std::vector<uint16_t> file_out;
  try {
    file = load_problem(temp_path(), &file_out);
  } catch (const Error& e) {
    file_error = e.what();
  }
  if (mem_error.empty() != file_error.empty())
    disagree("the buffer and file readers disagree",
             "buffer: '" + mem_error + "', file: '" + file_error + "'");
  if (!mem_error.empty()) return false;
  if (!same_problem(mem, file) || mem_out != file_out)
    disagree("the buffer and file readers built different problems", "");

  // Run what was accepted when it is small (the library checks it again).
  const Problem& p = mem;
  const size_t weights = size_t(p.shape.E) * p.shape.H * p.shape.I;
  size_t tokens = 0;
  for (int r = 0; r < p.world_size; ++r) tokens += size_t(p.tokens(r));
  if (weights > size_t(8) * 128 * 128 || tokens > 64 || p.world_size > 4) return true;
  try {
    const RunResult res = run_layers(p, Backend::kCPU, 1);
    for (int r = 0; r < p.world_size; ++r)
      if (res.out[r].size() != size_t(p.tokens(r)) * p.shape.H)
        disagree("output size", std::to_string(res.out[r].size()));
  } catch (const Error&) {
    // e.g. a NaN scale byte: the library's own rejection.
  }
  return true;
}

}  // namespace moe_ep::cli::fuzz
