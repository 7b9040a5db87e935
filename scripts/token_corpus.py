"""Corpora for the token-level workflows: CoNLL-2003 NER and UD English EWT tagging.

Each writes train/dev(/test).spacy, `train.txt` (the train docs' texts, a doc a
line) and `pretrain.txt` (the AG News pretraining text where given, then the
train texts: never dev or test text), and stats.json.
"""

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import spacy
from spacy.tokens import Doc, DocBin
from tqdm import tqdm

from elmo_spacy.pretrain.texts import read_texts

from .conll import check_md5, read_conll2003, read_conllu

TASKS = {
    "ner": {
        "files": {"train": "eng.train", "dev": "eng.testa", "test": "eng.testb"},
        "reader": read_conll2003,
    },
    "tag": {
        "files": {
            "train": "en_ewt-ud-train.conllu",
            "dev": "en_ewt-ud-dev.conllu",
            "test": "en_ewt-ud-test.conllu",
        },
        "reader": read_conllu,
    },
}


def build_token_corpus(
    task: str,
    source_dir: Path,
    output_dir: Path,
    pretrain_text: Path | None = None,
    verify: bool = True,
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Convert the task's files in `source_dir`; the test file only where it
    is there. Returns the counts (also in stats.json)."""
    spec = TASKS[task]
    paths = {split: source_dir / name for split, name in spec["files"].items()}
    for split in ("train", "dev"):
        if not paths[split].is_file():
            raise FileNotFoundError(
                f"{paths[split]} is missing: point the workflow at the folder that holds "
                f"{spec['files']['train']} and {spec['files']['dev']}."
            )
    if not paths["test"].is_file():
        log(f"No test split: {paths['test']} does not exist. Every figure will be on dev.")
        del paths["test"]
    if verify:
        for path in paths.values():
            what = check_md5(path)
            log(f"{path.name}: {what or 'a file this project has no checksum for'}")
    vocab = spacy.blank("en").vocab
    output_dir.mkdir(parents=True, exist_ok=True)
    stats: dict[str, Any] = {"task": task, "source": str(source_dir), "has_test": "test" in paths}
    for split, path in paths.items():
        docs = list(tqdm(spec["reader"](path, vocab), desc=split, unit="doc"))
        DocBin(docs=docs, store_user_data=False).to_disk(output_dir / f"{split}.spacy")
        stats[split] = _counts(docs)
        if split == "train":
            _write_lines(output_dir / "train.txt", (doc.text for doc in docs))
            pretrain = list(read_texts(pretrain_text)) if pretrain_text else []
            _write_lines(output_dir / "pretrain.txt", pretrain + [doc.text for doc in docs])
            stats["pretrain_texts"] = len(pretrain) + len(docs)
    (output_dir / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def _counts(docs: list[Doc]) -> dict[str, int]:
    return {
        "docs": len(docs),
        "sentences": sum(1 for doc in docs for _ in doc.sents),
        "tokens": sum(len(doc) for doc in docs),
        "entities": sum(len(doc.ents) for doc in docs),
    }


def _write_lines(path: Path, texts: Iterable[str]) -> None:
    with path.open("w", encoding="utf-8") as file:
        for text in texts:
            file.write(text.replace("\n", " ") + "\n")
