// Host launch of the decode kernel (sm90_decode.cuh) as the launch plan says: one or two
// launches per GEMM (two where tile 16 splits its rows), each with the plan's tile, consumer
// shape, ring and first wave. Programmatic stream serialization, so each CTA's setup overlaps
// the previous kernel. Included by the per-recipe instantiation files only.
#pragma once

#include "kernels/common/pdl.cuh"
#include "kernels/gemm/decode/sm90_decode.cuh"
#include "moe_ep/plan.h"

namespace moe_ep::kern {

// The decode kernels a plan can pick: {tile_n, fragments per consumer warp, K-chunks per slot}.
// 4-bit weights: tile 8 with one or two fragments per warp, tile 16, tile 32 with the lean
// (2-chunk) or the 4-chunk consumer; all on 4-chunk slots but tile 32's lean one. bf16 weights
// (2 KB per fragment and chunk): tiles 8 and 16 with one fragment per warp on 2-chunk slots.
template <int kN, int kFW, int kCps>
struct DecodeVariant {
  static constexpr int kTile = kN, kFrags = kFW, kChunks = kCps;
};
template <Recipe R, class F>
cudaError_t with_decode_variant(const DecodeLaunchPlan& d, F f) {
  if constexpr (R == Recipe::kBf16) {
    if (d.frags_per_warp == 1 && d.chunks_per_slot == 2) {
      if (d.tile_n == 8) return f(DecodeVariant<8, 1, 2>{});
      if (d.tile_n == 16) return f(DecodeVariant<16, 1, 2>{});
    }
  } else {
    if (d.tile_n == 8 && d.chunks_per_slot == 4)
      return d.frags_per_warp == 1 ? f(DecodeVariant<8, 1, 4>{}) : f(DecodeVariant<8, 2, 4>{});
    if (d.tile_n == 16 && d.chunks_per_slot == 4 && d.frags_per_warp == 2)
      return f(DecodeVariant<16, 2, 4>{});
    if (d.tile_n == 32 && d.frags_per_warp == 2) {
      if (d.chunks_per_slot == 2) return f(DecodeVariant<32, 2, 2>{});
      if (d.chunks_per_slot == 4) return f(DecodeVariant<32, 2, 4>{});
    }
  }
  return cudaErrorInvalidConfiguration;  // not a variant the plan picks
}
template <Recipe R, class F>
cudaError_t for_each_decode_variant(F f) {
  if constexpr (R == Recipe::kBf16)
    return first_error({f(DecodeVariant<8, 1, 2>{}), f(DecodeVariant<16, 1, 2>{})});
  else
    return first_error({f(DecodeVariant<8, 1, 4>{}), f(DecodeVariant<8, 2, 4>{}),
                        f(DecodeVariant<16, 2, 4>{}), f(DecodeVariant<32, 2, 2>{}),
                        f(DecodeVariant<32, 2, 4>{})});
}

// The room-for-fc2 ring of tile 8's fc1 asks for a third of the SM: within the kernel's limit.
static_assert(kSmemPerSm / 3 <= DecodeConfig<Recipe::kMxfp4Bf16, 8, 2, 4>::kMaxSmemBytes &&
                  kSmemPerSm / 3 <= DecodeConfig<Recipe::kNvfp4, 8, 2, 4>::kMaxSmemBytes,
              "the room-for-fc2 ring fits the kernel's shared-memory attribute");

template <Recipe R, bool kFc1, ExpertEpilogue kEpi>
cudaError_t launch_decode(const ForwardArgs& args, const DecodeLaunchPlan& d, int mtiles,
                          cudaStream_t s) {
  if (d.grid_tiles == 0) return cudaSuccess;
  ForwardArgs a = args;
  // A row split's second launch (the wide tiles) waits for the first at its end instead of its
  // start: everything it reads was complete before the first could launch.
  a.tile_part = d.tile_part;
  a.pdl_late = d.tile_part == 2;
  return with_decode_variant<R>(d, [&](auto v) {
    using V = decltype(v);
    using C = DecodeConfig<R, V::kTile, V::kFrags, V::kChunks>;
    return launch_pdl(sm90_moe_decode_kernel<R, V::kTile, V::kFrags, kFc1, V::kChunks, kEpi>,
                      dim3(d.grid_tiles, mtiles), dim3(C::kThreads), d.smem_bytes, s, a, d.stages,
                      d.first_wave);
  });
}

template <Recipe R, bool kFc1, ExpertEpilogue kEpi>
cudaError_t launch_decode_gemm(const ForwardArgs& a, const GemmPlan& g, cudaStream_t s) {
  for (int i = 0; i < g.num_decode_launches; ++i)
    if (const cudaError_t e = launch_decode<R, kFc1, kEpi>(a, g.decode[i], g.mtiles, s);
        e != cudaSuccess)
      return e;
  return cudaSuccess;
}

template <Recipe R, ExpertEpilogue kEpi>
cudaError_t set_decode_attributes() {
  return for_each_decode_variant<R>([](auto v) {
    using V = decltype(v);
    constexpr int kBytes = DecodeConfig<R, V::kTile, V::kFrags, V::kChunks>::kMaxSmemBytes;
    return first_error(
        {set_max_smem(sm90_moe_decode_kernel<R, V::kTile, V::kFrags, true, V::kChunks, kEpi>,
                      kBytes),
         set_max_smem(sm90_moe_decode_kernel<R, V::kTile, V::kFrags, false, V::kChunks, kEpi>,
                      kBytes)});
  });
}

}  // namespace moe_ep::kern
