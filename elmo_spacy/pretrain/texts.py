"""Raw pretraining text: one doc per line (.txt) or one {"text": ...} object per line (.jsonl)."""

import json
from collections.abc import Iterator
from pathlib import Path

from ..errors import ElmoSpacyError


def read_texts(path: str | Path) -> Iterator[str]:
    """Yield the texts of a .txt file (one per line, blank lines skipped) or of a
    .jsonl file (the "text" field of each line). Errors name file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such text file")
    jsonl = path.suffix == ".jsonl"
    with path.open(encoding="utf-8", errors="strict") as lines:
        for number, line in enumerate(_decoded(lines, path), start=1):
            if not line.strip():
                continue
            if not jsonl:
                yield line.rstrip("\n")
                continue
            try:
                record = json.loads(line)
                yield record["text"]
            except (ValueError, KeyError, TypeError) as err:
                raise ElmoSpacyError(
                    f'{path}:{number}: expected a JSON object with a "text" field ({err})'
                ) from err


def _decoded(lines, path: Path) -> Iterator[str]:
    while True:
        try:
            line = next(lines)
        except StopIteration:
            return
        except UnicodeDecodeError as err:
            # The text reader decodes in chunks: err.start counts from the chunk,
            # not the file, so find the first bad byte again from the start.
            raise ElmoSpacyError(_where_not_utf8(path, err)) from err
        yield line


def _where_not_utf8(path: Path, err: UnicodeDecodeError) -> str:
    """`path:line:column: ...` for the first byte of `path` that is not UTF-8.
    Lines end at LF, CRLF or CR (as when reading the text); the column counts
    bytes from 1, and the offset counts bytes of the file from 0."""
    offset, line_number = 0, 1
    with path.open("rb") as raw:
        for line in raw:  # a UTF-8 sequence never holds the byte \n
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as bad:
                before = line[: bad.start]
                line_number += before.count(b"\r")
                column = bad.start - (before.rfind(b"\r") + 1) + 1
                found = line[bad.start : bad.start + 1].hex()
                return (
                    f"{path}:{line_number}:{column}: not valid UTF-8: byte 0x{found} at byte "
                    f"offset {offset + bad.start} of the file ({bad.reason}). Re-encode the "
                    "file as UTF-8 (from Latin-1: iconv -f latin1 -t utf-8), or fix that line."
                )
            line_number += 1 + line.count(b"\r") - line.endswith(b"\r\n")
            offset += len(line)
    return f"{path}: not valid UTF-8 ({err.reason}); re-encode the file as UTF-8"


def read_tokenised_texts(
    path: str | Path, lang: str = "en", show_progress: bool = True
) -> list[list[str]]:
    """The texts of `path` (see `read_texts`), each cut into tokens by spaCy's
    tokenizer for `lang`: the tokens a pipeline will later see. With
    `show_progress`, a progress bar counts the docs on stderr."""
    import spacy
    from tqdm import tqdm

    tokenizer = spacy.blank(lang).tokenizer
    docs = tokenizer.pipe(read_texts(path), batch_size=1000)
    bar = tqdm(docs, desc=f"tokenising {Path(path).name}", unit="doc", disable=not show_progress)
    return [[t.text for t in doc] for doc in bar]
