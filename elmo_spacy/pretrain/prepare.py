"""Text read and tokenised once, written as a prepared corpus (see
`elmo_spacy.pretrain.corpus` for the format): `elmo-spacy prepare`.

The text is cut into shards of about `shard_size` characters at doc
boundaries, by reading alone, so every run over the same inputs cuts them
the same way. Part K of N (`part=(K, N)`) tokenises the shards whose number
is K modulo N: N machines prepare one corpus between them, each into a
folder of its own, and pretraining reads the N folders as the whole.

Each shard is written under a temporary name and renamed when complete; the
manifest is written last. A preparation killed or stopped at any point goes
on from its last finished shard when run again with the same inputs and
settings (`plan.json` records them); a finished one is left as it is.
"""

import hashlib
import json
import os
import shutil
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy
from tqdm import tqdm

from ..errors import ElmoSpacyError
from ..files import write_file
from .corpus import (
    DOCS,
    FORMAT,
    MANIFEST,
    OFFSET_DTYPE,
    TOKEN_DTYPE,
    TOKENS,
    TYPE_COUNTS,
    TYPE_OFFSETS,
    TYPES,
    VERSION,
    Corpus,
    Tokenization,
    is_prepared,
)
from .texts import TextFile, find_text_files

PLAN = "plan.json"
SHARD_DONE = "shard.json"
DEFAULT_SHARD_SIZE = 100_000_000  # characters of text a shard, about 20M tokens of English
TASK_CHARS = 1_000_000  # characters of text a tokenising task
# What a prepared folder holds besides its shards: an existing folder with
# anything else in it is not written into.
FOLDER_FILES = (MANIFEST, PLAN, TYPES, TYPE_OFFSETS, TYPE_COUNTS)


def prepare_corpus(
    inputs: Sequence[str | Path],
    output_dir: str | Path,
    *,
    lang: str = "en",
    pretokenized: bool = False,
    n_process: int = 1,
    part: tuple[int, int] = (0, 1),
    shard_size: int = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    show_progress: bool = True,
) -> Path:
    """Tokenise the text files that `inputs` name (files, folders, globs: see
    `find_text_files`) and write them to `output_dir` as a prepared corpus.

    lang: the language of spaCy's tokenizer (ignored with `pretokenized`).
    pretokenized: split on white space instead (text that came tokenised).
    n_process: processes that tokenise (the reading and writing is one more).
    part: (K, N), prepare the K-th of N parts (counting from 0).
    shard_size: characters of text a shard, at least.
    overwrite: replace an earlier preparation of other inputs or settings in
        `output_dir`; without it, such a folder is refused, and one of the
        same inputs and settings is finished or left as it is.
    Returns `output_dir`.
    """
    tokenization = Tokenization("whitespace") if pretokenized else Tokenization("spacy", lang)
    files = find_text_files(inputs)
    k, n = part
    if not (n >= 1 and 0 <= k < n):
        raise ElmoSpacyError(f"part {k}/{n}: K must be in 0..N-1, N at least 1")
    if shard_size < 1:
        raise ElmoSpacyError(f"shard size {shard_size}: at least 1 character")
    if n_process < 1:
        raise ElmoSpacyError(f"n_process = {n_process}: at least 1")
    plan = {
        "format": FORMAT,
        "version": VERSION,
        "tokenization": tokenization.to_dict(),
        "sources": [_source_stamp(f) for f in files],
        "shard_size": shard_size,
        "part": [k, n],
    }
    created = not Path(output_dir).exists()
    writer = CorpusWriter(Path(output_dir), plan, overwrite)
    if writer.finished:
        return writer.path
    try:
        with _tokenizers(tokenization, n_process) as tokenize:
            _prepare(files, writer, tokenize, show_progress)
    except BaseException:
        if created and not writer.done:  # nothing to go on from: leave nothing behind
            shutil.rmtree(writer.path, ignore_errors=True)
        raise
    return writer.path


def open_corpus(
    paths: Sequence[str | Path],
    cache: str | Path,
    *,
    lang: str | None = None,
    pretokenized: bool = False,
    show_progress: bool = True,
) -> Corpus:
    """The `Corpus` of prepared folders, or of text files (see
    `find_text_files`) prepared into the folder `cache` (`prepare_corpus`),
    where a later call with the same files and settings finds them prepared.
    `lang` (default "en") and `pretokenized` say how text files are
    tokenised; given with prepared folders, they must say what the folders
    were prepared with."""
    prepared = [is_prepared(p) for p in paths]
    if all(prepared):
        corpus = Corpus.open(paths)
        if lang is not None or pretokenized:
            asked = Tokenization("whitespace") if pretokenized else Tokenization("spacy", lang)
            if asked != corpus.tokenization:
                raise ElmoSpacyError(
                    f"{paths[0]} was prepared with {corpus.tokenization}, not {asked}: leave "
                    "out --lang and --pretokenized, which are for text files, or prepare it again"
                )
        return corpus
    if any(prepared):
        raise ElmoSpacyError(
            f"{', '.join(map(str, paths))}: give prepared folders or text files, not both "
            "(prepare the text with `elmo-spacy prepare` first)"
        )
    folder = prepare_corpus(
        paths,
        cache,
        lang=lang or "en",
        pretokenized=pretokenized,
        overwrite=True,
        show_progress=show_progress,
    )
    return Corpus.open([folder])


def prepare_docs(
    docs: Iterable[Sequence[str]],
    output_dir: str | Path,
    *,
    tokenization: Tokenization = Tokenization("spacy", "en"),
    shard_size: int = DEFAULT_SHARD_SIZE,
) -> Path:
    """Write docs that are tokenised already (lists of token strings) to
    `output_dir` as a prepared corpus; `tokenization` says how they were cut
    (the biLM pretrained on them records it). An existing corpus there is
    replaced."""
    plan = {
        "format": FORMAT,
        "version": VERSION,
        "tokenization": tokenization.to_dict(),
        "sources": [{"name": "<docs>"}],
        "shard_size": shard_size,
        "part": [0, 1],
    }
    writer = CorpusWriter(Path(output_dir), plan, overwrite=True)
    shard, shard_chars = 0, 0
    for doc in docs:
        if not doc:
            continue
        tokens = list(doc)
        writer.add(shard, [tokens])
        shard_chars += sum(len(t) + 1 for t in tokens)
        if shard_chars >= shard_size:
            writer.end_shard()
            shard, shard_chars = shard + 1, 0
    writer.finish([{"name": "<docs>"}], shards_in_plan=shard + (shard_chars > 0))
    return writer.path


def _prepare(files: list[Path], writer: "CorpusWriter", tokenize, show_progress: bool) -> None:
    """Read `files` once, cut them into shards, have this part's shards
    tokenised (in order, a few tasks ahead) and written."""
    k, n = writer.part
    bar = tqdm(
        desc=f"preparing {writer.path.name}" + (f" (part {k + 1} of {n})" if n > 1 else ""),
        unit="tok",
        unit_scale=True,
        disable=not show_progress,
        mininterval=1.0,
    )
    pending: deque = deque()  # (shard, tokenised task or its Future), or (shard, None): its end

    def drain(keep: int) -> None:
        while len(pending) > keep:
            shard, task = pending.popleft()
            if task is None:
                writer.end_shard()
                continue
            result = task.result() if isinstance(task, Future) else task
            bar.update(writer.add_tokenised(shard, *result))
            bar.set_postfix(docs=f"{writer.n_docs:,}", shards=len(writer.done), refresh=False)

    def submit(shard: int, texts: list[str]) -> None:
        if texts:
            pending.append((shard, tokenize(texts)))
            drain(keep=2 * tokenize.workers)

    shard, shard_chars, ours = 0, 0, writer.wants(0)
    task: list[str] = []
    task_chars = 0
    sources = []
    for path in files:
        source = TextFile(path)
        n_docs = 0
        for _, text in source.docs():
            n_docs += 1
            shard_chars += len(text)
            if ours:
                task.append(text)
                task_chars += len(text)
                if task_chars >= TASK_CHARS:
                    submit(shard, task)
                    task, task_chars = [], 0
            if shard_chars >= writer.shard_size:
                if ours:
                    submit(shard, task)
                    task, task_chars = [], 0
                    pending.append((shard, None))
                shard, shard_chars = shard + 1, 0
                ours = writer.wants(shard)
        if n_docs == 0:
            raise ElmoSpacyError(
                f"{path}: no text: the file is empty or holds only blank lines. Leave it out."
            )
        sources.append({**_source_stamp(path), "sha256": source.sha256, "docs": n_docs})
    if ours and shard_chars:
        submit(shard, task)
        pending.append((shard, None))
    drain(keep=0)
    bar.close()
    writer.finish(sources, shards_in_plan=shard + (shard_chars > 0))


class _tokenizers:
    """A function texts -> (types, ids, lengths) (see `tokenize_texts`) that
    runs in this process, or returns a Future of it in one of `n_process`
    worker processes; a context manager that ends them."""

    def __init__(self, tokenization: Tokenization, n_process: int) -> None:
        self.tokenization, self.workers = tokenization, n_process
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self):
        if self.workers > 1:
            self.pool = ProcessPoolExecutor(
                self.workers,
                mp_context=get_context("spawn"),
                initializer=_start_worker,
                initargs=(self.tokenization,),
            )
        else:
            _start_worker(self.tokenization)
        return self

    def __call__(self, texts: list[str]):
        if self.pool is None:
            return tokenize_texts(texts)
        return self.pool.submit(tokenize_texts, texts)

    def __exit__(self, *_) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


_TOKENIZER: Any = None  # this process's tokenizer: set by _start_worker


def _start_worker(tokenization: Tokenization) -> None:
    global _TOKENIZER
    if tokenization.tokenizer == "whitespace":
        _TOKENIZER = str.split
    else:
        import spacy

        _TOKENIZER = spacy.blank(tokenization.lang).tokenizer


def tokenize_texts(texts: list[str]) -> tuple[list[str], numpy.ndarray, numpy.ndarray]:
    """Tokenise texts with this process's tokenizer: the distinct tokens, every
    token as the (n_tokens,) int32 index of its string in them, and the
    (n_docs,) int64 tokens of each doc."""
    if _TOKENIZER is str.split:
        index: dict[str, int] = {}
        lengths = numpy.empty(len(texts), dtype="int64")
        ids: list[int] = []
        for i, text in enumerate(texts):
            tokens = text.split()
            lengths[i] = len(tokens)
            ids += [index.setdefault(t, len(index)) for t in tokens]
        return list(index), numpy.array(ids, dtype=TOKEN_DTYPE), lengths
    from spacy.attrs import ORTH

    docs = list(_TOKENIZER.pipe(texts, batch_size=256))
    hashes = numpy.concatenate([doc.to_array(ORTH) for doc in docs] or [numpy.zeros(0, "uint64")])
    unique, inverse = numpy.unique(hashes, return_inverse=True)
    strings = _TOKENIZER.vocab.strings
    types = [strings[int(h)] for h in unique]
    lengths = numpy.array([len(doc) for doc in docs], dtype="int64")
    return types, inverse.astype(TOKEN_DTYPE), lengths


class CorpusWriter:
    """Writes a prepared folder shard by shard (see the module docstring).

    Token ids are the folder's from the start: a type's id is its place in
    the order the folder first saw the types; each shard keeps the types it
    added, so that a preparation that goes on knows the ids of the shards
    written before.
    """

    def __init__(self, path: Path, plan: dict[str, Any], overwrite: bool) -> None:
        self.path, self.plan = path, plan
        self.part = tuple(plan["part"])
        self.shard_size = plan["shard_size"]
        self.finished = False
        self.index: dict[str, int] = {}
        self.n_docs = 0
        self._shard: _ShardFile | None = None
        self._start(overwrite)
        if self.finished:
            return
        self.done = self._finished_shards()
        for entry in self.done.values():
            shard = self.path / entry["name"]
            offsets = numpy.fromfile(shard / TYPE_OFFSETS, dtype=OFFSET_DTYPE)
            blob = (shard / TYPES).read_bytes()
            for start, stop in zip(offsets[:-1], offsets[1:]):
                self.index[blob[start:stop].decode("utf-8", "surrogatepass")] = len(self.index)
        self.n_docs = sum(e["docs"] for e in self.done.values())

    def wants(self, index: int) -> bool:
        """Whether shard `index` of the whole is this part's and not written yet."""
        k, n = self.part
        return index % n == k and index not in self.done

    def _start(self, overwrite: bool) -> None:
        path = self.path
        if path.exists() and not path.is_dir():
            raise FileExistsError(f"{path} is a file, not a folder: choose another output folder")
        plan_path = path / PLAN
        if plan_path.is_file():
            earlier = json.loads(plan_path.read_text(encoding="utf-8"))
            if earlier == self.plan:
                self.finished = is_prepared(path)
                return
            if not overwrite:
                raise FileExistsError(
                    f"{path} holds a preparation of other inputs or settings "
                    f"({_plan_difference(earlier, self.plan)}). Prepare into another folder, or "
                    "pass --overwrite to replace it."
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
                    f"{path} holds a prepared corpus without its {PLAN}: pass --overwrite to "
                    "replace it, or choose another folder"
                )
            for p in path.iterdir():
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        path.mkdir(parents=True, exist_ok=True)
        _write_atomic(plan_path, json.dumps(self.plan, indent=2) + "\n")

    def _finished_shards(self) -> dict[int, dict[str, Any]]:
        """The shards written before, by index: those in one unbroken run
        from this part's first (a later one after a gap was not written by
        this writer's order, and is written again)."""
        k, n = self.part
        for stale in self.path.glob(".shard-*"):
            shutil.rmtree(stale, ignore_errors=True)
        done: dict[int, dict[str, Any]] = {}
        index = k
        while (self.path / _shard_name(index) / SHARD_DONE).is_file():
            entry = json.loads((self.path / _shard_name(index) / SHARD_DONE).read_text())
            done[index] = entry
            index += n
        for later in self.path.glob("shard-*"):
            if int(later.name.split("-")[1]) not in done:
                shutil.rmtree(later)
        return done

    def add(self, shard: int, docs: list[list[str]]) -> int:
        """Append tokenised docs to shard `shard`; returns their tokens."""
        index: dict[str, int] = {}
        ids = [index.setdefault(t, len(index)) for doc in docs for t in doc]
        lengths = numpy.array([len(doc) for doc in docs], dtype="int64")
        return self.add_tokenised(shard, list(index), numpy.array(ids, TOKEN_DTYPE), lengths)

    def add_tokenised(
        self, shard: int, types: list[str], ids: numpy.ndarray, lengths: numpy.ndarray
    ) -> int:
        """Append docs as `tokenize_texts` returns them to shard `shard`
        (begun if it is not the one being written); returns their tokens.
        Docs without tokens are left out."""
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
        added = list(self.index)[shard.first_type :]
        self.done[shard.index] = shard.finish(added)

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
        encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
        offsets = numpy.zeros(len(strings) + 1, dtype=OFFSET_DTYPE)
        offsets[1:] = numpy.cumsum([len(e) for e in encoded])
        blob = b"".join(encoded)
        checksums = {
            TYPES: _write_atomic(self.path / TYPES, blob),
            TYPE_OFFSETS: _write_atomic(self.path / TYPE_OFFSETS, offsets.tobytes()),
            TYPE_COUNTS: _write_atomic(self.path / TYPE_COUNTS, counts.tobytes()),
        }
        if all("sha256" in s for s in sources):  # files: the same wherever they lie
            contents: Any = [_content(s) for s in sources]
        else:  # docs given in Python: what was written
            contents = [e["sha256"] for e in shards]
        plan_id = _digest(
            json.dumps({**self.plan, "part": None, "sources": contents}, sort_keys=True)
        )
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "tokenization": self.plan["tokenization"],
            "sources": sources,
            "shard_size": self.shard_size,
            "part": list(self.part),
            "plan": plan_id,
            "shards_in_plan": shards_in_plan,
            "docs": sum(e["docs"] for e in shards),
            "tokens": sum(e["tokens"] for e in shards),
            "types": len(strings),
            "shards": shards,
            "sha256": checksums,
            "fingerprint": _digest(
                json.dumps([plan_id, checksums, [e["sha256"] for e in shards]], sort_keys=True)
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
        ends = self.n_tokens + numpy.cumsum(lengths)
        self.offsets += ends.tolist()
        self.n_tokens += len(tokens)

    def finish(self, added: list[str]) -> dict[str, Any]:
        self.tokens.close()
        docs = numpy.array(self.offsets, dtype=OFFSET_DTYPE).tobytes()
        (self.temporary / DOCS).write_bytes(docs)
        self.hashes[DOCS].update(docs)
        encoded = [s.encode("utf-8", "surrogatepass") for s in added]
        offsets = numpy.zeros(len(encoded) + 1, dtype=OFFSET_DTYPE)
        offsets[1:] = numpy.cumsum([len(e) for e in encoded])
        (self.temporary / TYPES).write_bytes(b"".join(encoded))
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
        _fsync_folder(self.temporary)
        os.replace(self.temporary, self.final)
        return entry


def _shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def _is_ours(name: str) -> bool:
    return name in FOLDER_FILES or name.startswith(("shard-", ".shard-", f".{MANIFEST}"))


def _source_stamp(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"path": str(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _content(source: dict[str, Any]) -> dict[str, Any]:
    """What identifies a source's content wherever it lies: its name, size and checksum."""
    return {"name": Path(source["path"]).name, "bytes": source["bytes"], "sha256": source["sha256"]}


def _plan_difference(earlier: dict[str, Any], now: dict[str, Any]) -> str:
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


def _fsync_folder(folder: Path) -> None:
    for file in folder.iterdir():
        with file.open("rb") as handle:
            os.fsync(handle.fileno())
