"""The edge between array frameworks and the extension: which framework an array belongs to,
the views that make it cross by DLPack without a copy, where outputs are allocated, and which
CUDA stream a call runs on."""

import sys

import numpy as np

# Framework codes understood by the extension (bindings.cpp: Framework).
NUMPY, TORCH, DLPACK = 0, 1, 2


def _torch():
    """torch if the caller already imported it (we never import torch ourselves for numpy)."""
    return sys.modules.get("torch")


def is_torch(a):
    t = _torch()
    return t is not None and isinstance(a, t.Tensor)


def is_cupy(a):
    cp = sys.modules.get("cupy")
    return cp is not None and isinstance(a, cp.ndarray)


def framework_of(a):
    if is_torch(a):
        return TORCH
    if isinstance(a, np.ndarray):
        return NUMPY
    return DLPACK


def is_tensor(a):
    """A torch tensor, a numpy array or a DLPack producer (cupy, jax, ...)."""
    return isinstance(a, np.ndarray) or is_torch(a) or hasattr(a, "__dlpack__")


def require_tensor(a, name, optional=False):
    """Raises the library's InvalidArgumentError unless `a` is a tensor (or None if optional):
    a list, a scalar or a string is not taken in place of a tensor."""
    if a is None and optional:
        return
    if not is_tensor(a):
        from ._errors import InvalidArgumentError

        kind = "None" if a is None else type(a).__name__
        raise InvalidArgumentError(
            f"{name} must be a tensor (torch.Tensor, numpy.ndarray or a DLPack array), got {kind}"
        )


def require_count(n, name, lo=0):
    """An int (not a bool, not a float) >= lo, or the library's InvalidArgumentError."""
    from ._errors import InvalidArgumentError

    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise InvalidArgumentError(f"{name} must be an int, got {type(n).__name__} {n!r}")
    if int(n) < lo:
        raise InvalidArgumentError(f"{name} = {int(n)} must be >= {lo}")
    return int(n)


def _is_ml_bf16(dtype):
    # An ml_dtypes.bfloat16 array cannot exist unless ml_dtypes was imported.
    ml = sys.modules.get("ml_dtypes")
    return ml is not None and dtype == ml.bfloat16


def to_extension(a):
    """An object nanobind's ndarray caster takes without copying (None stays None). Hot path:
    called for every tensor of every forward."""
    if a is None:
        return None
    if type(a) is np.ndarray:
        return a.view(np.uint16) if _is_ml_bf16(a.dtype) else a
    t = _torch()
    if t is not None and isinstance(a, t.Tensor):
        if a.requires_grad:
            a = a.detach()  # DLPack refuses tensors that require grad
        if a.dtype in _torch_byte_dtypes(t):
            a = a.view(t.uint8)  # float8 scale bytes cross as raw bytes
        return a
    if isinstance(a, np.ndarray):
        return a.view(np.uint16) if _is_ml_bf16(a.dtype) else a
    return a  # cupy and other DLPack producers (anything else was rejected by require_tensor)


_BYTE_DTYPES = None


def _torch_byte_dtypes(t):
    global _BYTE_DTYPES
    if _BYTE_DTYPES is None:
        names = ("float8_e4m3fn", "float8_e8m0fnu", "float8_e5m2")
        _BYTE_DTYPES = frozenset(getattr(t, n) for n in names if hasattr(t, n))
    return _BYTE_DTYPES


def bf16_like(x, rows, cols):
    """An uninitialized bf16 [rows, cols] output in x's framework and on x's device."""
    if is_torch(x):
        t = _torch()
        return t.empty((rows, cols), dtype=t.bfloat16, device=x.device)
    if isinstance(x, np.ndarray):
        out = np.empty((rows, cols), dtype=np.uint16)
        return out.view(x.dtype) if _is_ml_bf16(x.dtype) else out
    if is_cupy(x):
        import cupy

        with x.device:
            return cupy.empty((rows, cols), dtype=cupy.uint16)
    raise TypeError(
        f"hidden_states of type {type(x).__name__} is not supported: pass a torch tensor, a "
        "numpy array or a cupy array"
    )


def as_bf16_result(out, x):
    """The output as the caller expects it (numpy: the same bf16 representation as x)."""
    if isinstance(out, np.ndarray) and isinstance(x, np.ndarray) and _is_ml_bf16(x.dtype):
        return out.view(x.dtype)
    return out


def device_of(a):
    """('cpu', 0) or ('cuda', index) of an array."""
    if is_torch(a):
        d = a.device
        return ("cuda", d.index if d.index is not None else 0) if d.type == "cuda" else ("cpu", 0)
    if isinstance(a, np.ndarray):
        return ("cpu", 0)
    if hasattr(a, "__dlpack_device__"):
        kind, index = a.__dlpack_device__()
        return ("cuda", int(index)) if int(kind) == 2 else ("cpu", 0)
    return ("cpu", 0)


def stream_for(x, stream=None):
    """The cudaStream_t (as an int) a call on x runs on: an explicit `stream` (int, or an object
    with .cuda_stream / .ptr), else torch's / cupy's current stream for CUDA data, else 0."""
    if stream is not None:
        if isinstance(stream, int):
            return stream
        for attr in ("cuda_stream", "ptr"):
            if hasattr(stream, attr):
                return int(getattr(stream, attr))
        raise TypeError(f"stream of type {type(stream).__name__} is not a CUDA stream")
    if device_of(x)[0] != "cuda":
        return 0
    if is_torch(x):
        t = _torch()
        index = x.device.index
        raw = getattr(t._C, "_cuda_getCurrentRawStream", None)  # what current_stream() reads
        if raw is not None and index is not None:
            return int(raw(index))
        return int(t.cuda.current_stream(x.device).cuda_stream)
    if is_cupy(x):
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    return 0
