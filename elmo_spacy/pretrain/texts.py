"""Raw pretraining text: files of one doc per line (.txt) or of one {"text": ...}
object per line (.jsonl), either gzip-compressed (.gz), named one by one, by
folder or by glob."""

import glob
import gzip
import hashlib
import io
import json
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from ..errors import ElmoSpacyError

TEXT_SUFFIXES = (".txt", ".jsonl", ".txt.gz", ".jsonl.gz")


def find_text_files(inputs: Sequence[str | Path]) -> list[Path]:
    """The text files that `inputs` (files, folders, globs) name, in order, each once."""
    found: list[Path] = []
    for given in inputs:
        path = Path(given)
        if path.is_dir():
            matches = sorted(
                p for p in path.rglob("*") if p.is_file() and p.name.endswith(TEXT_SUFFIXES)
            )
            if not matches:
                raise ElmoSpacyError(
                    f"{path}: a folder without text files (names ending in "
                    f"{', '.join(TEXT_SUFFIXES)})"
                )
        elif path.exists():
            matches = [path]
        elif glob.has_magic(str(given)):
            matches = sorted(Path(p) for p in glob.glob(str(given), recursive=True))
            matches = [p for p in matches if p.is_file()]
            if not matches:
                raise ElmoSpacyError(f"{given}: no file matches this pattern")
        else:
            raise FileNotFoundError(f"{path}: no such text file or folder")
        found += [p for p in matches if p not in found]
    return found


class TextFile:
    """One text file, read once (`docs`); then `sha256`, of its bytes on disk."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        name = self.path.name
        self.compressed = name.endswith(".gz")
        self.jsonl = name.removesuffix(".gz").endswith(".jsonl")
        self.sha256 = ""

    def docs(self) -> Iterator[str]:
        """Yield each non-blank line of a .txt file (ending at LF, CRLF or CR),
        or the "text" of each of a .jsonl file; errors name the file and line."""
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such text file")
        digest = hashlib.sha256()
        with self.path.open("rb") as raw:
            hashed = _Hashed(raw, digest)
            stream: BinaryIO = io.BufferedReader(hashed, 1 << 20)
            if self.compressed:
                stream = gzip.GzipFile(fileobj=stream)
            lines = io.TextIOWrapper(stream, encoding="utf-8", errors="strict")
            try:
                for number, line in enumerate(lines, start=1):
                    if line.strip():
                        yield self._text(line, number)
            except UnicodeDecodeError as err:
                # err.start counts from the decoder's chunk, not the file: find the byte again.
                raise ElmoSpacyError(self._where_not_utf8(err)) from err
            except (gzip.BadGzipFile, EOFError, zlib.error) as err:
                raise ElmoSpacyError(
                    f"{self.path}: not a readable gzip file ({err}): it may be truncated or "
                    "not compressed; check it with `gzip -t`"
                ) from err
            while hashed.read(1 << 20):  # the rest (a gzip trailer) counts in the checksum
                pass
        self.sha256 = digest.hexdigest()

    def _text(self, line: str, number: int) -> str:
        if not self.jsonl:
            return line.rstrip("\n")
        where = f"{self.path}:{number}"
        try:
            record = json.loads(line)
        except ValueError as err:
            raise ElmoSpacyError(f"{where}: not JSON ({err})") from err
        if not isinstance(record, dict) or "text" not in record:
            found = f"keys {sorted(record)}" if isinstance(record, dict) else type(record).__name__
            raise ElmoSpacyError(
                f'{where}: expected a JSON object with a "text" field, found {found}'
            )
        text = record["text"]
        if not isinstance(text, str):
            found = "null" if text is None else f"of type {type(text).__name__}"
            raise ElmoSpacyError(f'{where}: "text" is {found}, not a string')
        return text

    def _where_not_utf8(self, err: UnicodeDecodeError) -> str:
        """`path:line:column: ...` (in bytes) for the first byte that is not UTF-8."""
        offset, line_number = 0, 1
        with self.path.open("rb") as raw:
            stream = gzip.GzipFile(fileobj=raw) if self.compressed else raw
            for line in stream:  # a UTF-8 sequence never holds the byte \n
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as bad:
                    before = line[: bad.start]
                    line_number += before.count(b"\r")
                    column = bad.start - (before.rfind(b"\r") + 1) + 1
                    found = line[bad.start : bad.start + 1].hex()
                    return (
                        f"{self.path}:{line_number}:{column}: not valid UTF-8: byte 0x{found} "
                        f"at byte offset {offset + bad.start} of the "
                        f"{'uncompressed ' if self.compressed else ''}file ({bad.reason}). "
                        "Re-encode the file as UTF-8 (from Latin-1: iconv -f latin1 -t utf-8), "
                        "or fix that line."
                    )
                line_number += 1 + line.count(b"\r") - line.endswith(b"\r\n")
                offset += len(line)
        return f"{self.path}: not valid UTF-8 ({err.reason}); re-encode the file as UTF-8"


class _Hashed(io.RawIOBase):
    """A binary file that feeds what is read from it to a hash."""

    def __init__(self, raw: BinaryIO, digest) -> None:
        self.raw, self.digest = raw, digest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.raw.readinto(buffer)
        if n:
            self.digest.update(memoryview(buffer)[:n])
        return n


def read_texts(path: str | Path) -> Iterator[str]:
    """Yield the texts of one text file (see `TextFile.docs`)."""
    return TextFile(path).docs()
