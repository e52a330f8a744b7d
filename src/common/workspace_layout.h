// The one description of a rank's workspace (a symmetric window: every rank has the same layout
// at the same offsets, so a peer's buffer is its base pointer plus our offset). Kernels and the
// CPU backend take every byte offset from here; nothing computes offsets by hand.
//
//   signals     [W] uint64                     per-peer epoch flags (GPU protocol)
//   recv_count  [W] int32                      rows received from each source in this call
//   recv_act    [W][capacity][act_row_bytes]  token rows in the recipe's activation format,
//                                              written by the source rank (dispatch)
//   recv_meta   [W][capacity][meta_row_bytes] per received row: source token index, its K
//                                              expert ids and K top-k weights
//   combine     [capacity*K][H] bf16           y[t,k] rows, written by the owner ranks
//   out         [capacity][H] bf16             finalized output (local only)
//
// The signals and counts come first, at offsets that depend on W alone: layers of one EP group
// with different geometries (H, K, recipe) share a pooled window (include/moe_ep/group.h), and
// the epochs in the signal slots carry on from one layer's call to the next.
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
    l.signals_off = off;
    off = align_up(off + size_t(world_size) * 8, kAlign);
    l.recv_count_off = off;
    off = align_up(off + size_t(world_size) * 4, kAlign);
    l.recv_act_off = off;
    off = align_up(off + rows * l.act_row_bytes, kAlign);
    l.recv_meta_off = off;
    off = align_up(off + rows * l.meta_row_bytes, kAlign);
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

// A rank's local scratch of the CUDA backend (not addressed by peers): where the expert side's
// buffers of one workspace lie, as byte offsets from the scratch allocation. On one GPU the
// scratch follows the WorkspaceLayout in the same allocation (`base` = its total_bytes); at
// W > 1 it is an allocation of its own beside the window (`base` = 0). The expert side sees up
// to W * capacity rows (virtual tokens) and W * capacity * K routed pairs.
struct ScratchLayout {
  struct Params {
    int world_size = 1, capacity = 0, hidden = 0, intermediate = 0, top_k = 0;
    int local_experts = 0;
    int act_row_bytes = 0;       // the window's activation row (W > 1: the source's copy)
    size_t tile_list_bytes = 0;  // the routing tile list, sized for the smallest tile
    size_t base = 0;
    bool fused_combine = true;  // W > 1: fc2 row pointers, else a local y buffer [pairs][H]
    bool fp8 = false;           // the fp8 path's folded x and h, references, tensor map, tickets
  };
  // W > 1 only.
  size_t act_off = 0;       // [capacity][act_row_bytes] this rank's source rows
  size_t vids_off = 0;      // int32 [W*capacity][K] the virtual tokens' local slots
  size_t vweights_off = 0;  // f32 [W*capacity][K]
  size_t y_dst_off = 0;     // bf16* [W*capacity*K] (fused combine)
  size_t y_off = 0;         // bf16 [W*capacity*K][H] (copy combine)
  // Every workspace.
  size_t xq_off = 0;         // bf16 [W*capacity][H] x as the GEMMs see it
  size_t h_off = 0;          // bf16 [pairs][I] fc1's output in sorted order
  size_t pairs_off = 0;      // int32 [pairs] the expert-sorted pair list
  size_t tiles_off = 0;      // the routing tiles
  size_t num_tiles_off = 0;  // int32 [2] the tile count, then the narrow ones'
  size_t counts_off = 0;     // int32 [E_local + 1] the spread route's counts and ticket
  size_t ranks_off = 0;      // int32 [pairs] the spread route's place of each pair
  // The fp8 path only.
  size_t xq8_off = 0, xref_off = 0, h8_off = 0, href_off = 0;
  size_t total_bytes = 0;  // from the allocation's start (base included)

  // The layer's own state beside the (pooled) scratch, as offsets in an allocation of its own:
  // what a forward leaves for the next forward of the same layer (counters back at zero, the
  // tensor map of this layer's h8), so that layers sharing the scratch do not disturb each other.
  struct State {
    size_t counts_off = 0;     // int32 [E_local + 1] the spread route's counts and ticket
    size_t fp8_sched_off = 0;  // int32 [2]: the fp8 kernel's item ticket and exit count
    size_t h8map_off = 0;      // 128 bytes: h8's tensor map (fp8 path)
    size_t total_bytes = 0;
  } state;

  static ScratchLayout make(const Params& p) {
    ScratchLayout l;
    auto al = [](size_t v) { return WorkspaceLayout::align_up(v, WorkspaceLayout::kAlign); };
    const size_t vtok = size_t(p.world_size) * p.capacity, rows = vtok * p.top_k;
    size_t off = p.base;
    auto take = [&](size_t& field, size_t bytes) {
      field = off;
      off = al(off + bytes);
    };
    if (p.world_size > 1) {
      take(l.act_off, size_t(p.capacity) * p.act_row_bytes);
      take(l.vids_off, rows * 4);
      take(l.vweights_off, rows * 4);
      if (p.fused_combine)
        take(l.y_dst_off, rows * sizeof(uint16_t*));
      else
        take(l.y_off, rows * p.hidden * 2);
    }
    take(l.xq_off, vtok * p.hidden * 2);
    take(l.h_off, rows * p.intermediate * 2);
    take(l.pairs_off, rows * 4);
    take(l.tiles_off, p.tile_list_bytes);
    take(l.num_tiles_off, 8);
    take(l.ranks_off, rows * 4);
    if (p.fp8) {
      take(l.xq8_off, vtok * p.hidden);
      take(l.xref_off, vtok);
      take(l.h8_off, rows * p.intermediate);
      take(l.href_off, rows);
    }
    l.total_bytes = off;
    off = 0;
    take(l.state.counts_off, size_t(p.local_experts + 1) * 4);
    if (p.fp8) {
      take(l.state.h8map_off, 128);
      take(l.state.fp8_sched_off, 8);
    }
    l.state.total_bytes = off;
    return l;
  }
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
