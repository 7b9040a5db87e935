"""AG News CSV -> cleaned texts with labels, and the corpus files the project trains on."""

import csv
import hashlib
import html
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CLASS_NAMES = ("World", "Sports", "Business", "Sci/Tech")

_BARE_NUMERIC_ENTITY = re.compile(r"(?<!&)#(\d{2,5});")
_BARE_NAMED_ENTITY = re.compile(r"(?<![&\w])(quot|amp|lt|gt|apos|nbsp);")
_TAG = re.compile(r"</?[A-Za-z][^<>]{0,200}>")
_SPACES = re.compile(r"\s+")


# md5 of the AG News files this project knows, and what each one is.
KNOWN_MD5 = {
    "train.csv": {
        "b1a00f826fdfbd249f79597b59e1dc12": "the official train split (120,000 rows)",
        "575693ea27caba092b22cb99b121daeb": "the 18,192-row subset of the local mirror",
    },
    "test.csv": {"d52ea96a97a2d943681189a97654912d": "the official test split (7,600 rows)"},
}


class BadRowError(ValueError):
    """A CSV row that cannot be used; the message names file, line and reason."""


class ChecksumError(ValueError):
    """A data file whose md5 is not one of the known ones."""


def md5sum(path: Path) -> str:
    digest = hashlib.md5()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_known_file(path: Path) -> str:
    """What the AG News file `path` is, by its md5 (see KNOWN_MD5). Raises
    ChecksumError, naming the file and both checksums, for any other content."""
    known = KNOWN_MD5[path.name]
    actual = md5sum(path)
    if actual not in known:
        expected = " or ".join(f"{md5} ({what})" for md5, what in known.items())
        raise ChecksumError(
            f"{path}: md5 is {actual}, expected {expected}. The file may be truncated "
            "or altered: delete it and run `spacy project assets` again, or pass "
            "--no-verify to use it as it is."
        )
    return known[actual]


@dataclass
class Row:
    label: str
    text: str
    line: int


@dataclass
class ReadReport:
    skipped: list[str] = field(default_factory=list)


def clean_text(text: str) -> str:
    """Undo AG News' artefacts: backslashes that stand for newlines, HTML entities
    in the `&amp;` and the bare `#36;` / `quot;` forms, and markup such as
    `&lt;b&gt;`; then collapse white space."""
    text = text.replace("\\", " ")
    text = html.unescape(html.unescape(text))  # "&amp;lt;" needs two rounds
    text = _BARE_NUMERIC_ENTITY.sub(r"&#\1;", text)
    text = html.unescape(_BARE_NAMED_ENTITY.sub(r"&\1;", text))
    text = _TAG.sub(" ", text)
    return _SPACES.sub(" ", text).strip()


def join_title(title: str, description: str) -> str:
    """One text from a title and a description, the title closed by a full stop."""
    title, description = clean_text(title), clean_text(description)
    if not title:
        return description
    if title[-1] not in ".!?":
        title += "."
    return f"{title} {description}".strip()


def read_agnews_csv(
    path: Path,
    class_names: Sequence[str] = CLASS_NAMES,
    skip_bad_rows: bool = False,
    report: ReadReport | None = None,
) -> Iterator[Row]:
    """Rows of an AG News CSV file ("class","title","description"; class 1..N).

    A bad row (wrong column count, unknown class, bytes that are not UTF-8,
    an empty text) raises BadRowError naming path:line, or is skipped and
    recorded in `report.skipped` when skip_bad_rows is set.
    """
    path = Path(path)
    report = report if report is not None else ReadReport()
    labels = {str(i + 1): name for i, name in enumerate(class_names)}
    raw = path.read_bytes()
    for record, line in _records(raw):
        try:
            row = _parse(record, labels, path, line)
        except BadRowError as err:
            if not skip_bad_rows:
                raise
            report.skipped.append(str(err))
            continue
        yield row


def _records(raw: bytes) -> Iterator[tuple[bytes, int]]:
    """Split CSV bytes into records (quoted fields may hold newlines); yields
    each non-blank record and the line it starts on."""
    line, start, start_line, quoted = 1, 0, 1, False
    for i, byte in enumerate(raw):
        if byte == 0x22:  # "
            quoted = not quoted
        elif byte == 0x0A:  # \n
            line += 1
            if not quoted:
                if raw[start:i].strip():
                    yield raw[start:i], start_line
                start, start_line = i + 1, line
    if raw[start:].strip():
        yield raw[start:], start_line


def _parse(record: bytes, labels: dict[str, str], path: Path, line: int) -> Row:
    try:
        text = record.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRowError(
            f"{path}:{line}: bytes that are not UTF-8 ({err.reason} at byte {err.start})"
        ) from err
    try:
        fields = next(csv.reader([text.rstrip("\r")], strict=True))
    except csv.Error as err:
        raise BadRowError(f"{path}:{line}: malformed CSV ({err})") from err
    if len(fields) != 3:
        raise BadRowError(
            f"{path}:{line}: expected 3 columns (class, title, description), got {len(fields)}"
        )
    label, title, description = fields
    if label.strip() not in labels:
        raise BadRowError(
            f"{path}:{line}: unknown class {label!r}; expected one of {sorted(labels)}"
        )
    joined = join_title(title, description)
    if not joined:
        raise BadRowError(f"{path}:{line}: empty title and description")
    return Row(labels[label.strip()], joined, line)


def stratified_split(
    rows: Sequence[Row], dev_fraction: float, seed: int
) -> tuple[list[Row], list[Row]]:
    """Hold out `dev_fraction` of each class (at least one row per class when
    the fraction is positive), seeded. Returns (train, dev) in file order."""
    rng = random.Random(seed)
    by_label: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_label.setdefault(row.label, []).append(i)
    dev = set()
    for label in sorted(by_label):
        indices = by_label[label]
        rng.shuffle(indices)
        n_dev = max(1, round(len(indices) * dev_fraction)) if dev_fraction > 0 else 0
        dev.update(indices[:n_dev])
    train = [r for i, r in enumerate(rows) if i not in dev]
    return train, [r for i, r in enumerate(rows) if i in dev]
