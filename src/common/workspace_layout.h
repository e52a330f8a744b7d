// The one description of a rank's workspace (a symmetric window: every rank has the same layout
// at the same offsets, so a peer's buffer is its base pointer plus our offset). Kernels and the
// CPU backend take every byte offset from here; nothing computes offsets by hand.
//
//   recv_act    [W][capacity][act_row_bytes]  token rows in the recipe's activation format,
//                                              written by the source rank (dispatch)
//   recv_meta   [W][capacity][meta_row_bytes] per received row: source token index, its K
//                                              expert ids and K top-k weights
//   recv_count  [W] int32                      rows received from each source in this call
//   signals     [W] uint64                     per-peer epoch flags (GPU protocol)
//   combine     [capacity*K][H] bf16           y[t,k] rows, written by the owner ranks
//   out         [capacity][H] bf16             finalized output (local only)
#pragma once

#include <cstddef>
#include <cstdint>

#include "moe_ep/formats.h"

namespace moe_ep {

struct WorkspaceLayout {
  int world_size = 1;
  int capacity = 0;
  int hidden = 0;
  int top_k = 0;
  int act_row_bytes = 0;   // one token row in the activation format, 16-byte aligned
  int meta_row_bytes = 0;  // token index + K ids + K weights, 16-byte aligned

  size_t recv_act_off = 0, recv_meta_off = 0, recv_count_off = 0, signals_off = 0, combine_off = 0,
         out_off = 0, total_bytes = 0;

  static constexpr size_t kAlign = 256;
  MOE_EP_HD static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

  // act_data_bytes / act_scale_bytes: the recipe's activation row (data, then scales).
  static WorkspaceLayout make(int world_size, int capacity, int hidden, int top_k,
                              int act_data_bytes, int act_scale_bytes) {
    WorkspaceLayout l;
    l.world_size = world_size;
    l.capacity = capacity;
    l.hidden = hidden;
    l.top_k = top_k;
    l.act_row_bytes = int(align_up(size_t(act_data_bytes + act_scale_bytes), 16));
    l.meta_row_bytes = int(align_up(size_t(4 + 8 * top_k), 16));
    size_t off = 0;
    const size_t rows = size_t(world_size) * size_t(capacity);
    l.recv_act_off = off;
    off = align_up(off + rows * l.act_row_bytes, kAlign);
    l.recv_meta_off = off;
    off = align_up(off + rows * l.meta_row_bytes, kAlign);
    l.recv_count_off = off;
    off = align_up(off + size_t(world_size) * 4, kAlign);
    l.signals_off = off;
    off = align_up(off + size_t(world_size) * 8, kAlign);
    l.combine_off = off;
    off = align_up(off + size_t(capacity) * top_k * hidden * 2, kAlign);
    l.out_off = off;
    off = align_up(off + size_t(capacity) * hidden * 2, kAlign);
    l.total_bytes = off;
    return l;
  }

  MOE_EP_HD size_t recv_act(int src, int row) const {
    return recv_act_off + (size_t(src) * capacity + row) * act_row_bytes;
  }
  MOE_EP_HD size_t recv_meta(int src, int row) const {
    return recv_meta_off + (size_t(src) * capacity + row) * meta_row_bytes;
  }
  MOE_EP_HD size_t recv_count(int src) const { return recv_count_off + size_t(src) * 4; }
  MOE_EP_HD size_t signal(int peer) const { return signals_off + size_t(peer) * 8; }
  MOE_EP_HD size_t combine_row(int token, int slot) const {
    return combine_off + (size_t(token) * top_k + slot) * hidden * 2;
  }
  MOE_EP_HD size_t out_row(int token) const { return out_off + size_t(token) * hidden * 2; }
};

// Accessors for one metadata row: [int32 token][int32 ids[K]][f32 weights[K]].
struct RecvMetaRow {
  unsigned char* base;
  int top_k;
  MOE_EP_HD int32_t* token() const { return reinterpret_cast<int32_t*>(base); }
  MOE_EP_HD int32_t* ids() const { return reinterpret_cast<int32_t*>(base + 4); }
  MOE_EP_HD float* weights() const { return reinterpret_cast<float*>(base + 4 + 4 * top_k); }
};

}  // namespace moe_ep
