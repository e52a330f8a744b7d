"""Plain-PyTorch MoE layer (EP = 1) on the same shapes as bench_layer: bf16 experts through
torch._grouped_mm, SwiGLU, weighted sum. The baseline column of the records (docs/benchmarks.md).

    python3 bench/torch_baseline.py --json out.json [--tokens 1,8,...] [--iters 20]
"""
import argparse
import json
import statistics

import torch

SHAPES = {"dsv3": (7168, 2048, 256, 8), "qwen3": (2048, 768, 128, 8), "gpt-oss": (2880, 2880, 128, 4)}


def routing(T, E, K, zipf, gen):
    if zipf:
        p = 1.0 / torch.arange(1, E + 1, dtype=torch.float64, device="cuda")
        p = p[torch.randperm(E, device="cuda", generator=gen)]
        ids = torch.multinomial(p.expand(T, E), K, replacement=False, generator=gen)
    else:
        ids = torch.rand(T, E, device="cuda", generator=gen).topk(K, dim=1).indices
    w = torch.rand(T, K, device="cuda", generator=gen).softmax(-1)
    return ids.to(torch.int32), w


def moe_forward(x, ids, w, w13, w2):
    T, K = ids.shape
    E, I2, H = w13.shape
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    tok = order // K
    xs = x[tok]
    h = torch._grouped_mm(xs, w13.transpose(-2, -1), offs=offs)
    g, u = h[:, : I2 // 2], h[:, I2 // 2 :]
    h = (torch.nn.functional.silu(g.float()) * u.float()).to(torch.bfloat16)
    y = torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs)
    y = y.float() * w.reshape(-1)[order].unsqueeze(1)
    out = torch.zeros(T, H, dtype=torch.float32, device="cuda")
    out.index_add_(0, tok, y)
    return out.to(torch.bfloat16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--shape", default="dsv3")
    ap.add_argument("--tokens", default="1,8,32,128,512,2048,4096")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    H, I, E, K = SHAPES[args.shape]
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13 = (torch.randn(E, 2 * I, H, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    expert_bytes = (2 * I * H + H * I) * 2
    records = []
    print(f"{'shape':8} {'tokens':>6} {'routing':8} {'median_us':>10} {'min_us':>10} {'max_us':>10}")
    for T in [int(t) for t in args.tokens.split(",")]:
        for zipf in (False, True):
            sets = []
            for _ in range(2):
                ids, w = routing(T, E, K, zipf, gen)
                x = torch.randn(T, H, device="cuda", generator=gen).to(torch.bfloat16)
                sets.append((x, ids, w))
            for i in range(3):
                moe_forward(*sets[i & 1], w13, w2)
            torch.cuda.synchronize()
            times = []
            for i in range(args.iters):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                moe_forward(*sets[i & 1], w13, w2)
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e) * 1000)
            med = statistics.median(times)
            touched = int(torch.unique(sets[0][1]).numel())
            pairs = T * K
            rec = {
                "device": torch.cuda.get_device_name(), "ep": 1, "rank_count": 1,
                "shape": args.shape, "recipe": "torch_bf16_grouped_mm", "tokens_per_rank": T,
                "routing": "zipf" if zipf else "uniform", "median_us": med,
                "min_us": min(times), "max_us": max(times),
                "weight_bytes_read": touched * expert_bytes,
                "hbm_fraction": touched * expert_bytes / (med * 1e-6) / 4.22e12,
                "tflops": 6.0 * H * I * pairs / (med * 1e-6) / 1e12,
                "mma_fraction": 6.0 * H * I * pairs / (med * 1e-6) / 1e12 / 755.0,
                "iterations": args.iters, "timing": "eager, cuda events",
            }
            records.append(rec)
            print(f"{args.shape:8} {T:6d} {rec['routing']:8} {med:10.1f} {min(times):10.1f} {max(times):10.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
