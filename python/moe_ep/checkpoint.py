"""Hugging Face checkpoints (include/moe_ep/checkpoint.h, docs/checkpoints.md).

    ckpt = moe_ep.Checkpoint("path/to/model")
    ckpt.info                                   # model type, format, shape, MoE layers, router
    layer = ckpt.layer(ckpt.info["moe_layers"][0], max_tokens_per_rank=256)   # a MoeEpLayer
    ids, weights = ckpt.route(0, hidden_states_f32)                           # the model's router

Each rank loads only its own experts' bytes from the files.
"""

import numpy as np

from . import _moe_ep
from . import _tensors as T
from .layer import MoeEpLayer, unsupported_reasons


class Checkpoint:
    """A Hugging Face model directory: config.json, *.safetensors (with or without
    model.safetensors.index.json), hf_quant_config.json for ModelOpt NVFP4.

    Construction reads and checks config.json, the index and every shard's header (no tensor
    data); every inconsistency is an ``InvalidArgumentError`` naming the file, tensor, field,
    value and expectation.
    """

    def __init__(self, path):
        self._impl = _moe_ep._Checkpoint(str(path))
        self._info = dict(self._impl.info())

    @property
    def info(self):
        """dict: dir, model_type, weight_format ('bf16', 'mxfp4', 'nvfp4'), hidden_size,
        moe_intermediate_size, num_experts, top_k, num_hidden_layers, moe_layers, swiglu_limit,
        swiglu_alpha, swiglu_beta, has_expert_bias, native_recipe (a recipe name), router,
        norm_topk_prob, routed_scaling_factor, n_group, topk_group."""
        return dict(self._info)

    def load_layer(self, layer_index, recipe=None, rank=0, world_size=1):
        """The experts of ``rank`` of ``world_size`` of decoder layer ``layer_index`` as numpy
        arrays in the checkpoint layout of ``recipe`` (default: the native one): w13, w2,
        w13_scale, w2_scale (None for bf16; bf16 as uint16 bits), fc1_alpha, fc2_alpha,
        fc1_norm_const, fc1_bias, fc2_bias (None when the model has none), and ``config``: a dict
        of num_experts, hidden_size, intermediate_size, top_k, recipe, swiglu_limit,
        swiglu_alpha, swiglu_beta, input_norm_const, has_expert_bias."""
        return dict(
            self._impl.load_layer(
                int(layer_index), None if recipe is None else str(recipe), int(world_size),
                int(rank)
            )
        )

    def layer(self, layer_index, recipe=None, rank=0, world_size=1, max_tokens_per_rank=256,
              **kwargs):
        """A ``MoeEpLayer`` of this rank built from the loaded weights. ``kwargs`` go to
        ``MoeEpLayer`` (backend, cpu_fleet, device, nccl_unique_id, process_group, ...); with
        ``process_group`` the rank and world size are the group's."""
        pg = kwargs.get("process_group")
        if pg is not None:
            import torch.distributed as dist

            rank, world_size = dist.get_rank(group=pg), dist.get_world_size(group=pg)
        w = self.load_layer(layer_index, recipe, rank, world_size)
        c = w["config"]
        if pg is None:
            kwargs.setdefault("world_size", world_size)
            kwargs.setdefault("rank", rank)
        return MoeEpLayer(
            w["w13"],
            w["w2"],
            w["w13_scale"],
            w["w2_scale"],
            num_experts=c["num_experts"],
            max_tokens_per_rank=max_tokens_per_rank,
            top_k=c["top_k"],
            recipe=c["recipe"],
            hidden_size=c["hidden_size"],
            intermediate_size=c["intermediate_size"],
            swiglu_limit=c["swiglu_limit"],
            swiglu_alpha=c["swiglu_alpha"],
            swiglu_beta=c["swiglu_beta"],
            input_norm_const=c["input_norm_const"],
            has_expert_bias=c["has_expert_bias"],
            fc1_alpha=w["fc1_alpha"],
            fc2_alpha=w["fc2_alpha"],
            fc1_norm_const=w["fc1_norm_const"],
            fc1_bias=w["fc1_bias"],
            fc2_bias=w["fc2_bias"],
            **kwargs,
        )

    def unsupported_reasons(self, recipe=None, world_size=1, max_tokens_per_rank=256,
                            backend="cpu"):
        """Every reason this model's MoE layers cannot run in ``recipe`` (default: the native
        one) on ``backend`` at ``world_size`` ranks; empty when they can (``moe_ep.
        unsupported_reasons`` with the model's own geometry and expert semantics)."""
        i = self._info
        return unsupported_reasons(
            num_experts=i["num_experts"], max_tokens_per_rank=max_tokens_per_rank,
            hidden_size=i["hidden_size"], intermediate_size=i["moe_intermediate_size"],
            top_k=i["top_k"], recipe=recipe or i["native_recipe"], world_size=world_size,
            backend=backend, swiglu_limit=i["swiglu_limit"], swiglu_alpha=i["swiglu_alpha"],
            swiglu_beta=i["swiglu_beta"], has_expert_bias=i["has_expert_bias"])

    def route(self, layer_index, hidden_states):
        """The model's router of ``layer_index`` on hidden states [T, H] (computed in fp32):
        ``(topk_ids int32 [T, K], topk_weights float32 [T, K])`` as numpy arrays."""
        x = hidden_states
        if T.is_torch(x):
            x = x.detach().to("cpu").float().contiguous().numpy()
        x = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
        return tuple(self._impl.route(int(layer_index), x))

    @property
    def bytes_read(self):
        """Tensor bytes read from the shards so far (headers not counted)."""
        return int(self._impl.bytes_read())

    def __repr__(self):
        i = self._info
        return (
            f"Checkpoint({i['dir']!r}: {i['model_type']}, {i['weight_format']}, "
            f"E={i['num_experts']}, H={i['hidden_size']}, I={i['moe_intermediate_size']}, "
            f"K={i['top_k']}, {len(i['moe_layers'])} MoE layers)"
        )
