"""Whole tiny models in transformers with every MoE block's routed experts replaced by moe_ep
layers built through moe_ep.Checkpoint (the routers, shared experts, attention and the rest stay
transformers'), against the golden logits of tests/data/models (docs/goldens.md).

Needs torch and transformers (scripts/requirements-golden.txt) beside moe_ep; skips without them,
as in CI, whose checks of the same checkpoints are test_model_goldens.py's."""

import json
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import moe_ep  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MODELS_DIR = os.path.join(ROOT, "tests", "data", "models")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import make_model_goldens as G  # noqa: E402  (the same loading as the goldens were made with)

MODELS = sorted(
    m for m in os.listdir(MODELS_DIR)
    if os.path.exists(os.path.join(MODELS_DIR, m, "goldens.safetensors"))
)

# Relative L2 error of the logits [B, S, V] against transformers' float32 logits. What enters it:
# each MoE block's input rounded to bf16 (the layer's input dtype) and the recipe's roundings of
# h, y and the output, about 3e-3 of the block's output for bf16 / mxfp4_bf16
# (test_model_goldens.py), carried to the logits through the later layers. The bound is the
# contract's 5e-3 for one layer (docs/contract.md §7) times the model's MoE layers, the error of
# layers that add what each contributes. Measured (CPU backend): 1.6e-3 DeepSeek-V3 (one MoE
# layer), 1.7e-3 Qwen3-MoE, 1.9e-3 Mixtral, 5.3e-3 gpt-oss (two MoE layers each; gpt-oss's
# experts, with biases and a larger fc1, carry more of the residual stream). The ModelOpt NVFP4
# model on the `nvfp4` recipe, whose activations are quantized to 4 bits: 6.2e-2, of which one
# token of 16 is routed differently in the second layer because its input moved; bound 0.12,
# twice that (the `nvfp4_bf16` recipe will be held to the bf16 bound).
PER_MOE_LAYER_TOL = {"bf16": 5e-3, "mxfp4_bf16": 5e-3, "nvfp4_bf16": 5e-3}
NVFP4_ACTIVATIONS_TOL = 0.12


def logits_tol(recipe, num_moe_layers):
    if recipe == "nvfp4":
        return NVFP4_ACTIVATIONS_TOL
    return PER_MOE_LAYER_TOL[recipe] * num_moe_layers


# The reference model as loaded here against the logits it made when the goldens were written.
CURRENT_TOL = 1e-5


class MoeEpExperts(torch.nn.Module):
    """In place of a block's `experts`: transformers' router hands over (top-k ids, weights), the
    moe_ep layer computes the routed sum from bf16 hidden states."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states, top_k_index, top_k_weights):
        x = hidden_states.to(torch.bfloat16).contiguous()
        out = self.layer(x, top_k_index.to(torch.int32).contiguous(),
                         top_k_weights.to(torch.float32).contiguous())
        return out.to(hidden_states.dtype)


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def golden(name):
    from safetensors.torch import load_file

    return load_file(os.path.join(MODELS_DIR, name, "goldens.safetensors"))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name", MODELS)
def test_logits_with_moe_ep_experts(name, device):
    if device == "cuda" and not (torch.cuda.is_available() and moe_ep.cuda_backend_available()):
        pytest.skip("no CUDA device, or this build has no usable CUDA backend")
    torch.backends.cuda.matmul.allow_tf32 = False
    d = os.path.join(MODELS_DIR, name)
    ckpt = moe_ep.Checkpoint(d)
    info = ckpt.info
    g = golden(name)
    input_ids = g["input_ids"].to(torch.int64).to(device)
    model = G.load_reference_model(d, device)
    with torch.no_grad():
        ref = model(input_ids).logits.cpu()
    assert rel_l2(ref, g["logits"]) <= CURRENT_TOL, "the goldens are not this transformers'"

    if device == "cuda":
        assert ckpt.unsupported_reasons(max_tokens_per_rank=input_ids.numel(),
                                        backend="cuda") == []
    blocks = G.moe_blocks(model)
    assert sorted(blocks) == list(info["moe_layers"])
    kw = dict(backend="cpu") if device == "cpu" else dict(backend="cuda", device=0)
    layers = []
    try:
        for L, block in blocks.items():
            layers.append(ckpt.layer(L, max_tokens_per_rank=input_ids.numel(), **kw))
            block.experts = MoeEpExperts(layers[-1])
        with torch.no_grad():
            logits = model(input_ids).logits.cpu()
    finally:
        for lay in layers:
            lay.destroy()
    assert torch.isfinite(logits).all()
    err = rel_l2(logits, g["logits"])
    recipe = info["native_recipe"]
    tol = logits_tol(recipe, len(blocks))
    assert err <= tol, f"{name} ({recipe}, {device}): logits rel L2 {err:.3e} > {tol:g}"
    # The replacement is in force: the logits moved, by the recipe's roundings.
    assert err > 0


def test_models_are_the_committed_ones():
    """Each committed directory is one the generator makes (the names and formats agree)."""
    assert sorted(G.MODELS) == MODELS
    for name in MODELS:
        with open(os.path.join(MODELS_DIR, name, "config.json")) as f:
            assert json.load(f)["model_type"] == G.MODELS[name]["model_type"]
        meta = _metadata(os.path.join(MODELS_DIR, name, "goldens.safetensors"))
        assert meta["generator"] == "scripts/make_model_goldens.py"
        assert np.isfinite(golden(name)["logits"].numpy()).all()


def _metadata(path):
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        return f.metadata()
