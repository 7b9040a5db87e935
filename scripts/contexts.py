"""Contextual vs static: one word in two contexts, its ELMo vectors and their nearest neighbours."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy
from spacy.language import Language
from spacy.tokens import Doc, Token

# (word, context 1, context 2): the word has another sense in each.
WORD_SENSES = [
    ("bank", "They sat on the bank of the river.", "The bank raised its interest rates."),
    ("Apple", "Apple pie is a classic dessert.", "Apple shares rose after the iPhone launch."),
    ("play", "The team will play Chelsea on Sunday.", "The play opened on Broadway last night."),
    ("cell", "The prisoner was kept in a cell.", "The cell phone market is growing fast."),
]


@dataclass
class Occurrence:
    token: Token
    similarity_to_other: float  # cosine with the same word in the other context
    neighbours: list[tuple[float, str]]  # (cosine, token in its context), nearest first


def compare_senses(
    nlp: Language,
    reference_docs: Sequence[Doc],
    layer: int,
    senses: Sequence[tuple[str, str, str]] = WORD_SENSES,
    n_neighbours: int = 3,
) -> list[tuple[str, Occurrence, Occurrence]]:
    """For each (word, context, context): the word's `layer` vector in each
    context (layer 0 is the biLM's context-free token encoding), their cosine,
    and the nearest tokens among `reference_docs` (annotated by `nlp`)."""
    bank, labels = _token_bank(reference_docs, layer)
    results = []
    for word, *contexts in senses:
        docs = list(nlp.pipe(contexts))
        tokens = [next(t for t in doc if t.text == word) for doc in docs]
        vectors = [_unit(t._.elmo[layer]) for t in tokens]
        similarity = float(vectors[0] @ vectors[1])
        pair = []
        for token, vector in zip(tokens, vectors):
            scores = bank @ vector
            best = numpy.argsort(-scores)[:n_neighbours]
            pair.append(
                Occurrence(token, similarity, [(float(scores[i]), labels[i]) for i in best])
            )
        results.append((word, *pair))
    return results


def _token_bank(docs: Sequence[Doc], layer: int) -> tuple[numpy.ndarray, list[str]]:
    """(n_tokens, width) unit vectors of every alphabetic token, and each one
    shown in a little context: 'sat on the [bank] of the'."""
    rows, labels = [], []
    for doc in docs:
        for token in doc:
            if token.is_alpha:
                rows.append(_unit(doc._.elmo[layer, token.i]))
                left = doc[max(token.i - 2, 0) : token.i].text
                right = doc[token.i + 1 : token.i + 3].text
                labels.append(f"{left} [{token.text}] {right}".strip())
    return numpy.stack(rows), labels


def _unit(vector: numpy.ndarray) -> numpy.ndarray:
    norm = numpy.linalg.norm(vector)
    return vector / norm if norm else vector
