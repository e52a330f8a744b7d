// The CUDA backend's workspaces: the window's layout and the local scratch (ScratchLayout), made
// once per capacity.
#include "cuda/cuda_backend.h"
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
  if (W_ > 1) ws->ep_index = comm_->create_workspace(ws->layout);  // collective, same order
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
  ws->mem.allocate(ws->scratch.total_bytes, "a workspace");
  if (fp8_)
    check(kern::encode_fp8_h_tensor_map(ws->mem.as<unsigned char>() + ws->scratch.h8map_off,
                                        ws->mem.as<uint8_t>() + ws->scratch.h8_off, rows, I),
          "encoding the tensor map of h8");
  // The spread route's counts and ticket start at zero; each forward leaves them at zero.
  check(cudaMemset(ws->mem.as<unsigned char>() + ws->scratch.counts_off, 0, size_t(El_ + 1) * 4),
        "zeroing the route counts");
  if (fp8_)  // the fp8 kernel's item ticket and exit count: each launch leaves them at zero
    check(cudaMemset(ws->mem.as<unsigned char>() + ws->scratch.fp8_sched_off, 0, 8),
          "zeroing the fp8 item tickets");
  check(cudaDeviceSynchronize(), "zeroing the workspace's counters");
  workspaces_.push_back(std::move(ws));
  return int(workspaces_.size()) - 1;
}

size_t CudaBackend::workspace_bytes(int ws) const {
  const Workspace& w = get_ws(ws);
  return w.mem.bytes + (w.ep_index >= 0 ? comm_->workspace(w.ep_index).bytes : 0);
}

TensorView CudaBackend::workspace_output(int ws, int tokens) {
  const Workspace& w = get_ws(ws);
  unsigned char* base =
      w.ep_index >= 0 ? comm_->workspace(w.ep_index).base : w.mem.as<unsigned char>();
  return TensorView::contiguous(base + w.layout.out_off, DType::kBF16,
                                {tokens, cfg_.fleet.hidden_size}, dev_);
}

}  // namespace moe_ep::cuda
