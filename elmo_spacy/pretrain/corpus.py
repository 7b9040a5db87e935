"""A prepared corpus: text tokenised once (`elmo-spacy prepare`), read by
pretraining without holding it in memory.

One folder holds:

    manifest.json      written last: what the folder holds (see below)
    types.bin          every distinct token (type), UTF-8, one after another
    type_offsets.bin   int64 (n_types + 1,): type i is types.bin[offsets[i]:offsets[i + 1]]
    type_counts.bin    int64 (n_types,): how often each type occurs
    shard-00000/       one or more shards, each
        tokens.bin     int32 (n_tokens,): the docs' tokens as type ids, doc after doc
        docs.bin       int64 (n_docs + 1,): doc d is tokens[docs[d]:docs[d + 1]]

All arrays are raw and little-endian, so that any tool can memory-map them.
Opening a corpus reads its manifest and maps the type table; the shards are
read where a batch needs them, by positioned reads (`DiskArray`), whatever
their size. The manifest
gives the format version, the tokenisation, the sources (path, size, SHA-256),
the counts, each shard's checksums and the folder's fingerprint.

A corpus prepared in parts (`--shard K/N`) is N such folders: read together
(`Corpus.open` of all of them), their shards take their places in the order
of the whole, and their type tables are merged.
"""

import hashlib
import json
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy

from ..bilm.inputs.tokenization import Tokenization
from ..errors import ElmoSpacyError

FORMAT = "elmo_spacy.prepared_corpus"
VERSION = 1
MANIFEST = "manifest.json"
TYPES, TYPE_OFFSETS, TYPE_COUNTS = "types.bin", "type_offsets.bin", "type_counts.bin"
TOKENS, DOCS = "tokens.bin", "docs.bin"
TOKEN_DTYPE, OFFSET_DTYPE = numpy.dtype("<i4"), numpy.dtype("<i8")


class TypeTable:
    """The distinct tokens of a corpus and their counts.

    strings: (bytes,) uint8, the types' UTF-8 one after another.
    offsets: (n + 1,) int64, type i is strings[offsets[i]:offsets[i + 1]].
    counts: (n,) int64.
    """

    def __init__(self, strings: numpy.ndarray, offsets: numpy.ndarray, counts: numpy.ndarray):
        self.strings, self.offsets, self.counts = strings, offsets, counts
        self._bytes = memoryview(self.strings)

    def __len__(self) -> int:
        return len(self.counts)

    def string(self, i: int) -> str:
        return str(self._bytes[self.offsets[i] : self.offsets[i + 1]], "utf-8", "surrogatepass")

    def strings_of(self, ids: Iterable[int]) -> list[str]:
        ids = numpy.fromiter(ids, dtype="int64") if not isinstance(ids, numpy.ndarray) else ids
        data = self._bytes
        return [
            str(data[start:stop], "utf-8", "surrogatepass")
            for start, stop in zip(self.offsets[ids].tolist(), self.offsets[ids + 1].tolist())
        ]

    @classmethod
    def from_strings(cls, strings: Sequence[str], counts: Sequence[int]) -> "TypeTable":
        encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
        offsets = numpy.zeros(len(encoded) + 1, dtype=OFFSET_DTYPE)
        offsets[1:] = numpy.cumsum([len(e) for e in encoded], dtype="int64")
        blob = numpy.frombuffer(b"".join(encoded), dtype="uint8")
        return cls(blob, offsets, numpy.asarray(counts, dtype=OFFSET_DTYPE))


class DiskArray:
    """A raw little-endian array in a file, read a slice at a time by
    positioned reads (os.pread). Unlike a memory map, reading leaves nothing
    in the process's resident memory: a page read once (and the 64 KiB that
    the kernel maps around a faulting page) would count there until the
    process ends, so a map read at random grows to the file's size. The file's
    pages stay in the OS's cache, shared by every process that reads them."""

    def __init__(self, path: Path, dtype: numpy.dtype, count: int) -> None:
        self.path, self.dtype, self.length = path, dtype, count
        self._file = path.open("rb")

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key: slice) -> numpy.ndarray:
        """The items of a slice (step 1), as a read-only array."""
        start, stop, step = key.indices(self.length)
        if step != 1:
            raise IndexError("a DiskArray reads slices of step 1")
        count = max(0, stop - start)
        size = self.dtype.itemsize
        data = os.pread(self._file.fileno(), count * size, start * size)
        return numpy.frombuffer(data, dtype=self.dtype)

    def pairs(self, indices: numpy.ndarray) -> tuple[numpy.ndarray, numpy.ndarray]:
        """(a[indices], a[indices + 1]): a doc's first offset and the next."""
        first = numpy.empty(len(indices), dtype="int64")
        second = numpy.empty(len(indices), dtype="int64")
        for row, i in enumerate(indices.tolist()):
            first[row], second[row] = self[i : i + 2]
        return first, second


@dataclass
class Shard:
    """One shard of a prepared folder: its tokens, (n_tokens,) int32 type ids,
    and doc offsets, (n_docs + 1,) int64."""

    path: Path
    index: int  # its place in the whole corpus (of all parts)
    tokens: DiskArray
    docs: DiskArray

    @property
    def n_docs(self) -> int:
        return len(self.docs) - 1


class PreparedCorpus:
    """One prepared folder (see the module docstring), opened: its manifest,
    type table and shards, memory-mapped."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        manifest_path = self.path / MANIFEST
        if not manifest_path.is_file():
            raise ElmoSpacyError(_not_prepared(self.path))
        try:
            self.manifest: dict[str, Any] = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise ElmoSpacyError(f"{manifest_path} is not valid JSON ({err})") from err
        if self.manifest.get("format") != FORMAT:
            raise ElmoSpacyError(f"{manifest_path} is not the manifest of a prepared corpus")
        if self.manifest.get("version") != VERSION:
            raise ElmoSpacyError(
                f"{self.path} was prepared in format version {self.manifest.get('version')}; "
                f"this elmo_spacy reads version {VERSION}: prepare the text again"
            )
        n_types = self.manifest["types"]
        self.types = TypeTable(
            _map(self.path / TYPES, numpy.dtype("uint8"), None),
            _map(self.path / TYPE_OFFSETS, OFFSET_DTYPE, n_types + 1),
            _map(self.path / TYPE_COUNTS, OFFSET_DTYPE, n_types),
        )
        self.shards = [
            Shard(
                self.path / entry["name"],
                entry["index"],
                _disk_array(self.path / entry["name"] / TOKENS, TOKEN_DTYPE, entry["tokens"]),
                _disk_array(self.path / entry["name"] / DOCS, OFFSET_DTYPE, entry["docs"] + 1),
            )
            for entry in self.manifest["shards"]
        ]

    @property
    def tokenization(self) -> Tokenization:
        return Tokenization.from_dict(self.manifest["tokenization"])

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]

    @property
    def plan(self) -> str:
        """The same for every part of one preparation (same sources and settings)."""
        return self.manifest["plan"]


class Corpus:
    """Prepared folders read as one corpus: their shards in order (the parts
    of one preparation in the order of the whole, other folders after each
    other as given) and one type table (a folder's own, or the merge of
    several). Doc d of the corpus is numbered across all shards.

    types: the `TypeTable`; token ids read through `tokens` index it.
    shards: the `Shard`s in order; doc_starts: (n_shards + 1,) first doc
        number of each shard, then the number of docs.
    """

    def __init__(self, folders: Sequence[PreparedCorpus]) -> None:
        if not folders:
            raise ElmoSpacyError("a corpus needs at least one prepared folder")
        self.folders = list(folders)
        tokenizations = {str(f.tokenization) for f in folders}
        if len(tokenizations) > 1:
            listed = "; ".join(f"{f.path}: {f.tokenization}" for f in folders)
            raise ElmoSpacyError(
                f"These folders were tokenised in different ways ({listed}): a biLM learns "
                "one tokenisation. Prepare them all with the same --lang or --pretokenized."
            )
        self.tokenization = folders[0].tokenization
        if len(folders) == 1:
            self.types = folders[0].types
            maps: list[numpy.ndarray | None] = [None]
        else:
            self.types, maps = _merged_types([f.types for f in folders])
        shards = [(f, shard, m) for f, m in zip(folders, maps) for shard in f.shards]
        shards = _in_order(shards)
        self.shards = [shard for _, shard, _ in shards]
        self._type_maps = [m for _, _, m in shards]
        self.doc_starts = numpy.zeros(len(self.shards) + 1, dtype="int64")
        self.doc_starts[1:] = numpy.cumsum([s.n_docs for s in self.shards])
        self.n_tokens = sum(len(s.tokens) for s in self.shards)
        self.fingerprint = hashlib.sha256(
            "\n".join(f.fingerprint for f, _, _ in _unique_folders(shards)).encode()
        ).hexdigest()

    @classmethod
    def open(cls, paths: Sequence[str | Path]) -> "Corpus":
        return cls([PreparedCorpus(p) for p in paths])

    @property
    def n_docs(self) -> int:
        return int(self.doc_starts[-1])

    def tokens(self, shard: int, start: int, length: int) -> numpy.ndarray:
        """(length,) int64 type ids of the corpus's table, from `start` in a shard."""
        ids = self.shards[shard].tokens[start : start + length]
        type_map = self._type_maps[shard]
        return ids.astype("int64") if type_map is None else type_map[ids]

    def describe(self) -> dict[str, Any]:
        """Where the corpus is and what it holds, for logs."""
        return {
            "paths": [str(f.path) for f in self.folders],
            "fingerprint": self.fingerprint,
            "docs": self.n_docs,
            "tokens": self.n_tokens,
            "types": len(self.types),
            "tokenization": self.tokenization.to_dict(),
        }


def is_prepared(path: str | Path) -> bool:
    """Whether `path` is a prepared folder (complete: it has its manifest)."""
    return (Path(path) / MANIFEST).is_file()


def _not_prepared(path: Path) -> str:
    if path.is_dir() and any(path.glob("shard-*")):
        return (
            f"{path} is a preparation that has not finished (no {MANIFEST}): run the same "
            "`elmo-spacy prepare` command again, which goes on from its last finished shard."
        )
    return (
        f"{path} is not a prepared corpus (no {MANIFEST}): make one with `elmo-spacy "
        f"prepare TEXT... {path}`, or give `elmo-spacy pretrain` the text files themselves."
    )


def _map(path: Path, dtype: numpy.dtype, count: int | None) -> numpy.ndarray:
    """The array in the raw file `path`, memory-mapped read-only; its size
    checked against `count` items (None: any)."""
    _check_size(path, dtype, count)
    if path.stat().st_size == 0:  # numpy cannot map an empty file
        return numpy.zeros(0, dtype=dtype)
    # A plain array over the map: slicing a numpy.memmap costs a Python object more.
    return numpy.asarray(numpy.memmap(path, dtype=dtype, mode="r"))


def _disk_array(path: Path, dtype: numpy.dtype, count: int) -> DiskArray:
    _check_size(path, dtype, count)
    return DiskArray(path, dtype, count)


def _check_size(path: Path, dtype: numpy.dtype, count: int | None) -> None:
    if not path.is_file():
        raise ElmoSpacyError(
            f"{path} is missing: the prepared corpus is incomplete; prepare it again"
        )
    size = path.stat().st_size
    if size % dtype.itemsize or (count is not None and size != count * dtype.itemsize):
        raise ElmoSpacyError(
            f"{path} holds {size} bytes, not the {count} items of {dtype.itemsize} bytes the "
            "manifest says: the file was truncated or replaced; prepare the corpus again"
        )


def _merged_types(tables: Sequence[TypeTable]) -> tuple[TypeTable, list[numpy.ndarray]]:
    """One table of the types of all `tables` (in order of first appearance),
    their counts summed, and for each table the (n,) int64 map of its ids to
    the merged table's."""
    index: dict[str, int] = {}
    maps = []
    for table in tables:
        ids = [index.setdefault(table.string(i), len(index)) for i in range(len(table))]
        maps.append(numpy.array(ids, dtype="int64"))
    counts = numpy.zeros(len(index), dtype="int64")
    for table, type_map in zip(tables, maps):
        numpy.add.at(counts, type_map, numpy.asarray(table.counts))
    return TypeTable.from_strings(list(index), counts), maps


def _in_order(shards: list) -> list:
    """Shards of the parts of one preparation in the order of the whole (by
    their index); folders of other preparations after each other, as given.
    Refuses a shard given twice; warns when parts of a preparation are missing."""
    plans: dict[str, int] = {}
    for folder, _, _ in shards:
        plans.setdefault(folder.plan, len(plans))
    seen: dict[tuple[str, int], Path] = {}
    for folder, shard, _ in shards:
        key = (folder.plan, shard.index)
        if key in seen:
            raise ElmoSpacyError(
                f"{folder.path} and {seen[key]} hold the same shard ({shard.index}) of one "
                "preparation: give each part once"
            )
        seen[key] = folder.path
    for plan in plans:
        parts = [f for f, _, _ in shards if f.plan == plan]
        expected = parts[0].manifest["shards_in_plan"]
        have = len({s.index for f, s, _ in shards if f.plan == plan})
        if have < expected:
            n_parts = parts[0].manifest["part"][1]
            warnings.warn(
                f"{parts[0].path}: {have} of the {expected} shards of its preparation "
                f"(in {n_parts} parts) are given; training on those alone",
                UserWarning,
                stacklevel=3,
            )
    return sorted(shards, key=lambda item: (plans[item[0].plan], item[1].index))


def _unique_folders(shards: list) -> list:
    seen, folders = set(), []
    for folder, shard, m in shards:
        if id(folder) not in seen:
            seen.add(id(folder))
            folders.append((folder, shard, m))
    return folders
