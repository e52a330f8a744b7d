// The PTX helpers of the sm90 kernels (cp.async, ldmatrix, mma.sync, mbarrier, bulk copies and
// tensor-memory loads, shared-memory loads) in one header; the wgmma helpers live with the wgmma
// kernels (gemm/wgmma/sm90_wgmma.cuh), programmatic dependent launch in pdl.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moe_ep::kern {

// ---------------------------------------------------------------------------------------------
// PTX helpers

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy to a shared-memory address; src_size 16 copies, 0 fills zeros and reads
// nothing.
__device__ __forceinline__ void cp_async16_sz(uint32_t smem, const void* gmem, uint32_t src_size) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(src_size));
}
// The same to a generic shared-memory pointer; `pred` false fills the destination with zeros.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
  cp_async16_sz(smem_addr(smem), gmem, pred ? 16u : 0u);
}
// ... issued only where `issue` holds (a PTX predicate: no branch around it).
__device__ __forceinline__ void cp_async16_if(uint32_t smem, const void* gmem, uint32_t src_size,
                                              bool issue) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n"
      " @p cp.async.cg.shared.global [%0], [%1], 16, %2;\n}\n" ::"r"(smem),
      "l"(gmem), "r"(src_size), "r"(uint32_t(issue)));
}
// An L2 evict_first policy for all of a copy's lines: the decode kernel's weights and scales,
// each byte read once per forward.
__device__ __forceinline__ uint64_t make_l2_evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// a times half kHalf (0 low, 1 high) of b in both lanes. ptxas folds the broadcast into the
// multiply's operand (HMUL2 ... b.H0_H0 / b.H1_H1), so one register carries two multipliers.
template <int kHalf>
__device__ __forceinline__ uint32_t mul_bf16x2_by_half(uint32_t a, uint32_t b) {
  static_assert(kHalf == 0 || kHalf == 1, "a half of a bf16x2");
  uint32_t d;
  if constexpr (kHalf == 0)
    asm("{\n.reg .b16 l, h;\n.reg .b32 m;\nmov.b32 {l, h}, %2;\nmov.b32 m, {l, l};\n"
        "mul.rn.bf16x2 %0, %1, m;\n}\n"
        : "=r"(d)
        : "r"(a), "r"(b));
  else
    asm("{\n.reg .b16 l, h;\n.reg .b32 m;\nmov.b32 {l, h}, %2;\nmov.b32 m, {h, h};\n"
        "mul.rn.bf16x2 %0, %1, m;\n}\n"
        : "=r"(d)
        : "r"(a), "r"(b));
  return d;
}

// ---------------------------------------------------------------------------------------------
// mbarrier, bulk copy

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
// One box of a 2-D tensor map at column x, row y into shared memory at dst (aligned as its
// swizzle asks), completing on the mbarrier at shared address bar's transaction count.
__device__ __forceinline__ void tma_box_2d(uint32_t dst, const void* tmap, int x, int y,
                                           uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(tmap), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
// True in one lane of the (converged) warp.
__device__ __forceinline__ bool elect_one() {
  uint32_t p = 0;
  asm volatile("{\n .reg .pred e;\n elect.sync _|e, 0xffffffff;\n selp.u32 %0, 1, 0, e;\n}\n"
               : "=r"(p));
  return p != 0;
}
// Adds `bytes` to the barrier's expected transactions of its current phase (no arrival).
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arrive at `addr` + `zero_dep`, where zero_dep is 0 at run time but computed from registers
// loaded out of the slot: the arrive cannot issue before those loads have returned their data,
// so the producer's next bulk copy into the slot cannot overtake a read of it.
__device__ __forceinline__ void mbar_arrive_after(uint32_t addr, uint32_t zero_dep) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(addr + zero_dep) : "memory");
}
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
// Spins until the mbarrier at shared address `addr` completes phase `parity`.
__device__ __forceinline__ void mbar_wait(uint32_t addr, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  mbar_wait(smem_addr(bar), parity);
}
// Global -> shared bulk copy (16-byte aligned, multiple of 16 bytes) completing on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
// The same under an L2 cache policy (make_l2_policy).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1], "
      "%2, [%3], %4;\n" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t lds16(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t& r0, uint32_t& r1, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr));
}

}  // namespace moe_ep::kern
