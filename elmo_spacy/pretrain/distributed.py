"""Data-parallel pretraining under torchrun: which process this is, and the few
collective operations the training loop needs.

Started as `torchrun --nproc_per_node N --no-python elmo-spacy pretrain ...`,
each of the N processes (ranks) maps the same prepared corpus, plans the
same batches, builds and trains on its own share of every batch, and
PyTorch's DistributedDataParallel averages the gradients (gloo on the CPU,
NCCL on GPUs). Started without torchrun, there is one rank and nothing is
shared.
"""

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..bilm.runtime.devices import resolve_device


@dataclass(frozen=True)
class Workers:
    """The ranks of one pretraining run, seen from one of them.

    rank, world_size: torchrun's RANK and WORLD_SIZE (0 and 1 without it).
    device: where this rank's biLM lives.
    """

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the checkpoints, models and log and shows progress."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def share(self, items: list) -> list:
        """This rank's share of `items`: every world_size-th one from `rank`."""
        return items[self.rank :: self.world_size]

    def sum(self, values: list[float | torch.Tensor]) -> list[float]:
        """Element-wise sums over all ranks of numbers or scalar tensors (on
        this rank's device): one transfer to the host, one collective."""
        tensor = torch.stack(
            [
                v.detach().to(self.device, torch.float64)
                if isinstance(v, torch.Tensor)
                else torch.tensor(float(v), dtype=torch.float64, device=self.device)
                for v in values
            ]
        )
        if self.distributed:
            dist.all_reduce(tensor)
        return tensor.tolist()

    def wait_for_all(self) -> None:
        if self.distributed:
            dist.barrier()


def start_workers(gpu_id: int = -1) -> Workers:
    """Join the process group that torchrun set up, or run alone.

    gpu_id: -1 for the CPU. Alone, the index of the GPU to use; under torchrun
    any value >= 0 puts each rank on GPU LOCAL_RANK, with NCCL.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Workers(device=resolve_device(gpu_id, "--gpu-id"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(local_rank if gpu_id >= 0 else -1, "--gpu-id")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Workers(dist.get_rank(), dist.get_world_size(), device)


def stop_workers(workers: Workers) -> None:
    if workers.distributed and dist.is_initialized():
        dist.destroy_process_group()
