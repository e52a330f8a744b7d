"""moe_ep from Python on the CPU backend, with numpy only (runs in CI).

The oracle is numpy_reference.py, written from docs/contract.md §3 independently of the C++
code."""


import numpy as np
import pytest

import moe_ep
import numpy_reference as R
from rank_threads import run_ranks

E, H, I, K, CAP = 8, 128, 64, 2, 16
TOL = 5e-3  # docs/contract.md §7: relative L2


def master_weights(seed=0, e=E, h=H, i=I):
    rng = np.random.default_rng(seed)
    w13 = (rng.standard_normal((e, 2 * i, h)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((e, h, i)) * 0.1).astype(np.float32)
    return w13, w2


def inputs(t, seed=1, e=E, k=K, h=H):
    rng = np.random.default_rng(seed)
    x = R.bf16_bits(rng.standard_normal((t, h)))
    ids = np.array([rng.permutation(e)[:k] for _ in range(t)], dtype=np.int32).reshape(t, k)
    w = rng.random((t, k)).astype(np.float32)
    return x, ids, w


def make_layer(pack, recipe="bf16", first=0, count=E, **kw):
    sl = slice(first, first + count)
    take = lambda name: None if pack[name] is None else pack[name][sl]  # noqa: E731
    return moe_ep.MoeEpLayer(
        take("w13"),
        take("w2"),
        take("w13_scale"),
        take("w2_scale"),
        num_experts=kw.pop("num_experts", E),
        max_tokens_per_rank=kw.pop("max_tokens_per_rank", CAP),
        top_k=kw.pop("top_k", K),
        recipe=recipe,
        fc1_alpha=take("fc1_alpha"),
        fc2_alpha=take("fc2_alpha"),
        fc1_norm_const=take("fc1_norm_const"),
        **kw,
    )


def reference(pack, recipe, x, ids, w, **kw):
    return R.moe_forward(
        recipe, pack["w13"], pack["w2"], pack["w13_scale"], pack["w2_scale"], x, ids, w,
        fc1_alpha=pack["fc1_alpha"], fc2_alpha=pack["fc2_alpha"],
        fc1_norm_const=pack["fc1_norm_const"], **kw,
    )


@pytest.fixture(scope="module")
def bf16_pack():
    return moe_ep.pack_expert_weights("bf16", *master_weights())


# --- numerics ------------------------------------------------------------------------------------
@pytest.mark.parametrize("t", [0, 1, 7, CAP - 1, CAP])
def test_bf16_matches_numpy_reference(bf16_pack, t):
    x, ids, w = inputs(t, seed=t)
    if t >= 2:
        ids[1, 0] = -1  # an empty slot contributes nothing
    with make_layer(bf16_pack) as layer:
        out = layer(x, ids, w)
    assert out.dtype == np.uint16 and out.shape == (t, H)
    ref = reference(bf16_pack, "bf16", x, ids, w)
    assert not np.isnan(R.bf16_to_f32(out)).any()
    if t:
        assert R.rel_l2(out, ref) <= TOL
        assert np.abs(R.bf16_to_f32(out)).max() > 0


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4_mxfp8", "mxfp4_bf16", "nvfp4_bf16"])
@pytest.mark.parametrize("limit,in_fc1", [(None, False), (0.75, True)])
def test_4bit_recipes_match_numpy_reference(recipe, limit, in_fc1):
    nc = 2.0 if recipe == "nvfp4" else 1.0
    pack = moe_ep.pack_expert_weights(recipe, *master_weights(3), input_norm_const=nc)
    x, ids, w = inputs(11, seed=4)
    with make_layer(pack, recipe, swiglu_limit=limit, apply_topk_in_fc1=in_fc1,
                    input_norm_const=nc) as layer:
        out = layer(x, ids, w)
    ref = reference(pack, recipe, x, ids, w, swiglu_limit=limit, apply_topk_in_fc1=in_fc1,
                    input_norm_const=nc)
    assert R.rel_l2(out, ref) <= TOL


def test_reference_detects_a_wrong_activation(bf16_pack):
    # The oracle is sharp enough: a clamp the layer does not apply is far outside tolerance.
    x, ids, w = inputs(8)
    x = R.bf16_bits(R.bf16_to_f32(x) * 30)
    with make_layer(bf16_pack) as layer:
        out = layer(x, ids, w)
    assert R.rel_l2(out, reference(bf16_pack, "bf16", x, ids, w, swiglu_limit=0.1)) > 10 * TOL


def test_all_slots_empty_gives_zeros(bf16_pack):
    x, ids, w = inputs(5)
    ids[:] = -1
    with make_layer(bf16_pack) as layer:
        out = layer(x, ids, w)
    assert (R.bf16_to_f32(out) == 0).all()


def test_all_tokens_to_one_expert(bf16_pack):
    x, ids, w = inputs(CAP)
    ids[:, 0] = 5
    ids[:, 1] = -1
    with make_layer(bf16_pack) as layer:
        out = layer(x, ids, w)
    assert R.rel_l2(out, reference(bf16_pack, "bf16", x, ids, w)) <= TOL


def test_repeated_calls_are_bitwise_identical(bf16_pack):
    x, ids, w = inputs(9)
    with make_layer(bf16_pack) as layer:
        a, b = layer(x, ids, w), layer(x, ids, w)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("recipe", ["bf16", "mxfp4_mxfp8", "nvfp4_bf16"])
def test_finalized_equals_sum_of_unfinalized(recipe):
    pack = moe_ep.pack_expert_weights(recipe, *master_weights(5))
    x, ids, w = inputs(13, seed=6)
    ids[2, 1] = -1
    with make_layer(pack, recipe) as fin, make_layer(pack, recipe, do_finalize=False) as unf:
        out = fin(x, ids, w)
        rows, weights, indices = unf.forward_unfinalized(x, ids, w)
        # Into the caller's buffers (poisoned first): the same bits, the same arrays back.
        bufs = (np.full((13 * K, H), 0xFFFF, np.uint16), np.full((13, K), np.nan, np.float32),
                np.full((13, K), -7, np.int32))
        got = unf.forward_unfinalized(x, ids, w, out=bufs)
        assert all(g is b for g, b in zip(got, bufs))
        live_rows = indices[indices >= 0]
        assert np.array_equal(bufs[0][live_rows], rows[live_rows])
        assert np.array_equal(bufs[1], weights) and np.array_equal(bufs[2], indices)
        with pytest.raises(moe_ep.InvalidArgumentError, match=r"rows.*dim 0 is 13, expected 26"):
            unf.forward_unfinalized(x, ids, w, out=(bufs[0][:13], bufs[1], bufs[2]))
        with pytest.raises(moe_ep.InvalidArgumentError, match="three tensors"):
            unf.forward_unfinalized(x, ids, w, out=bufs[:2])
    assert rows.shape == (13 * K, H) and rows.dtype == np.uint16
    assert weights.shape == (13, K) and weights.dtype == np.float32
    assert indices.shape == (13, K) and indices.dtype == np.int32
    if recipe == "mxfp4_mxfp8":  # the weight was applied in fc1
        assert (weights == 1).all()
    else:
        assert np.array_equal(weights, w)
    # docs/contract.md §3: fp32 sum in slot order, empty slots skipped, then bf16.
    acc = np.zeros((13, H), np.float32)
    for k in range(K):
        live = indices[:, k] >= 0
        assert np.array_equal(live, ids[:, k] >= 0)
        y = R.bf16_to_f32(rows[np.where(live, indices[:, k], 0)])
        acc = np.where(live[:, None], (acc + (weights[:, k:k + 1] * y).astype(np.float32)), acc)
        acc = acc.astype(np.float32)
    assert np.array_equal(R.bf16_bits(acc), out)


# --- several ranks in one process ------------------------------------------------------------------
def test_two_ranks_on_threads(bf16_pack):
    W = 2
    fleet = moe_ep.CpuFleet(W)
    assert fleet.world_size == W
    tokens = [7, 0]  # unequal T, one rank with none
    data = [inputs(t, seed=10 + r) for r, t in enumerate(tokens)]
    outs = [None] * W

    def rank_main(r):
        layer = make_layer(bf16_pack, first=r * E // W, count=E // W, world_size=W, rank=r,
                           cpu_fleet=fleet)
        assert layer.rank == r and layer.world_size == W and layer.num_local_experts == E // W
        layer.warmup()
        outs[r] = [layer(*data[r]) for _ in range(2)]
        layer.destroy()

    run_ranks(W, rank_main)
    for r in range(W):
        ref = reference(bf16_pack, "bf16", *data[r])
        assert outs[r][0].shape == (tokens[r], H)
        assert np.array_equal(outs[r][0], outs[r][1])
        if tokens[r]:
            assert R.rel_l2(outs[r][0], ref) <= TOL


def test_four_ranks_collective_workspace_selection(bf16_pack):
    W = 4
    fleet = moe_ep.CpuFleet(W)
    tokens = [3, 0, 4, 1]  # the largest T (4) decides the workspace on every rank
    data = [inputs(t, seed=30 + r) for r, t in enumerate(tokens)]
    chosen, outs = [None] * W, [None] * W

    def rank_main(r):
        layer = make_layer(bf16_pack, first=r * E // W, count=E // W, world_size=W, rank=r,
                           cpu_fleet=fleet)
        small = layer.create_workspace(4)
        layer.create_workspace(8)
        ws = layer.select_workspace(tokens[r], collective=True)
        chosen[r] = (ws, small)
        outs[r] = layer(*data[r], workspace=ws)
        layer.destroy()

    run_ranks(W, rank_main)
    for r in range(W):
        ws, small = chosen[r]
        assert ws == small  # capacity 4, on every rank, also those with fewer tokens
        if tokens[r]:
            assert R.rel_l2(outs[r], reference(bf16_pack, "bf16", *data[r])) <= TOL


def test_peer_that_never_arrives_is_reported(bf16_pack):
    fleet = moe_ep.CpuFleet(2)
    with pytest.raises(moe_ep.PeerError, match="peer rank 1"):  # rank 1 never constructs
        make_layer(bf16_pack, count=E // 2, world_size=2, rank=0, cpu_fleet=fleet,
                   timeout_ms=200, warmup_timeout_ms=200)


# --- workspaces, views, weights ----------------------------------------------------------------------
def test_workspaces_and_views(bf16_pack):
    x, ids, w = inputs(6)
    with make_layer(bf16_pack) as layer:
        assert layer.default_workspace == moe_ep.Workspace(0, CAP)
        small = layer.create_workspace(4)
        assert small.capacity == 4 and small.index != 0
        assert layer.select_workspace(3) == small
        assert layer.select_workspace(5).capacity == CAP
        assert layer.select_workspace(4, collective=True) == small
        with pytest.raises(moe_ep.CapacityError):
            layer.select_workspace(CAP + 1)
        layer.warmup(small)
        full = layer(x, ids, w)
        part = layer(x[:4], ids[:4], w[:4], workspace=small)
        assert np.array_equal(part, full[:4])
        with pytest.raises(moe_ep.CapacityError, match="6.*4"):
            layer(x, ids, w, workspace=small)
        view = layer(x, ids, w, return_workspace_view=True)
        assert np.array_equal(view, full)
        assert layer.workspace_bytes() > 0
        # out=: the caller's buffer, written and returned (no allocation per call).
        mine = np.full((6, H), 0x7FC0, dtype=np.uint16)
        assert layer(x, ids, w, out=mine) is mine
        assert np.array_equal(mine, full)
        with pytest.raises(moe_ep.InvalidArgumentError):
            layer(x, ids, w, out=np.empty((5, H), dtype=np.uint16))  # wrong T
        with pytest.raises(moe_ep.InvalidArgumentError):
            layer(x, ids, w, out=mine, return_workspace_view=True)
        with pytest.raises(moe_ep.InvalidArgumentError):
            layer(x, ids, w, out=[0] * H)
        # The decode workspace of an engine's scheduler: cdiv(3 * (1 + 1), 2) = 3 tokens per
        # rank, created once (the same one again), and a forward in it.
        dec = layer.warmup(max_num_seqs=3, num_speculative_tokens=1, sp_size=2)
        assert dec.capacity == 3
        assert layer.warmup(max_num_seqs=3, num_speculative_tokens=1, sp_size=2) == dec
        assert np.array_equal(layer(x[:3], ids[:3], w[:3], workspace=dec), full[:3])
        with pytest.raises(moe_ep.InvalidArgumentError, match="max_tokens_per_rank"):
            layer.warmup(max_num_seqs=CAP + 1)
        with pytest.raises(moe_ep.InvalidArgumentError):
            layer.warmup(max_num_seqs=0)
        # The launch plan, printable: the CPU reference names T only; a bad count is refused.
        layer(x, ids, w)
        assert layer.last_plan() == "cpu reference T=6"
        assert layer.plan(3) == "cpu reference T=3"
        with pytest.raises(moe_ep.InvalidArgumentError):
            layer.plan(-1)


def test_kernel_weight_moves_are_bitwise_invisible(bf16_pack):
    # EPLB: swap two experts' kernel rows in place, remap topk_ids, same output bitwise.
    x, ids, w = inputs(CAP, seed=21)
    with make_layer(bf16_pack) as layer:
        before = layer(x, ids, w)
        kw = layer.kernel_weights()
        assert kw.fc1_scale is None and kw.fc2_scale is None  # bf16 has no scales
        assert kw.fc1_weight.shape[0] == E and kw.fc1_weight.dtype == np.uint8
        assert kw.fc1_weight.shape[1] == 2 * I * H * 2
        for t in (kw.fc1_weight, kw.fc2_weight):
            t[[1, 6]] = t[[6, 1]]
        remap = ids.copy()
        remap[ids == 1], remap[ids == 6] = 6, 1
        after = layer(x, remap, w)
        views = layer.expert_weight_views()
        assert views.fc1_alpha.shape == (E,) and views.weights.fc2_weight.shape[0] == E
    assert np.array_equal(before, after)
    # Negative control: experts really swapped but ids not remapped gives another output.
    swapped = dict(bf16_pack)
    for name in ("w13", "w2"):
        a = bf16_pack[name].copy()
        a[[1, 6]] = a[[6, 1]]
        swapped[name] = a
    with make_layer(swapped) as layer:
        assert not np.array_equal(before, layer(x, ids, w))


def test_strided_and_readonly_inputs(bf16_pack):
    x, ids, w = inputs(5)
    wide = np.zeros((5, H + 64), np.uint16)
    wide[:, :H] = x
    x_strided = wide[:, :H]  # row stride H + 64
    assert not x_strided.flags.c_contiguous
    for a in (x, ids, w):
        a.flags.writeable = False
    with make_layer(bf16_pack) as layer:
        assert np.array_equal(layer(x_strided, ids, w), layer(x, ids, w))


def test_ml_dtypes_bfloat16_is_accepted(bf16_pack):
    ml = pytest.importorskip("ml_dtypes")
    x, ids, w = inputs(4)
    with make_layer(bf16_pack) as layer:
        out = layer(x.view(ml.bfloat16), ids, w)
        assert out.dtype == ml.bfloat16
        assert np.array_equal(out.view(np.uint16), layer(x, ids, w))


def test_per_call_epilogue_vectors():
    pack = moe_ep.pack_expert_weights("nvfp4", *master_weights(8))
    x, ids, w = inputs(6)
    with make_layer(pack, "nvfp4") as layer:
        base = layer(x, ids, w)
        doubled = layer(x, ids, w, fc2_alpha=pack["fc2_alpha"] * 2)
    assert R.rel_l2(doubled, R.bf16_bits(R.bf16_to_f32(base) * 2)) <= TOL


def test_caller_epilogue_vectors_are_read_in_place():
    # Vectors given at construction on the layer's device are the caller's own (they alias the
    # model's parameters): expert_weight_views() hands them back, and a change in them (an EPLB
    # move) reaches the next forward. Biases come back as the layer's copies.
    pack = moe_ep.pack_expert_weights("nvfp4", *master_weights(8))
    fc2_alpha = pack["fc2_alpha"].copy()
    x, ids, w = inputs(6)
    rng = np.random.default_rng(3)
    b2 = (0.1 * rng.standard_normal((E, H))).astype(np.float32)
    with moe_ep.MoeEpLayer(pack["w13"], pack["w2"], pack["w13_scale"], pack["w2_scale"],
                           num_experts=E, max_tokens_per_rank=CAP, top_k=K, recipe="nvfp4",
                           fc1_alpha=pack["fc1_alpha"], fc2_alpha=fc2_alpha,
                           fc2_bias=b2) as layer:
        views = layer.expert_weight_views()
        assert views.fc2_alpha is fc2_alpha
        assert views.fc1_norm_const.shape == (E,) and views.fc1_bias is None
        assert np.array_equal(views.fc2_bias, b2) and views.fc2_bias is not b2
        base = layer(x, ids, w)
        fc2_alpha *= 2  # in place, as an expert move would write
        doubled = layer(x, ids, w)
        fc2_alpha /= 2
        again = layer(x, ids, w)
    assert not np.array_equal(doubled, base)
    assert np.array_equal(again, base)


# --- errors ------------------------------------------------------------------------------------
def test_too_many_tokens_names_both_numbers(bf16_pack):
    x, ids, w = inputs(CAP + 1)
    with make_layer(bf16_pack) as layer:
        with pytest.raises(moe_ep.CapacityError) as info:
            layer(x, ids, w)
    msg = str(info.value)
    assert str(CAP + 1) in msg and str(CAP) in msg
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)


def test_wrong_dtypes_and_shapes(bf16_pack):
    x, ids, w = inputs(3)
    with make_layer(bf16_pack) as layer:
        with pytest.raises(moe_ep.InvalidArgumentError, match="float32"):
            layer(R.bf16_to_f32(x), ids, w)
        with pytest.raises(ValueError, match="topk_ids.*int64"):
            layer(x, ids.astype(np.int64), w)
        with pytest.raises(ValueError, match="topk_weights"):
            layer(x, ids, w.astype(np.float64))
        with pytest.raises(ValueError, match="hidden_states"):
            layer(x[:, : H // 2], ids, w)
        with pytest.raises(ValueError, match="topk_ids"):
            layer(x, ids[:2], w)
        bad = ids.copy()
        bad[0, 0] = E
        with pytest.raises(moe_ep.Error, match=str(E)):
            layer(x, bad, w)
        with pytest.raises(moe_ep.StateError):
            layer.forward_unfinalized(x, ids, w)


def test_forward_on_unfinalized_layer_is_a_state_error(bf16_pack):
    x, ids, w = inputs(3)
    with make_layer(bf16_pack, do_finalize=False) as layer:
        with pytest.raises(moe_ep.StateError, match="forward_unfinalized"):
            layer(x, ids, w)


def test_calls_after_destroy(bf16_pack):
    x, ids, w = inputs(3)
    layer = make_layer(bf16_pack)
    layer.destroy()
    layer.destroy()  # idempotent
    assert layer.destroyed
    for call in (lambda: layer(x, ids, w), layer.warmup, layer.kernel_weights,
                 lambda: layer.create_workspace(2)):
        with pytest.raises(moe_ep.DestroyedError, match="destroy"):
            call()


def test_unsupported_configuration(bf16_pack):
    reasons = moe_ep.unsupported_reasons(num_experts=8, max_tokens_per_rank=16, hidden_size=100,
                                         intermediate_size=64, top_k=2, world_size=3)
    text = "\n".join(reasons)
    assert len(reasons) == 2
    assert "W = 3" in text and "H = 100" in text
    # gpt-oss's semantics: the CPU backend runs them with every recipe; the CUDA backend with
    # the bf16-activation recipes and names each for the others.
    oai = dict(num_experts=8, max_tokens_per_rank=16, hidden_size=H, intermediate_size=I, top_k=2,
               has_expert_bias=True, swiglu_alpha=1.702, swiglu_beta=1.0)
    assert moe_ep.unsupported_reasons(**oai, recipe="nvfp4") == []
    cuda_text = "\n".join(moe_ep.unsupported_reasons(**oai, recipe="nvfp4", backend="cuda"))
    assert "bias" in cuda_text and "1.702" in cuda_text
    for recipe in ("bf16", "mxfp4_bf16", "nvfp4_bf16"):
        text = "\n".join(moe_ep.unsupported_reasons(**oai, recipe=recipe, backend="cuda"))
        assert "bias" not in text and "1.702" not in text, (recipe, text)
    assert moe_ep.unsupported_reasons(num_experts=8, max_tokens_per_rank=16, hidden_size=H,
                                      intermediate_size=I, top_k=2) == []
    if not moe_ep.cuda_backend_available():
        cuda = moe_ep.unsupported_reasons(num_experts=8, max_tokens_per_rank=16, hidden_size=H,
                                          intermediate_size=I, top_k=2, backend="cuda")
        assert any("CUDA" in r for r in cuda)
    # Expert biases and the gpt-oss activation on the CPU backend: they change the output, and
    # biases of the wrong shape are refused with both shapes named.
    rng = np.random.default_rng(5)
    b13 = rng.standard_normal((E, 2 * I)).astype(np.float32)
    b2 = (0.1 * rng.standard_normal((E, H))).astype(np.float32)
    x, ids, w = inputs(4)
    with make_layer(bf16_pack) as plain:
        base = plain(x, ids, w)
    with make_layer(bf16_pack, fc1_bias=b13, fc2_bias=b2, swiglu_alpha=1.702, swiglu_beta=1.0,
                    swiglu_limit=7.0) as oai_layer:
        assert not np.array_equal(oai_layer(x, ids, w), base)
    with pytest.raises(moe_ep.InvalidArgumentError, match=r"fc2_bias.*\[8, 128\]"):
        make_layer(bf16_pack, fc2_bias=b2[:, :64].copy())
    # What an engine may ask that the layer does not do (FlashInfer's MoE-EP layer refuses the
    # same): each its own reason, and a layer with any of them is refused.
    engine = moe_ep.unsupported_reasons(
        num_experts=8, max_tokens_per_rank=16, hidden_size=H, intermediate_size=I, top_k=2,
        weight_scheme="awq", skip_final_all_reduce=True, runtime_weight_transfer=True,
        dual_batch_overlap=True)
    text = "\n".join(engine)
    assert len(engine) == 4, engine
    assert "'awq'" in text and "skip_final_all_reduce" in text
    assert "runtime weight transfer" in text and "dual batch overlap" in text
    assert moe_ep.unsupported_reasons(num_experts=8, max_tokens_per_rank=16, hidden_size=H,
                                      intermediate_size=I, top_k=2, weight_scheme="bf16") == []
    with pytest.raises(moe_ep.UnsupportedError, match="dual batch overlap"):
        make_layer(bf16_pack, dual_batch_overlap=True)
    with pytest.raises(ValueError, match="w13"):
        make_layer(bf16_pack, count=E // 2)  # weights for 4 experts, config says 8 on W = 1


def test_fp8_mma_option():
    # Refused for another recipe on every backend, each reason naming it; on the CPU backend the
    # mxfp4_mxfp8 layer computes the recipe exactly with or without it.
    kw = dict(num_experts=8, max_tokens_per_rank=16, hidden_size=H, intermediate_size=I, top_k=2)
    reasons = moe_ep.unsupported_reasons(recipe="nvfp4", fp8_mma=True, **kw)
    assert len(reasons) == 1 and "fp8_mma" in reasons[0] and "nvfp4" in reasons[0]
    assert moe_ep.unsupported_reasons(recipe="mxfp4_mxfp8", fp8_mma=True, **kw) == []
    cuda = moe_ep.unsupported_reasons(recipe="mxfp4_mxfp8", fp8_mma=True, world_size=2,
                                      backend="cuda", **kw)
    if not any("no CUDA backend" in r for r in cuda):
        assert any("fp8_mma" in r and "W = 2" in r for r in cuda)
    pack = moe_ep.pack_expert_weights("mxfp4_mxfp8", *master_weights(5))
    x, ids, w = inputs(9, seed=6)
    with make_layer(pack, "mxfp4_mxfp8", backend="cpu") as plain, make_layer(
        pack, "mxfp4_mxfp8", backend="cpu", fp8_mma=True
    ) as opted:
        assert np.array_equal(plain(x, ids, w), opted(x, ids, w))
        assert not plain.uses_fp8_mma and not opted.uses_fp8_mma  # no fp8 tensor cores on a CPU
    with pytest.raises(moe_ep.UnsupportedError, match="fp8_mma"):
        make_layer(moe_ep.pack_expert_weights("nvfp4", *master_weights(5)), "nvfp4",
                   fp8_mma=True)


def test_error_classes_follow_the_library_codes():
    names = moe_ep._moe_ep._error_code_names()
    classes = {c.code: c for c in (moe_ep.InvalidArgumentError, moe_ep.CapacityError,
                                   moe_ep.UnsupportedError, moe_ep.DestroyedError,
                                   moe_ep.PeerError, moe_ep.BackendError, moe_ep.StateError)}
    assert sorted(names) == sorted(classes)  # every library code has its class
    for c in classes.values():
        assert issubclass(c, moe_ep.Error) and issubclass(c, RuntimeError)
    assert issubclass(moe_ep.InvalidArgumentError, ValueError)
    assert issubclass(moe_ep.CapacityError, ValueError)
    assert not issubclass(moe_ep.PeerError, ValueError)


def test_properties(bf16_pack):
    with make_layer(bf16_pack) as layer:
        assert layer.output_is_reduced is True
        assert layer.is_monolithic is False
        assert layer.can_overlap_shared_experts is True
        assert layer.backend == "cpu" and layer.recipe == "bf16"
        assert layer.hidden_size == H and layer.top_k == K and layer.max_tokens_per_rank == CAP
        try:
            import torch

            assert layer.topk_indices_dtype == torch.int32
        except ImportError:
            assert layer.topk_indices_dtype == np.int32
        assert "bf16" in repr(layer)


def test_pack_expert_weights_shapes():
    w13, w2 = master_weights()
    for recipe, g in (("nvfp4", 16), ("mxfp4_mxfp8", 32), ("mxfp4_bf16", 32), ("nvfp4_bf16", 16)):
        p = moe_ep.pack_expert_weights(recipe, w13, w2)
        assert p["w13"].shape == (E, 2 * I, H // 2) and p["w13"].dtype == np.uint8
        assert p["w2"].shape == (E, H, I // 2)
        assert p["w13_scale"].shape == (E, 2 * I, H // g)
        assert p["w2_scale"].shape == (E, H, I // g)
        assert p["fc1_alpha"].shape == (E,) and p["fc1_alpha"].dtype == np.float32
    with pytest.raises(ValueError, match="w2"):
        moe_ep.pack_expert_weights("bf16", w13, w2[:, :, : I // 2])
