#!/usr/bin/env python3
"""Tiny random MoE models and the goldens of their MoE blocks, made by Hugging Face transformers.

    pip install -r scripts/requirements-golden.txt      # into a venv of its own, not .venv
    python scripts/make_model_goldens.py                 # writes tests/data/models/<name>/
    python scripts/make_model_goldens.py --check         # regenerates into a temporary folder and
                                                         # compares; exit 1 on a difference
    python scripts/make_model_goldens.py --check --device cuda   # the references on the GPU

Each model is built from a config alone (no download), with weights drawn from numpy's PCG64
(seeded, so the files do not depend on the torch release), rounded to bf16, and saved with
transformers' `save_pretrained`; gpt-oss's experts are then written in their MXFP4 on-disk
format and one Qwen3-MoE in NVIDIA ModelOpt's NVFP4 format. The references run in float32 on
the model transformers loads back from those files (MXFP4 dequantized by transformers'
`Mxfp4Config(dequantize=True)`; NVFP4 dequantized here, as the format defines it), so the
goldens are transformers' own MoE blocks on exactly the weights of the files.
`goldens.safetensors` holds, per MoE layer L, `layer{L}.hidden_states` [T, H] (bf16 values),
`layer{L}.topk_ids` / `layer{L}.topk_weights` (the model's router) and `layer{L}.routed_output`
(the routed experts' sum, without any shared expert), and the whole model's `input_ids` and
`logits`. docs/goldens.md describes the models and the formats.
"""

import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

SEED = 20261202
TOKENS = 32  # tokens of each layer's golden
BATCH, SEQ = 2, 8  # the whole model's input_ids
MARGIN = 2e-3  # the least router margin a golden token keeps (see route_margin)
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
                           "models")

# H and I multiples of 64; vocabulary and attention as small as the families allow.
_ATTN = dict(vocab_size=128, num_hidden_layers=2, num_attention_heads=2, tie_word_embeddings=False)
MODELS = {
    "qwen3_moe": dict(
        model_type="qwen3_moe", weight_format="bf16", num_experts_key="num_experts",
        config=dict(_ATTN, hidden_size=128, intermediate_size=128, moe_intermediate_size=64,
                    num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                    num_key_value_heads=1, head_dim=32, decoder_sparse_step=1, mlp_only_layers=[]),
    ),
    "mixtral": dict(
        model_type="mixtral", weight_format="bf16", max_shard_size="400KB",  # sharded + index
        config=dict(_ATTN, hidden_size=128, intermediate_size=64, num_local_experts=8,
                    num_experts_per_tok=2, num_key_value_heads=1, head_dim=32),
    ),
    "deepseek_v3": dict(
        model_type="deepseek_v3", weight_format="bf16",
        config=dict(_ATTN, hidden_size=128, intermediate_size=128, moe_intermediate_size=64,
                    n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                    n_shared_experts=1, routed_scaling_factor=2.5, first_k_dense_replace=1,
                    norm_topk_prob=True, num_key_value_heads=2, q_lora_rank=32, kv_lora_rank=32,
                    qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16),
    ),
    "gpt_oss_mxfp4": dict(
        model_type="gpt_oss", weight_format="mxfp4",
        config=dict(_ATTN, hidden_size=128, intermediate_size=64, num_local_experts=16,
                    num_experts_per_tok=4, num_key_value_heads=1, head_dim=32, sliding_window=4),
    ),
    "qwen3_moe_nvfp4": dict(
        model_type="qwen3_moe", weight_format="nvfp4",
        config=dict(_ATTN, hidden_size=128, intermediate_size=128, moe_intermediate_size=64,
                    num_experts=16, num_experts_per_tok=4, norm_topk_prob=True,
                    num_key_value_heads=1, head_dim=32, decoder_sparse_step=1, mlp_only_layers=[]),
    ),
}
# gpt-oss's experts (transformers' GptOssExperts): fc1 std so that |gate| passes the clamp
# limit 7 on a few percent of the elements.
GPT_OSS_FC1_GAIN = 4.0


# --- small formats --------------------------------------------------------------------------------
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_codes(x):
    """E2M1 codes (sign in bit 3) of x, round to nearest even, saturating at 6."""
    a = np.abs(x)
    mag = ((a > 0.25).astype(np.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5)
           + (a >= 3.5) + (a > 5.0)).astype(np.uint8)
    return mag | np.where(x < 0, np.uint8(8), np.uint8(0))


def e2m1_values(codes):
    v = E2M1_GRID[codes & 7]
    return np.where(codes & 8, -v, v)


def pack_nibbles(codes):
    """Two codes a byte along the last axis, the even element in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed):
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


def quantize_mxfp4(w):
    """OpenAI's MXFP4 for gpt-oss: blocks of 32 along the last axis, the scale a power of two
    2^(b-127) rounded up from amax / 6 (so no code saturates), codes round to nearest even.
    Returns (blocks uint8 [..., n/32, 16], scales uint8 [..., n/32])."""
    w = np.asarray(w, dtype=np.float64)
    blocks = w.reshape(w.shape[:-1] + (w.shape[-1] // 32, 32))
    amax = np.abs(blocks).max(axis=-1)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.ceil(np.log2(amax / 6.0)), -127)
    e = np.clip(e, -127, 127)
    codes = e2m1_codes(blocks / np.exp2(e)[..., None])
    return pack_nibbles(codes), (e + 127).astype(np.uint8)


def e4m3_round(x):
    """(value as float64, float8_e4m3fn tensor) of x, round to nearest even (torch's cast)."""
    t = torch.from_numpy(np.asarray(x, dtype=np.float32)).to(torch.float8_e4m3fn)
    return t.to(torch.float64).numpy(), t


def quantize_nvfp4(w, amax_global):
    """NVIDIA ModelOpt's NVFP4 for one linear weight [out, in]: weight_scale_2 = amax / (6 * 448)
    (fp32), one E4M3 scale per 16 inputs = e4m3(block amax / 6 / weight_scale_2), codes =
    e2m1(w / (scale * weight_scale_2)). Returns weight uint8 [out, in/2], weight_scale
    float8_e4m3fn [out, in/16] and weight_scale_2 float32 scalar."""
    w = np.asarray(w, dtype=np.float64)
    scale_2 = np.float32(amax_global / (6.0 * 448.0))
    blocks = w.reshape(w.shape[0], -1, 16)
    s_val, s_t = e4m3_round(np.abs(blocks).max(axis=-1) / 6.0 / float(scale_2))
    denom = s_val[..., None] * float(scale_2)
    codes = e2m1_codes(np.where(denom > 0, blocks / np.where(denom > 0, denom, 1), 0))
    return pack_nibbles(codes.reshape(w.shape)), s_t, scale_2


def dequantize_nvfp4(weight, weight_scale, weight_scale_2):
    vals = e2m1_values(unpack_nibbles(weight)).reshape(weight.shape[0], -1, 16)
    s = weight_scale.to(torch.float64).numpy()[..., None] * float(weight_scale_2)
    return (vals * s).reshape(weight.shape[0], -1)


def bf16_round(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float32)).to(torch.bfloat16).to(torch.float32)


# --- models -----------------------------------------------------------------------------------------
def hf_config(spec):
    cfg = transformers.AutoConfig.for_model(spec["model_type"], **spec["config"])
    cfg._experts_implementation = "eager"  # the modeling file's own loop over experts
    cfg._attn_implementation = "eager"
    return cfg


def moe_blocks(model):
    """{decoder layer index: its MoE block} (the blocks that have routed experts)."""
    return {i: layer.mlp for i, layer in enumerate(model.model.layers)
            if hasattr(layer.mlp, "experts")}


def init_weights(model, rng, model_type):
    """Every parameter and buffer drawn from rng, rounded to bf16 values: linear weights
    N(0, 1/fan_in), norms 1 + N(0, 0.1), biases and gpt-oss's sinks N(0, 0.1 / 0.5), embeddings
    N(0, 1); DeepSeek-V3's e_score_correction_bias N(0, 0.05) so that it changes the choice."""
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not p.is_floating_point() or "rotary" in name or "inv_freq" in name:
                continue
            shape = tuple(p.shape)
            leaf = name.rsplit(".", 1)[-1]
            if "norm" in name:
                v = 1.0 + 0.1 * rng.standard_normal(shape)
            elif leaf == "e_score_correction_bias":
                v = 0.05 * rng.standard_normal(shape)
            elif leaf == "sinks":
                v = 0.5 * rng.standard_normal(shape)
            elif "embed_tokens" in name:
                v = rng.standard_normal(shape)
            elif len(shape) == 1 or leaf.endswith("bias"):
                v = 0.1 * rng.standard_normal(shape)
            elif model_type == "gpt_oss" and leaf in ("gate_up_proj", "down_proj"):
                # [E, in, out]: fan_in is dim 1
                gain = GPT_OSS_FC1_GAIN if leaf == "gate_up_proj" else 1.0
                v = gain / math.sqrt(shape[1]) * rng.standard_normal(shape)
            else:  # [.., out, in]
                v = rng.standard_normal(shape) / math.sqrt(shape[-1])
            p.copy_(bf16_round(v))


def save_bf16(model, out_dir, spec):
    model.to(torch.bfloat16).save_pretrained(
        out_dir, safe_serialization=True, max_shard_size=spec.get("max_shard_size", "50MB"))
    model.to(torch.float32)


def read_tensors(model_dir):
    """All tensors of a model directory (single file or shards)."""
    out = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors") and f != "goldens.safetensors":
            out.update(load_file(os.path.join(model_dir, f)))
    return out


def write_single_file(model_dir, tensors):
    for f in os.listdir(model_dir):
        if f.startswith("model") and (f.endswith(".safetensors") or f.endswith(".index.json")):
            os.remove(os.path.join(model_dir, f))
    save_file({k: tensors[k].contiguous() for k in sorted(tensors)},
              os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})


def update_config(model_dir, rename=None, **fields):
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    for old, new in (rename or {}).items():
        cfg[new] = cfg.pop(old)
    cfg.update(fields)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def write_gpt_oss_mxfp4(model_dir, model):
    """gpt-oss's experts in the on-disk format of the released checkpoints: per layer
    `mlp.experts.gate_up_proj_blocks` [E, 2I, H/32, 16] and `_scales` [E, 2I, H/32] (rows in
    transformers' order: gate and up interleaved, even rows gate), `gate_up_proj_bias` [E, 2I],
    `down_proj_blocks` [E, H, I/32, 16], `_scales`, `down_proj_bias` [E, H]; quantization_config
    {quant_method: mxfp4}."""
    tensors = read_tensors(model_dir)
    for key in [k for k in tensors if k.endswith("mlp.experts.gate_up_proj")
                or k.endswith("mlp.experts.down_proj")]:
        w = tensors.pop(key).to(torch.float32).numpy()  # [E, in, out]
        blocks, scales = quantize_mxfp4(np.swapaxes(w, 1, 2))  # per 32 along `in`
        tensors[key + "_blocks"] = torch.from_numpy(blocks)
        tensors[key + "_scales"] = torch.from_numpy(scales)
    write_single_file(model_dir, tensors)
    update_config(model_dir, swiglu_limit=7.0, quantization_config={
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
    })


def write_modelopt_nvfp4(model_dir, model, calib):
    """The routed experts of a Qwen3-MoE in NVIDIA ModelOpt's NVFP4 export format: per linear
    `weight` uint8 [out, in/2], `weight_scale` float8_e4m3fn [out, in/16], `weight_scale_2` and
    `input_scale` float32 scalars; gate and up of an expert share weight_scale_2 and input_scale
    (one global scale for the fused gate/up GEMM engines run). input_scale =
    amax of the linear's input over `calib` (the layer's calibration tokens) / (6 * 448).
    Everything else stays bf16 and is listed in exclude_modules (hf_quant_config.json and
    config.json's quantization_config)."""
    tensors = read_tensors(model_dir)
    for li, block in moe_blocks(model).items():
        x = calib[li]
        pre = f"model.layers.{li}.mlp.experts."
        gate_up = block.experts.gate_up_proj.detach().numpy().astype(np.float64)  # [E, 2I, H]
        down = block.experts.down_proj.detach().numpy().astype(np.float64)  # [E, H, I]
        E, I = gate_up.shape[0], gate_up.shape[1] // 2
        for e in range(E):
            gate, up = gate_up[e, :I], gate_up[e, I:]
            amax = max(np.abs(gate).max(), np.abs(up).max())
            h = F.silu(torch.from_numpy(x @ gate.T)) * torch.from_numpy(x @ up.T)
            in_scales = {"gate_proj": np.abs(x).max(), "up_proj": np.abs(x).max(),
                         "down_proj": float(h.abs().max())}
            for proj, w, amax_p in (("gate_proj", gate, amax), ("up_proj", up, amax),
                                    ("down_proj", down[e], np.abs(down[e]).max())):
                q, s, s2 = quantize_nvfp4(w, amax_p)
                key = f"{pre}{e}.{proj}."
                del tensors[key + "weight"]
                tensors[key + "weight"] = torch.from_numpy(q)
                tensors[key + "weight_scale"] = s
                tensors[key + "weight_scale_2"] = torch.tensor(s2, dtype=torch.float32)
                tensors[key + "input_scale"] = torch.tensor(
                    np.float32(in_scales[proj] / (6.0 * 448.0)), dtype=torch.float32)
    write_single_file(model_dir, tensors)
    quant = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
             "exclude_modules": ["lm_head", "model.embed_tokens", "model.layers.*.self_attn*",
                                 "model.layers.*.mlp.gate"]}
    with open(os.path.join(model_dir, "hf_quant_config.json"), "w") as f:
        json.dump({"producer": {"name": "modelopt", "version": "(format only: written by "
                                "moe_ep scripts/make_model_goldens.py)"},
                   "quantization": quant}, f, indent=2, sort_keys=True)
        f.write("\n")
    update_config(model_dir, quantization_config=dict(quant, quant_method="modelopt"))


def dequantized_nvfp4_experts(model_dir, model):
    """{param name: fp32 tensor} of the routed experts' weights of a ModelOpt NVFP4 directory."""
    out = {}
    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        for li, block in moe_blocks(model).items():
            pre = f"model.layers.{li}.mlp.experts."
            E = block.experts.gate_up_proj.shape[0]
            gu, dn = [], []
            for e in range(E):
                rows = []
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    k = f"{pre}{e}.{proj}."
                    rows.append(dequantize_nvfp4(f.get_tensor(k + "weight").numpy(),
                                                 f.get_tensor(k + "weight_scale"),
                                                 f.get_tensor(k + "weight_scale_2").item()))
                gu.append(np.concatenate(rows[:2]))
                dn.append(rows[2])
            out[pre + "gate_up_proj"] = torch.from_numpy(np.stack(gu).astype(np.float32))
            out[pre + "down_proj"] = torch.from_numpy(np.stack(dn).astype(np.float32))
    return out


def load_reference_model(model_dir, device="cpu"):
    """The float32 transformers model of a directory written here, loaded as transformers loads
    it (bf16: from_pretrained; MXFP4: Mxfp4Config(dequantize=True)); for ModelOpt NVFP4, which
    transformers does not load, the config's model with the checkpoint's bf16 tensors and the
    experts' NVFP4 weights dequantized as the format defines them. Eager attention and experts."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    quant = (cfg.get("quantization_config") or {}).get("quant_method")
    kw = dict(attn_implementation="eager")
    if quant == "mxfp4":
        model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.bfloat16, experts_implementation="eager",
            quantization_config=transformers.Mxfp4Config(dequantize=True), **kw)
    elif quant == "modelopt":
        cfg.pop("quantization_config")
        config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        config._experts_implementation = "eager"
        config._attn_implementation = "eager"
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
            dense = {k: f.get_tensor(k) for k in f.keys() if ".mlp.experts." not in k}
        dense.update(dequantized_nvfp4_experts(model_dir, model))
        missing, unexpected = model.load_state_dict(dense, strict=False)
        missing = [m for m in missing if "rotary" not in m]
        if missing or unexpected:
            raise RuntimeError(f"{model_dir}: missing {missing}, unexpected {unexpected}")
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.bfloat16, experts_implementation="eager", **kw)
    if getattr(model.config, "_experts_implementation", "eager") not in (None, "eager"):
        raise RuntimeError(f"{model_dir}: experts implementation "
                           f"{model.config._experts_implementation}, wanted eager")
    return model.to(torch.float32).to(device).eval()


# --- routers and goldens -----------------------------------------------------------------------------
def router_of(block):
    return block.gate if hasattr(block, "gate") else block.router


def route_margin(block, model_type, x):
    """Per token, how far the router's choice is from changing: the gap between the K-th and the
    (K+1)-th score it ranks by (softmax probabilities, gpt-oss's logits, DeepSeek-V3's biased
    sigmoid scores within the chosen groups, and the gap of the group scores)."""
    r = router_of(block)
    k = r.top_k
    with torch.no_grad():
        logits = F.linear(x, r.weight, getattr(r, "bias", None))
        if model_type == "deepseek_v3":
            s = logits.sigmoid() + r.e_score_correction_bias
            g = s.view(len(x), r.num_group, -1).topk(2, dim=-1)[0].sum(-1)
            gs = g.sort(dim=-1, descending=True)[0]
            gmargin = gs[:, r.topk_group - 1] - gs[:, r.topk_group]
            keep = torch.zeros_like(g).scatter_(1, g.topk(r.topk_group, dim=-1)[1], 1)
            s = s.masked_fill(~keep.repeat_interleave(s.shape[1] // g.shape[1], 1).bool(), -1e9)
            ss = s.sort(dim=-1, descending=True)[0]
            return torch.minimum(ss[:, k - 1] - ss[:, k], gmargin)
        score = logits if model_type == "gpt_oss" else logits.softmax(-1)
        ss = score.sort(dim=-1, descending=True)[0]
        return ss[:, k - 1] - ss[:, k]


def routed_experts(block, x):
    """transformers' router and routed experts of one MoE block on x [T, H]:
    (topk_ids, topk_weights, routed_output)."""
    with torch.no_grad():
        out = router_of(block)(x)
        weights, ids = out[1], out[2]
        routed = block.experts(x, ids, weights)
        # The block as the model runs it equals routed + shared (DeepSeek-V3), or routed.
        full = block(x[None])
        full = full[0] if isinstance(full, tuple) else full
        shared = block.shared_experts(x) if hasattr(block, "shared_experts") else 0
        if not torch.allclose(full[0], routed + shared, rtol=1e-5, atol=1e-6):
            raise RuntimeError("the MoE block's output is not routed + shared experts")
    return ids.to(torch.int32), weights.to(torch.float32), routed


def golden_hidden_states(block, model_type, hidden, rng, device):
    """TOKENS rows of bf16 values N(0, 1) whose routing is clear of ties by MARGIN."""
    rows = []
    while sum(len(r) for r in rows) < TOKENS:
        x = bf16_round(rng.standard_normal((4 * TOKENS, hidden))).to(device)
        rows.append(x[route_margin(block, model_type, x) > MARGIN])
    return torch.cat(rows)[:TOKENS]


def make_goldens(model_dir, spec, seed, device):
    model = load_reference_model(model_dir, device)
    rng = np.random.default_rng([seed, 1])
    H = model.config.hidden_size
    out = {}
    for li, block in moe_blocks(model).items():
        x = golden_hidden_states(block, spec["model_type"], H, rng, device)
        ids, w, routed = routed_experts(block, x)
        out[f"layer{li}.hidden_states"] = x
        out[f"layer{li}.topk_ids"] = ids
        out[f"layer{li}.topk_weights"] = w
        out[f"layer{li}.routed_output"] = routed
    input_ids = torch.from_numpy(rng.integers(0, model.config.vocab_size, (BATCH, SEQ)))
    with torch.no_grad():
        logits = model(input_ids.to(device)).logits
    out["input_ids"] = input_ids.to(torch.int32)
    out["logits"] = logits.to(torch.float32)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "seed": str(seed), "device": device, "tokens": str(TOKENS), "margin": str(MARGIN),
            "generator": "scripts/make_model_goldens.py"}
    save_file({k: v.detach().cpu().contiguous() for k, v in out.items()},
              os.path.join(model_dir, "goldens.safetensors"), metadata=meta)


def make_model(name, spec, out_root, device):
    seed = SEED + sorted(MODELS).index(name)
    rng = np.random.default_rng(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(spec), dtype=torch.float32)
    init_weights(model, rng, spec["model_type"])
    model.eval()
    model_dir = os.path.join(out_root, name)
    shutil.rmtree(model_dir, ignore_errors=True)
    save_bf16(model, model_dir, spec)
    if spec.get("num_experts_key"):  # the name the model's own release uses
        update_config(model_dir, rename={"num_local_experts": spec["num_experts_key"]})
    if spec["weight_format"] == "mxfp4":
        write_gpt_oss_mxfp4(model_dir, model)
    elif spec["weight_format"] == "nvfp4":
        calib_rng = np.random.default_rng([seed, 2])
        calib = {li: bf16_round(calib_rng.standard_normal((256, model.config.hidden_size)))
                 .numpy().astype(np.float64) for li in moe_blocks(model)}
        write_modelopt_nvfp4(model_dir, model, calib)
    for f in ("generation_config.json",):
        p = os.path.join(model_dir, f)
        if os.path.exists(p):
            os.remove(p)
    make_goldens(model_dir, spec, seed, device)
    return model_dir


# --- --check --------------------------------------------------------------------------------------------
def _load_all(path):
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}


def _canonical_slot_order(tensors):
    """Each token's top-k slots sorted by expert id, ids and weights together: a router whose
    top-k is unsorted (DeepSeek-V3's torch.topk(sorted=False)) returns the same choice in another
    slot order on another device, and the layer's output does not depend on the order."""
    for k in [k for k in tensors if k.endswith(".topk_ids")]:
        w = k[: -len("topk_ids")] + "topk_weights"
        if w not in tensors:
            continue
        ids = tensors[k].long()
        order = torch.argsort(ids, dim=-1, stable=True)
        tensors[k] = torch.gather(tensors[k], -1, order.to(torch.int64))
        tensors[w] = torch.gather(tensors[w], -1, order.to(torch.int64))


def compare_dirs(new, old, rtol):
    """Differences between a regenerated model directory and the committed one: file names,
    config JSON, checkpoint tensors bitwise, golden inputs and ids exactly (each token's slots in
    expert order), golden outputs within rtol of their largest magnitude."""
    problems = []
    files_new, files_old = sorted(os.listdir(new)), sorted(os.listdir(old))
    if files_new != files_old:
        return [f"files {files_new} != {files_old}"]
    for f in files_new:
        a, b = os.path.join(new, f), os.path.join(old, f)
        if f.endswith(".json"):
            with open(a) as fa, open(b) as fb:
                ja, jb = json.load(fa), json.load(fb)
            ja.pop("transformers_version", None)
            jb.pop("transformers_version", None)
            if ja != jb:
                problems.append(f"{f} differs")
            continue
        ta, ma = _load_all(a)
        tb, mb = _load_all(b)
        if sorted(ta) != sorted(tb):
            problems.append(f"{f}: tensor names differ")
            continue
        if f == "goldens.safetensors":
            _canonical_slot_order(ta)
            _canonical_slot_order(tb)
        for k in sorted(ta):
            x, y = ta[k], tb[k]
            if x.dtype != y.dtype or x.shape != y.shape:
                problems.append(f"{f}:{k}: {x.dtype}{list(x.shape)} != {y.dtype}{list(y.shape)}")
            elif f != "goldens.safetensors" or not x.is_floating_point() or k.endswith(
                    "hidden_states"):
                if not torch.equal(x.view(torch.uint8) if x.dtype.itemsize == 1 else x, y.view(
                        torch.uint8) if y.dtype.itemsize == 1 else y):
                    problems.append(f"{f}:{k}: not bitwise equal")
            else:
                err = float((x.double() - y.double()).abs().max() / y.double().abs().max())
                if not err <= rtol:
                    problems.append(f"{f}:{k}: max difference {err:.3g} of the largest value "
                                    f"(limit {rtol:g})")
        if f == "goldens.safetensors":
            for v in ("transformers", "torch"):
                if ma.get(v) != mb.get(v):
                    print(f"  note: {os.path.basename(new)}: {v} {ma.get(v)} here, "
                          f"{mb.get(v)} in the committed goldens")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="folder of the model directories")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where the float32 references run")
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary folder and compare with --out")
    ap.add_argument("--rtol", type=float, default=1e-4,
                    help="--check: the largest difference of a golden output, relative to its "
                         "largest magnitude (float32 summation order differs between devices)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    names = [n for n in args.models.split(",") if n]
    for n in names:
        if n not in MODELS:
            sys.exit(f"unknown model {n!r}; known: {', '.join(MODELS)}")
    if not args.check:
        os.makedirs(args.out, exist_ok=True)
        for n in names:
            d = make_model(n, MODELS[n], args.out, args.device)
            size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
            print(f"{n}: {d} ({size / 1024:.0f} KiB)")
        return 0
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for n in names:
            make_model(n, MODELS[n], tmp, args.device)
            old = os.path.join(args.out, n)
            problems = (compare_dirs(os.path.join(tmp, n), old, args.rtol)
                        if os.path.isdir(old) else [f"{old} is missing"])
            print(f"{n}: {'current' if not problems else 'DIFFERS'}")
            for p in problems:
                print(f"  {p}")
            failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
