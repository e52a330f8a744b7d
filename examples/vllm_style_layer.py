"""An MoE layer driven the way an inference engine (vLLM's FlashInferMoeEp path) drives it:
checkpoint-style expert tensors in, one layer object per MoE layer and rank, warm up, capture
a CUDA graph per batch size (on a GPU), then run steps and check them against a plain reference.

    python examples/vllm_style_layer.py                 # GPU if the CUDA backend runs, else CPU
    python examples/vllm_style_layer.py --device cpu --recipe mxfp4_bf16 --tokens 24

Works with torch (CPU or CUDA tensors) and, without torch, with numpy on the CPU backend.
"""

import argparse
import sys
import time

import numpy as np

import moe_ep

try:
    import torch
except ImportError:  # numpy only: the CPU backend
    torch = None


# --- the "checkpoint" ------------------------------------------------------------------------------
def load_checkpoint(recipe, num_experts, hidden, inter, seed=0):
    """Stands in for reading one MoE layer's expert tensors from a checkpoint: fp32 master weights
    packed into the recipe's storage format (uint8 E2M1 + scale bytes, or bf16)."""
    rng = np.random.default_rng(seed)
    w13 = (rng.standard_normal((num_experts, 2 * inter, hidden)) * 0.05).astype(np.float32)
    w2 = (rng.standard_normal((num_experts, hidden, inter)) * 0.05).astype(np.float32)
    return moe_ep.pack_expert_weights(recipe, w13, w2)


def to_framework(ckpt, recipe, device):
    """numpy checkpoint arrays -> torch tensors on `device` (bf16 weights as torch.bfloat16)."""
    if torch is None:
        return ckpt
    out = {}
    for name, a in ckpt.items():
        if a is None:
            out[name] = None
        elif recipe == "bf16" and name in ("w13", "w2"):
            out[name] = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)
        else:
            out[name] = torch.from_numpy(a).to(device)
    return out


# --- a plain reference (dequantized weights, float64) ---------------------------------------------
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])


def dequant(recipe, w, s):
    if recipe == "bf16":
        return (w.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    v = np.empty(w.shape[:-1] + (w.shape[-1] * 2,))
    v[..., 0::2], v[..., 1::2] = E2M1[w & 0xF], E2M1[w >> 4]
    if recipe in ("nvfp4", "nvfp4_bf16"):  # E4M3 scale bytes
        b = s.astype(np.int64)
        e, m = (b >> 3) & 0xF, b & 7
        sc = np.where(e == 0, m * 2.0**-9, (1 + m / 8) * np.exp2(e - 7.0))
        return v * np.repeat(sc, 16, axis=-1)
    return v * np.repeat(np.exp2(s.astype(np.float64) - 127), 32, axis=-1)


def reference(ckpt, recipe, x_bits, ids, weights):
    """The unquantized model (docs/contract.md §3 without activation quantization) on the
    dequantized checkpoint weights: gate/up order, SwiGLU, the top-k weighted sum."""
    x = (x_bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    W13 = dequant(recipe, ckpt["w13"], ckpt["w13_scale"])
    W2 = dequant(recipe, ckpt["w2"], ckpt["w2_scale"])
    a1 = ckpt["fc1_alpha"].astype(np.float64)
    a2 = ckpt["fc2_alpha"].astype(np.float64)
    scale = recipe in ("nvfp4", "nvfp4_bf16")  # the NVFP4 weights' alphas
    inter = W13.shape[1] // 2
    out = np.zeros((x.shape[0], W2.shape[1]))
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = ids[t, k]
            if e < 0:
                continue
            gu = W13[e] @ x[t] * (a1[e] if scale else 1)
            g, u = gu[:inter], gu[inter:]
            y = W2[e] @ (u * g / (1 + np.exp(-g))) * (a2[e] if scale else 1)
            out[t] += weights[t, k] * y
    return out


def as_bits(t):
    """bf16 tensor/array -> numpy uint16 bits."""
    if torch is not None and isinstance(t, torch.Tensor):
        return t.detach().cpu().view(torch.int16).numpy().view(np.uint16)
    return np.asarray(t).view(np.uint16)


# --- the engine's view --------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--recipe", default="bf16",
                    choices=["bf16", "mxfp4_bf16", "mxfp4_mxfp8", "nvfp4", "nvfp4_bf16"])
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--inter", type=int, default=256)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()

    device = args.device
    if device == "auto":
        gpu = torch is not None and torch.cuda.is_available() and moe_ep.cuda_backend_available()
        device = "cuda" if gpu else "cpu"
    if device == "cuda" and torch is None:
        sys.exit("--device cuda needs torch")
    E, H, I, K = args.experts, args.hidden, args.inter, args.top_k

    # What the engine asks before it picks this MoE method.
    reasons = moe_ep.unsupported_reasons(num_experts=E, max_tokens_per_rank=args.max_tokens,
                                         hidden_size=H, intermediate_size=I, top_k=K,
                                         recipe=args.recipe, backend=device)
    if reasons:
        sys.exit("not supported:\n  " + "\n  ".join(reasons))

    # The EP group, once per process (W = 1 here; process_group= for torch.distributed): every
    # MoE layer of the model is built from it and shares its communicator and workspace pool.
    group = moe_ep.EpGroup(backend=device)
    # Construct from checkpoint-style tensors.
    ckpt = load_checkpoint(args.recipe, E, H, I)
    w = to_framework(ckpt, args.recipe, device)
    layer = moe_ep.MoeEpLayer(
        w["w13"], w["w2"], w["w13_scale"], w["w2_scale"],
        num_experts=E, max_tokens_per_rank=args.max_tokens, top_k=K, recipe=args.recipe,
        fc1_alpha=w["fc1_alpha"], fc2_alpha=w["fc2_alpha"], fc1_norm_const=w["fc1_norm_const"],
        group=group,
    )
    print(layer)
    print(f"  output_is_reduced={layer.output_is_reduced} is_monolithic={layer.is_monolithic} "
          f"topk_indices_dtype={layer.topk_indices_dtype}")

    # A decode-sized workspace beside the default one, warmed up before any capture.
    T = args.tokens
    ws = layer.select_workspace(T)
    if ws.capacity > T:
        ws = layer.create_workspace(T)
    layer.warmup(ws)

    # Static input buffers, as a CUDA-graph-capturing engine keeps them.
    rng = np.random.default_rng(1)
    if torch is not None:
        x_buf = torch.zeros((T, H), dtype=torch.bfloat16, device=device)
        ids_buf = torch.zeros((T, K), dtype=layer.topk_indices_dtype, device=device)
        wt_buf = torch.zeros((T, K), dtype=torch.float32, device=device)
    else:
        x_buf = np.zeros((T, H), np.uint16)
        ids_buf = np.zeros((T, K), np.int32)
        wt_buf = np.zeros((T, K), np.float32)

    graph, out_buf = None, None
    if device == "cuda":
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out_buf = layer(x_buf, ids_buf, wt_buf, workspace=ws)
        print(f"  captured a CUDA graph for T={T} (workspace capacity {ws.capacity})")

    worst = 0.0
    for step in range(args.steps):
        # The router's output for this step (random here).
        x = rng.standard_normal((T, H)).astype(np.float32)
        x_bits = (x.view(np.uint32) + 0x8000 >> 16).astype(np.uint16)  # round to bf16
        ids = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32)
        wts = rng.random((T, K)).astype(np.float32)
        wts /= wts.sum(axis=1, keepdims=True)
        if torch is not None:
            x_buf.copy_(torch.from_numpy(x_bits.view(np.int16)).view(torch.bfloat16))
            ids_buf.copy_(torch.from_numpy(ids))
            wt_buf.copy_(torch.from_numpy(wts))
        else:
            x_buf[:], ids_buf[:], wt_buf[:] = x_bits, ids, wts
        t0 = time.perf_counter()
        if graph is not None:
            graph.replay()
            torch.cuda.synchronize()
            out = out_buf
        else:
            out = layer(x_buf, ids_buf, wt_buf, workspace=ws)
        dt = time.perf_counter() - t0
        got = (as_bits(out).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        ref = reference(ckpt, args.recipe, x_bits, ids, wts)
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        worst = max(worst, err)
        print(f"  step {step}: T={T} {dt * 1e3:.2f} ms, rel L2 vs reference {err:.2e}")

    layer.destroy()
    group.destroy()  # collective, after every layer of the group
    # The reference is the unquantized model: for recipes that quantize activations the gap is
    # the recipe's own quantization error (FP8: a few percent, FP4: about 15 percent). The exact
    # per-recipe models are in tests/python (numpy_reference.py, torch_reference.py).
    limit = {"bf16": 5e-3, "mxfp4_bf16": 5e-3, "mxfp4_mxfp8": 0.1, "nvfp4": 0.25,
             "nvfp4_bf16": 5e-3}[args.recipe]
    print(("OK" if worst <= limit else "MISMATCH") + f": worst rel L2 {worst:.2e} (limit {limit})")
    return 0 if worst <= limit else 1


if __name__ == "__main__":
    sys.exit(main())
