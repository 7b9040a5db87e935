"""Write the project's corpus: train/dev(/test) DocBins and the pretraining text."""

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spacy.language import Language
from spacy.tokens import DocBin
from tqdm import tqdm

from elmo_spacy.pretrain.texts import read_texts

from .agnews import ReadReport, Row, clean_text, read_agnews_csv, stratified_split


def rows_to_docbin(
    nlp: Language, rows: Sequence[Row], labels: Sequence[str], desc: str = "docs"
) -> DocBin:
    """Tokenise each row and set exclusive `doc.cats` over `labels`."""
    docbin = DocBin()
    docs = nlp.tokenizer.pipe((r.text for r in rows), batch_size=1000)
    for row, doc in zip(rows, tqdm(docs, desc=desc, total=len(rows), unit="doc")):
        doc.cats = {label: float(label == row.label) for label in labels}
        docbin.add(doc)
    return docbin


def build_corpus(
    nlp: Language,
    train_csv: Path,
    output_dir: Path,
    *,
    test_csv: Path | None = None,
    unlabeled: Path | None = None,
    class_names: Sequence[str],
    dev_fraction: float = 0.05,
    seed: int = 0,
    skip_bad_rows: bool = False,
    limit: int = 0,
) -> dict[str, Any]:
    """Write train.spacy, dev.spacy (a stratified, seeded split of train),
    test.spacy (only when test_csv is given) and pretrain.txt (the train split's
    texts and the unlabeled texts; never dev or test) to `output_dir`.
    `limit` > 0 keeps the first rows of train only. Returns the counts."""
    reports: dict[str, ReadReport] = {"train": ReadReport()}
    rows = list(read_agnews_csv(train_csv, class_names, skip_bad_rows, reports["train"]))
    if limit:
        rows = rows[:limit]
    if not rows:
        skipped = len(reports["train"].skipped)
        raise ValueError(
            f"{train_csv} has no rows to train on"
            + (f" ({skipped} skipped as bad)" if skipped else "")
            + ": is it the AG News train.csv (class, title, description)?"
        )
    train, dev = stratified_split(rows, dev_fraction, seed)
    splits: dict[str, list[Row]] = {"train": train, "dev": dev}
    if test_csv is not None:
        reports["test"] = ReadReport()
        splits["test"] = list(
            read_agnews_csv(test_csv, class_names, skip_bad_rows, reports["test"])
        )
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, split_rows in splits.items():
        rows_to_docbin(nlp, split_rows, class_names, desc=name).to_disk(
            output_dir / f"{name}.spacy"
        )
    pretrain_texts = [r.text for r in train]
    if unlabeled is not None:
        pretrain_texts += [t for t in map(clean_text, read_texts(unlabeled)) if t]
    (output_dir / "pretrain.txt").write_text("\n".join(pretrain_texts) + "\n", encoding="utf-8")
    stats = {
        "source": str(train_csv),
        "train_rows_read": len(rows),
        "docs": {name: len(r) for name, r in splits.items()},
        "per_class": {
            name: {c: sum(r.label == c for r in split_rows) for c in class_names}
            for name, split_rows in splits.items()
        },
        "pretrain_texts": len(pretrain_texts),
        "has_test": test_csv is not None,
        "skipped_rows": {name: report.skipped for name, report in reports.items()},
        "dev_fraction": dev_fraction,
        "seed": seed,
    }
    (output_dir / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats
