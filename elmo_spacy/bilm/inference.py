"""Running a biLM over tokenised sentences: the one inference path of the
`elmo` pipe, `elmo_spacy.Embedder` and `elmo-spacy embed`. Plain PyTorch.

Sentences are cut into overlapping windows (`windows`), the windows sorted
by length and run in chunks of at most `max_batch_tokens` padded tokens, and
each window's kept part copied into its sentence's output. Every row of every
chunk starts from the same LSTM state: zeros, or a primed state (see
`BiLM.primed_states`), so a sentence gets the same vectors whatever else is
in its batch.
"""

from collections.abc import Callable, Sequence

import numpy
import torch

from ..errors import ElmoSpacyError
from .bilm import BiLM
from .inputs.batch import length_runs
from .model.network import States

# The warm-up text of state = "primed" when none is given: a few sentences of
# plain news English, tokenised as spaCy's English tokenizer does. Published
# ELMo models were trained on news text (the 1B Word Benchmark), with the LSTM
# state carried from sentence to sentence.
DEFAULT_WARMUP: tuple[str, ...] = (
    "The city council met on Tuesday evening to discuss the new budget .",
    "Officials said the plan would add two bus lines and repair several roads "
    "before the end of the year .",
    "Some residents welcomed the proposal , while others asked how it would be paid for .",
    "The council is expected to vote on the budget next month .",
    "Meanwhile , shares in the region 's largest employer rose 3 percent after "
    "it reported higher profits .",
)
STATES = ("zero", "primed")


def embed_tokens(
    bilm: BiLM,
    sentences: Sequence[Sequence[str]],
    *,
    max_batch_tokens: int = 4096,
    window: int = 1024,
    window_overlap: int = 64,
    initial_states: States | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[numpy.ndarray]:
    """The biLM's layers of each sentence: one float32 array (L + 1, n, 2P)
    per sentence of n tokens, in the order given ((L + 1, 0, 2P) for an
    empty sentence).

    max_batch_tokens: windows are sorted by length and run in chunks of at
        most this many padded tokens (a longer window runs alone).
    window, window_overlap: a sentence longer than `window` tokens runs in
        pieces of at most `window` tokens overlapping by 2 * `window_overlap`
        (see `windows`): memory stays bounded whatever the sentence's length.
    initial_states: the state every row of every chunk starts from, one row
        per direction and layer (`BiLM.primed_states`); None: zeros.
    progress: called with the number of tokens of each chunk once it has run.

    Runs under `torch.inference_mode()` and leaves the biLM in eval mode.
    """
    check_window(window, window_overlap)
    if bilm.stateful:
        raise ElmoSpacyError(
            "Inference runs the biLM stateless (sentences are batched by length, so a carried "
            "state would join unrelated sentences): set bilm.stateful = False, or use "
            "state = 'primed' for a state that every sentence starts from"
        )
    bilm.eval()
    n_layers, width = bilm.config.n_output_layers, bilm.config.width
    outputs = [numpy.zeros((n_layers, len(s), width), dtype=numpy.float32) for s in sentences]
    pieces = [
        (i, *span)
        for i, sentence in enumerate(sentences)
        for span in windows(len(sentence), window, window_overlap)
    ]
    pieces.sort(key=lambda piece: piece[2] - piece[1])
    bounds = length_runs(
        numpy.array([last - first for _, first, last, _, _ in pieces]), max_batch_tokens
    )
    for chunk in (pieces[a:b] for a, b in zip(bounds[:-1], bounds[1:])):
        tokens = [sentences[i][first:last] for i, first, last, _, _ in chunk]
        with torch.inference_mode():
            layers = bilm(bilm.batch(tokens), initial_states)
            array = layers.float().cpu().numpy()  # (L + 1, B, T, 2P)
        for row, (i, first, _, keep_first, keep_last) in enumerate(chunk):
            kept = slice(keep_first - first, keep_last - first)
            outputs[i][:, keep_first:keep_last] = array[:, row, kept]
        if progress is not None:
            progress(sum(len(t) for t in tokens))
    return outputs


def windows(n_tokens: int, window: int, overlap: int) -> list[tuple[int, int, int, int]]:
    """Pieces (first, last, keep_first, keep_last) covering a sentence of
    n_tokens: run tokens [first, last), keep [keep_first, keep_last). The kept
    parts tile the sentence, and each kept token has at least `overlap` tokens
    of context on both sides in its piece (or the sentence's edge); a
    sentence of at most `window` tokens is one piece, and none for 0."""
    if n_tokens <= window:
        return [(0, n_tokens, 0, n_tokens)] if n_tokens else []
    step = window - 2 * overlap
    return [
        (
            max(0, keep - overlap),
            min(n_tokens, keep + step + overlap),
            keep,
            min(n_tokens, keep + step),
        )
        for keep in range(0, n_tokens, step)
    ]


def check_window(window: int, window_overlap: int) -> None:
    """Refuse windows whose kept parts would not advance."""
    if not 0 <= 2 * window_overlap < window:
        raise ElmoSpacyError(
            f"window = {window}, window_overlap = {window_overlap}: "
            "need 0 <= 2 * window_overlap < window."
        )


def initial_states_for(
    bilm: BiLM, state: str, warmup: Sequence[Sequence[str]] | None = None
) -> States | None:
    """The starting state of `state`: None for "zero"; for "primed", the
    state that the warm-up sentences leave (`DEFAULT_WARMUP` when None),
    computed once per version of the weights (`BiLM.primed_states`)."""
    check_state(state)
    if state == "zero":
        return None
    if warmup is None:
        warmup = [sentence.split() for sentence in DEFAULT_WARMUP]
    return bilm.primed_states(warmup)


def check_state(state: str, setting: str = "state") -> None:
    if state not in STATES:
        raise ElmoSpacyError(f"{setting} = {state!r}: use one of {STATES}")


def resolve_layers(
    layers: Sequence[int] | None, n_layers: int, setting: str = "layers"
) -> list[int] | None:
    """Layer indices into 0..n_layers - 1 (negative ones count from the top),
    checked: each in range, none twice. None (all layers) stays None."""
    if layers is None:
        return None
    layers = [int(i) for i in layers]
    if not layers:
        raise ElmoSpacyError(f"{setting} is empty: name at least one layer, or none to keep all")
    if not all(-n_layers <= i < n_layers for i in layers):
        raise ElmoSpacyError(
            f"{setting} = {layers}, but the biLM has {n_layers} layers "
            f"(0 = token encoding, 1..{n_layers - 1} = LSTM layers)"
        )
    resolved = [i % n_layers for i in layers]
    if len(set(resolved)) < len(resolved):
        raise ElmoSpacyError(f"{setting} = {layers} names a layer twice")
    return resolved
