"""The fixture corpus that the plugin's tests train on, built without the study.

tests/data/train.csv (120 AG News rows: "class","title","description") ->
train.spacy and dev.spacy (a seeded split holding out a fraction of each
class, docs with exclusive `doc.cats`) and pretrain.txt (the train split's
texts, then tests/data/unlabeled.txt). The study's `python -m scripts corpus`
does the same for the real files, with checks this fixture does not need;
the texts and the split here are the ones it makes.
"""

import csv
import html
import random
import re
from pathlib import Path

import spacy
from spacy.tokens import DocBin

CLASS_NAMES = ("World", "Sports", "Business", "Sci/Tech")

_BARE_NUMERIC_ENTITY = re.compile(r"(?<!&)#(\d{2,5});")
_BARE_NAMED_ENTITY = re.compile(r"(?<![&\w])(quot|amp|lt|gt|apos|nbsp);")
_TAG = re.compile(r"</?[A-Za-z][^<>]{0,200}>")
_SPACES = re.compile(r"\s+")


def clean_text(text: str) -> str:
    """AG News' artefacts undone: backslashes for newlines, entities, markup."""
    text = html.unescape(html.unescape(text.replace("\\", " ")))
    text = _BARE_NUMERIC_ENTITY.sub(r"&#\1;", text)
    text = html.unescape(_BARE_NAMED_ENTITY.sub(r"&\1;", text))
    return _SPACES.sub(" ", _TAG.sub(" ", text)).strip()


def read_rows(path: Path) -> list[tuple[str, str]]:
    """(label, text) of each row; the title closed by a full stop."""
    rows = []
    with path.open(encoding="utf-8", newline="") as file:
        for label, title, description in csv.reader(file):
            title, description = clean_text(title), clean_text(description)
            if title and title[-1] not in ".!?":
                title += "."
            rows.append((CLASS_NAMES[int(label) - 1], f"{title} {description}".strip()))
    return rows


def split(rows: list, dev_fraction: float, seed: int) -> tuple[list, list]:
    """Hold out `dev_fraction` of each class (at least one row), seeded; file order."""
    rng = random.Random(seed)
    by_label: dict[str, list[int]] = {}
    for i, (label, _) in enumerate(rows):
        by_label.setdefault(label, []).append(i)
    dev = set()
    for label in sorted(by_label):
        indices = by_label[label]
        rng.shuffle(indices)
        dev.update(indices[: max(1, round(len(indices) * dev_fraction))])
    return [r for i, r in enumerate(rows) if i not in dev], [
        r for i, r in enumerate(rows) if i in dev
    ]


def build_fixture_corpus(
    train_csv: Path, unlabeled: Path, output_dir: Path, dev_fraction: float = 0.2, seed: int = 0
) -> None:
    nlp = spacy.blank("en")
    train, dev = split(read_rows(train_csv), dev_fraction, seed)
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("dev", dev)):
        docbin = DocBin()
        for (label, _), doc in zip(rows, nlp.tokenizer.pipe(text for _, text in rows)):
            doc.cats = {c: float(c == label) for c in CLASS_NAMES}
            docbin.add(doc)
        docbin.to_disk(output_dir / f"{name}.spacy")
    texts = [text for _, text in train]
    texts += [t for t in map(clean_text, unlabeled.read_text(encoding="utf-8").splitlines()) if t]
    (output_dir / "pretrain.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
