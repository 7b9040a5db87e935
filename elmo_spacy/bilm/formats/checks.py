"""What every reader of a model's files checks, written once: a path that
must exist, a JSON file that must parse, and arrays whose shapes a model's
description calls for."""

import contextlib
import difflib
import json
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import ElmoSpacyError


class BiLMLoadError(ElmoSpacyError):
    """A biLM path, folder, file or payload that cannot be loaded, with the reason."""


def existing(path: str | Path, what: str = "") -> Path:
    """`path` (with `~` expanded), if it exists; else a `BiLMLoadError` that
    says where the path breaks off and names the closest names there.
    `what` starts the message (e.g. "The options file of the pair: ")."""
    path = Path(path).expanduser()
    if path.exists():
        return path
    missing, parent = path, path.parent
    while not parent.exists():
        missing, parent = parent, parent.parent
    message = f"{what}{path} does not exist"
    if not path.is_absolute():
        message += f" (a relative path, from {Path.cwd()})"
    if missing != path:
        message += f": {parent} has no {missing.name}"
    try:
        names = [p.name for p in parent.iterdir()]
    except OSError:
        names = []
    close = difflib.get_close_matches(missing.name, names, n=3, cutoff=0.6)
    if close:
        raise BiLMLoadError(
            f"{message}. Did you mean {' or '.join(str(parent / n) for n in close)}?"
        )
    raise BiLMLoadError(message + ".")


def listing(names: Iterable[str], limit: int = 12) -> str:
    """Names for a message, the first `limit` of them."""
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def read_json(path: Path, error: type[ElmoSpacyError], name: str | None = None) -> Any:
    """The JSON value in the UTF-8 file `path`; where it cannot be read or
    parsed, `error` (the format's), naming the file as `name` (default: its path)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # ValueError: bad JSON, or not UTF-8
        raise error(f"{name or path} is not a readable JSON file: {err}") from err


def check_shapes(
    found: Mapping[str, Sequence[int]],
    expected: Mapping[str, Sequence[int]],
    *,
    where: str,
    described_by: str,
    error: type[ElmoSpacyError],
    unexpected: bool = False,
) -> None:
    """Raise `error` unless every array of `expected` (name -> shape, -1 for
    any size) is in `found` (name -> shape) with its shape, and, with
    `unexpected`, `found` holds nothing else. The message names the file
    (`where`), what it fails to match (`described_by`), and the arrays."""
    missing = [name for name in expected if name not in found]
    extra = sorted(set(found) - set(expected)) if unexpected else []
    wrong = [
        f"{name} has shape {tuple(found[name])} where {described_by} calls for "
        + str(tuple("any" if n < 0 else n for n in shape))
        for name, shape in expected.items()
        if name in found
        and (
            len(found[name]) != len(shape)
            or any(n >= 0 and n != m for n, m in zip(shape, found[name]))
        )
    ]
    problems = [f"missing {listing(missing, 5)}"] if missing else []
    problems += [f"unexpected {listing(extra, 5)}"] if extra else []
    if problems or wrong:
        raise error(
            f"{where} does not match {described_by} ({'; '.join(problems + wrong[:3])}): were "
            "the files of different models mixed?"
        )


def are_missing(names: Sequence[str]) -> str:
    """ "a, b are missing" (or "a is missing"), for a message."""
    return f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} missing"


def refuse_unknown(
    values: Mapping[str, Any],
    known: Mapping[str, Collection[str]],
    ignored: Collection[str],
    where: str,
    error: type[ElmoSpacyError],
    what: str,
) -> None:
    """Raise `error` if `values` has a section other than those of `known`
    (section -> its keys) and `ignored`, or a key its section does not know:
    such a setting may change what the model computes."""
    unknown = sorted(set(values) - set(known) - set(ignored))
    for section, keys in known.items():
        unknown += [f"{section}.{k}" for k in sorted(set(values.get(section, {})) - set(keys))]
    if unknown:
        raise error(
            f"{where}: {what} this converter does not know: {unknown}. They may change what "
            "the model computes, so it stops rather than guess."
        )


@contextlib.contextmanager
def settings_of(where: str, error: type[ElmoSpacyError], what: str) -> Iterator[None]:
    """Turn a missing key (`what` names what keys are) or a value of the wrong
    type, met while reading a model's settings, into `error` naming `where`."""
    try:
        yield
    except error:
        raise
    except KeyError as err:
        raise error(f"{where}: {what} {err} is missing") from err
    except (TypeError, ValueError) as err:
        raise error(f"{where}: {err}") from err
