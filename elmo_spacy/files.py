"""Output files and folders written all at once, so that a crash never leaves half of one."""

import os
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterable
from pathlib import Path


def write_directory(
    path: str | Path, write: Callable[[Path], None], owned: Collection[str]
) -> Path:
    """Fill a temporary sibling of `path` with `write(temporary)`, then put it in
    place of `path`, which is never half written (a run stopped between the
    two renames leaves the old folder at `.<name>.old`). An existing `path`
    is replaced only if it holds nothing but files named in `owned`."""
    path = Path(path)
    check_output_folder(path)
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
    try:
        temporary.mkdir(parents=True)
        try:
            write(temporary)
            _usual_permissions(temporary.rglob("*"))
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if path.exists():
            os.replace(path, old)
        os.replace(temporary, path)
    except OSError as err:
        if err.errno is None:  # raised with a message of its own
            raise
        # The OS names the temporary folder, which the user never chose.
        raise type(err)(f"Cannot write {path}: {describe_os_error(err)}") from err
    shutil.rmtree(old, ignore_errors=True)
    return path


def write_file(path: str | Path, write: Callable[[Path], None]) -> None:
    """Run `write` on a temporary file beside `path`, flush it to disk, then
    rename it to `path`, which is never half written; the temporary file is
    removed if `write` fails or is interrupted."""
    path = Path(path)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    temporary = Path(name)
    try:
        write(temporary)
        with open(temporary, "rb") as file:
            os.fsync(file.fileno())
        _usual_permissions([temporary])  # not mkstemp's 0600
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _usual_permissions(files: Iterable[Path]) -> None:
    """Give `files` the mode a plain open() gives (0666 less the umask): some
    writers (safetensors, mkstemp) make theirs 0600, which other users cannot read."""
    umask = os.umask(0)
    os.umask(umask)
    for file in files:
        if file.is_file() and not file.is_symlink():
            os.chmod(file, 0o666 & ~umask)


def check_output_folder(path: str | Path) -> None:
    """Refuse an output folder that cannot be made: `path`, or a folder it
    would be made in, is a file."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(
            f"{path} is a file, not a folder: choose another output folder (a new one), or "
            "move that file away first."
        )
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise NotADirectoryError(
                    f"Cannot make the folder {path}: {parent} is a file, not a folder. "
                    "Choose another output folder."
                )
            return


def describe_os_error(err: OSError) -> str:
    """What an error of the OS means and what to do, without its "[Errno N]"
    and its path (which may be a temporary one the user never chose)."""
    import errno

    what = {
        errno.ENOENT: "no such file or folder: check the path",
        errno.EEXIST: "it exists already: choose another path, or move it away first",
        errno.ENOTDIR: "a part of the path is a file, not a folder: choose another path",
        errno.EISDIR: "it is a folder, not a file: give the path of a file",
        errno.EACCES: "permission denied: choose a place you may write to (or read), or "
        "change the permissions",
        errno.EPERM: "operation not permitted: choose another place",
        errno.ENOSPC: "no space left on the disk: free some space, or choose another disk",
        errno.EROFS: "the file system is read-only: choose another place",
    }
    return what.get(err.errno, err.strerror or str(err))
