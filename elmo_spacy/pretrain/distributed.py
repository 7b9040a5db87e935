"""Data-parallel pretraining under torchrun (`torchrun --nproc_per_node N
--no-python elmo-spacy pretrain ...`, on one machine or several, with or
without a shared filesystem): which process this is, and the few collective
operations the training loop needs. Without torchrun there is one rank."""

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from ..bilm.runtime.devices import resolve_device


@dataclass(frozen=True)
class ProcessGroup:
    """The ranks of one pretraining run, seen from one of them (torchrun's RANK
    and WORLD_SIZE), and this rank's device. Rank 0 writes what the run saves."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    # Rank -> the lowest rank that sees the same output folder (`find_folder_leaders`);
    # None (or all 0) where every rank sees rank 0's.
    folder_leaders: tuple[int, ...] | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def share(self, items: list) -> list:
        """Every world_size-th item from `rank`."""
        return items[self.rank :: self.world_size]

    def sum(self, values: list[float | torch.Tensor]) -> list[float]:
        """Element-wise sums over all ranks of numbers or scalar tensors."""
        tensor = torch.stack(
            [torch.as_tensor(v, dtype=torch.float64, device=self.device).detach() for v in values]
        )
        if self.distributed:
            dist.all_reduce(tensor)
        return tensor.tolist()

    def wait_for_all(self) -> None:
        if self.distributed:
            dist.barrier()

    @property
    def folder_leader(self) -> int:
        """The lowest rank that sees this rank's output folder: it prepares text
        for them all."""
        return 0 if self.folder_leaders is None else self.folder_leaders[self.rank]

    @property
    def prepares(self) -> bool:
        return self.folder_leader == self.rank

    @property
    def sees_main_folder(self) -> bool:
        return self.folder_leader == 0

    @property
    def folders_shared(self) -> bool:
        return not any(self.folder_leaders or ())

    @property
    def ranks_by_folder(self) -> list[list[int]]:
        """The ranks in groups that see one output folder."""
        groups: dict[int, list[int]] = {}
        for rank, leader in enumerate(self.folder_leaders or (0,) * self.world_size):
            groups.setdefault(leader, []).append(rank)
        return list(groups.values())

    def gather(self, value) -> list:
        """`value` (picklable) of every rank, in rank order."""
        if not self.distributed:
            return [value]
        values = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def from_main(self, value):
        """Rank 0's `value` (any picklable object), on every rank."""
        if not self.distributed:
            return value
        box = [value if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=self.device)
        return box[0]


def join_process_group(gpu_id: int = -1) -> ProcessGroup:
    """Join the process group that torchrun set up, or run alone, on the CPU
    (gpu_id -1) or GPU `gpu_id`; under torchrun any gpu_id >= 0 puts each
    rank on GPU LOCAL_RANK, with NCCL."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return ProcessGroup(device=resolve_device(gpu_id, "--gpu-id"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(local_rank if gpu_id >= 0 else -1, "--gpu-id")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return ProcessGroup(dist.get_rank(), dist.get_world_size(), device)


def leave_process_group(group: ProcessGroup) -> None:
    if group.distributed and dist.is_initialized():
        dist.destroy_process_group()


def find_folder_leaders(group: ProcessGroup, folder: Path) -> ProcessGroup:
    """`group` with `folder_leaders`: each rank writes a file of its own into
    the folder that holds `folder`, then looks for every rank's: the lowest
    rank whose file it sees leads its group (one group where the folder is
    shared, one a machine where each has its own disk)."""
    if not group.distributed:
        return group
    place = Path(folder).absolute().parent
    place.mkdir(parents=True, exist_ok=True)
    token = group.from_main(uuid.uuid4().hex)

    def probe(rank: int) -> Path:
        return place / f".elmo-spacy-{token}-{rank}"

    mine = probe(group.rank)
    mine.touch()
    try:
        group.wait_for_all()
        leader = min(r for r in range(group.world_size) if probe(r).exists())
        leaders = tuple(group.gather(leader))
        group.wait_for_all()  # every rank has looked before any file goes
    finally:
        mine.unlink(missing_ok=True)
    return ProcessGroup(group.rank, group.world_size, group.device, leaders)


def send_folder(group: ProcessGroup, source: Path | None, into: Path) -> Path | None:
    """Rank 0's folder `source` (its files), or None where rank 0 has none, on
    every rank: itself where the rank sees it, else a copy sent by rank 0
    into `into / source.name`. Every rank calls it."""
    if group.folders_shared:
        return source
    sent = None
    if group.is_main and source is not None:
        sent = (source.name, {p.name: p.read_bytes() for p in source.iterdir() if p.is_file()})
    sent = group.from_main(sent)
    if group.sees_main_folder or sent is None:
        return source
    name, files = sent
    copy = into / name
    copy.mkdir(parents=True, exist_ok=True)
    for file, data in files.items():
        (copy / file).write_bytes(data)
    return copy
