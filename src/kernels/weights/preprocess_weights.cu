// Weight preprocessing, once at construction: checkpoint-layout expert weights into the
// kernel-resident layout (forward_args.h), and the scale bytes checked on the way and written in
// their resident encoding (resident_scales.h), the codes of their blocks adjusted to it.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "kernels/common/launch.h"
#include "kernels/gemm/fp8/fp8_fragments.h"
#include "kernels/gemm/sm90_gemm_device.cuh"
#include "kernels/weights/resident_scales.h"

namespace moe_ep::kern {
namespace {

struct PrepShape {
  int E, M, K, I, mtiles, chunks;
  bool fc1;
  bool fp8 = false;  // the fp8 resident layout (fp8_resident_piece) for 4-bit weights
  __device__ int row_of(int mtile, int frag, int r) const {
    return fc1 ? (frag & 1) * I + mtile * kFc1TileH + (frag >> 1) * 16 + r
               : mtile * kTileRows + frag * 16 + r;
  }
};

// Rows of one M-tile as fp8_resident_piece asks for them.
struct PrepRows {
  const PrepShape* p;
  int mtile;
  __device__ int operator()(int frag, int r) const { return p->row_of(mtile, frag, r); }
};

// One thread per 16-byte piece of the resident weights. 4-bit codes in the bf16 layout: those of
// a block whose raw scale (raw_scale, nv: E4M3 per 16, else UE8M0 per 32) the resident encoding
// cannot carry are zeroed or have their signs flipped (resident_scales.h).
__global__ void preprocess_weights_kernel(PrepShape p, bool four_bit, const uint8_t* raw,
                                          const uint8_t* raw_scale, bool nv, uint8_t* out,
                                          size_t pieces_per_expert) {
  const int block = nv ? fmt::kNvfp4Block : fmt::kMxBlock;
  const size_t total = pieces_per_expert * p.E;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const int e = int(idx / pieces_per_expert);
    const size_t rem = idx % pieces_per_expert;
    const int per_frag = four_bit ? 32 : 128;
    const size_t blk = rem / per_frag;
    const int within = int(rem % per_frag);
    const int lane = four_bit ? within : within / 4;
    const int frag = int(blk % kTileFrags);
    const int chunk = int(blk / kTileFrags % p.chunks);
    const int mtile = int(blk / kTileFrags / p.chunks);
    const int g = lane >> 2, t4 = lane & 3;
    uint32_t words[4];
    if (four_bit && p.fp8) {
      fp8_resident_piece(raw + size_t(e) * p.M * (p.K / 2), p.M, p.K, chunk, lane, frag,
                         PrepRows{&p, mtile}, words);
    } else if (four_bit) {
      for (int s = 0; s < 4; ++s) {
        uint32_t w = 0;
        for (int j = 0; j < 4; ++j) {
          const int row = p.row_of(mtile, frag, g + (j & 1) * 8);
          const int kc = chunk * kKChunk + s * 16 + 2 * t4 + (j >> 1) * 8;
          uint32_t byte = 0;
          if (row < p.M) {
            byte = raw[(size_t(e) * p.M + row) * (p.K / 2) + kc / 2];
            const uint8_t sc = raw_scale[(size_t(e) * p.M + row) * (p.K / block) + kc / block];
            if (block_codes_zeroed(nv, sc)) byte = 0;
            if (block_codes_negated(nv, sc)) byte ^= 0x88u;  // both codes' sign bits
          }
          // Low element = low nibble (even k), high element = high nibble; bit layout of
          // decode_e2m1x8 (e2m1_layout.h).
          for (int elem = 0; elem < 2; ++elem) {
            const uint32_t code = elem ? byte >> 4 : byte & 0xfu;
            for (int bit = 0; bit < 4; ++bit)
              w |= ((code >> bit) & 1u) << e2m1_bit_pos(j, elem, bit);
          }
        }
        words[s] = w;
      }
    } else {
      // bf16: piece q of lane l holds k16 step q ^ ((l / 2) % 4) (bf16_resident_step), so that
      // the 16-byte reads of one step by eight consecutive lanes hit eight distinct 16-byte bank
      // groups (4-way conflicts in the plain order) whether the fragment is copied as it is.
      const int s = bf16_resident_step(lane, within & 3);
      for (int j = 0; j < 4; ++j) {
        const int row = p.row_of(mtile, frag, g + (j & 1) * 8);
        const int kc = chunk * kKChunk + s * 16 + 2 * t4 + (j >> 1) * 8;
        uint32_t v = 0;
        if (row < p.M)
          v = *reinterpret_cast<const uint32_t*>(raw + ((size_t(e) * p.M + row) * p.K + kc) * 2);
        words[j] = v;
      }
    }
    *reinterpret_cast<uint4*>(out + idx * 16) = make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// One thread per resident scale byte. bad[0..3] = {flag, expert, row, byte}.
__global__ void preprocess_scales_kernel(PrepShape p, bool nv, const uint8_t* raw, uint8_t* out,
                                         size_t bytes_per_expert, int* bad) {
  const size_t total = bytes_per_expert * p.E;
  const int per_frag = nv ? 64 : 32, per_row = nv ? 4 : 2, block = nv ? 16 : 32;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const int e = int(idx / bytes_per_expert);
    const size_t rem = idx % bytes_per_expert;
    const size_t blk = rem / per_frag;
    const int within = int(rem % per_frag);
    const int r = within / per_row, s = within % per_row;
    const int frag = int(blk % kTileFrags);
    const int chunk = int(blk / kTileFrags % p.chunks);
    const int mtile = int(blk / kTileFrags / p.chunks);
    const int row = p.row_of(mtile, frag, r);
    uint8_t b = 0;
    if (row < p.M) {
      b = raw[(size_t(e) * p.M + row) * (p.K / block) + chunk * per_row + s];
      if (scale_byte_refused(nv, b) && atomicCAS(&bad[0], 0, 1) == 0) {
        bad[1] = e;
        bad[2] = row;
        bad[3] = b;
      }
    }
    out[idx] = nv ? nv_resident_scale(b) : b;
  }
}

}  // namespace

cudaError_t preprocess_weights(Recipe recipe, bool fc1, int E, int H, int I, const uint8_t* raw,
                               const uint8_t* raw_scale, uint8_t* out, uint8_t* out_scale,
                               cudaStream_t stream, std::string* why, bool fp8_layout) {
  const ResidentShape rs = resident_shape(recipe, H, I);
  PrepShape p;
  p.fp8 = fp8_layout;  // the kernel applies it to 4-bit weights only
  p.E = E;
  p.fc1 = fc1;
  p.I = I;
  p.M = fc1 ? 2 * I : H;
  p.K = fc1 ? H : I;
  p.mtiles = fc1 ? rs.fc1_mtiles : rs.fc2_mtiles;
  p.chunks = fc1 ? rs.fc1_chunks : rs.fc2_chunks;
  const bool four_bit = recipe != Recipe::kBf16;
  const bool nv_scales = recipe_traits(recipe).e4m3_scales;  // E4M3 per 16, else UE8M0 per 32
  const size_t wbytes = fc1 ? rs.fc1_bytes : rs.fc2_bytes;
  const size_t sbytes = fc1 ? rs.fc1_scale_bytes : rs.fc2_scale_bytes;
  why->clear();
  if (E == 0) return cudaSuccess;
  const int threads = 256, blocks = 132 * 16;
  preprocess_weights_kernel<<<blocks, threads, 0, stream>>>(p, four_bit, raw, raw_scale, nv_scales,
                                                            out, wbytes / 16);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || !four_bit)
    return err != cudaSuccess ? err : cudaStreamSynchronize(stream);
  int* bad = nullptr;
  if ((err = cudaMalloc(&bad, 4 * sizeof(int))) != cudaSuccess) return err;
  cudaMemsetAsync(bad, 0, 4 * sizeof(int), stream);
  preprocess_scales_kernel<<<blocks, threads, 0, stream>>>(p, nv_scales, raw_scale, out_scale,
                                                           sbytes, bad);
  int host_bad[4] = {0, 0, 0, 0};
  err = cudaGetLastError();
  if (err == cudaSuccess)
    err = cudaMemcpyAsync(host_bad, bad, sizeof host_bad, cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  cudaFree(bad);
  if (err == cudaSuccess && host_bad[0]) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", host_bad[3]);
    *why = std::string(fc1 ? "w13_scale" : "w2_scale") + " byte " + hex + " at local expert " +
           std::to_string(host_bad[1]) + ", row " + std::to_string(host_bad[2]) +
           (nv_scales ? " is an E4M3 NaN"
                      : " is a UE8M0 NaN or a scale above 2^64 (bytes > 191 are not supported)");
  }
  return err;
}

}  // namespace moe_ep::kern
