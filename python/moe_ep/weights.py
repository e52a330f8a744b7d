"""Weight preparation (include/moe_ep/weight_prep.h): fp32 master weights to a recipe's packed
checkpoint tensors, as numpy arrays."""

import numpy as np

from . import _moe_ep
from . import _tensors as T


def _f32(a):
    if a is None:
        return None
    if T.is_torch(a):
        a = a.detach().to("cpu").float().contiguous().numpy()
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def pack_expert_weights(recipe, w13, w2, *, input_norm_const=1.0, fc1_norm_const=None):
    """Packs fp32 w13 [E, 2I, H] (rows [0, I) gate, [I, 2I) up) and w2 [E, H, I] for `recipe`.

    Returns a dict of numpy arrays: w13, w2, w13_scale, w2_scale (None for bf16; bf16 weights
    come as uint16 bits), fc1_alpha, fc2_alpha, fc1_norm_const (float32 [E]). For nvfp4 and
    nvfp4_bf16 the alphas undo the per-expert global scales (alpha * acc is the true dot
    product).
    Slice [first:first + E_local] along dim 0 for one rank's share.
    """
    return dict(
        _moe_ep._pack_expert_weights(
            str(recipe), _f32(w13), _f32(w2), float(input_norm_const), _f32(fc1_norm_const)
        )
    )
