"""Python edges of issue 43: negative counts and non-tensor arguments raise the library's own
InvalidArgumentError; NaN/Inf topk_weights are rejected by the CPU backend (docs/python.md,
"Bad input") and the rejection changes nothing."""

import numpy as np
import pytest

import moe_ep
import numpy_reference as R

E, H, I, K, CAP = 8, 128, 64, 2, 16


@pytest.fixture(scope="module")
def pack():
    rng = np.random.default_rng(3)
    w13 = (rng.standard_normal((E, 2 * I, H)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((E, H, I)) * 0.1).astype(np.float32)
    return moe_ep.pack_expert_weights("bf16", w13, w2)


@pytest.fixture()
def layer(pack):
    with moe_ep.MoeEpLayer(pack["w13"], pack["w2"], num_experts=E, max_tokens_per_rank=CAP,
                           top_k=K) as lay:
        yield lay


def inputs(t, seed=1):
    rng = np.random.default_rng(seed)
    x = R.bf16_bits(rng.standard_normal((t, H)))
    ids = np.array([rng.permutation(E)[:K] for _ in range(t)], dtype=np.int32).reshape(t, K)
    w = rng.random((t, K)).astype(np.float32)
    return x, ids, w


def test_select_workspace_rejects_negative_and_non_int_counts(layer):
    for bad, words in [(-5, ["num_tokens = -5", ">= 0"]), (3.5, ["must be an int", "float"]),
                       (True, ["must be an int", "bool"]), ("4", ["must be an int", "str"])]:
        with pytest.raises(moe_ep.InvalidArgumentError) as e:
            layer.select_workspace(bad)
        for w in words:
            assert w in str(e.value)
    assert layer.select_workspace(0).capacity == CAP  # 0 tokens is a valid count
    with pytest.raises(moe_ep.InvalidArgumentError, match="capacity = -3 must be >= 1"):
        layer.create_workspace(-3)
    with pytest.raises(moe_ep.InvalidArgumentError, match="workspace = -2 must be >= 0"):
        layer.warmup(-2)


@pytest.mark.parametrize("which", [0, 1, 2])
@pytest.mark.parametrize("bad", [[[0, 1]], 3.0, "abc", None])
def test_non_tensor_forward_arguments_raise_invalid_argument(layer, which, bad):
    args = list(inputs(2))
    args[which] = bad
    name = ["hidden_states", "topk_ids", "topk_weights"][which]
    with pytest.raises(moe_ep.InvalidArgumentError) as e:
        layer(*args)
    assert f"{name} must be a tensor" in str(e.value)
    kind = "None" if bad is None else type(bad).__name__
    assert f"got {kind}" in str(e.value)
    with pytest.raises(moe_ep.InvalidArgumentError):
        layer.forward_unfinalized(*args)  # the same check comes first, before the mode check


def test_non_tensor_weights_raise_invalid_argument(pack):
    with pytest.raises(moe_ep.InvalidArgumentError, match="w13 must be a tensor.*got list"):
        moe_ep.MoeEpLayer(pack["w13"].tolist(), pack["w2"], num_experts=E,
                          max_tokens_per_rank=CAP, top_k=K)
    with pytest.raises(moe_ep.InvalidArgumentError, match="fc1_alpha must be a tensor"):
        moe_ep.MoeEpLayer(pack["w13"], pack["w2"], num_experts=E, max_tokens_per_rank=CAP,
                          top_k=K, fc1_alpha=[1.0] * E)


def test_host_num_tokens_outside_rows_is_rejected(layer):
    x, ids, w = inputs(4)
    for n in (-3, 5):
        with pytest.raises(moe_ep.InvalidArgumentError, match=f"num_tokens = {n} is outside"):
            layer(x, ids, w, num_tokens=np.array([n], dtype=np.int32))
    out = layer(x, ids, w, num_tokens=np.array([2], dtype=np.int32))
    assert not np.isnan(R.bf16_to_f32(out[:2])).any()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_topk_weights_are_rejected_and_change_nothing(layer, bad):
    x, ids, w = inputs(5, seed=7)
    before = layer(x, ids, w)
    w_bad = w.copy()
    w_bad[3, 1] = bad
    out = np.full((5, H), 0x7FC0, dtype=np.uint16)
    with pytest.raises(moe_ep.InvalidArgumentError) as e:
        layer._impl.forward(x, ids, w_bad, out, None, None, None, -1, 0, None)
    assert "topk_weights[3, 1]" in str(e.value) and "not finite" in str(e.value)
    assert (out == 0x7FC0).all(), "the rejected call wrote its output"
    with pytest.raises(moe_ep.InvalidArgumentError, match=r"topk_weights\[3, 1\]"):
        layer(x, ids, w_bad)
    # A non-finite weight in a row past num_tokens is not read, so it is not an error.
    w_tail = w.copy()
    w_tail[4, 0] = bad
    layer(x, ids, w_tail, num_tokens=np.array([4], dtype=np.int32))
    # An empty slot's weight (id -1) is never read: a NaN there is not an error.
    ids_empty, w_empty = ids.copy(), w.copy()
    ids_empty[2, 0], w_empty[2, 0] = -1, bad
    assert not np.isnan(R.bf16_to_f32(layer(x, ids_empty, w_empty))).any()
    # The layer is unchanged: the same call gives the same bits.
    assert np.array_equal(layer(x, ids, w), before)


def test_non_finite_topk_weights_rejected_on_every_rank(pack):
    # W = 2: the rank with the bad weight rejects, its peer learns it at once (no hang).
    import threading

    W = 2
    fleet = moe_ep.CpuFleet(W)
    errors = [None] * W
    x, ids, w = inputs(3, seed=9)
    w_bad = w.copy()
    w_bad[0, 0] = np.nan

    def rank(r):
        el = E // W
        sl = slice(r * el, (r + 1) * el)
        with moe_ep.MoeEpLayer(pack["w13"][sl], pack["w2"][sl], num_experts=E,
                               max_tokens_per_rank=CAP, top_k=K, world_size=W, rank=r,
                               cpu_fleet=fleet, timeout_ms=5000) as lay:
            try:
                lay(x, ids, w_bad if r == 0 else w)
            except moe_ep.Error as e:
                errors[r] = e
            lay(x, ids, w)  # both ranks recover and run the next call

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(W)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert isinstance(errors[0], moe_ep.InvalidArgumentError)
    assert "not finite" in str(errors[0])
    assert errors[1] is not None and "rank 0" in str(errors[1])
