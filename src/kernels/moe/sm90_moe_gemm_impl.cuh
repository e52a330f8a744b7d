// Launch and attribute helpers of the grouped GEMMs, instantiated once per recipe by the
// sm90_moe_gemm_<recipe>.cu files (so the four recipes compile in parallel).
#pragma once

#include <cstdlib>

#include "kernels/moe/moe_launch.h"
#include "kernels/moe/sm90_moe_decode.cuh"
#include "kernels/moe/sm90_moe_device.cuh"
#include "kernels/moe/sm90_moe_wgmma.cuh"

namespace moe_ep::kern {

template <Recipe R, int kN, bool kFc1>
cudaError_t launch_gemm(const ForwardArgs& a, cudaStream_t s) {
  const int tiles = max_tiles(a.tokens * a.K, a.local_experts, kN);
  const int mtiles = kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles;
  if (tiles == 0) return cudaSuccess;
  dim3 grid(tiles, mtiles);
  sm90_moe_gemm_kernel<R, kN, kFc1><<<grid, kThreads, GemmConfig<R, kN>::kSmemBytes, s>>>(a);
  return cudaGetLastError();
}

// Prefill tiles (tile_n 128): one CTA per (tile, M-tile) in a 1-D grid, M-tile fastest.
template <Recipe R, bool kFc1>
cudaError_t launch_wgmma(const ForwardArgs& a, cudaStream_t s) {
  const int tiles = max_tiles(a.tokens * a.K, a.local_experts, kWgN);
  const int mtiles = kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles;
  if (tiles == 0) return cudaSuccess;
  sm90_moe_wgmma_kernel<R, kFc1>
      <<<unsigned(tiles) * unsigned(mtiles), kThreads, WgmmaConfig<R>::kSmemBytes, s>>>(a);
  return cudaGetLastError();
}

// m64 (tile_n 160, 4-bit weights): one CTA per (tile, group of kG half M-tiles), group fastest.
template <Recipe R, bool kFc1, int kG, int kMinB>
cudaError_t launch_wgmma3_shape(const ForwardArgs& a, cudaStream_t s) {
  const int tiles = max_tiles(a.tokens * a.K, a.local_experts, kWg3MaxN);
  const int halves = 2 * (kFc1 ? a.rs.fc1_mtiles : a.rs.fc2_mtiles);
  const int groups = (halves + kG - 1) / kG;
  if (tiles == 0) return cudaSuccess;
  using C = Wgmma3Config<R, kG, kMinB>;
  sm90_moe_wgmma3_kernel<R, kFc1, kG, kMinB>
      <<<unsigned(tiles) * unsigned(groups), C::kNT, C::kSmemBytes, s>>>(a);
  return cudaGetLastError();
}

template <Recipe R, bool kFc1>
cudaError_t launch_wgmma3(const ForwardArgs& a, cudaStream_t s) {
  const std::array<int, 2> shape = m64_shapes()[kFc1];
  note_m64_shape(kFc1, shape);
  return with_m64_shape(shape, [&](auto c) {
    return launch_wgmma3_shape<R, kFc1, decltype(c)::kG, decltype(c)::kMinB>(a, s);
  });
}

// Every built shape's shared-memory size (a test may switch shapes after warmup).
template <Recipe R>
cudaError_t set_wgmma3_attributes() {
  cudaError_t err = cudaSuccess;
  for (const auto& shape : kM64Shapes)
    for (bool fc1 : {false, true})
      if (err == cudaSuccess)
        err = with_m64_shape(shape, [fc1](auto c) {
          constexpr int kG = decltype(c)::kG, kMinB = decltype(c)::kMinB;
          constexpr int kBytes = Wgmma3Config<R, kG, kMinB>::kSmemBytes;
          return fc1 ? set_max_smem(sm90_moe_wgmma3_kernel<R, true, kG, kMinB>, kBytes)
                     : set_max_smem(sm90_moe_wgmma3_kernel<R, false, kG, kMinB>, kBytes);
        });
  return err;
}

template <Recipe R>
cudaError_t launch_gemms(const ForwardArgs& a, cudaStream_t s, cudaEvent_t* ev) {
  // The 4-bit recipes' tile_n 8, 16 and 32 (at most 21 rows per expert on average) go to the
  // decode kernel (tile 16 since its 4-chunk slots: DSV3 nvfp4 512 tokens 3447 -> 3055 us,
  // docs/gpu_kernels.md §6; MOE_EP_DECODE16=0 keeps it on the mma.sync kernel); bf16 weights
  // keep the tile_n 16 path here (launch_forward maps their tile_n 8 to 16, 32 to 128). Tile_n
  // 160 (4-bit weights, more than 21 rows on average) runs the m64 wgmma kernel, 128 the v2 one.
  if constexpr (R != Recipe::kBf16)
    if (a.tile_n == 8) return launch_decode_gemms<R>(a, s, ev);
  if constexpr (R != Recipe::kBf16)
    if (a.tile_n == 16 && decode_tile16()) return launch_decode_gemms<R, 16>(a, s, ev);
  if constexpr (R != Recipe::kBf16)
    if (a.tile_n == 32) return launch_decode_gemms<R, 32>(a, s, ev);
  if (a.tile_n == 16)
    return launch_fc1_fc2([&] { return launch_gemm<R, 16, true>(a, s); },
                          [&] { return launch_gemm<R, 16, false>(a, s); }, s, ev);
  if constexpr (R != Recipe::kBf16)
    if (a.tile_n == kWg3MaxN)
      return launch_fc1_fc2([&] { return launch_wgmma3<R, true>(a, s); },
                            [&] { return launch_wgmma3<R, false>(a, s); }, s, ev);
  return launch_fc1_fc2([&] { return launch_wgmma<R, true>(a, s); },
                        [&] { return launch_wgmma<R, false>(a, s); }, s, ev);
}

template <Recipe R>
cudaError_t set_gemm_attributes() {
  if constexpr (R != Recipe::kBf16) {
    const cudaError_t err = first_error({set_decode_attributes<R>(), set_wgmma3_attributes<R>()});
    if (err != cudaSuccess) return err;
  }
  return first_error(
      {set_max_smem(sm90_moe_gemm_kernel<R, 16, true>, GemmConfig<R, 16>::kSmemBytes),
       set_max_smem(sm90_moe_gemm_kernel<R, 16, false>, GemmConfig<R, 16>::kSmemBytes),
       set_max_smem(sm90_moe_wgmma_kernel<R, true>, WgmmaConfig<R>::kSmemBytes),
       set_max_smem(sm90_moe_wgmma_kernel<R, false>, WgmmaConfig<R>::kSmemBytes)});
}

}  // namespace moe_ep::kern
