// The CUDA backend's EP forward (W > 1; docs/protocol.md): source quantize, dispatch, unpack,
// the expert chain of the single-GPU forward on the received rows, combine, finalize.
#include "cuda/cuda_backend.h"
#include "cuda/cuda_group.h"
#include "kernels/ep/ep_launch.h"
#include "reference/cpu_math.h"

namespace moe_ep::cuda {

void CudaBackend::forward_ep(const ValidatedForward& in, const ForwardTargets& out,
                             const Workspace& ws) {
  const cudaStream_t s = static_cast<cudaStream_t>(in.stream);
  last_stream_ = in.stream;
  const int ep_index = static_cast<const CudaPooledWorkspace&>(*ws.pool).ep_index;
  const EpWorkspace& ew = comm_->workspace(ep_index);
  const EpTransport tp = comm_->transport(ep_index, ws.layout);  // this layer's offsets
  const WorkspaceLayout& L = ws.layout;
  unsigned char* scratch = scratch_base(ws);
  const int H = cfg_.fleet.hidden_size, K = cfg_.recipe.top_k;
  const ActFormat act = act_format(cfg_.recipe.recipe, H);
  uint8_t* act_rows = scratch + ws.scratch.act_off;
  cudaEvent_t* ev = static_cast<cudaEvent_t*>(stage_events_);
  auto mark = [&](int i) {
    // External: inside a stream capture the record becomes an event node of the graph.
    if (ev) check(cudaEventRecordWithFlags(ev[i], s, cudaEventRecordExternal), "stage event");
  };
  mark(0);

  // 1. Source: check ids, quantize x into activation rows.
  kern::EpSourceArgs sa;
  sa.recipe = cfg_.recipe.recipe;
  sa.H = H;
  sa.K = K;
  sa.num_experts = cfg_.fleet.num_experts;
  sa.tokens = in.tokens;
  sa.num_tokens = in.num_tokens;
  sa.x = in.x.ptr<uint16_t>();
  sa.x_stride = in.x.strides[0];
  sa.ids = in.ids.ptr<int32_t>();
  sa.input_norm_const = cfg_.recipe.input_norm_const;
  sa.act = act_rows;
  sa.act_row_bytes = L.act_row_bytes;
  sa.act_data_bytes = act.data_bytes;
  sa.error = err_dev_;
  check(kern::launch_ep_source(sa, s), "launching the EP quantize");
  mark(1);

  // 2. Dispatch (each token once per owner rank) and wait for every source.
  EpDispatchParams dp;
  dp.tp = tp;
  dp.act = act_rows;
  dp.act_stride = L.act_row_bytes;
  dp.topk_ids = in.ids.ptr<int32_t>();
  dp.topk_weights = in.weights.ptr<float>();
  dp.num_tokens = in.tokens;
  dp.num_tokens_dev = in.num_tokens;
  dp.num_local_experts = El_;
  // One token per warp (16 a block), at most one block per SM (measured: 64 to 264 blocks
  // within 5% at 4096 tokens, 132 the fastest).
  dp.num_blocks = ep_blocks_for(num_sms_, in.tokens, 16);
  dp.fused_wait = true;  // the last block waits for every source (no wait launch)
  // Rows at the owners in tile order (per-tile atomics). A one-block dispatch / signal-only
  // combine (decode sizes) publishes with one system fence and no global atomics.
  dp.ordered_rows = false;
  dp.solo = true;
  // The source quantize above is a plain launch, so the caller's ids, weights and count are
  // complete when the dispatch starts: it reads them before its wait for the quantize grid.
  dp.early_inputs = true;
  check(launch_ep_dispatch(dp, s), "launching EP dispatch");
  mark(2);

  // 3. Expert compute over the received rows (virtual tokens src * capacity + row).
  kern::ForwardArgs a = common_args(in);
  const int vtok = W_ * ws.capacity;
  kern::EpUnpackArgs ua;
  ua.recipe = cfg_.recipe.recipe;
  ua.window = ew.base;
  ua.world = W_;
  ua.capacity = ws.capacity;
  ua.H = H;
  ua.K = K;
  ua.recv_act_off = L.recv_act_off;
  ua.recv_meta_off = L.recv_meta_off;
  ua.recv_count_off = L.recv_count_off;
  ua.act_row_bytes = L.act_row_bytes;
  ua.act_data_bytes = act.data_bytes;
  ua.meta_row_bytes = L.meta_row_bytes;
  ua.expert_base = rank_ * El_;
  ua.local_experts = El_;
  ua.xq = reinterpret_cast<uint16_t*>(scratch + ws.scratch.xq_off);
  ua.ids = reinterpret_cast<int32_t*>(scratch + ws.scratch.vids_off);
  ua.weights = reinterpret_cast<float*>(scratch + ws.scratch.vweights_off);
  ua.ep_error = &tp.state->error;  // a failed wait of this call: route nothing
  if (ws.combine != CombineMode::kCopy) {
    ua.y_dst = reinterpret_cast<uint16_t**>(scratch + ws.scratch.y_dst_off);
    for (int r = 0; r < W_; ++r)
      ua.peer_combine[r] = reinterpret_cast<uint16_t*>(tp.peer_base[r] + L.combine_off);
  }
  check(kern::launch_ep_unpack(ua, s), "launching the EP unpack");
  mark(3);
  a.expert_base = rank_ * El_;
  a.tokens = vtok;
  a.ids = ua.ids;
  a.topk_weights = ua.weights;
  a.xq = ua.xq;
  a.xq_ready = true;
  attach_expert_scratch(a, scratch, ws.state.as<unsigned char>(), ws.scratch);
  if (ws.combine != CombineMode::kCopy) {
    a.y_dst = ua.y_dst;  // fc2 stores into the sources' combine areas (NVLink)
    a.y_dst_fence = ws.combine == CombineMode::kFusedFence;
  } else {
    a.y_rows = reinterpret_cast<uint16_t*>(scratch + ws.scratch.y_off);
  }
  last_plan_ = plan_for(in.tokens, ws.capacity);
  check(kern::launch_forward(a, last_plan_, s, nullptr), "launching the expert compute");
  mark(4);

  // 4. Combine (y rows dense in receive order) and wait for every owner. Fused: fc2 already
  //    stored the rows at the sources; one block fences, signals 2n and waits for every owner.
  EpCombineParams cp;
  cp.tp = tp;
  cp.num_local_experts = El_;
  if (ws.combine != CombineMode::kCopy) {
    cp.signal_only = true;
    cp.num_blocks = 1;
    cp.num_threads = 64;  // one waiting thread per peer (W <= kEpMaxRanks = 64)
  } else {
    cp.y = a.y_rows;
    cp.y_stride = H;
    // Rows received ~ W * T (peers' T about ours); at small T each (row, slot, 4 KB piece) is
    // a warp's work, 16 warps a block. Two blocks per SM from ~8K received pairs on (measured
    // 3% faster than one at 4096 tokens).
    cp.num_blocks = ep_blocks_for(2 * num_sms_, int64_t(W_) * in.tokens * K * 4, 16);
  }
  cp.fused_wait = true;
  cp.solo = true;
  check(launch_ep_combine(cp, s), "launching EP combine");
  mark(5);

  // 5. Finalize from the local combine area, in slot order.
  kern::ForwardArgs f = common_args(in);
  f.tokens = in.tokens;
  f.num_tokens = in.num_tokens;
  f.ids = in.ids.ptr<int32_t>();
  f.topk_weights = in.weights.ptr<float>();
  f.y_rows = reinterpret_cast<uint16_t*>(ew.base + L.combine_off);
  uint16_t* rows = nullptr;
  if (out.out.defined()) {
    f.out = out.out.ptr<uint16_t>();
  } else {
    rows = out.rows.ptr<uint16_t>();
    f.weights_out = out.weights.ptr<float>();
    f.indices_out = out.indices.ptr<int32_t>();
  }
  check(kern::launch_finalize(f, rows, s), "launching the finalize");
  mark(6);
}

}  // namespace moe_ep::cuda
