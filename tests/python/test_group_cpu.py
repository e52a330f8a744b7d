"""moe_ep.EpGroup from Python on the CPU backend (runs in CI): layers built from one group share
its workspace pool and give bitwise the outputs of separately built layers."""

import numpy as np
import pytest

import moe_ep
from rank_threads import run_ranks
from test_layer_cpu import CAP, E, H, inputs, make_layer, master_weights


@pytest.fixture(scope="module")
def packs():
    return [moe_ep.pack_expert_weights("bf16", *master_weights(seed=10 + i)) for i in range(3)]


def test_group_layers_bitwise_equal_separate_layers(packs):
    group = moe_ep.EpGroup(backend="cpu")
    assert (group.world_size, group.rank, group.backend) == (1, 0, "cpu")
    grouped = [make_layer(p, group=group) for p in packs]
    alone = [make_layer(p) for p in packs]
    assert all(layer.group is group for layer in grouped)
    for step, i in enumerate([0, 2, 1, 0, 1, 2]):
        x, ids, w = inputs(3 + step, seed=50 + step)
        assert np.array_equal(grouped[i](x, ids, w), alone[i](x, ids, w)), (step, i)
    # One workspace set for the three layers (the same geometry: one layer's size).
    assert group.num_pooled_workspaces == 1
    assert group.pool_bytes == alone[0].workspace_bytes()
    grouped[1].destroy()  # the others keep the pool
    assert group.pool_bytes == alone[0].workspace_bytes()
    x, ids, w = inputs(CAP, seed=3)
    assert np.array_equal(grouped[2](x, ids, w), alone[2](x, ids, w))
    with pytest.raises(moe_ep.StateError):
        group.destroy()  # layers still alive
    for layer in grouped + alone:
        layer.destroy()
    assert group.pool_bytes == 0
    group.destroy()
    with pytest.raises(moe_ep.DestroyedError):
        make_layer(packs[0], group=group)


def test_view_dies_at_another_layers_call(packs):
    with moe_ep.EpGroup(backend="cpu") as group:
        a, b = make_layer(packs[0], group=group), make_layer(packs[1], group=group)
        x, ids, w = inputs(6, seed=8)
        va = a(x, ids, w, return_workspace_view=True)
        a_out = va.copy()
        vb = b(x, ids, w, return_workspace_view=True)
        assert not np.array_equal(a_out, vb)
        assert np.array_equal(va, vb)  # A's view now shows B's output
        a.destroy()
        b.destroy()


def test_group_excludes_bootstrap_arguments(packs):
    group = moe_ep.EpGroup(backend="cpu")
    with pytest.raises(moe_ep.InvalidArgumentError, match="world_size"):
        make_layer(packs[0], group=group, world_size=2)
    with pytest.raises(moe_ep.InvalidArgumentError, match="EpGroup"):
        make_layer(packs[0], group=object())


def test_group_of_two_cpu_ranks(packs):
    W = 2
    fleet = moe_ep.CpuFleet(W)
    outs = {}

    def rank_main(r):
        group = moe_ep.EpGroup(world_size=W, rank=r, backend="cpu", cpu_fleet=fleet)
        sl = dict(first=r * E // W, count=E // W)
        grouped = [make_layer(p, group=group, **sl) for p in packs]
        alone = [make_layer(p, world_size=W, rank=r, cpu_fleet=fleet, **sl) for p in packs]
        for step, i in enumerate([1, 0, 2, 1]):
            x, ids, w = inputs(2 + step + r, seed=70 + 10 * step + r)
            outs[(r, step)] = (grouped[i](x, ids, w), alone[i](x, ids, w))
        outs[(r, "pool")] = (group.pool_bytes, alone[0].workspace_bytes())
        for layer in grouped + alone:
            layer.destroy()
        group.destroy()

    run_ranks(W, rank_main)
    for key, (got, want) in outs.items():
        if key[1] == "pool":
            assert got == want, key
        else:
            assert np.array_equal(got, want), key
            assert got.shape[1] == H and got.shape[0] >= 1
