// Activation rows with the values the activation quantizers treat apart (tests/gpu and
// tests/multigpu). Both 4/8-bit activation recipes get a 32-aligned block of zeros (scale 0;
// MXFP8 scale byte 0) and one of values near 1e-33 (NVFP4 scale 0 or a subnormal E4M3; MXFP8
// scale byte 8): the EP unpack converts MXFP8 scale bytes below 27 by the reference. nvfp4 also
// gets an element at +Inf and one at -Inf (their blocks take the reference arithmetic), a NaN
// element (that element's reference path) and a pair at +-3.0e38 (amax * nc overflows for nc >
// 1.13); its scales saturate at 448, so the outputs stay finite. The same values would make
// mxfp4_mxfp8's outputs NaN (Inf / NaN activations, or g * u overflowing), so it gets none of
// them: the tests check finite outputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "moe_ep/config.h"

namespace moe_ep {

inline void plant_edge_activations(std::vector<uint16_t>& x, int T, int H, Recipe r) {
  if (T == 0 || H < 256 || (r != Recipe::kNvfp4 && r != Recipe::kMxfp4Mxfp8)) return;
  auto at = [&](int t, int i) -> uint16_t& { return x[size_t(t % T) * H + i]; };
  for (int i = 64; i < 96; ++i) at(4, i) = 0;
  for (int i = 128; i < 160; ++i) at(5, i) = (i & 1 ? 0x8000 : 0) | 0x089e;  // +-1.0e-33
  if (r == Recipe::kNvfp4) {
    at(0, 5) = 0x7f80;      // +Inf
    at(1, 37) = 0x7fc0;     // NaN
    at(3, H - 1) = 0xff80;  // -Inf
    at(2, 100) = 0x7f62;    // +3.0e38
    at(2, 101) = 0xff62;    // -3.0e38
  }
}

}  // namespace moe_ep
