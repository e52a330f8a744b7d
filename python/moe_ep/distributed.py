"""Bootstrap of a CUDA layer from a torch.distributed process group: rank and world size come
from the group and the NCCL unique id made on the group's first rank is broadcast over it."""

from . import _moe_ep


def nccl_unique_id():
    """A fresh ncclUniqueId (128 bytes). Made by this library's NCCL when it was built with CUDA,
    else by torch's (torch.cuda.nccl.unique_id)."""
    try:
        return bytes(_moe_ep._nccl_unique_id())
    except Exception as ours:  # noqa: BLE001 - fall back to torch's NCCL below
        try:
            import torch.cuda.nccl

            return bytes(torch.cuda.nccl.unique_id())
        except Exception:  # noqa: BLE001
            raise ours from None


def bootstrap_from_process_group(group, device=None):
    """{world_size, rank, device, nccl_unique_id} for this process in `group` (collective)."""
    import torch
    import torch.distributed as dist

    if group is None:
        group = dist.group.WORLD
    world_size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if device is None:
        device = torch.cuda.current_device()
    elif not isinstance(device, int):
        device = torch.device(device).index or 0
    payload = [nccl_unique_id() if rank == 0 else None]
    src = dist.get_global_rank(group, 0) if group is not dist.group.WORLD else 0
    # broadcast_object_list puts the pickled bytes on the current CUDA device for NCCL groups.
    with torch.cuda.device(device):
        dist.broadcast_object_list(payload, src=src, group=group)
    uid = payload[0]
    if not isinstance(uid, (bytes, bytearray)) or len(uid) != 128:
        raise RuntimeError("moe_ep: the NCCL unique id broadcast over the process group is not 128 bytes")
    return {"world_size": world_size, "rank": rank, "device": int(device), "nccl_unique_id": bytes(uid)}
