"""moe_ep: the Mixture-of-Experts layer with expert parallelism, from Python.

    import moe_ep
    layer = moe_ep.MoeEpLayer(w13, w2, num_experts=E, max_tokens_per_rank=256, top_k=8)
    out = layer(hidden_states, topk_ids, topk_weights)

Tensors cross by DLPack without copies (torch, numpy, cupy); see docs/python.md.
"""

import ctypes
import os


def _preload_nccl():
    # A CUDA build links libnccl from the nvidia-nccl Python package; load it first so that the
    # extension resolves it even where the package's folder is not on the loader's path.
    try:
        import nvidia.nccl as _n  # noqa: PLC0415

        for d in list(getattr(_n, "__path__", [])):
            lib = os.path.join(d, "lib", "libnccl.so.2")
            if os.path.exists(lib):
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
                return
    except Exception:  # noqa: BLE001 - the CPU build needs none of this
        pass


try:
    from . import _moe_ep
except ImportError as e:
    if "nccl" not in str(e):
        raise
    _preload_nccl()
    from . import _moe_ep

from ._errors import (  # noqa: E402
    BackendError,
    CapacityError,
    DestroyedError,
    Error,
    InvalidArgumentError,
    PeerError,
    StateError,
    UnsupportedError,
    BY_CODE as _BY_CODE,
)

# One Python class per moe_ep::ErrorCode, matched by the library's code names.
_by_name = {cls.code: cls for cls in _BY_CODE}
_moe_ep._set_error_classes([_by_name.get(n, Error) for n in _moe_ep._error_code_names()])

from ._moe_ep import CpuFleet  # noqa: E402
from .checkpoint import Checkpoint  # noqa: E402
from .distributed import bootstrap_from_process_group, nccl_unique_id  # noqa: E402
from .layer import (  # noqa: E402
    EpGroup,
    ExpertWeightViews,
    KernelWeights,
    MoeEpLayer,
    UnfinalizedOutput,
    Workspace,
    unsupported_reasons,
)
from .weights import pack_expert_weights  # noqa: E402

__version__ = "0.1.0"


def cuda_backend_available():
    """True when this build has a CUDA backend and a GPU it can run on."""
    return _moe_ep._resolve_backend("auto") == "cuda"


__all__ = [
    "BackendError",
    "CapacityError",
    "Checkpoint",
    "CpuFleet",
    "DestroyedError",
    "EpGroup",
    "Error",
    "ExpertWeightViews",
    "InvalidArgumentError",
    "KernelWeights",
    "MoeEpLayer",
    "PeerError",
    "StateError",
    "UnfinalizedOutput",
    "UnsupportedError",
    "Workspace",
    "bootstrap_from_process_group",
    "cuda_backend_available",
    "nccl_unique_id",
    "pack_expert_weights",
    "unsupported_reasons",
]
