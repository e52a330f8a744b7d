// Host memory the command needs, checked before it allocates: a problem that does not fit is
// an error that says what needs how many bytes, what the machine has, and which --experts
// would fit, instead of std::bad_alloc (or the kernel's OOM killer) in the middle of a run.
#pragma once

#include <cstdint>
#include <string>

#include "problem.h"

namespace moe_ep::cli {

// Bytes this machine can still allocate (MemAvailable of /proc/meminfo; 0 if unknown).
uint64_t available_memory_bytes();

struct MemoryNeed {
  uint64_t master = 0;  // fp32 master weights (random problems)
  uint64_t packed = 0;  // one copy of the packed weights
  uint64_t tokens = 0;  // inputs, outputs, references and workspaces
  uint64_t total = 0;
  uint64_t per_expert = 0;  // what one more expert adds
};
MemoryNeed memory_need(const ModelShape& shape, Recipe recipe, int ranks, int tokens_per_rank,
                       bool with_master);

// Throws moe_ep::Error (kInvalidArgument) when the need exceeds what is available: `budget`
// bytes (the --memory flag: plan for another machine), or this machine's available memory when
// 0.
void check_memory_for(const ModelShape& shape, Recipe recipe, int ranks, int tokens_per_rank,
                      bool with_master, uint64_t budget = 0);

// What the command is doing now, for the message of an allocation that fails anyway.
void memory_stage(const std::string& what);
std::string out_of_memory_message();

std::string gigabytes(uint64_t bytes);

}  // namespace moe_ep::cli
