// On/off benchmark knobs read from the environment (MOE_EP_TRANSPORT_PDL, MOE_EP_DECODE_PIPE,
// MOE_EP_DECODE16, MOE_EP_FC2_EARLY, MOE_EP_FC1_PDL, MOE_EP_FC2_PDL, MOE_EP_ORDERED_ROWS,
// MOE_EP_RELEASE_EACH, MOE_EP_DECODE16_SPLIT, MOE_EP_BENCH_BARRIER, MOE_EP_ROUTE_BATCH,
// MOE_EP_WARP_ROUTE, MOE_EP_ROUTE_SPREAD, MOE_EP_FP8_FINE_N): "1" turns the switch on, "0" off,
// and anything else (unset included) leaves the default. Callers keep the value in a
// function-local static, so each knob is read once per process and never on the forward path.
#pragma once

#include <cstdlib>
#include <cstring>

namespace moe_ep {

// 1 for exactly "1", 0 for exactly "0", -1 otherwise (a knob whose default is a policy).
inline int env_mode(const char* name) {
  const char* v = std::getenv(name);
  if (v != nullptr && std::strcmp(v, "1") == 0) return 1;
  if (v != nullptr && std::strcmp(v, "0") == 0) return 0;
  return -1;
}

inline bool env_switch(const char* name, bool default_on) {
  const int m = env_mode(name);
  return m < 0 ? default_on : m == 1;
}

// For the programs that start one process per GPU (the moe-ep command, bench_layer --ep, the
// multi-GPU tests), before they fork: NCCL's NVLink SHARP (multicast) off unless the caller set
// NCCL_NVLS_ENABLE. The layer's transport (NCCL's device API over LSA pointers) does not use
// it, and hosts without working multicast need it off (DEVICE.md). The library itself never
// sets it: an engine's environment is the engine's.
inline void nccl_multicast_off_unless_set() { setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0); }

}  // namespace moe_ep
