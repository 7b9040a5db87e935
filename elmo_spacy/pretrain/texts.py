"""Raw pretraining text: one doc per line (.txt) or one {"text": ...} object per line (.jsonl)."""

import json
from collections.abc import Iterator
from pathlib import Path


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
                raise ValueError(
                    f'{path}:{number}: expected a JSON object with a "text" field ({err})'
                ) from err


def _decoded(lines, path: Path) -> Iterator[str]:
    number = 0
    while True:
        try:
            line = next(lines)
        except StopIteration:
            return
        except UnicodeDecodeError as err:
            raise ValueError(
                f"{path}:{number + 1}: not valid UTF-8 ({err.reason} at byte {err.start}); "
                "re-encode the file as UTF-8"
            ) from err
        number += 1
        yield line


def read_tokenised_texts(
    path: str | Path, lang: str = "en", progress: bool = True
) -> list[list[str]]:
    """The texts of `path` (see `read_texts`), each cut into tokens by spaCy's
    tokenizer for `lang`: the tokens a pipeline will later see. With
    `progress`, a progress bar counts the docs on stderr."""
    import spacy
    from tqdm import tqdm

    tokenizer = spacy.blank(lang).tokenizer
    docs = tokenizer.pipe(read_texts(path), batch_size=1000)
    bar = tqdm(docs, desc=f"tokenising {Path(path).name}", unit="doc", disable=not progress)
    return [[t.text for t in doc] for doc in bar]
