"""MoeEpLayer: the MoE expert-parallel layer as an inference engine calls it (vLLM's names)."""

import collections
import dataclasses

import numpy as np

from . import _moe_ep
from . import _tensors as T

KernelWeights = collections.namedtuple(
    "KernelWeights", ["fc1_weight", "fc1_scale", "fc2_weight", "fc2_scale"]
)
KernelWeights.__doc__ = (
    "Kernel-resident weights as byte tensors [E_local, bytes_per_expert] aliasing the memory "
    "the kernels read (scales are None for the bf16 recipe)."
)
ExpertWeightViews = collections.namedtuple(
    "ExpertWeightViews",
    ["weights", "fc1_alpha", "fc2_alpha", "fc1_norm_const", "fc1_bias", "fc2_bias"],
)
UnfinalizedOutput = collections.namedtuple("UnfinalizedOutput", ["rows", "weights", "indices"])
UnfinalizedOutput.__doc__ = (
    "rows bf16 [T*K, H] (row t*K+k is y[t,k]), weights f32 [T, K], indices i32 [T, K] (row of "
    "each slot in rows, -1 for an empty slot)."
)


@dataclasses.dataclass(frozen=True)
class Workspace:
    """A workspace profile of a layer (created collectively, in the same order on all ranks)."""

    index: int
    capacity: int


_CONFIG_FIELDS = (
    "num_experts",
    "max_tokens_per_rank",
    "hidden_size",
    "intermediate_size",
    "top_k",
    "recipe",
    "swiglu_limit",
    "swiglu_alpha",
    "swiglu_beta",
    "apply_topk_in_fc1",
    "do_finalize",
    "input_norm_const",
    "activation_dtype",
    "combine_dtype",
    "has_expert_bias",
    "has_custom_swiglu_alpha_beta",
    "weight_scheme",
    "skip_final_all_reduce",
    "runtime_weight_transfer",
    "dual_batch_overlap",
    "fp8_mma",
)


def _dtype_name(d):
    """'bfloat16' from a torch/numpy dtype or a string."""
    if d is None:
        return "bfloat16"
    if isinstance(d, str):
        return d
    name = str(d)
    return name.split(".")[-1]  # torch.bfloat16 -> bfloat16


def _config_of(names):
    """The configuration keywords among a function's locals (the signatures spell them out
    for the reader; this passes them on once)."""
    return {k: names[k] for k in _CONFIG_FIELDS}


def _spec(**kw):
    spec = _moe_ep._Spec()
    unknown = set(kw) - set(_CONFIG_FIELDS)
    if unknown:
        raise TypeError(f"unknown configuration keyword(s): {sorted(unknown)}")
    for k, v in kw.items():
        if v is None:
            continue
        if k in ("activation_dtype", "combine_dtype"):
            v = _dtype_name(v)
        setattr(spec, k, v)
    return spec


def unsupported_reasons(
    *,
    num_experts,
    max_tokens_per_rank,
    hidden_size,
    intermediate_size,
    top_k,
    recipe="bf16",
    world_size=1,
    backend="cpu",
    swiglu_limit=None,
    swiglu_alpha=1.0,
    swiglu_beta=0.0,
    apply_topk_in_fc1=False,
    do_finalize=True,
    input_norm_const=1.0,
    activation_dtype="bfloat16",
    combine_dtype="bfloat16",
    has_expert_bias=False,
    has_custom_swiglu_alpha_beta=False,
    fp8_mma=False,
    weight_scheme=None,
    skip_final_all_reduce=False,
    runtime_weight_transfer=False,
    dual_batch_overlap=False,
):
    """Every human-readable reason why this configuration cannot run on `backend`
    ('cpu', 'cuda' or 'auto'); an empty list when it can."""
    spec = _spec(**_config_of(locals()))
    return list(_moe_ep._unsupported_reasons(spec, int(world_size), backend))


def _bootstrap_args(world_size, rank, backend, device, nccl_unique_id, process_group,
                    default_backend):
    """(world_size, rank, backend, device, nccl_unique_id) after process_group= and defaults."""
    if process_group is not None:
        from .distributed import bootstrap_from_process_group

        boot = bootstrap_from_process_group(process_group, device=device)
        world_size, rank = boot["world_size"], boot["rank"]
        device, nccl_unique_id = boot["device"], boot["nccl_unique_id"]
        if backend is None:
            backend = "cuda"
    if backend is None:
        backend = default_backend
    if device is None:
        device = 0
    elif not isinstance(device, int):
        device = device.index if getattr(device, "index", None) is not None else 0
    if nccl_unique_id is not None:
        nccl_unique_id = bytes(nccl_unique_id)
    return world_size, rank, backend, device, nccl_unique_id


class _Collective:
    """What a group and a layer share: a collective destroy() (each class says its own), the
    ``destroyed`` flag, and ``with`` blocks that destroy on exit."""

    @property
    def destroyed(self):
        return self._impl.destroyed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()
        return False


class EpGroup(_Collective):
    """The EP group of this rank (docs/contract.md §4): made once per process and EP group, and
    passed to every layer (``MoeEpLayer(..., group=g)``). Its layers share one communicator (one
    ``process_group=`` bootstrap, one NCCL communicator) and one workspace pool: one workspace
    per capacity, sized for the largest layer that uses it, so N layers hold their weights plus
    one workspace set. Layers of a group run one after another (one stream); a workspace view of
    one layer is valid until the next call of any layer of the group in the same workspace.

    Bootstrap arguments as ``MoeEpLayer`` takes them; ``backend`` defaults to ``'cuda'`` with
    ``process_group``, ``nccl_unique_id`` or ``nccl_comm``, else ``'auto'`` (CUDA when a GPU and
    the CUDA backend are present). Creation is collective.
    """

    def __init__(
        self,
        *,
        world_size=1,
        rank=0,
        backend=None,
        device=None,
        cpu_fleet=None,
        nccl_unique_id=None,
        nccl_comm=0,
        process_group=None,
        timeout_ms=30000,
        warmup_timeout_ms=120000,
    ):
        default = "cuda" if (nccl_unique_id is not None or nccl_comm) else "auto"
        world_size, rank, backend, device, nccl_unique_id = _bootstrap_args(
            world_size, rank, backend, device, nccl_unique_id, process_group, default)
        self._impl = _moe_ep._Group(int(world_size), int(rank), str(backend), int(device),
                                    cpu_fleet, nccl_unique_id, int(nccl_comm), int(timeout_ms),
                                    int(warmup_timeout_ms))

    @property
    def world_size(self):
        return self._impl.world_size

    @property
    def rank(self):
        return self._impl.rank

    @property
    def backend(self):
        return self._impl.backend

    @property
    def device(self):
        return self._impl.device

    @property
    def pool_bytes(self):
        """Bytes of every pooled workspace alive now (device memory on CUDA)."""
        return self._impl.pool_bytes

    @property
    def num_pooled_workspaces(self):
        return self._impl.num_pooled_workspaces

    def destroy(self):
        """Collective and idempotent; every layer of the group must be destroyed first."""
        self._impl.destroy()

    def __repr__(self):
        return (f"EpGroup(world_size={self.world_size}, rank={self.rank}, "
                f"backend={self.backend!r}, pool_bytes={self.pool_bytes})")


class MoeEpLayer(_Collective):
    """One MoE layer of one EP rank (docs/contract.md §4).

    Construction is collective over the EP group: every rank constructs its layer with the
    same configuration (on the CPU backend with W > 1, each rank on its own Python thread,
    sharing one ``CpuFleet``).

    Weights are this rank's E_local experts as the checkpoint stores them:

    - 4-bit recipes: ``w13`` uint8 [E_local, 2I, H/2], ``w2`` uint8 [E_local, H, I/2],
      ``w13_scale`` [E_local, 2I, H/g], ``w2_scale`` [E_local, H, I/g] (uint8 or float8 bytes)
    - ``bf16``: ``w13`` bf16 [E_local, 2I, H], ``w2`` bf16 [E_local, H, I] (torch.bfloat16,
      or numpy uint16 bits / ml_dtypes.bfloat16); no scales.

    They are copied at construction. ``hidden_size`` and ``intermediate_size`` default to
    what the weights' shapes say.

    Bootstrap (pick one):

    - ``group=`` an ``EpGroup``: the layer shares the group's communicator and workspace pool
      (the other bootstrap arguments are left out).
    - CPU: ``backend='cpu'`` (the default for host weights); W > 1 needs ``cpu_fleet``.
    - CUDA: ``world_size``, ``rank``, ``device`` and ``nccl_unique_id`` (128 bytes, the same on
      every rank; see ``moe_ep.nccl_unique_id()``) or ``nccl_comm`` (an ncclComm_t as int).
    - CUDA from torch.distributed: ``process_group=`` a group (or ``torch.distributed.group.WORLD``);
      rank and world size come from it and the NCCL unique id is broadcast over it.
    """

    def __init__(
        self,
        w13,
        w2,
        w13_scale=None,
        w2_scale=None,
        *,
        num_experts,
        max_tokens_per_rank,
        top_k,
        recipe="bf16",
        hidden_size=None,
        intermediate_size=None,
        swiglu_limit=None,
        swiglu_alpha=1.0,
        swiglu_beta=0.0,
        apply_topk_in_fc1=False,
        do_finalize=True,
        input_norm_const=1.0,
        activation_dtype="bfloat16",
        combine_dtype="bfloat16",
        has_expert_bias=False,
        has_custom_swiglu_alpha_beta=False,
        fp8_mma=False,
        weight_scheme=None,
        skip_final_all_reduce=False,
        runtime_weight_transfer=False,
        dual_batch_overlap=False,
        fc1_alpha=None,
        fc2_alpha=None,
        fc1_norm_const=None,
        fc1_bias=None,
        fc2_bias=None,
        world_size=1,
        rank=0,
        backend=None,
        device=None,
        cpu_fleet=None,
        nccl_unique_id=None,
        nccl_comm=0,
        process_group=None,
        timeout_ms=30000,
        warmup_timeout_ms=120000,
        group=None,
    ):
        if group is not None:
            defaults = (("world_size", world_size, 1), ("rank", rank, 0), ("backend", backend, None),
                        ("device", device, None), ("cpu_fleet", cpu_fleet, None),
                        ("nccl_unique_id", nccl_unique_id, None), ("nccl_comm", nccl_comm, 0),
                        ("process_group", process_group, None))
            given = [n for n, v, d in defaults if v is not d and v != d]
            if given or not isinstance(group, EpGroup):
                from ._errors import InvalidArgumentError

                raise InvalidArgumentError(
                    "group= must be a moe_ep.EpGroup and excludes the bootstrap arguments "
                    f"(given: {', '.join(given) or type(group).__name__})")
        for name, a, optional in (
            ("w13", w13, False),
            ("w2", w2, False),
            ("w13_scale", w13_scale, True),
            ("w2_scale", w2_scale, True),
            ("fc1_alpha", fc1_alpha, True),
            ("fc2_alpha", fc2_alpha, True),
            ("fc1_norm_const", fc1_norm_const, True),
            ("fc1_bias", fc1_bias, True),
            ("fc2_bias", fc2_bias, True),
        ):
            T.require_tensor(a, name, optional)
        if hidden_size is None:
            hidden_size = int(w2.shape[1]) if len(w2.shape) == 3 else 0
        if intermediate_size is None and len(w13.shape) != 3:
            intermediate_size = 0  # the library names the shape error
        if intermediate_size is None:
            intermediate_size = int(w13.shape[1]) // 2
        wdev = T.device_of(w13)
        if device is None and wdev[0] == "cuda":
            device = wdev[1]
        world_size, rank, backend, device, nccl_unique_id = _bootstrap_args(
            world_size, rank, backend, device, nccl_unique_id, process_group,
            "cuda" if wdev[0] == "cuda" else "cpu")
        if group is not None:
            world_size, rank, backend = group.world_size, group.rank, group.backend
            device = group.device
        self._group = group
        self._framework = T.TORCH if T.is_torch(w13) else T.NUMPY
        spec = _spec(**_config_of(locals()))
        x = T.to_extension
        self._impl = _moe_ep._Layer(
            spec,
            x(w13),
            x(w2),
            x(w13_scale),
            x(w2_scale),
            x(fc1_alpha),
            x(fc2_alpha),
            x(fc1_norm_const),
            x(fc1_bias),
            x(fc2_bias),
            int(world_size),
            int(rank),
            str(backend),
            int(device),
            cpu_fleet,
            nccl_unique_id,
            int(nccl_comm),
            int(timeout_ms),
            int(warmup_timeout_ms),
            group._impl if group is not None else None,
        )
        self._hidden_size = int(hidden_size)
        self._top_k = int(top_k)
        # Epilogue vectors the caller gave on the layer's own device are read from the caller's
        # memory by every forward that passes none (not from the copy made at construction), so
        # that an expert move in them (EPLB) reaches the kernels; expert_weight_views() hands
        # them back.
        layer_dev = ("cuda", int(device)) if self.backend == "cuda" else ("cpu", 0)
        self._caller_vectors = {
            name: v
            for name, v in (
                ("fc1_alpha", fc1_alpha),
                ("fc2_alpha", fc2_alpha),
                ("fc1_norm_const", fc1_norm_const),
            )
            if v is not None and T.device_of(v) == layer_dev
        }

    # --- forward -------------------------------------------------------------------------
    def __call__(
        self,
        hidden_states,
        topk_ids,
        topk_weights,
        *,
        fc1_alpha=None,
        fc2_alpha=None,
        fc1_norm_const=None,
        workspace=None,
        return_workspace_view=False,
        stream=None,
        num_tokens=None,
        out=None,
    ):
        """The finalized output bf16 [T, H] in the caller's framework and on its device.

        ``out``: the caller's bf16 [T, H] tensor on the layer's device (torch.bfloat16, or numpy
        uint16 bits / ml_dtypes.bfloat16), written and returned: no allocation per call, so the
        forward can be captured in a CUDA graph with the caller's buffers.

        With ``return_workspace_view`` the output is a zero-copy view of the workspace, valid in
        stream order until the next call of any layer of the group that uses that workspace (the
        group's pooled workspace of its capacity); otherwise it is a fresh
        tensor (torch.empty / numpy.empty) that the library writes into.
        ``stream``: defaults to torch's (or cupy's) current stream for CUDA tensors.
        ``num_tokens``: optional int32 one-element tensor on the layer's device, the number of
        valid leading rows read when the forward runs (a CUDA graph captured at T rows replays
        with any count <= T; rows past it come back as zeros).
        """
        self._check_inputs(hidden_states, topk_ids, topk_weights, fc1_alpha, fc2_alpha,
                           fc1_norm_const, num_tokens)
        fc1_alpha, fc2_alpha, fc1_norm_const = self._vectors(fc1_alpha, fc2_alpha, fc1_norm_const)
        x = T.to_extension
        ws = self._ws_index(workspace)
        s = T.stream_for(hidden_states, stream)
        if out is not None:
            if return_workspace_view:
                from ._errors import InvalidArgumentError

                raise InvalidArgumentError("out= and return_workspace_view=True exclude each other")
            T.require_tensor(out, "out")
        elif return_workspace_view:
            out = self._impl.forward_view(
                x(hidden_states), x(topk_ids), x(topk_weights), x(fc1_alpha), x(fc2_alpha),
                x(fc1_norm_const), ws, s, x(num_tokens), T.framework_of(hidden_states),
            )
            return T.as_bf16_result(out, hidden_states)
        if out is None:
            rows = int(hidden_states.shape[0]) if len(hidden_states.shape) >= 1 else 0
            out = T.bf16_like(hidden_states, rows, self._hidden_size)
        self._impl.forward(
            x(hidden_states), x(topk_ids), x(topk_weights), x(out), x(fc1_alpha), x(fc2_alpha),
            x(fc1_norm_const), ws, s, x(num_tokens),
        )
        return out

    forward = __call__

    def forward_unfinalized(
        self,
        hidden_states,
        topk_ids,
        topk_weights,
        *,
        fc1_alpha=None,
        fc2_alpha=None,
        fc1_norm_const=None,
        workspace=None,
        stream=None,
        num_tokens=None,
        out=None,
    ):
        """Only on a layer built with do_finalize=False: UnfinalizedOutput(rows, weights,
        indices); summing them as in docs/contract.md §3 gives bitwise the finalized output.

        ``out``: the caller's (rows bf16 [T*K, H], weights float32 [T, K], indices int32 [T, K])
        on the layer's device, written and returned as an UnfinalizedOutput: no allocation per
        call, so the forward can be captured in a CUDA graph."""
        self._check_inputs(hidden_states, topk_ids, topk_weights, fc1_alpha, fc2_alpha,
                           fc1_norm_const, num_tokens)
        fc1_alpha, fc2_alpha, fc1_norm_const = self._vectors(fc1_alpha, fc2_alpha, fc1_norm_const)
        x = T.to_extension
        if out is not None:
            if not isinstance(out, (tuple, list)) or len(out) != 3:
                from ._errors import InvalidArgumentError

                raise InvalidArgumentError(
                    "out= must be the three tensors (rows, weights, indices), got "
                    f"{type(out).__name__}")
            for name, a in zip(("rows", "weights", "indices"), out):
                T.require_tensor(a, name)
            self._impl.forward_unfinalized_into(
                x(hidden_states), x(topk_ids), x(topk_weights), x(out[0]), x(out[1]), x(out[2]),
                x(fc1_alpha), x(fc2_alpha), x(fc1_norm_const), self._ws_index(workspace),
                T.stream_for(hidden_states, stream), x(num_tokens),
            )
            return UnfinalizedOutput(*out)
        rows, weights, indices = self._impl.forward_unfinalized(
            x(hidden_states), x(topk_ids), x(topk_weights), x(fc1_alpha), x(fc2_alpha),
            x(fc1_norm_const), self._ws_index(workspace), T.stream_for(hidden_states, stream),
            x(num_tokens), T.framework_of(hidden_states),
        )
        return UnfinalizedOutput(T.as_bf16_result(rows, hidden_states), weights, indices)

    def _vectors(self, fc1_alpha, fc2_alpha, fc1_norm_const):
        """The per-call epilogue vectors, the caller's own from construction where none given."""
        own = self._caller_vectors
        return (
            own.get("fc1_alpha") if fc1_alpha is None else fc1_alpha,
            own.get("fc2_alpha") if fc2_alpha is None else fc2_alpha,
            own.get("fc1_norm_const") if fc1_norm_const is None else fc1_norm_const,
        )

    @staticmethod
    def _check_inputs(hidden_states, topk_ids, topk_weights, fc1_alpha, fc2_alpha,
                      fc1_norm_const, num_tokens):
        """Non-tensor arguments (lists, scalars, None) get the library's InvalidArgumentError
        here; everything about the tensors themselves is checked by the library."""
        T.require_tensor(hidden_states, "hidden_states")
        T.require_tensor(topk_ids, "topk_ids")
        T.require_tensor(topk_weights, "topk_weights")
        T.require_tensor(fc1_alpha, "fc1_alpha", optional=True)
        T.require_tensor(fc2_alpha, "fc2_alpha", optional=True)
        T.require_tensor(fc1_norm_const, "fc1_norm_const", optional=True)
        T.require_tensor(num_tokens, "num_tokens", optional=True)
        if isinstance(num_tokens, np.ndarray) and num_tokens.size == 1:
            # Host counts are checked now (a device count is read when the forward runs and
            # clamped to [0, T] there, as a CUDA graph replays it).
            n = int(num_tokens.reshape(-1)[0])
            rows = int(hidden_states.shape[0]) if len(hidden_states.shape) >= 1 else 0
            if n < 0 or n > rows:
                from ._errors import InvalidArgumentError

                raise InvalidArgumentError(
                    f"num_tokens = {n} is outside [0, T = {rows}] (T: rows of hidden_states)"
                )

    # --- workspaces ----------------------------------------------------------------------
    @property
    def default_workspace(self):
        return Workspace(0, self._impl.workspace_capacity(0))

    def create_workspace(self, capacity):
        """A new workspace of `capacity` tokens per rank (collective: same order on all ranks)."""
        i = self._impl.create_workspace(T.require_count(capacity, "capacity", lo=1))
        return Workspace(i, self._impl.workspace_capacity(i))

    def select_workspace(self, num_tokens, *, collective=False):
        """The smallest workspace that holds `num_tokens`: the largest T of any rank in this
        call, or with ``collective=True`` this rank's T (the maximum is found over the group)."""
        num_tokens = T.require_count(num_tokens, "select_workspace: num_tokens")
        if collective:
            i = self._impl.select_workspace_collective(num_tokens)
        else:
            i = self._impl.select_workspace(num_tokens)
        return Workspace(i, self._impl.workspace_capacity(i))

    def workspace_bytes(self, workspace=None):
        return self._impl.workspace_bytes(max(self._ws_index(workspace), 0))

    def plan(self, num_tokens, workspace=None):
        """The launch plan a forward of num_tokens tokens runs, in one line (the CUDA backend's
        kernels, tiles, grids and rings; the CPU reference names only T). Runs nothing."""
        num_tokens = T.require_count(num_tokens, "plan: num_tokens")
        return self._impl.plan(num_tokens, max(self._ws_index(workspace), 0))

    def last_plan(self):
        """The launch plan of the latest forward, in one line."""
        return self._impl.last_plan()

    def warmup(self, workspace=None, *, max_num_seqs=None, num_speculative_tokens=0, sp_size=1):
        """Does every lazy step so that a following forward can be captured in a CUDA graph.

        With ``max_num_seqs`` (the engine's scheduler bound) it also creates, collectively, the
        decode workspace of cdiv(max_num_seqs * (1 + num_speculative_tokens), sp_size) tokens per
        rank (or finds the one the layer has) and returns it, warmed up too."""
        self._impl.warmup(self._ws_index(workspace))
        if max_num_seqs is None:
            return None
        i = self._impl.create_decode_workspace(
            T.require_count(max_num_seqs, "max_num_seqs", lo=1),
            T.require_count(num_speculative_tokens, "num_speculative_tokens"),
            T.require_count(sp_size, "sp_size", lo=1),
        )
        return Workspace(i, self._impl.workspace_capacity(i))

    @staticmethod
    def _ws_index(workspace):
        if workspace is None:
            return -1
        if isinstance(workspace, Workspace):
            return workspace.index
        return T.require_count(workspace, "workspace")

    # --- weights (EPLB) --------------------------------------------------------------------
    def kernel_weights(self):
        """KernelWeights of byte tensors [E_local, bytes_per_expert] aliasing kernel memory."""
        return KernelWeights(*self._impl.kernel_weights(self._framework))

    def expert_weight_views(self):
        """ExpertWeightViews(weights=KernelWeights, fc1_alpha, fc2_alpha, fc1_norm_const,
        fc1_bias, fc2_bias): what the kernels read. An epilogue vector the caller passed at
        construction on the layer's device is the caller's own tensor (the forwards read it);
        the others, and the biases (None without them), alias the layer's copies."""
        v = self._impl.expert_weight_views(self._framework)
        own = self._caller_vectors
        vec = [own.get(n, v[4 + i]) for i, n in
               enumerate(("fc1_alpha", "fc2_alpha", "fc1_norm_const"))]
        return ExpertWeightViews(KernelWeights(*v[:4]), *vec, v[7], v[8])

    # --- lifetime --------------------------------------------------------------------------
    def destroy(self):
        """Collective and idempotent; any later call raises moe_ep.DestroyedError. Views from
        kernel_weights() / return_workspace_view must not be used after it."""
        self._impl.destroy()

    @property
    def group(self):
        """The EpGroup the layer was built from (None for a layer with a group of its own)."""
        return self._group

    # --- properties as vLLM reads them -------------------------------------------------------
    @property
    def can_overlap_shared_experts(self):
        return self._impl.can_overlap_shared_experts

    @property
    def output_is_reduced(self):
        return self._impl.output_is_reduced

    @property
    def is_monolithic(self):
        return self._impl.is_monolithic

    @property
    def uses_fp8_mma(self):
        """True where the expert GEMMs run on fp8 tensor cores (fp8_mma on the CUDA backend)."""
        return self._impl.uses_fp8_mma

    @property
    def topk_indices_dtype(self):
        """torch.int32 when torch is importable, else numpy.int32."""
        try:
            import torch

            return torch.int32
        except ImportError:
            import numpy

            return numpy.int32

    @property
    def rank(self):
        return self._impl.rank

    @property
    def world_size(self):
        return self._impl.world_size

    @property
    def num_local_experts(self):
        return self._impl.num_local_experts

    @property
    def backend(self):
        return self._impl.backend

    @property
    def recipe(self):
        return self._impl.recipe

    @property
    def hidden_size(self):
        return self._hidden_size

    @property
    def top_k(self):
        return self._top_k

    @property
    def max_tokens_per_rank(self):
        return self._impl.max_tokens_per_rank

    def __repr__(self):
        if self._impl.destroyed:
            return "MoeEpLayer(destroyed)"
        return (
            f"MoeEpLayer(recipe={self.recipe}, backend={self.backend}, rank={self.rank}/"
            f"{self.world_size}, E_local={self.num_local_experts}, H={self.hidden_size}, "
            f"K={self.top_k}, capacity={self.max_tokens_per_rank})"
        )
