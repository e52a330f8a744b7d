// The CUDA backend's workspaces: this layer's window layout and scratch layout (ScratchLayout) in
// the group's pooled workspace of the capacity (src/cuda/cuda_group.h), and the layer's own
// state beside them.
#include "cuda/cuda_backend.h"
#include "cuda/cuda_group.h"
#include "reference/cpu_math.h"

namespace moe_ep::cuda {

int CudaBackend::create_workspace(int capacity) {
  check_host_errors();
  select_device();
  auto ws = std::make_unique<Workspace>();
  ws->capacity = capacity;
  const int H = cfg_.fleet.hidden_size, K = cfg_.recipe.top_k, I = cfg_.recipe.intermediate_size;
  const ActFormat act = act_format(cfg_.recipe.recipe, H);
  ws->layout = WorkspaceLayout::make(W_, capacity, H, K, act.data_bytes, act.scale_bytes);
  ws->combine = cfg_.plan_options.combine;
  const size_t rows = size_t(W_) * capacity * K;
  ScratchLayout::Params p;
  p.world_size = W_;
  p.capacity = capacity;
  p.hidden = H;
  p.intermediate = I;
  p.top_k = K;
  p.local_experts = El_;
  p.act_row_bytes = ws->layout.act_row_bytes;
  p.tile_list_bytes =
      size_t(kern::max_tiles(int(rows), El_, kern::kMinTileN)) * sizeof(kern::TileInfo);
  p.base = W_ == 1 ? ws->layout.total_bytes : 0;
  p.fused_combine = ws->combine != CombineMode::kCopy;
  p.fp8 = fp8_;
  ws->scratch = ScratchLayout::make(p);
  PoolNeeds needs;
  needs.window = ws->layout;
  needs.scratch_bytes = ws->scratch.total_bytes;  // W = 1: the window layout included
  // Collective (same order on every rank): the group's pooled workspace of this capacity, made
  // or re-made larger for this layer.
  ws->pool = group_->acquire(capacity, needs);
  ws->state.allocate(ws->scratch.state.total_bytes, "a workspace's layer state");
  // The spread route's counts and ticket start at zero, and the fp8 kernel's item ticket and
  // exit count; each forward leaves them at zero.
  check(cudaMemset(ws->state.ptr, 0, ws->scratch.state.total_bytes), "zeroing the layer state");
  workspaces_.push_back(std::move(ws));
  const int idx = int(workspaces_.size()) - 1;
  workspaces_[idx]->generation = workspaces_[idx]->pool->generation + 1;  // derive below
  refresh_state(idx);
  check(cudaDeviceSynchronize(), "zeroing the workspace's counters");
  return idx;
}

void CudaBackend::refresh_state(int idx) {
  get_ws(idx);  // throws for an unknown workspace
  Workspace& ws = *workspaces_[size_t(idx)];
  if (ws.generation == ws.pool->generation) return;
  if (fp8_) {
    const size_t rows = size_t(W_) * ws.capacity * cfg_.recipe.top_k;
    check(kern::encode_fp8_h_tensor_map(ws.state.as<unsigned char>() + ws.scratch.state.h8map_off,
                                        scratch_base(ws) + ws.scratch.h8_off, rows,
                                        cfg_.recipe.intermediate_size),
          "encoding the tensor map of h8");
  }
  ws.generation = ws.pool->generation;
}

unsigned char* CudaBackend::window_base(const Workspace& w) const {
  const auto& pooled = static_cast<const CudaPooledWorkspace&>(*w.pool);
  return pooled.ep_index >= 0 ? comm_->workspace(pooled.ep_index).base
                              : pooled.mem.as<unsigned char>();
}

unsigned char* CudaBackend::scratch_base(const Workspace& w) const {
  return static_cast<const CudaPooledWorkspace&>(*w.pool).mem.as<unsigned char>();
}

size_t CudaBackend::workspace_bytes(int ws) const {
  const Workspace& w = get_ws(ws);
  if (W_ == 1) return w.scratch.total_bytes;  // the window layout and the scratch, one allocation
  return w.scratch.total_bytes +
         WorkspaceLayout::align_up(w.layout.total_bytes, NCCL_WIN_REQUIRED_ALIGNMENT);
}

TensorView CudaBackend::workspace_output(int ws, int tokens) {
  const Workspace& w = get_ws(ws);
  return TensorView::contiguous(window_base(w) + w.layout.out_off, DType::kBF16,
                                {tokens, cfg_.fleet.hidden_size}, dev_);
}

}  // namespace moe_ep::cuda
