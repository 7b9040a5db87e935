"""`elmo-spacy prepare`: text read and tokenised once, written shard by shard
(`corpus.CorpusWriter`). The shards are cut at doc boundaries by reading
alone, so every run over the same inputs, and every part, cuts them alike.
"""

import contextlib
import functools
import hashlib
import json
import shutil
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy
from tqdm import tqdm

from ..errors import ElmoSpacyError
from ..tokenizer import blank
from .corpus import TOKEN_DTYPE, Corpus, CorpusWriter, Tokenization, is_prepared
from .texts import TextFile, find_text_files

DEFAULT_SHARD_SIZE = 100_000_000  # characters of text a shard, about 20M tokens of English
TASK_CHARS = 1_000_000  # characters of text a tokenising task


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
    """Tokenise the text files that `inputs` name into `output_dir` as a
    prepared corpus; the options are those of `elmo-spacy prepare`."""
    tokenization = Tokenization("whitespace") if pretokenized else Tokenization("spacy", lang)
    if not pretokenized:
        blank(lang, f"--lang {lang}")  # refused before any work
    files = find_text_files(inputs)
    k, n = part
    if not (n >= 1 and 0 <= k < n):
        raise ElmoSpacyError(f"part {k}/{n}: K must be in 0..N-1, N at least 1")
    if shard_size < 1:
        raise ElmoSpacyError(f"shard size {shard_size}: at least 1 character")
    if n_process < 1:
        raise ElmoSpacyError(f"n_process = {n_process}: at least 1")
    created = not Path(output_dir).exists()
    stamps = [_source_stamp(f) for f in files]
    writer = CorpusWriter(Path(output_dir), tokenization, stamps, shard_size, part, overwrite)
    if writer.finished:
        return writer.path
    sources: list[dict[str, Any]] = []  # filled as the files are read
    try:
        with _tokenizers(tokenization, n_process) as tokenize:
            _write(writer, _read(files, sources), sources, tokenize, n_process, show_progress)
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
    """The `Corpus` of prepared folders, or of text files prepared into the
    folder `cache` (`lang` default "en"); given with prepared folders, `lang`
    and `pretokenized` must say what those were cut with."""
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
        missing = [
            str(p)
            for p, is_folder in zip(paths, prepared)
            if not is_folder and not Path(p).exists()
        ]
        if missing:
            raise ElmoSpacyError(f"{', '.join(missing)}: no such file or folder")
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
    `output_dir` as a prepared corpus, replacing any there but a finished
    preparation of the same docs (held in memory to digest them);
    `tokenization` says how they were cut (the biLM pretrained on them records it)."""
    docs = [list(doc) for doc in docs if doc]
    digest = hashlib.sha256()
    for doc in docs:
        digest.update(json.dumps(doc).encode())
    sources = [{"name": "<docs>", "docs": len(docs), "sha256": digest.hexdigest()}]
    writer = CorpusWriter(Path(output_dir), tokenization, sources, shard_size, (0, 1), True)
    if not writer.finished:
        _write(writer, docs, sources, _indexed, 1, False, size=lambda d: sum(len(t) + 1 for t in d))
    return writer.path


def _read(files: list[Path], sources: list[dict[str, Any]]) -> Iterator[str]:
    """The docs of `files` in order; each file's record joins `sources` once read."""
    for path in files:
        source = TextFile(path)
        n_docs = 0
        for text in source.docs():
            n_docs += 1
            yield text
        if n_docs == 0:
            raise ElmoSpacyError(
                f"{path}: no text: the file is empty or holds only blank lines. Leave it out."
            )
        sources.append({**_source_stamp(path), "sha256": source.sha256, "docs": n_docs})


def _write(
    writer: CorpusWriter,
    docs: Iterable,
    sources: list[dict[str, Any]],
    tokenize: Callable,
    n_process: int,
    show_progress: bool,
    size: Callable[[Any], int] = len,
) -> None:
    """Cut `docs` into shards of `writer.shard_size` (`size` of each doc),
    have this part's tokenised, a few tasks ahead, and written."""
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
            bar.update(writer.add(shard, *result))
            bar.set_postfix(docs=f"{writer.n_docs:,}", shards=len(writer.done), refresh=False)

    def submit(shard: int, texts: list) -> None:
        if texts:
            pending.append((shard, tokenize(texts)))
            drain(keep=2 * n_process)

    with bar:  # closed before an error is shown, which then starts a line of its own
        shard, shard_chars, ours = 0, 0, writer.wants(0)
        task: list = []
        task_chars = 0
        for doc in docs:
            chars = size(doc)
            shard_chars += chars
            if ours:
                task.append(doc)
                task_chars += chars
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
        if ours and shard_chars:
            submit(shard, task)
            pending.append((shard, None))
        drain(keep=0)
    writer.finish(sources, shards_in_plan=shard + (shard_chars > 0))


@contextlib.contextmanager
def _tokenizers(tokenization: Tokenization, n_process: int) -> Iterator[Callable]:
    """`tokenize_texts` in this process, or a Future of it from `n_process` workers."""
    if n_process == 1:
        _start_worker(tokenization)
        yield tokenize_texts
        return
    pool = ProcessPoolExecutor(
        n_process,
        mp_context=get_context("spawn"),
        initializer=_start_worker,
        initargs=(tokenization,),
    )
    try:
        yield functools.partial(pool.submit, tokenize_texts)
    finally:
        pool.shutdown(cancel_futures=True)


_TOKENIZER: Any = None  # this process's tokenizer: set by _start_worker


def _start_worker(tokenization: Tokenization) -> None:
    global _TOKENIZER
    if tokenization.tokenizer == "whitespace":
        _TOKENIZER = str.split
    else:
        _TOKENIZER = blank(tokenization.lang, str(tokenization)).tokenizer


def tokenize_texts(texts: list[str]) -> tuple[list[str], numpy.ndarray, numpy.ndarray]:
    """The distinct tokens of `texts`, every token as the (n_tokens,) int32
    index of its string in them, and the (n_docs,) int64 tokens of each doc."""
    if _TOKENIZER is str.split:
        return _indexed([text.split() for text in texts])
    from spacy.attrs import ORTH

    docs = list(_TOKENIZER.pipe(texts, batch_size=256))
    hashes = numpy.concatenate([doc.to_array(ORTH) for doc in docs] or [numpy.zeros(0, "uint64")])
    unique, inverse = numpy.unique(hashes, return_inverse=True)
    strings = _TOKENIZER.vocab.strings
    types = [strings[int(h)] for h in unique]
    lengths = numpy.array([len(doc) for doc in docs], dtype="int64")
    return types, inverse.astype(TOKEN_DTYPE), lengths


def _indexed(docs: list[list[str]]) -> tuple[list[str], numpy.ndarray, numpy.ndarray]:
    """Docs of token strings as `tokenize_texts` returns them."""
    index: dict[str, int] = {}
    ids = [index.setdefault(t, len(index)) for doc in docs for t in doc]
    return list(index), numpy.array(ids, TOKEN_DTYPE), numpy.array([len(d) for d in docs], "int64")


def _source_stamp(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"path": str(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
