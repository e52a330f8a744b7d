"""The forward of docs/contract.md §3 in torch (float64 GEMMs, the contract's roundings), written
from the contract's text; runs on whatever device its inputs are on. Mirrors numpy_reference.py
for torch callers."""

import torch

E2M1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]


def round_bf16(x):
    return x.to(torch.float32).to(torch.bfloat16).to(torch.float64)


def round_e4m3(x):
    x = x.to(torch.float32).clamp(-448.0, 448.0)  # E4M3 saturates; torch's cast would give NaN
    return x.to(torch.float8_e4m3fn).to(torch.float64)


def round_e2m1(x):
    a = x.abs()
    code = ((a > 0.25).long() + (a >= 0.75).long() + (a > 1.25).long() + (a >= 1.75).long()
            + (a > 2.5).long() + (a >= 3.5).long() + (a > 5.0).long())
    vals = torch.tensor(E2M1[:8], dtype=torch.float64, device=x.device)
    return torch.sign(x).to(torch.float64) * vals[code]


def ue8m0_scale(amax, max_value):
    ma, ea = torch.frexp(amax)
    mm, em = torch.frexp(torch.tensor(max_value, dtype=amax.dtype, device=amax.device))
    e = ea - em + (ma > mm).to(ea.dtype)
    e = torch.where(amax == 0, torch.full_like(e, -127), e.clamp(-127, 127))
    return torch.exp2(e.to(torch.float64))


def quant_nvfp4(x, nc):
    shape = x.shape
    xb = x.to(torch.float32).reshape(*shape[:-1], shape[-1] // 16, 16)
    nc = torch.tensor(float(nc), dtype=torch.float32, device=x.device)
    amax = xb.abs().amax(dim=-1, keepdim=True)
    s = round_e4m3((amax * nc) / 6.0)
    q = round_e2m1(((xb * nc) / s.to(torch.float32)).to(torch.float64))
    q = torch.where(s == 0, torch.zeros_like(q), q)
    return (q * s).reshape(shape)


def quant_mxfp8(x):
    shape = x.shape
    xb = x.to(torch.float32).to(torch.float64).reshape(*shape[:-1], shape[-1] // 32, 32)
    scale = ue8m0_scale(xb.abs().amax(dim=-1, keepdim=True), 448.0)
    return (round_e4m3(xb / scale) * scale).reshape(shape)


def dequant_weights(recipe, w, scale):
    if recipe == "bf16":
        return w.view(torch.bfloat16).to(torch.float64) if w.dtype != torch.bfloat16 else w.double()
    w = w.view(torch.uint8).long()
    lut = torch.tensor(E2M1, dtype=torch.float64, device=w.device)
    vals = torch.stack([lut[w & 0xF], lut[w >> 4]], dim=-1).reshape(*w.shape[:-1], -1)
    if recipe in ("nvfp4", "nvfp4_bf16"):  # NVFP4 weights: E4M3 per 16
        s = scale.view(torch.uint8).view(torch.float8_e4m3fn).to(torch.float64)
        g = 16
    else:
        s = torch.exp2(scale.view(torch.uint8).to(torch.float64) - 127.0)
        g = 32
    return vals * s.repeat_interleave(g, dim=-1)


def moe_forward(recipe, w13, w2, w13_scale, w2_scale, x, ids, weights, *, fc1_alpha=None,
                fc2_alpha=None, fc1_norm_const=None, input_norm_const=1.0, swiglu_limit=None,
                apply_topk_in_fc1=False, return_rows=False):
    """Finalized bf16 [T, H] (or the bf16 rows y [T, K, H] with return_rows)."""
    T, K = ids.shape
    E = w13.shape[0]
    W13 = dequant_weights(recipe, w13, w13_scale)
    W2 = dequant_weights(recipe, w2, w2_scale)
    I, H = W13.shape[1] // 2, W13.shape[2]
    ones = torch.ones(E, dtype=torch.float32, device=x.device)
    a1 = ones if fc1_alpha is None else fc1_alpha.float()
    a2 = ones if fc2_alpha is None else fc2_alpha.float()
    nc1 = ones if fc1_norm_const is None else fc1_norm_const.float()
    in_fc1 = apply_topk_in_fc1 or recipe == "mxfp4_mxfp8"
    xf = x.to(torch.float32)
    if recipe == "nvfp4":
        xq = quant_nvfp4(xf, input_norm_const)
    elif recipe == "mxfp4_mxfp8":
        xq = quant_mxfp8(xf)
    else:
        xq = xf.to(torch.float64)
    y = torch.zeros((T, K, H), dtype=torch.bfloat16, device=x.device)
    for e in range(E):
        t_idx, k_idx = torch.nonzero(ids == e, as_tuple=True)
        if t_idx.numel() == 0:
            continue
        acc = xq[t_idx] @ W13[e].T
        if recipe in ("nvfp4", "nvfp4_bf16"):  # the NVFP4 weights' alphas
            acc = acc * float(a1[e])
        elif recipe == "mxfp4_mxfp8":
            acc = round_bf16(acc)
        g, u = acc[:, :I], acc[:, I:]
        if swiglu_limit is not None:
            g = g.clamp(max=swiglu_limit)
            u = u.clamp(-swiglu_limit, swiglu_limit)
        h = u * g * torch.sigmoid(g)
        if in_fc1:
            h = h * weights[t_idx, k_idx].double()[:, None]
        if recipe == "nvfp4":
            h = quant_nvfp4(h, float(nc1[e]))
        elif recipe == "mxfp4_mxfp8":
            h = quant_mxfp8(h)
        else:
            h = round_bf16(h)
        out = h @ W2[e].T
        if recipe in ("nvfp4", "nvfp4_bf16"):
            out = out * float(a2[e])
        y[t_idx, k_idx] = out.to(torch.float32).to(torch.bfloat16)
    if return_rows:
        return y
    acc = torch.zeros((T, H), dtype=torch.float32, device=x.device)
    for k in range(K):
        c = torch.ones(T, device=x.device) if in_fc1 else weights[:, k].float()
        live = (ids[:, k] >= 0)[:, None]
        acc = torch.where(live, acc + c[:, None] * y[:, k].float(), acc)
    return acc.to(torch.bfloat16)


def rel_l2(out, ref):
    a, b = out.double(), ref.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
