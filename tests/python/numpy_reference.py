"""An independent numpy model of docs/contract.md §3 (one forward of the MoE layer, every
recipe), written from the contract's text: GEMMs in float64, the contract's roundings (bf16,
E4M3, E2M1, UE8M0) where it names them, and the fixed-order fp32 finalize. The tests compare the
library against it with the contract's tolerance (relative L2 <= 5e-3)."""

import numpy as np

E2M1_VALUES = np.array(
    [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64
)


# --- bf16 -------------------------------------------------------------------------------------
def bf16_bits(x):
    """float -> bf16 bits, round to nearest even (via float32)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(np.asarray(x, dtype=np.float32)), np.uint16(0x7FFF), r)


def bf16_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_bf16(x):
    return bf16_to_f32(bf16_bits(x)).astype(np.float64)


# --- small floats -------------------------------------------------------------------------------
def _floor_log2(a):
    _, ex = np.frexp(a)
    return ex.astype(np.int64) - 1


def round_e4m3(x):
    """Value of E4M3(x): nearest even, saturating at +-448."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    e = np.maximum(_floor_log2(a), -6)
    q = np.rint(a * np.exp2(3.0 - e)) * np.exp2(e - 3.0)
    return np.sign(x) * np.minimum(q, 448.0)


def round_e2m1(x):
    """Value of E2M1(x): nearest even on the grid 0 .5 1 1.5 2 3 4 6, saturating."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    code = (
        (a > 0.25).astype(int)
        + (a >= 0.75)
        + (a > 1.25)
        + (a >= 1.75)
        + (a > 2.5)
        + (a >= 3.5)
        + (a > 5.0)
    )
    return np.sign(x) * E2M1_VALUES[code]


def e4m3_decode(b):
    b = np.asarray(b, dtype=np.int64)
    exp, man = (b >> 3) & 0xF, b & 7
    v = np.where(exp == 0, man * 2.0**-9, (1 + man / 8.0) * np.exp2(exp - 7.0))
    v = np.where((exp == 15) & (man == 7), np.nan, v)
    return np.where(b & 0x80, -v, v)


def ue8m0_decode(b):
    return np.exp2(np.asarray(b, dtype=np.float64) - 127.0)


def ue8m0_scale(amax, max_value):
    """The smallest 2^e with amax / 2^e <= max_value (e in [-127, 127]); 2^-127 for amax 0."""
    ma, ea = np.frexp(np.asarray(amax, dtype=np.float64))
    mm, em = np.frexp(max_value)
    e = ea - em + (ma > mm)
    e = np.where(amax == 0, -127, np.clip(e, -127, 127))
    return np.exp2(e.astype(np.float64))


# --- block quantizers (dequantized values as the GEMMs see them) --------------------------------
def _blocks(x, g):
    return x.reshape(*x.shape[:-1], x.shape[-1] // g, g)


def quant_nvfp4(x, nc):
    """s = e4m3(amax*nc/6), q = e2m1(x*nc/s); returns q*s (nc stays in), per 16 along the row."""
    xb = _blocks(np.asarray(x, dtype=np.float32), 16)
    nc = np.float32(nc)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    s = round_e4m3((amax * nc).astype(np.float32) / np.float32(6.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        q = round_e2m1(((xb * nc).astype(np.float32) / s.astype(np.float32)).astype(np.float32))
    q = np.where(s == 0, 0.0, q)
    return (q * s).reshape(x.shape)


def quant_mxfp8(x):
    xb = _blocks(np.asarray(x, dtype=np.float32).astype(np.float64), 32)
    scale = ue8m0_scale(np.abs(xb).max(axis=-1, keepdims=True), 448.0)
    return (round_e4m3(xb / scale) * scale).reshape(np.shape(x))


def dequant_weights(recipe, w, scale):
    """Checkpoint tensors -> float64 [..., rows, cols]."""
    if recipe == "bf16":
        return bf16_to_f32(w).astype(np.float64)
    w = np.asarray(w, dtype=np.uint8)
    vals = np.empty(w.shape[:-1] + (w.shape[-1] * 2,), dtype=np.float64)
    vals[..., 0::2] = E2M1_VALUES[w & 0xF]
    vals[..., 1::2] = E2M1_VALUES[w >> 4]
    if recipe in ("nvfp4", "nvfp4_bf16"):  # NVFP4 weights: E4M3 per 16
        s, g = e4m3_decode(scale), 16
    else:
        s, g = ue8m0_decode(scale), 32
    return vals * np.repeat(s, g, axis=-1)


# --- the layer ----------------------------------------------------------------------------------
def expert_rows(recipe, w13, w2, w13_scale, w2_scale, x_bits, ids, weights, *, fc1_alpha=None,
                fc2_alpha=None, fc1_norm_const=None, input_norm_const=1.0, swiglu_limit=None,
                apply_topk_in_fc1=False):
    """y[t, k] as bf16 bits [T, K, H] (zeros for empty slots) and whether the weight was
    applied in fc1. Weights cover every expert (all ranks)."""
    T, K = ids.shape
    E = w13.shape[0]
    W13 = dequant_weights(recipe, w13, w13_scale)  # [E, 2I, H]
    W2 = dequant_weights(recipe, w2, w2_scale)  # [E, H, I]
    I, H = W13.shape[1] // 2, W13.shape[2]
    ones = np.ones(E, dtype=np.float32)
    a1 = ones if fc1_alpha is None else np.asarray(fc1_alpha, np.float32)
    a2 = ones if fc2_alpha is None else np.asarray(fc2_alpha, np.float32)
    nc1 = ones if fc1_norm_const is None else np.asarray(fc1_norm_const, np.float32)
    in_fc1 = apply_topk_in_fc1 or recipe == "mxfp4_mxfp8"

    x = bf16_to_f32(x_bits)
    if recipe == "nvfp4":
        xq = quant_nvfp4(x, np.float32(input_norm_const))
    elif recipe == "mxfp4_mxfp8":
        xq = quant_mxfp8(x)
    else:
        xq = x.astype(np.float64)

    y = np.zeros((T, K, H), dtype=np.uint16)
    for e in range(E):
        t_idx, k_idx = np.nonzero(ids == e)
        if t_idx.size == 0:
            continue
        acc = xq[t_idx] @ W13[e].T  # [n, 2I]
        if recipe in ("nvfp4", "nvfp4_bf16"):  # the NVFP4 weights' alphas
            acc = acc * float(a1[e])
        elif recipe == "mxfp4_mxfp8":
            acc = round_bf16(acc)
        g, u = acc[:, :I], acc[:, I:]
        if swiglu_limit is not None:
            g = np.minimum(g, swiglu_limit)
            u = np.clip(u, -swiglu_limit, swiglu_limit)
        h = u * g / (1.0 + np.exp(-g))
        if in_fc1:
            h = h * weights[t_idx, k_idx].astype(np.float64)[:, None]
        if recipe == "nvfp4":
            h = quant_nvfp4(h, nc1[e])
        elif recipe == "mxfp4_mxfp8":
            h = quant_mxfp8(h)
        else:
            h = round_bf16(h)
        out = h @ W2[e].T  # [n, H]
        if recipe in ("nvfp4", "nvfp4_bf16"):
            out = out * float(a2[e])
        y[t_idx, k_idx] = bf16_bits(out)
    return y, in_fc1


def finalize(y_bits, ids, weights, in_fc1):
    """out[t] = bf16(sum_k c[t,k] * float(y[t,k])), fp32, in slot order."""
    T, K, H = y_bits.shape
    acc = np.zeros((T, H), dtype=np.float32)
    for k in range(K):
        c = np.ones(T, np.float32) if in_fc1 else weights[:, k].astype(np.float32)
        term = (c[:, None] * bf16_to_f32(y_bits[:, k])).astype(np.float32)
        acc = np.where((ids[:, k] >= 0)[:, None], (acc + term).astype(np.float32), acc)
    return bf16_bits(acc)


def moe_forward(recipe, w13, w2, w13_scale, w2_scale, x_bits, ids, weights, **kw):
    """The finalized output bf16 bits [T, H]."""
    y, in_fc1 = expert_rows(recipe, w13, w2, w13_scale, w2_scale, x_bits, ids, weights, **kw)
    return finalize(y, ids, weights, in_fc1)


def rel_l2(out_bits, ref_bits):
    a = bf16_to_f32(out_bits).astype(np.float64)
    b = bf16_to_f32(ref_bits).astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
