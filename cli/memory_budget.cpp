#include "memory_budget.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include "moe_ep/config.h"
#include "moe_ep/status.h"

namespace moe_ep::cli {
namespace {

std::mutex g_stage_mutex;
std::string g_stage = "starting";

}  // namespace

std::string gigabytes(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB", double(bytes) / 1e9);
  return buf;
}

uint64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

MemoryNeed memory_need(const ModelShape& s, Recipe recipe, int ranks, int tokens, bool master) {
  const RecipeTraits t = recipe_traits(recipe);
  const uint64_t weights_per_expert = 3ull * uint64_t(s.I) * uint64_t(s.H);
  // Packed bytes per weight: half a byte plus a scale byte per block (4-bit), 2 bytes (bf16).
  const double packed_per_weight = t.weights_4bit ? 0.5 + 1.0 / t.weight_block : 2.0;
  MemoryNeed m;
  // The pack, the reference's copy and the copy a layer holds; fp32 master weights (and the
  // packer's work) for random problems.
  const double per_expert =
      double(weights_per_expert) * ((master ? 4.0 : 0.0) + 3.0 * packed_per_weight);
  m.per_expert = uint64_t(per_expert);
  m.master = master ? uint64_t(s.E) * weights_per_expert * 4 : 0;
  m.packed = uint64_t(double(s.E) * double(weights_per_expert) * packed_per_weight);
  // Per token and rank: activations, outputs and their copies, the float64 reference, the
  // workspaces (receive areas of every rank, the K combine rows).
  const uint64_t n = uint64_t(ranks) * uint64_t(tokens);
  m.tokens =
      n * uint64_t(s.H) * (26 + 4 * uint64_t(s.K) + 2 * uint64_t(ranks)) + n * uint64_t(s.K) * 16;
  m.total = uint64_t(s.E) * m.per_expert + m.tokens;
  return m;
}

void check_memory_for(const ModelShape& s, Recipe recipe, int ranks, int tokens, bool master,
                      uint64_t budget) {
  const uint64_t avail = budget ? budget : available_memory_bytes();
  if (avail == 0) return;  // unknown: let the allocation decide
  const MemoryNeed m = memory_need(s, recipe, ranks, tokens, master);
  if (m.total <= avail) return;
  std::ostringstream o;
  o << "shape " << s.name << " (E " << s.E << ", H " << s.H << ", I " << s.I << ", K " << s.K
    << ") with recipe " << recipe_name(recipe) << ", " << tokens << " tokens per rank on " << ranks
    << " rank(s) needs about " << gigabytes(m.total) << " of host memory (";
  if (master) o << "fp32 master weights " << gigabytes(m.master) << ", ";
  o << "packed weights 3 x " << gigabytes(m.packed) << ", tokens and workspaces "
    << gigabytes(m.tokens) << "); " << (budget ? "--memory allows " : "this machine has ")
    << gigabytes(avail) << (budget ? "" : " available");
  // The largest expert count that fits (a multiple of the ranks, at least K).
  if (m.tokens < avail && m.per_expert > 0) {
    int64_t n = int64_t((avail - m.tokens) / m.per_expert);
    n -= n % ranks;
    if (n >= s.K && n >= ranks) {
      o << "; use --experts N with N <= " << n << " (a multiple of the " << ranks
        << " rank(s), at least K = " << s.K << ")";
      throw Error(ErrorCode::kInvalidArgument, o.str());
    }
  }
  o << "; use fewer --tokens, fewer --experts or a smaller --shape";
  throw Error(ErrorCode::kInvalidArgument, o.str());
}

void memory_stage(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_stage_mutex);
  g_stage = what;
}

std::string out_of_memory_message() {
  std::string stage;
  {
    std::lock_guard<std::mutex> lock(g_stage_mutex);
    stage = g_stage;
  }
  const uint64_t avail = available_memory_bytes();
  return "out of memory (std::bad_alloc) while " + stage +
         (avail ? "; this machine has " + gigabytes(avail) + " available" : std::string()) +
         "; use --experts N with a smaller N, fewer --tokens or a smaller --shape";
}

}  // namespace moe_ep::cli
