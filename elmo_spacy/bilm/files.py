"""Output folders written all at once, so that a crash never leaves half of one."""

import os
import shutil
from collections.abc import Callable, Collection
from pathlib import Path


def write_directory(
    path: str | Path, write: Callable[[Path], None], owned: Collection[str]
) -> Path:
    """Fill a temporary sibling of `path` with `write(temporary)`, then put it in
    place of `path`. A failing `write` leaves nothing behind, and `path` is
    never half written: a run stopped between the two renames leaves the old
    folder complete at `.<name>.old`.

    An existing `path` is replaced only if it holds nothing but files named in
    `owned` (what an earlier write of the same kind left): anything else there
    stops the write, so no other data is lost.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(
            f"{path} is a file, not a folder: choose another output folder (a new one), or "
            "move that file away first."
        )
    if path.exists():
        others = sorted(
            p.name + ("/" if p.is_dir() else "") for p in path.iterdir() if p.name not in owned
        )
        if others:
            listed = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if others[5:] else "")
            it, they, are = ("it", "it", "is") if len(others) == 1 else ("them", "they", "are")
            raise FileExistsError(
                f"{path} already holds {listed}, which {are} not part of what is written "
                f"there. The folder is written as a whole, so {they} would be deleted: choose "
                f"another output folder (a new or empty one), or move {it} out of {path} first."
            )
    temporary = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    try:
        write(temporary)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    old = path.with_name(f".{path.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        os.replace(path, old)
    os.replace(temporary, path)
    shutil.rmtree(old, ignore_errors=True)
    return path
