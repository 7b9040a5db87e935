"""Evaluate a text classification pipeline: accuracy, per-class P/R/F1, confusion matrix, λ/γ."""

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy
from spacy.language import Language
from spacy.tokens import Doc
from spacy.util import minibatch
from thinc.api import Model
from tqdm import tqdm

from elmo_spacy.layers import layer_weights, scalar_mix_node


def classification_metrics(
    gold: Sequence[str], predicted: Sequence[str], labels: Sequence[str]
) -> dict[str, Any]:
    """Accuracy, per-class and macro precision/recall/F1 and the confusion matrix
    (rows: gold label, columns: predicted label, both in `labels` order)."""
    index = {label: i for i, label in enumerate(labels)}
    confusion = numpy.zeros((len(labels), len(labels)), dtype=int)
    for g, p in zip(gold, predicted, strict=True):
        confusion[index[g], index[p]] += 1
    true_positives = numpy.diag(confusion).astype(float)
    precision = _ratio(true_positives, confusion.sum(axis=0))
    recall = _ratio(true_positives, confusion.sum(axis=1))
    f1 = _ratio(2 * precision * recall, precision + recall)
    per_class = {
        label: {
            "precision": float(precision[i]),
            "recall": float(recall[i]),
            "f1": float(f1[i]),
            "support": int(confusion[i].sum()),
        }
        for i, label in enumerate(labels)
    }
    return {
        "n_docs": int(confusion.sum()),
        "accuracy": float(true_positives.sum() / max(confusion.sum(), 1)),
        "macro_precision": float(precision.mean()),
        "macro_recall": float(recall.mean()),
        "macro_f1": float(f1.mean()),
        "per_class": per_class,
        "labels": list(labels),
        "confusion_matrix": confusion.tolist(),
    }


def classification_report(metrics: dict[str, Any]) -> str:
    """A plain-text report in the layout of scikit-learn's, plus the confusion matrix."""
    labels = metrics["labels"]
    width = max(len(x) for x in [*labels, "macro avg"])
    lines = [f"{'':>{width}}  precision    recall  f1-score   support", ""]
    for label in labels:
        m = metrics["per_class"][label]
        lines.append(
            f"{label:>{width}}  {m['precision']:9.4f} {m['recall']:9.4f} {m['f1']:9.4f} {m['support']:9d}"
        )
    lines += [
        "",
        f"{'accuracy':>{width}}  {'':9} {'':9} {metrics['accuracy']:9.4f} {metrics['n_docs']:9d}",
        f"{'macro avg':>{width}}  {metrics['macro_precision']:9.4f} {metrics['macro_recall']:9.4f} "
        f"{metrics['macro_f1']:9.4f} {metrics['n_docs']:9d}",
        "",
        "confusion matrix (rows: gold, columns: predicted)",
        " " * (width + 2) + " ".join(f"{x[:8]:>8}" for x in labels),
    ]
    for label, row in zip(labels, metrics["confusion_matrix"]):
        lines.append(f"{label:>{width}}  " + " ".join(f"{n:8d}" for n in row))
    return "\n".join(lines)


def evaluate_classifier(
    docs: Sequence[Doc], predict: Callable[[list[str]], list[str]], labels: Sequence[str]
) -> dict[str, Any]:
    """Score `predict` (texts -> one label each) on gold `docs` (with exclusive
    `doc.cats`), and time it: words/s counts the gold docs' tokens."""
    texts = [doc.text for doc in docs]
    n_words = sum(len(doc) for doc in docs)
    started = time.perf_counter()
    predicted = predict(texts)
    seconds = time.perf_counter() - started
    gold = [max(doc.cats, key=doc.cats.get) for doc in docs]
    metrics = classification_metrics(gold, predicted, labels)
    metrics["inference"] = {
        "words": n_words,
        "seconds": seconds,
        "words_per_second": n_words / max(seconds, 1e-9),
    }
    return metrics


def evaluate_textcat(nlp: Language, docs: Sequence[Doc], batch_size: int = 128) -> dict[str, Any]:
    """`evaluate_classifier` for a spaCy pipeline: the highest-scoring label of
    each doc, plus each part's accuracy for a textcat that sums two parts."""
    labels = list(nlp.get_pipe("textcat").labels)
    annotated: list[Doc] = []

    def predict(texts: list[str]) -> list[str]:
        piped = nlp.pipe(texts, batch_size=batch_size)
        annotated.extend(tqdm(piped, desc="evaluating", total=len(texts), unit="doc"))
        return [max(doc.cats, key=doc.cats.get) for doc in annotated]

    metrics = evaluate_classifier(docs, predict, labels)
    metrics["inference"]["batch_size"] = batch_size
    gold = [max(doc.cats, key=doc.cats.get) for doc in docs]
    branches = branch_accuracy(nlp.get_pipe("textcat").model, annotated, gold, labels)
    if branches is not None:
        metrics["branch_accuracy"] = branches
    return metrics


def score_parts(model: Model) -> dict[str, Model] | None:
    """The two parts whose class scores a `TextCatBiLSTM.v1` with a
    `linear_model` adds: {"linear_model": ..., "bilstm": ...}, each a model
    from docs to (n_docs, nO) scores before the softmax (the linear model's
    scores are zeros for an empty doc). None for a model without the two."""
    node = next((n for n in model.walk() if n.name == "sum_scores"), None)
    if node is None:
        return None
    return dict(zip(("linear_model", "bilstm"), node.layers))


def branch_accuracy(
    model: Model, docs: Sequence[Doc], gold: Sequence[str], labels: Sequence[str]
) -> dict[str, float] | None:
    """For a textcat whose class scores are a sum (`TextCatBiLSTM.v1` with a
    `linear_model`): the accuracy of each part alone, from its own scores. `docs`
    must be annotated by the pipeline already. None for other models."""
    parts = score_parts(model)
    if parts is None:
        return None
    gold_index = numpy.array([labels.index(g) for g in gold])
    accuracy = {}
    for name, part in parts.items():
        scores = [part.predict(list(batch)) for batch in minibatch(docs, 128)]
        accuracy[name] = float((numpy.concatenate(scores).argmax(axis=1) == gold_index).mean())
    return accuracy


def mix_weights(nlp: Language, component: str = "textcat") -> dict[str, Any] | None:
    """The scalar mix of a listening pipe: normalised λ per layer, γ, and
    whether they were trained. None if the pipe uses another mix."""
    return read_scalar_mix(nlp.get_pipe(component).model)


def _ratio(numerator: numpy.ndarray, denominator: numpy.ndarray) -> numpy.ndarray:
    return numpy.divide(
        numerator, denominator, out=numpy.zeros_like(numerator, dtype=float), where=denominator > 0
    )


def read_scalar_mix(model: Model) -> dict[str, Any] | None:
    """The scalar mix inside `model` (e.g. a listening pipe's model), as numbers
    for reports: `layer_weights` (softmax-normalised λ, one per layer), `gamma`,
    `trainable` (whether λ and γ are trained) and `layer_norm` (whether each
    layer is normalised first). None if `model` holds no scalar mix."""
    if not any(n.name == "scalar_mix" for n in model.walk()):
        return None
    node = scalar_mix_node(model)
    return {
        "layer_weights": [float(w) for w in layer_weights(node)],
        "gamma": float(node.get_param("gamma")[0]),
        "trainable": bool(node.attrs["trainable"]),
        "layer_norm": any(n.name == "normalize_layers" for n in model.walk()),
    }
