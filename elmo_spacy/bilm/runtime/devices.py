"""Where a biLM runs: a device asked for, checked against what torch sees."""

import torch

from ...errors import ElmoSpacyError


def resolve_device(device: str | int | torch.device, setting: str = "device") -> torch.device:
    """`device` as a torch device: a name ("cpu", "cuda", "cuda:1"), a
    torch.device, or a GPU index (-1: the CPU). A GPU that torch does not
    see is refused, naming `setting` (the option or argument that asked for
    it) and what to give instead."""
    cpu = "-1" if isinstance(device, int) else "'cpu'"
    given = device
    if isinstance(device, int):
        device = torch.device("cpu") if device < 0 else torch.device("cuda", device)
    else:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as err:
            raise ElmoSpacyError(f"{setting} = {given!r} is not a torch device ({err})") from err
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise ElmoSpacyError(
            f"{setting} = {given!r} asks for a GPU, but this torch sees no CUDA device (torch "
            f"{torch.__version__}, CUDA {torch.version.cuda}): use {setting} {cpu} for the CPU, "
            "or install a CUDA build of torch on a machine with a GPU"
        )
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ElmoSpacyError(
            f"{setting} = {given!r}, but torch sees {count} GPU(s) (cuda:0 to cuda:{count - 1})"
        )
    return device
