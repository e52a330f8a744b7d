// On/off benchmark knobs read from the environment (MOE_EP_TRANSPORT_PDL, MOE_EP_DECODE_PIPE,
// MOE_EP_DECODE16, MOE_EP_FC2_EARLY, MOE_EP_ORDERED_ROWS): "1" turns the switch on, "0" off, and
// anything else (unset included) leaves the default. Callers keep the value in a function-local
// static, so each knob is read once per process and never on the forward path.
#pragma once

#include <cstdlib>
#include <cstring>

namespace moe_ep {

inline bool env_switch(const char* name, bool default_on) {
  const char* v = std::getenv(name);
  if (v != nullptr && std::strcmp(v, "1") == 0) return true;
  if (v != nullptr && std::strcmp(v, "0") == 0) return false;
  return default_on;
}

}  // namespace moe_ep
