#include "ep_test_kernels.h"

namespace moe_ep::test {
namespace {

__global__ void fake_experts_kernel(EpTransport tp, int num_local, uint16_t* y, int32_t* y_index,
                                    bool use_index, bool remote) {
  const WorkspaceLayout& L = tp.layout;
  const int W = tp.world_size, K = L.top_k, H = L.hidden, cap = L.capacity;
  const uint8_t* mine = tp.peer_base[tp.rank];
  const size_t dense_rows = size_t(W) * cap * K;
  // Blocks walk (source, row) pairs; rows past the source's count are skipped.
  for (int j = blockIdx.x; j < W * cap; j += gridDim.x) {
    const int s = j / cap, i = j % cap;
    const int count = *reinterpret_cast<const int32_t*>(mine + L.recv_count(s));
    if (i >= count) continue;
    RecvMetaRow meta{const_cast<uint8_t*>(mine) + L.recv_meta(s, i), K};
    const int tok = *meta.token();
    for (int k = 0; k < K; ++k) {
      const int id = meta.ids()[k];
      if (id < 0 || id / num_local != tp.rank) continue;
      if (remote) {
        // Fused combine: straight into the source's combine row (peer memory).
        if (tok < 0 || tok >= cap) continue;
        uint16_t* dst = reinterpret_cast<uint16_t*>(tp.peer_base[s] + L.combine_row(tok, k));
        for (int h = threadIdx.x; h < H; h += blockDim.x) dst[h] = y_bits(tp.rank, s, tok, k, h);
        continue;
      }
      const size_t dense = (size_t(s) * cap + i) * K + k;
      const size_t row = use_index ? dense_rows - 1 - dense : dense;
      if (use_index && threadIdx.x == 0) y_index[dense] = int32_t(row);
      for (int h = threadIdx.x; h < H; h += blockDim.x)
        y[row * H + h] = y_bits(tp.rank, s, tok, k, h);
    }
  }
}

}  // namespace

cudaError_t launch_fake_experts(const EpTransport& tp, int num_local_experts, uint16_t* y,
                                int32_t* y_index, bool use_index, cudaStream_t stream,
                                bool remote) {
  fake_experts_kernel<<<264, 256, 0, stream>>>(tp, num_local_experts, y, y_index, use_index,
                                               remote);
  return cudaGetLastError();
}

}  // namespace moe_ep::test
