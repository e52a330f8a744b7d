"""moe_ep from torch: CPU tensors on the CPU backend (where torch is installed), CUDA tensors on
the CUDA backend against a torch model of every recipe, torch.cuda.graph capture and replay,
and a two-process torch.distributed run. Skips cleanly without torch, CUDA, or the CUDA backend.
"""

import os
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import moe_ep  # noqa: E402
import torch_reference as TR  # noqa: E402

E, H, I, K, CAP = 8, 256, 128, 4, 64
TOL = 5e-3
RECIPES = ["bf16", "mxfp4_bf16", "mxfp4_mxfp8", "nvfp4", "nvfp4_bf16"]

HAS_CUDA = torch.cuda.is_available()
HAS_BACKEND = HAS_CUDA and moe_ep.cuda_backend_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
needs_backend = pytest.mark.skipif(
    not HAS_BACKEND, reason="no CUDA device, or this build has no usable CUDA backend"
)


def packed(recipe, device, seed=0, e=E):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn((e, 2 * I, H), generator=g) * 0.1
    w2 = torch.randn((e, H, I), generator=g) * 0.1
    p = moe_ep.pack_expert_weights(recipe, w13, w2)
    out = {}
    for k, v in p.items():
        if v is None:
            out[k] = None
        elif recipe == "bf16" and k in ("w13", "w2"):
            out[k] = torch.from_numpy(v.view(np.int16)).view(torch.bfloat16).to(device)
        else:
            out[k] = torch.from_numpy(v).to(device)
    return out


def inputs(t, device, seed=1, e=E):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((t, H), generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e, generator=g)[:K] for _ in range(t)]) if t else \
        torch.zeros((0, K), dtype=torch.int64)
    w = torch.rand((t, K), generator=g)
    return x.to(device), ids.to(torch.int32).to(device), w.to(device)


def make_layer(p, recipe, first=0, count=E, **kw):
    sl = slice(first, first + count)
    take = lambda n: None if p[n] is None else p[n][sl]  # noqa: E731
    return moe_ep.MoeEpLayer(
        take("w13"), take("w2"), take("w13_scale"), take("w2_scale"),
        num_experts=kw.pop("num_experts", E), max_tokens_per_rank=kw.pop("cap", CAP), top_k=K,
        recipe=recipe, fc1_alpha=take("fc1_alpha"), fc2_alpha=take("fc2_alpha"),
        fc1_norm_const=take("fc1_norm_const"), **kw,
    )


def reference(p, recipe, x, ids, w, **kw):
    return TR.moe_forward(recipe, p["w13"], p["w2"], p["w13_scale"], p["w2_scale"], x, ids, w,
                          fc1_alpha=p["fc1_alpha"], fc2_alpha=p["fc2_alpha"],
                          fc1_norm_const=p["fc1_norm_const"], **kw)


# --- torch CPU tensors on the CPU backend (no GPU needed) -----------------------------------------
@pytest.mark.parametrize("recipe", RECIPES)
def test_torch_cpu_tensors_match_torch_reference(recipe):
    p = packed(recipe, "cpu")
    x, ids, w = inputs(9, "cpu")
    with make_layer(p, recipe) as layer:
        out = layer(x, ids, w)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
        assert out.shape == (9, H) and out.device.type == "cpu"
        kw = layer.kernel_weights()
        assert isinstance(kw.fc1_weight, torch.Tensor) and kw.fc1_weight.dtype == torch.uint8
    assert TR.rel_l2(out, reference(p, recipe, x, ids, w)) <= TOL


def test_torch_cpu_unfinalized_and_errors():
    p = packed("bf16", "cpu")
    x, ids, w = inputs(5, "cpu")
    with make_layer(p, "bf16", do_finalize=False) as layer:
        rows, weights, indices = layer.forward_unfinalized(x, ids, w)
        assert rows.dtype == torch.bfloat16 and rows.shape == (5 * K, H)
        assert torch.equal(weights, w) and indices.dtype == torch.int32
        with pytest.raises(moe_ep.StateError):
            layer(x, ids, w)
    with make_layer(p, "bf16") as layer:
        with pytest.raises(ValueError, match="float32"):
            layer(x.float(), ids, w)
        with pytest.raises(moe_ep.CapacityError, match=str(CAP + 1)):
            layer(*inputs(CAP + 1, "cpu"))
        x_grad = x.float().requires_grad_().to(torch.bfloat16)  # DLPack needs detach: we do it
        assert torch.equal(layer(x_grad, ids, w), layer(x, ids, w))
        assert layer.topk_indices_dtype == torch.int32


# --- CUDA --------------------------------------------------------------------------------------------
@needs_cuda
@pytest.mark.skipif(HAS_BACKEND, reason="the CUDA backend is usable here")
def test_cuda_tensors_without_backend_raise_the_library_error():
    p = packed("bf16", "cuda")
    with pytest.raises(moe_ep.Error) as info:
        make_layer(p, "bf16")
    assert "CUDA" in str(info.value) or "cuda" in str(info.value)


@needs_backend
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("t", [0, 1, 7, CAP])
def test_cuda_matches_torch_reference(recipe, t):
    p = packed(recipe, "cuda")
    x, ids, w = inputs(t, "cuda", seed=t)
    with make_layer(p, recipe) as layer:
        assert layer.backend == "cuda"
        out = layer(x, ids, w)
        torch.cuda.synchronize()
        again = layer(x, ids, w)
    assert out.device.type == "cuda" and out.dtype == torch.bfloat16 and out.shape == (t, H)
    assert torch.equal(out, again)  # repeated calls: bitwise identical
    if t:
        assert not torch.isnan(out).any()
        assert TR.rel_l2(out, reference(p, recipe, x, ids, w)) <= TOL


@needs_backend
def test_cuda_fp8_mma_path():
    # mxfp4_mxfp8 on fp8 tensor cores (opt-in; H and I are multiples of 128 here): the layer says
    # which path it took, and the fp8 path's outputs stay within the tolerance of docs/contract.md
    # §7 of the torch model on routed inputs (the K slots of a token average the path's own error).
    p = packed("mxfp4_mxfp8", "cuda")
    x, ids, w = inputs(CAP, "cuda", seed=3)
    with make_layer(p, "mxfp4_mxfp8") as plain, \
            make_layer(p, "mxfp4_mxfp8", fp8_mma=True) as fp8:
        assert not plain.uses_fp8_mma and fp8.uses_fp8_mma
        out, base = fp8(x, ids, w), plain(x, ids, w)
    ref = reference(p, "mxfp4_mxfp8", x, ids, w)
    assert not torch.equal(out, base)  # the fp8 path ran: its sums differ from the default path's
    assert TR.rel_l2(out, ref) <= TOL


@needs_backend
def test_cuda_matches_cpu_backend_and_finalize_sum():
    p_gpu = packed("nvfp4", "cuda")
    p_cpu = {k: (None if v is None else v.cpu()) for k, v in p_gpu.items()}
    x, ids, w = inputs(17, "cuda")
    with make_layer(p_gpu, "nvfp4") as g, make_layer(p_cpu, "nvfp4") as c, \
            make_layer(p_gpu, "nvfp4", do_finalize=False) as u:
        out = g(x, ids, w)
        ref = c(x.cpu(), ids.cpu(), w.cpu())
        rows, weights, indices = u.forward_unfinalized(x, ids, w)
    assert TR.rel_l2(out.cpu(), ref) <= TOL
    acc = torch.zeros((17, H), dtype=torch.float32, device="cuda")
    for k in range(K):
        live = (indices[:, k] >= 0)[:, None]
        acc = torch.where(live, acc + weights[:, k:k + 1] * rows[indices[:, k].clamp_min(0)].float(),
                          acc)
    assert torch.equal(acc.to(torch.bfloat16), out)


@needs_backend
def test_cuda_graph_capture_and_replay():
    recipe = "nvfp4"
    p = packed(recipe, "cuda")
    x, ids, w = inputs(32, "cuda", seed=5)
    layer = make_layer(p, recipe)
    small = layer.create_workspace(32)
    layer.warmup(small)
    eager = layer(x, ids, w, workspace=small)
    static_x, static_ids, static_w = x.clone(), ids.clone(), w.clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = layer(static_x, static_ids, static_w, workspace=small)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, eager)
    # New inputs copied into the captured buffers: the replay computes them.
    x2, ids2, w2 = inputs(32, "cuda", seed=6)
    static_x.copy_(x2)
    static_ids.copy_(ids2)
    static_w.copy_(w2)
    graph.replay()
    torch.cuda.synchronize()
    assert TR.rel_l2(static_out, reference(p, recipe, x2, ids2, w2)) <= TOL
    assert torch.equal(static_out, layer(x2, ids2, w2, workspace=small))
    layer.destroy()


@needs_backend
def test_cuda_runs_on_the_callers_stream():
    p = packed("bf16", "cuda")
    x, ids, w = inputs(16, "cuda")
    with make_layer(p, "bf16") as layer:
        ref = layer(x, ids, w)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            out = layer(x, ids, w)
        s.synchronize()
    assert torch.equal(out, ref)


@needs_backend
def test_cuda_group_layers_graph_replays_separate_layers_bitwise():
    recipe = "nvfp4"
    packs = [packed(recipe, "cuda", seed=20 + i) for i in range(3)]
    group = moe_ep.EpGroup(backend="cuda", device=0)
    grouped = [make_layer(p, recipe, group=group) for p in packs]
    alone = [make_layer(p, recipe) for p in packs]
    assert group.num_pooled_workspaces == 1
    assert group.pool_bytes == alone[0].workspace_bytes()  # one workspace set for three layers
    for layer in grouped:
        layer.warmup()
    x, ids, w = inputs(24, "cuda", seed=7)
    static_x = x.clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # each layer's output is the next one's input
        h = static_x
        for layer in grouped:
            h = layer(h, ids, w)
        static_out = h
    graph.replay()
    torch.cuda.synchronize()
    h = x
    for layer in alone:
        h = layer(h, ids, w)
    assert torch.equal(static_out, h)
    for layer in grouped + alone:
        layer.destroy()
    assert group.pool_bytes == 0
    group.destroy()


# --- two processes over torch.distributed --------------------------------------------------------------
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world, port, results, use_group):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    try:
        p = packed("nvfp4", f"cuda:{rank}")
        x, ids, w = inputs(5 + 6 * rank, f"cuda:{rank}", seed=40 + rank)
        count = E // world
        ref = reference(p, "nvfp4", x, ids, w)
        if use_group:  # one communicator for both layers, one workspace set
            group = moe_ep.EpGroup(process_group=dist.group.WORLD)
            layers = [make_layer(p, "nvfp4", first=rank * count, count=count, group=group)
                      for _ in range(2)]
            assert group.rank == rank and group.world_size == world
            for layer in layers:
                layer.warmup()
            outs = [layer(x, ids, w) for layer in layers]
            assert torch.equal(outs[0], outs[1])
            out = outs[1]
        else:
            layers = [make_layer(p, "nvfp4", first=rank * count, count=count,
                                 process_group=dist.group.WORLD)]
            assert layers[0].rank == rank and layers[0].world_size == world
            layers[0].warmup()
            out = layers[0](x, ids, w)
        results.put((rank, TR.rel_l2(out, ref), None))
        for layer in layers:
            layer.destroy()
        if use_group:
            group.destroy()
    except Exception as e:  # noqa: BLE001
        results.put((rank, None, repr(e)))
    finally:
        dist.destroy_process_group()


@needs_backend
@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("use_group", [False, True], ids=["layer", "group"])
def test_two_processes_torch_distributed(use_group):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, 2, port, results, use_group))
             for r in range(2)]
    for pr in procs:
        pr.start()
    got = [results.get(timeout=300) for _ in procs]
    for pr in procs:
        pr.join(timeout=60)
    for rank, err_l2, err in sorted(got):
        assert err is None, f"rank {rank}: {err}"
        assert err_l2 <= TOL, f"rank {rank}: rel L2 {err_l2}"
