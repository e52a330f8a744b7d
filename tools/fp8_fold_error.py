# Design check for the fp8 MMA path of mxfp4_mxfp8 (docs/kernels.md): the error of
# folding the per-32 UE8M0 scales into one power of two per row. Needs numpy and ml_dtypes
# (pip install numpy==2.1.3 ml_dtypes==0.5.1); not part of the tests.
import numpy as np, ml_dtypes
E4 = ml_dtypes.float8_e4m3fn
rng = np.random.default_rng(0)
def pow2_scale(amax, qmax):
    e = np.ceil(np.log2(np.maximum(amax, 1e-30) / qmax))
    return np.exp2(e)
def e2m1(v):
    grid = np.array([0, .5, 1, 1.5, 2, 3, 4, 6])
    a = np.abs(v); idx = np.abs(a[..., None] - grid).argmin(-1)
    return np.sign(v) * grid[idx]
def quant(x, qmax, fn):
    b = x.reshape(x.shape[0], -1, 32)
    s = pow2_scale(np.abs(b).max(-1, keepdims=True), qmax)
    return (fn(b / s) * s).reshape(x.shape), s[..., 0]
def e4(v): return v.astype(E4).astype(np.float64)
H, T, R = 7168, 64, 512
for name, outl in (("gaussian", 1.0), ("outlier channels x30", 30.0)):
    x = rng.standard_normal((T, H))
    ch = rng.choice(H, 16, replace=False); x[:, ch] *= outl
    w = rng.standard_normal((R, H)) * 0.02
    w[:, rng.choice(H, 64, replace=False)] *= 8
    xq, sx = quant(x, 448.0, e4)
    wq, sw = quant(w, 6.0, e2m1)
    ref = xq @ wq.T
    Sa = sx.max(1, keepdims=True)                 # per token
    xf = e4(xq / Sa) * Sa                         # fold: one power of two per row
    Sw = sw.max(1, keepdims=True) / 64            # max - 6 binades
    wf = e4(wq / Sw) * Sw
    span = np.log2(sw.max(1) / sw.min(1)).max()
    y = xf @ wf.T
    print(f"{name}: rel L2 {np.linalg.norm(y-ref)/np.linalg.norm(ref):.2e}, "
          f"weights exact: {np.array_equal(wf, wq)} (max scale span {span:.0f} binades), "
          f"activations exact: {np.mean(xf == xq)*100:.2f}% of elements")
