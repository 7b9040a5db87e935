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
The manifest gives the format version, the tokenisation, the sources (path,
size, SHA-256), the counts, each shard's checksums and the folder's
fingerprint. A corpus prepared in parts (`--part K/N`) is N such folders.
"""

import hashlib
import json
import os
import shutil
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy

from ..bilm.inputs.tokenization import Tokenization
from ..errors import ElmoSpacyError
from ..files import write_file

FORMAT = "elmo_spacy.prepared_corpus"
VERSION = 1
MANIFEST = "manifest.json"
SETTINGS_FILE = "plan.json"  # the inputs and settings of a preparation, written first
SHARD_DONE = "shard.json"  # in a finished shard: its entry of the manifest
TYPES, TYPE_OFFSETS, TYPE_COUNTS = "types.bin", "type_offsets.bin", "type_counts.bin"
TOKENS, DOCS = "tokens.bin", "docs.bin"
TOKEN_DTYPE, OFFSET_DTYPE = numpy.dtype("<i4"), numpy.dtype("<i8")
# A folder holding anything else (besides shards) is not written into.
FOLDER_FILES = (MANIFEST, SETTINGS_FILE, TYPES, TYPE_OFFSETS, TYPE_COUNTS)


class CorpusDamaged(ElmoSpacyError):
    """A file of a prepared corpus does not hold what its manifest says."""


def damaged(path: Path, what: str) -> CorpusDamaged:
    folder = path.parent.parent if path.parent.name.startswith("shard-") else path.parent
    return CorpusDamaged(
        f"{path} {what}: the prepared corpus is damaged (copied in part, or overwritten). "
        f"`elmo-spacy prepare --verify {folder}` checks every file; prepare the text again, or "
        "copy the folder again from where it is whole."
    )


@dataclass(eq=False)
class TypeTable:
    """The distinct tokens of a corpus, as types.bin, type_offsets.bin and type_counts.bin."""

    strings: numpy.ndarray
    offsets: numpy.ndarray
    counts: numpy.ndarray

    def __len__(self) -> int:
        return len(self.counts)

    def strings_of(self, ids: Iterable[int]) -> list[str]:
        ids = ids if isinstance(ids, numpy.ndarray) else numpy.fromiter(ids, dtype="int64")
        data = memoryview(self.strings)
        return [
            str(data[start:stop], "utf-8", "surrogatepass")
            for start, stop in zip(self.offsets[ids].tolist(), self.offsets[ids + 1].tolist())
        ]


def encode_strings(strings: Sequence[str]) -> tuple[bytes, numpy.ndarray]:
    """Strings as the format stores them: their UTF-8 one after another, and
    (n + 1,) int64 offsets."""
    encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
    offsets = numpy.zeros(len(encoded) + 1, dtype=OFFSET_DTYPE)
    offsets[1:] = numpy.cumsum([len(e) for e in encoded], dtype="int64")
    return b"".join(encoded), offsets


class DiskArray:
    """A raw little-endian array in a file, read a slice at a time by os.pread,
    which, unlike a memory map read at random, leaves the pages in the OS's
    cache only, shared by every process."""

    def __init__(self, path: Path, dtype: numpy.dtype, count: int) -> None:
        _check_size(path, dtype, count)
        self.path, self.dtype, self.length = path, dtype, count
        self._file = path.open("rb")

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key: slice) -> numpy.ndarray:
        start, stop, step = key.indices(self.length)
        if step != 1:
            raise IndexError("a DiskArray reads slices of step 1")
        size = self.dtype.itemsize
        data = os.pread(self._file.fileno(), max(0, stop - start) * size, start * size)
        return numpy.frombuffer(data, dtype=self.dtype)

    def pairs(self, indices: numpy.ndarray) -> tuple[numpy.ndarray, numpy.ndarray]:
        """(a[indices], a[indices + 1]): a doc's first offset and the next."""
        rows = numpy.array([self[i : i + 2] for i in indices.tolist()], "int64").reshape(-1, 2)
        return rows[:, 0], rows[:, 1]


@dataclass
class Shard:
    index: int  # its place in the whole corpus (of all parts)
    tokens: DiskArray  # (n_tokens,) int32 type ids
    docs: DiskArray  # (n_docs + 1,) int64 offsets

    @property
    def n_docs(self) -> int:
        return len(self.docs) - 1


class PreparedCorpus:
    """One prepared folder, opened."""

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
                entry["index"],
                DiskArray(self.path / entry["name"] / TOKENS, TOKEN_DTYPE, entry["tokens"]),
                DiskArray(self.path / entry["name"] / DOCS, OFFSET_DTYPE, entry["docs"] + 1),
            )
            for entry in self.manifest["shards"]
        ]
        self.tokenization = Tokenization.from_dict(self.manifest["tokenization"])
        self.preparation = self.manifest["plan"]  # the same for every part of one preparation

    def files(self) -> list[tuple[Path, str]]:
        """Every file the manifest gives a SHA-256 of, with that checksum."""
        listed = [(self.path / name, digest) for name, digest in self.manifest["sha256"].items()]
        for entry in self.manifest["shards"]:
            folder = self.path / entry["name"]
            listed += [(folder / name, digest) for name, digest in entry["sha256"].items()]
        return listed


class Corpus:
    """Prepared folders read as one corpus: their shards in order (see
    `_in_order`) and one type table (merged where there are several).
    doc_starts: (n_shards + 1,) the first doc number of each shard, then n_docs.
    """

    def __init__(self, folders: Sequence[PreparedCorpus]) -> None:
        if not folders:
            raise ElmoSpacyError("a corpus needs at least one prepared folder")
        self.folders = list(folders)
        if len({str(f.tokenization) for f in folders}) > 1:
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
        shards = _in_order([(f, shard, m) for f, m in zip(folders, maps) for shard in f.shards])
        self.shards = [shard for _, shard, _ in shards]
        self._type_maps = [m for _, _, m in shards]
        self._n_types = [len(f.types) for f, _, _ in shards]  # of the table a shard's ids index
        self.doc_starts = numpy.zeros(len(self.shards) + 1, dtype="int64")
        self.doc_starts[1:] = numpy.cumsum([s.n_docs for s in self.shards])
        self.n_tokens = sum(len(s.tokens) for s in self.shards)
        in_order = dict.fromkeys(f for f, _, _ in shards)
        self.fingerprint = _digest("\n".join(f.manifest["fingerprint"] for f in in_order))

    @classmethod
    def open(cls, paths: Sequence[str | Path]) -> "Corpus":
        return cls([PreparedCorpus(p) for p in paths])

    @property
    def n_docs(self) -> int:
        return int(self.doc_starts[-1])

    @property
    def paths(self) -> str:
        """The folders, for messages."""
        return ", ".join(str(f.path) for f in self.folders)

    def tokens(self, shard: int, start: int, length: int) -> numpy.ndarray:
        """(length,) int64 type ids of the corpus's table, from `start` in a
        shard; ids out of range or past the file's end raise `CorpusDamaged`."""
        tokens = self.shards[shard].tokens
        ids = tokens[start : start + length]
        if len(ids) != length:
            raise damaged(tokens.path, f"ends before token {start + length} that a doc holds")
        if length and (int(ids.min()) < 0 or int(ids.max()) >= self._n_types[shard]):
            raise damaged(
                tokens.path,
                f"holds token ids outside its type table (0..{self._n_types[shard] - 1}) in "
                f"tokens {start}..{start + length - 1}",
            )
        type_map = self._type_maps[shard]
        return ids.astype("int64") if type_map is None else type_map[ids]

    def verify(self, progress: Callable[[int], None] | None = None) -> None:
        """Check every file against its manifest's SHA-256 (sizes are checked at
        opening), `progress` called with the bytes of each block read."""
        for path, expected in (item for folder in self.folders for item in folder.files()):
            digest = hashlib.sha256()
            with path.open("rb") as file:
                while block := file.read(1 << 22):
                    digest.update(block)  # hashlib lets other threads run meanwhile
                    if progress is not None:
                        progress(len(block))
            if digest.hexdigest() != expected:
                raise damaged(path, "does not hold what its manifest's SHA-256 says")

    @property
    def n_bytes(self) -> int:
        """Bytes of the files `verify` reads."""
        return sum(path.stat().st_size for f in self.folders for path, _ in f.files())

    def describe(self) -> dict[str, Any]:
        return {
            "paths": [str(f.path) for f in self.folders],
            "fingerprint": self.fingerprint,
            "docs": self.n_docs,
            "tokens": self.n_tokens,
            "types": len(self.types),
            "tokenization": self.tokenization.to_dict(),
        }


class CorpusCheck(threading.Thread):
    """`Corpus.verify` of corpora in a thread of its own, while training reads them."""

    def __init__(self, corpora: Sequence[Corpus]) -> None:
        super().__init__(name="corpus-check", daemon=True)
        self.corpora, self.error = list(corpora), None
        self.start()

    def run(self) -> None:
        try:
            for corpus in self.corpora:
                corpus.verify()
        except Exception as err:  # noqa: BLE001  (handed to the training thread)
            self.error = err

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def wait(self) -> None:
        self.join()
        self.raise_if_failed()


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
    """The raw file `path` memory-mapped read-only, of `count` items (None: any)."""
    _check_size(path, dtype, count)
    if path.stat().st_size == 0:  # numpy cannot map an empty file
        return numpy.zeros(0, dtype=dtype)
    # A plain array over the map: slicing a numpy.memmap costs a Python object more.
    return numpy.asarray(numpy.memmap(path, dtype=dtype, mode="r"))


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
    """One table of the types of all `tables`, and for each the (n,) int64
    map of its ids to the merged table's."""
    index: dict[str, int] = {}
    maps = []
    for table in tables:
        ids = [index.setdefault(t, len(index)) for t in table.strings_of(range(len(table)))]
        maps.append(numpy.array(ids, dtype="int64"))
    counts = numpy.zeros(len(index), dtype="int64")
    for table, type_map in zip(tables, maps):
        numpy.add.at(counts, type_map, numpy.asarray(table.counts))
    blob, offsets = encode_strings(list(index))
    return TypeTable(numpy.frombuffer(blob, dtype="uint8"), offsets, counts), maps


def _in_order(shards: list) -> list:
    """(folder, shard, type map)s: those of the parts of one preparation in
    the order of the whole, other preparations after each other, as given.
    Refuses a shard given twice; warns when parts of a preparation are missing."""
    first: dict[str, PreparedCorpus] = {}  # each preparation's first folder, in order
    seen: dict[tuple[str, int], Path] = {}
    for folder, shard, _ in shards:
        key = (folder.preparation, shard.index)
        if key in seen:
            raise ElmoSpacyError(
                f"{folder.path} and {seen[key]} hold the same shard ({shard.index}) of one "
                "preparation: give each part once"
            )
        seen[key] = folder.path
        first.setdefault(folder.preparation, folder)
    for preparation, folder in first.items():
        expected = folder.manifest["shards_in_plan"]
        have = sum(given == preparation for given, _ in seen)
        if have < expected:
            warnings.warn(
                f"{folder.path}: {have} of the {expected} shards of its preparation "
                f"(in {folder.manifest['part'][1]} parts) are given; training on those alone",
                UserWarning,
                stacklevel=3,
            )
    place = {preparation: i for i, preparation in enumerate(first)}
    return sorted(shards, key=lambda item: (place[item[0].preparation], item[1].index))


# -- writing: `elmo-spacy prepare` (prepare.py) feeds a CorpusWriter -------------


class CorpusWriter:
    """Writes a prepared folder shard by shard. A type's id is its place in the
    order the folder first saw the types; each shard keeps the types it added,
    so that a preparation that goes on knows the ids of the shards written before.
    """

    def __init__(
        self,
        path: Path,
        tokenization: Tokenization,
        sources: list[dict[str, Any]],
        shard_size: int,
        part: tuple[int, int],
        overwrite: bool,
    ) -> None:
        self.path, self.part, self.shard_size = path, tuple(part), shard_size
        self.settings = {  # what plan.json records of the preparation
            "format": FORMAT,
            "version": VERSION,
            "tokenization": tokenization.to_dict(),
            "sources": sources,
            "shard_size": shard_size,
            "part": list(part),
        }
        self.index: dict[str, int] = {}
        self._shard: _ShardFile | None = None
        self.finished = self._start(overwrite)
        if self.finished:
            return
        # The shards written before: those in one unbroken run from this part's
        # first (one after a gap is written again), and the types each added.
        for stale in path.glob(".shard-*"):
            shutil.rmtree(stale, ignore_errors=True)
        self.done: dict[int, dict[str, Any]] = {}
        index = part[0]
        while (done := path / _shard_name(index) / SHARD_DONE).is_file():
            entry = self.done[index] = json.loads(done.read_text())
            offsets = numpy.fromfile(done.parent / TYPE_OFFSETS, dtype=OFFSET_DTYPE)
            types = TypeTable(numpy.fromfile(done.parent / TYPES, "uint8"), offsets, None)
            for string in types.strings_of(range(entry["types_added"])):
                self.index[string] = len(self.index)
            index += part[1]
        for later in path.glob("shard-*"):
            if int(later.name.split("-")[1]) not in self.done:
                shutil.rmtree(later)
        self.n_docs = sum(e["docs"] for e in self.done.values())

    def wants(self, index: int) -> bool:
        """Whether shard `index` of the whole is this part's and not written yet."""
        k, n = self.part
        return index % n == k and index not in self.done

    def _start(self, overwrite: bool) -> bool:
        """Check the folder, write plan.json; whether it holds this preparation finished."""
        path, settings_path = self.path, self.path / SETTINGS_FILE
        if path.exists() and not path.is_dir():
            raise FileExistsError(f"{path} is a file, not a folder: choose another output folder")
        if settings_path.is_file():
            earlier = json.loads(settings_path.read_text(encoding="utf-8"))
            if earlier == self.settings:
                return is_prepared(path)
            if not overwrite:
                raise FileExistsError(
                    f"{path} holds a preparation of other inputs or settings "
                    f"({_settings_difference(earlier, self.settings)}). Prepare into another "
                    "folder, or pass --overwrite to replace it."
                )
        if path.is_dir() and any(path.iterdir()):
            others = [p.name for p in path.iterdir() if not _is_ours(p.name)]
            if others:
                raise FileExistsError(
                    f"{path} holds {', '.join(sorted(others)[:5])}, which a prepared corpus "
                    "does not: choose a new or empty folder"
                )
            if not overwrite:
                raise FileExistsError(
                    f"{path} holds a prepared corpus without its {SETTINGS_FILE}: pass "
                    "--overwrite to replace it, or choose another folder"
                )
            for p in path.iterdir():
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        path.mkdir(parents=True, exist_ok=True)
        _write_atomic(settings_path, json.dumps(self.settings, indent=2) + "\n")
        return False

    def add(self, shard: int, types: list[str], ids: numpy.ndarray, lengths: numpy.ndarray) -> int:
        """Append docs as `tokenize_texts` returns them to shard `shard` (begun
        if it is not the one being written), leaving out docs without tokens;
        returns their tokens."""
        if self._shard is None:
            self._shard = _ShardFile(self.path, shard, first_type=len(self.index))
        elif self._shard.index != shard:
            raise RuntimeError(f"shard {shard} began before shard {self._shard.index} ended")
        local = numpy.array([self.index.setdefault(t, len(self.index)) for t in types], "int64")
        self._shard.write(local[ids].astype(TOKEN_DTYPE), lengths[lengths > 0])
        self.n_docs += int((lengths > 0).sum())
        return len(ids)

    def end_shard(self) -> None:
        """Finish the shard being written (if any), atomically."""
        if self._shard is None:
            return
        shard, self._shard = self._shard, None
        self.done[shard.index] = shard.finish(list(self.index)[shard.first_type :])

    def finish(self, sources: list[dict[str, Any]], shards_in_plan: int = 1) -> None:
        """Write the type table and the manifest: the folder is complete."""
        self.end_shard()
        shards = [self.done[i] for i in sorted(self.done)]
        if not shards:
            raise ElmoSpacyError(
                f"part {self.part[0]}/{self.part[1]} has no shard: the text has "
                f"{shards_in_plan} shard(s) of {self.shard_size:,} characters. Prepare in fewer "
                "parts, or with a smaller --shard-size."
            )
        strings = list(self.index)
        counts = numpy.zeros(len(strings), dtype=OFFSET_DTYPE)
        for entry in shards:
            tokens = numpy.fromfile(self.path / entry["name"] / TOKENS, dtype=TOKEN_DTYPE)
            counts += numpy.bincount(tokens, minlength=len(strings))
        blob, offsets = encode_strings(strings)
        checksums = {
            TYPES: _write_atomic(self.path / TYPES, blob),
            TYPE_OFFSETS: _write_atomic(self.path / TYPE_OFFSETS, offsets.tobytes()),
            TYPE_COUNTS: _write_atomic(self.path / TYPE_COUNTS, counts.tobytes()),
        }
        if all("path" in s for s in sources):  # files: their name, size and checksum
            contents: Any = [
                {"name": Path(s["path"]).name, "bytes": s["bytes"], "sha256": s["sha256"]}
                for s in sources
            ]
        else:  # docs given in Python: what was written
            contents = [e["sha256"] for e in shards]
        preparation = _digest(
            json.dumps({**self.settings, "part": None, "sources": contents}, sort_keys=True)
        )
        manifest = {
            **self.settings,
            "sources": sources,
            "plan": preparation,
            "shards_in_plan": shards_in_plan,
            "docs": sum(e["docs"] for e in shards),
            "tokens": sum(e["tokens"] for e in shards),
            "types": len(strings),
            "shards": shards,
            "sha256": checksums,
            "fingerprint": _digest(
                json.dumps([preparation, checksums, [e["sha256"] for e in shards]], sort_keys=True)
            ),
        }
        _write_atomic(self.path / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        self.finished = True


class _ShardFile:
    """One shard being written, under a temporary name until `finish`."""

    def __init__(self, folder: Path, index: int, first_type: int) -> None:
        self.index, self.first_type = index, first_type
        self.final = folder / _shard_name(index)
        self.temporary = folder / f".{_shard_name(index)}.tmp"
        shutil.rmtree(self.temporary, ignore_errors=True)
        self.temporary.mkdir()
        self.tokens = (self.temporary / TOKENS).open("wb")
        self.hashes = {TOKENS: hashlib.sha256(), DOCS: hashlib.sha256()}
        self.offsets = [0]
        self.n_tokens = 0

    def write(self, tokens: numpy.ndarray, lengths: numpy.ndarray) -> None:
        data = tokens.tobytes()
        self.tokens.write(data)
        self.hashes[TOKENS].update(data)
        self.offsets += (self.n_tokens + numpy.cumsum(lengths)).tolist()
        self.n_tokens += len(tokens)

    def finish(self, added: list[str]) -> dict[str, Any]:
        self.tokens.close()
        docs = numpy.array(self.offsets, dtype=OFFSET_DTYPE).tobytes()
        (self.temporary / DOCS).write_bytes(docs)
        self.hashes[DOCS].update(docs)
        blob, offsets = encode_strings(added)
        (self.temporary / TYPES).write_bytes(blob)
        (self.temporary / TYPE_OFFSETS).write_bytes(offsets.tobytes())
        entry = {
            "name": self.final.name,
            "index": self.index,
            "docs": len(self.offsets) - 1,
            "tokens": self.n_tokens,
            "first_type": self.first_type,
            "types_added": len(added),
            "sha256": {name: h.hexdigest() for name, h in self.hashes.items()},
        }
        (self.temporary / SHARD_DONE).write_text(json.dumps(entry) + "\n")
        for file in self.temporary.iterdir():
            with file.open("rb") as handle:
                os.fsync(handle.fileno())
        os.replace(self.temporary, self.final)
        return entry


def _shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def _is_ours(name: str) -> bool:
    return name in FOLDER_FILES or name.startswith(("shard-", ".shard-", f".{MANIFEST}"))


def _settings_difference(earlier: dict[str, Any], now: dict[str, Any]) -> str:
    changed = [key for key in now if earlier.get(key) != now.get(key)]
    if "sources" in changed:
        return "the input files, or their sizes or times, differ"
    return ", ".join(f"{key}: {earlier.get(key)} then, {now.get(key)} now" for key in changed)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _write_atomic(path: Path, data: str | bytes) -> str:
    """Write `path` all at once (`write_file`); returns the SHA-256 of its bytes."""
    data = data.encode() if isinstance(data, str) else data
    write_file(path, lambda temporary: temporary.write_bytes(data))
    return hashlib.sha256(data).hexdigest()
