"""moe_ep.Checkpoint on a tiny gpt-oss MXFP4 checkpoint written here with numpy and the
safetensors wheel (runs in CI).

The oracle is gpt-oss's expert math as transformers writes it (GptOssExperts on the weights
convert_moe_packed_tensors dequantizes: gate = rows 0::2, up = rows 1::2 of gate_up, the clamp,
(up + 1) * gate * sigmoid(1.702 * gate), the biases), in float64 with numpy, independent of
the loader's own de-interleaving."""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

import moe_ep
import numpy_reference as R
from rank_threads import run_ranks

E, H, I, K, L = 4, 64, 64, 2, 2
FP4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def dequant_mxfp4(blocks, scales):
    """transformers' convert_moe_packed_tensors, without the final transpose: [..., rows, cols]."""
    lo = FP4[blocks & 0x0F]
    hi = FP4[blocks >> 4]
    vals = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)
    vals = vals * np.exp2(scales.astype(np.float64) - 127)[..., None]
    return vals.reshape(*blocks.shape[:-2], -1)


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt_oss")
    rng = np.random.default_rng(5)
    t = {}
    for layer in range(L):
        p = f"model.layers.{layer}.mlp."
        t[p + "experts.gate_up_proj_blocks"] = rng.integers(0, 256, (E, 2 * I, H // 32, 16), np.uint8)
        t[p + "experts.gate_up_proj_scales"] = rng.integers(120, 125, (E, 2 * I, H // 32), np.uint8)
        t[p + "experts.gate_up_proj_bias"] = (rng.standard_normal((E, 2 * I)) * 0.1).astype(np.float32)
        t[p + "experts.down_proj_blocks"] = rng.integers(0, 256, (E, H, I // 32, 16), np.uint8)
        t[p + "experts.down_proj_scales"] = rng.integers(120, 125, (E, H, I // 32), np.uint8)
        t[p + "experts.down_proj_bias"] = (rng.standard_normal((E, H)) * 0.1).astype(np.float32)
        t[p + "router.weight"] = rng.standard_normal((E, H)).astype(np.float32)
        t[p + "router.bias"] = rng.standard_normal(E).astype(np.float32)
    names = sorted(t)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}
    for f, ns in shards.items():
        save_file({n: t[n] for n in ns}, str(d / f))
    index = {"metadata": {}, "weight_map": {n: f for f, ns in shards.items() for n in ns}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {"model_type": "gpt_oss", "hidden_size": H, "intermediate_size": I,
              "num_local_experts": E, "experts_per_token": K, "num_hidden_layers": L,
              "swiglu_limit": 7.0, "quantization_config": {"quant_method": "mxfp4"}}
    (d / "config.json").write_text(json.dumps(config))
    return d, t


def gpt_oss_reference(t, layer, x, ids, weights):
    p = f"model.layers.{layer}.mlp.experts."
    gu = dequant_mxfp4(t[p + "gate_up_proj_blocks"], t[p + "gate_up_proj_scales"])  # [E, 2I, H]
    dn = dequant_mxfp4(t[p + "down_proj_blocks"], t[p + "down_proj_scales"])  # [E, H, I]
    gub, dnb = t[p + "gate_up_proj_bias"], t[p + "down_proj_bias"]
    out = np.zeros((x.shape[0], H))
    for tok in range(x.shape[0]):
        for k in range(K):
            e = ids[tok, k]
            g_u = gu[e] @ x[tok] + gub[e]
            gate, up = g_u[0::2], g_u[1::2]
            gate = np.minimum(gate, 7.0)
            up = np.clip(up, -7.0, 7.0)
            h = (up + 1) * gate / (1 + np.exp(-1.702 * gate))
            out[tok] += weights[tok, k] * (dn[e] @ h + dnb[e])
    return out


def test_info_and_rank_slices(gpt_oss_dir):
    d, t = gpt_oss_dir
    ckpt = moe_ep.Checkpoint(d)
    info = ckpt.info
    assert info["model_type"] == "gpt_oss" and info["weight_format"] == "mxfp4"
    assert info["native_recipe"] == "mxfp4_bf16" and info["moe_layers"] == [0, 1]
    assert info["swiglu_limit"] == 7.0 and info["swiglu_beta"] == 1.0
    assert abs(info["swiglu_alpha"] - 1.702) < 1e-6
    w = ckpt.load_layer(1, rank=1, world_size=2)
    p = "model.layers.1.mlp.experts."
    blocks = t[p + "gate_up_proj_blocks"][2:4].reshape(2, 2 * I, H // 2)
    assert np.array_equal(w["w13"][:, :I], blocks[:, 0::2])
    assert np.array_equal(w["w13"][:, I:], blocks[:, 1::2])
    scales = t[p + "gate_up_proj_scales"][2:4]
    assert np.array_equal(w["w13_scale"][:, I:], scales[:, 1::2])
    assert np.array_equal(w["fc1_bias"][:, :I], t[p + "gate_up_proj_bias"][2:4, 0::2])
    assert np.array_equal(w["fc2_bias"], t[p + "down_proj_bias"][2:4])
    assert np.array_equal(w["w2"], t[p + "down_proj_blocks"][2:4].reshape(2, H, I // 2))
    assert w["config"]["recipe"] == "mxfp4_bf16" and w["config"]["has_expert_bias"]
    with pytest.raises(moe_ep.InvalidArgumentError, match="not divisible by world_size 3"):
        ckpt.load_layer(0, world_size=3)
    with pytest.raises(moe_ep.InvalidArgumentError, match="does not load into the bf16 recipe"):
        ckpt.load_layer(0, recipe="bf16")


def test_router_matches_gpt_oss(gpt_oss_dir):
    d, t = gpt_oss_dir
    ckpt = moe_ep.Checkpoint(d)
    x = np.random.default_rng(2).standard_normal((9, H)).astype(np.float32)
    ids, w = ckpt.route(0, x)
    logits = x.astype(np.float64) @ t["model.layers.0.mlp.router.weight"].T.astype(np.float64)
    logits += t["model.layers.0.mlp.router.bias"]
    top = np.argsort(-logits, axis=1, kind="stable")[:, :K]
    assert np.array_equal(ids, top)
    v = np.take_along_axis(logits, top, 1)
    ref = np.exp(v - v.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    np.testing.assert_allclose(w, ref, rtol=1e-5)


def test_layers_on_one_and_two_ranks_match_gpt_oss_math(gpt_oss_dir):
    d, t = gpt_oss_dir
    ckpt = moe_ep.Checkpoint(d)
    rng = np.random.default_rng(3)
    T = 6
    x_bits = R.bf16_bits(rng.standard_normal((T, H)))
    x = R.bf16_to_f32(x_bits)
    ids, w = ckpt.route(1, x)
    ref = gpt_oss_reference(t, 1, x.astype(np.float64), ids, w)

    single = ckpt.layer(1, max_tokens_per_rank=T, backend="cpu")
    out1 = single(x_bits, ids, w)
    single.destroy()
    err = np.linalg.norm(R.bf16_to_f32(out1) - ref) / np.linalg.norm(ref)
    assert err < 1e-2, err  # mxfp4_bf16: h rounded to bf16, y to bf16

    W = 2
    fleet = moe_ep.CpuFleet(W)
    outs = [None] * W

    def rank_main(r):
        layer = ckpt.layer(1, rank=r, world_size=W, max_tokens_per_rank=T, backend="cpu",
                           cpu_fleet=fleet)
        sl = slice(r * T // W, (r + 1) * T // W)
        outs[r] = layer(x_bits[sl], ids[sl], w[sl])
        layer.destroy()

    run_ranks(W, rank_main)
    assert np.array_equal(np.concatenate(outs), out1)  # W = 2 bitwise W = 1


def test_bad_directory_is_refused(tmp_path):
    with pytest.raises(moe_ep.InvalidArgumentError, match="config.json is missing"):
        moe_ep.Checkpoint(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "gpt_oss", "hidden_size": NaN}')
    with pytest.raises(moe_ep.InvalidArgumentError, match="malformed JSON"):
        moe_ep.Checkpoint(tmp_path)
