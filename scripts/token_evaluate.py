"""Evaluate NER and tagging pipelines with spaCy's scorer; tables and a confusion picture."""

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from spacy.language import Language
from spacy.tokens import Doc
from spacy.training import Example
from tqdm import tqdm

SCORES = {
    "ner": ("ents_p", "ents_r", "ents_f", "ents_per_type"),
    "tag": ("pos_acc", "tag_acc"),
}


def task_of(nlp: Language) -> str:
    if "ner" in nlp.pipe_names:
        return "ner"
    if {"tagger", "morphologizer"} & set(nlp.pipe_names):
        return "tag"
    raise ValueError(f"The pipeline ({nlp.pipe_names}) has neither ner nor tagger/morphologizer")


def evaluate_tokens(nlp: Language, gold: Sequence[Doc], batch_size: int = 64) -> dict[str, Any]:
    """spaCy's scores of `nlp` on `gold` docs (the names of its scorer: ents_*,
    pos_acc, tag_acc), words/s of the pipeline, and for tagging the UPOS
    confusion counts. Predictions run on the gold tokens, as CoNLL-2003 and UD
    scores are given (spaCy's tokenizer splits e.g. CoNLL's "1996-08-30"), and
    as the pipelines train: NER on whole documents, tagging on sentences
    (the tag configs' gold_preproc)."""
    task = task_of(nlp)
    if task == "tag":
        gold = [sentence.as_doc() for doc in gold for sentence in doc.sents]
    examples = [Example(gold_tokens(nlp, doc), doc) for doc in gold]
    started = time.perf_counter()
    docs = nlp.pipe((eg.predicted for eg in examples), batch_size=batch_size)
    predicted = list(tqdm(docs, total=len(examples), desc="evaluate", unit="doc", leave=False))
    seconds = time.perf_counter() - started
    for example, doc in zip(examples, predicted):
        example.predicted = doc
    scores: dict[str, Any] = {}
    for _, pipe in nlp.pipeline:
        if getattr(pipe, "scorer", None) is not None:
            scores.update(pipe.score(examples))
    metrics = {key: scores.get(key) for key in SCORES[task]}
    words = sum(len(doc) for doc in gold)
    metrics.update(n_docs=len(gold), words=words, seconds=seconds, words_per_second=words / seconds)
    if task == "tag":
        metrics["pos_confusion"] = pos_confusion(examples)
    return metrics


def gold_tokens(nlp: Language, doc: Doc) -> Doc:
    """A new doc of `doc`'s tokens and spaces, with no annotation."""
    return Doc(nlp.vocab, words=[t.text for t in doc], spaces=[bool(t.whitespace_) for t in doc])


def pos_confusion(examples: Sequence[Example]) -> dict[str, dict[str, int]]:
    """{gold UPOS: {predicted UPOS: count}} over the tokens aligned one to one."""
    counts: Counter = Counter()
    for example in examples:
        gold = example.get_aligned("POS", as_string=True)
        for token, tag in zip(example.predicted, gold):
            if tag:
                counts[tag, token.pos_] += 1
    confusion: dict[str, dict[str, int]] = {}
    for (gold_tag, predicted), n in counts.items():
        confusion.setdefault(gold_tag, {})[predicted] = n
    return confusion


def most_confused(confusion: dict[str, dict[str, int]], k: int = 8) -> list[str]:
    """The k tags most often in errors, as gold or as prediction."""
    errors: Counter = Counter()
    for gold, row in confusion.items():
        for predicted, n in row.items():
            if gold != predicted:
                errors[gold] += n
                errors[predicted] += n
    return [tag for tag, _ in errors.most_common(k)]


def ner_table(runs: Sequence[dict[str, Any]]) -> str:
    """Runs of `evaluate-tokens` on NER: F/P/R, per-type F1, train time, words/s."""
    types = sorted({t for r in runs for t in (r["dev"]["ents_per_type"] or {})})
    has_test = any("test" in r for r in runs)
    header = ["run", "dev F1", "dev P", "dev R"] + [f"dev F1 {t}" for t in types]
    header += ["test F1"] if has_test else []
    header += ["train time", "words/s"]
    lines = _header(header)
    for run in sorted(runs, key=lambda r: -(r["dev"]["ents_f"] or 0)):
        dev = run["dev"]
        cells = [run["name"]] + [_pct(dev[k]) for k in ("ents_f", "ents_p", "ents_r")]
        cells += [_pct((dev["ents_per_type"] or {}).get(t, {}).get("f")) for t in types]
        cells += [_pct(run["test"]["ents_f"]) if "test" in run else "n/a"] if has_test else []
        cells += [_minutes(run.get("train_seconds")), f"{dev['words_per_second']:,.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tag_table(runs: Sequence[dict[str, Any]]) -> str:
    """Runs of `evaluate-tokens` on tagging: UPOS and XPOS accuracy, train time, words/s."""
    has_test = any("test" in r for r in runs)
    header = ["run", "dev UPOS acc", "dev XPOS acc"]
    header += ["test UPOS acc", "test XPOS acc"] if has_test else []
    header += ["train time", "words/s"]
    lines = _header(header)
    for run in sorted(runs, key=lambda r: -(r["dev"]["pos_acc"] or 0)):
        dev = run["dev"]
        cells = [run["name"], _pct(dev["pos_acc"]), _pct(dev["tag_acc"])]
        if has_test:
            test = run.get("test", {})
            cells += [_pct(test.get("pos_acc")), _pct(test.get("tag_acc"))]
        cells += [_minutes(run.get("train_seconds")), f"{dev['words_per_second']:,.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _header(names: list[str]) -> list[str]:
    return ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2%}"


def _minutes(seconds: float | None) -> str:
    return "n/a" if not seconds else f"{seconds / 60:.1f} min"
