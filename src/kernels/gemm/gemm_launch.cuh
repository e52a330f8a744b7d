// Host launch of one recipe's grouped GEMMs (fc1, then fc2) as the launch plan says, and the
// shared-memory attributes of every kernel a plan can pick for the recipe. Instantiated once per
// recipe by the sm90_gemm_<recipe>.cu files, so the four recipes compile in parallel.
#pragma once

#include "kernels/common/launch.h"
#include "kernels/gemm/decode/decode_launch.cuh"
#include "kernels/gemm/sm90_gemm_device.cuh"
#include "kernels/gemm/wgmma/sm90_wgmma.cuh"
#include "moe_ep/plan.h"

namespace moe_ep::kern {

// Tiles of up to 160 rows: one CTA per (tile, group of half M-tiles), its warpgroups on the
// halves sharing each B stage (forward_args.h: 2 warpgroups at 2 CTAs per SM for 4-bit weights,
// 4 at 1 for bf16).
template <Recipe R>
using M64Config = Wgmma3Config<R, m64_warpgroups(R), m64_ctas_per_sm(R)>;
template <Recipe R, bool kFc1, ExpertEpilogue kEpi>
constexpr auto m64_kernel =
    sm90_moe_wgmma3_kernel<R, kFc1, m64_warpgroups(R), m64_ctas_per_sm(R), kEpi>;

// 4-bit weights, tiles of up to 64 rows: the same CTA of two warpgroups, at three per SM.
template <Recipe R>
using M64NarrowConfig = Wgmma3Config<R, m64_warpgroups(R), kM64NarrowCtasPerSm, kM64NarrowTileN>;
template <Recipe R, bool kFc1, ExpertEpilogue kEpi>
constexpr auto m64_narrow_kernel =
    sm90_moe_wgmma3_kernel<R, kFc1, m64_warpgroups(R), kM64NarrowCtasPerSm, kEpi, kM64NarrowTileN>;

// `ctas` CTAs of the narrow kernel; the second launch of an m64 split (pdl_late) with
// programmatic dependent launch.
template <Recipe R, bool kFc1, ExpertEpilogue kEpi>
cudaError_t launch_wgmma_m64_narrow(const ForwardArgs& a, int ctas, cudaStream_t s) {
  return launch_kernel(a.pdl_late, m64_narrow_kernel<R, kFc1, kEpi>, dim3(unsigned(ctas)),
                       dim3(M64NarrowConfig<R>::kNT), M64NarrowConfig<R>::kSmemBytes, s, a);
}

// Tiles of up to 160 rows. Split by rows (GemmPlan::m64_narrow_ctas, 4-bit weights): the wide
// tiles first on the m64 kernel, whose CTAs let the second launch start at once; then the
// narrow tiles (an expert's last, at most 64 rows) on the narrow kernel, which waits for the
// first before it exits.
template <Recipe R, bool kFc1, ExpertEpilogue kEpi>
cudaError_t launch_wgmma_m64(const ForwardArgs& args, const GemmPlan& g, cudaStream_t s) {
  ForwardArgs a = args;
  const bool split = g.m64_narrow_ctas > 0;
  a.tile_part = split ? 2 : 0;
  a.pdl_late = false;
  if (g.grid_ctas > 0) {
    m64_kernel<R, kFc1, kEpi>
        <<<unsigned(g.grid_ctas), M64Config<R>::kNT, M64Config<R>::kSmemBytes, s>>>(a);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  if (!split) return cudaSuccess;
  if constexpr (R != Recipe::kBf16) {
    // Without a wide launch (too few pairs for a wide tile) the narrow one is a plain launch.
    a.tile_part = 1;
    a.pdl_late = g.grid_ctas > 0;
    return launch_wgmma_m64_narrow<R, kFc1, kEpi>(a, g.m64_narrow_ctas, s);
  }
  return cudaErrorInvalidConfiguration;  // the plan never splits the bf16 recipe
}

template <Recipe R, bool kFc1, ExpertEpilogue kEpi>
cudaError_t launch_gemm(const ForwardArgs& a, const GemmPlan& g, cudaStream_t s) {
  constexpr bool kFourBit = R != Recipe::kBf16;
  switch (g.kernel) {
    case GemmKernel::kNone:
      return cudaSuccess;
    case GemmKernel::kDecode:
      return launch_decode_gemm<R, kFc1, kEpi>(a, g, s);
    case GemmKernel::kWgmmaM64:
      return launch_wgmma_m64<R, kFc1, kEpi>(a, g, s);
    case GemmKernel::kWgmmaM64Narrow:
      if constexpr (kFourBit) return launch_wgmma_m64_narrow<R, kFc1, kEpi>(a, g.grid_ctas, s);
      break;
    case GemmKernel::kFp8:
      break;
  }
  return cudaErrorInvalidConfiguration;  // a kernel this recipe does not build
}

template <Recipe R>
cudaError_t launch_gemms(const ForwardArgs& a, const ForwardPlan& p, cudaStream_t s,
                         cudaEvent_t* ev) {
  if (p.extended_epilogue) {
    if constexpr (has_extended_epilogue(R)) {
      constexpr ExpertEpilogue kExt = ExpertEpilogue::kExtended;
      return launch_fc1_fc2([&] { return launch_gemm<R, true, kExt>(a, p.fc1, s); },
                            [&] { return launch_gemm<R, false, kExt>(a, p.fc2, s); }, s, ev);
    }
    return cudaErrorInvalidConfiguration;  // the plan never asks it of this recipe
  }
  constexpr ExpertEpilogue kPlain = ExpertEpilogue::kSwiglu;
  return launch_fc1_fc2([&] { return launch_gemm<R, true, kPlain>(a, p.fc1, s); },
                        [&] { return launch_gemm<R, false, kPlain>(a, p.fc2, s); }, s, ev);
}

template <Recipe R, ExpertEpilogue kEpi>
cudaError_t set_gemm_attributes_for() {
  constexpr int kM64Bytes = M64Config<R>::kSmemBytes;
  if constexpr (R != Recipe::kBf16) {
    constexpr int kNarrowBytes = M64NarrowConfig<R>::kSmemBytes;
    return first_error({set_decode_attributes<R, kEpi>(),
                        set_max_smem(m64_kernel<R, true, kEpi>, kM64Bytes),
                        set_max_smem(m64_kernel<R, false, kEpi>, kM64Bytes),
                        set_max_smem(m64_narrow_kernel<R, true, kEpi>, kNarrowBytes),
                        set_max_smem(m64_narrow_kernel<R, false, kEpi>, kNarrowBytes)});
  } else {
    return first_error({set_decode_attributes<R, kEpi>(),
                        set_max_smem(m64_kernel<R, true, kEpi>, kM64Bytes),
                        set_max_smem(m64_kernel<R, false, kEpi>, kM64Bytes)});
  }
}

template <Recipe R>
cudaError_t set_gemm_attributes() {
  if constexpr (has_extended_epilogue(R))
    return first_error({set_gemm_attributes_for<R, ExpertEpilogue::kSwiglu>(),
                        set_gemm_attributes_for<R, ExpertEpilogue::kExtended>()});
  return set_gemm_attributes_for<R, ExpertEpilogue::kSwiglu>();
}

}  // namespace moe_ep::kern
