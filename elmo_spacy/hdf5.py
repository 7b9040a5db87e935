"""Sentence vectors in AllenNLP's HDF5 layout (what `allennlp elmo` wrote): one
float32 dataset per sentence under its key (its line index, or the sentence
itself), and `sentence_to_index`, the JSON of the sentence -> key map.
`elmo-spacy embed` and `elmo_spacy.allennlp.ElmoEmbedder.embed_file` write it."""

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy

from .errors import ElmoSpacyError


def write_hdf5(
    path: Path,
    keys: Sequence[str],
    vectors: Iterable[tuple[int, numpy.ndarray]],
    sentence_to_index: dict[str, str] | None,
) -> None:
    """Write the (position, array) pairs of `vectors`, each under
    keys[position], and `sentence_to_index` as a (1,) string dataset of its
    JSON (unless None)."""
    import h5py

    with h5py.File(path, "w") as file:
        for position, output in vectors:
            file.create_dataset(keys[position], output.shape, dtype="float32", data=output)
        if sentence_to_index is not None:
            dataset = file.create_dataset(
                "sentence_to_index", (1,), dtype=h5py.special_dtype(vlen=str)
            )
            dataset[0] = json.dumps(sentence_to_index)


def hdf5_keys(
    lines: Sequence[str],
    indices: Sequence[int],
    sentence_keys: bool,
    forget_sentences: bool,
    flag: str,
) -> tuple[list[str], dict[str, str] | None]:
    """The keys of lines[i] for each i of `indices`: i, or with `sentence_keys`
    (the setting `flag`) the sentence; and `sentence_to_index` (a repeated
    sentence maps to its last line, as in AllenNLP), None with either flag.
    Refuses sentence keys that AllenNLP would fail on half way (a repeated
    sentence) or that HDF5 cannot name (an empty line, ".", a "/")."""
    if not sentence_keys:
        index = None if forget_sentences else {lines[i]: str(i) for i in indices}
        return [str(i) for i in indices], index
    seen: dict[str, int] = {}
    for i in indices:
        sentence = lines[i]
        if not sentence or sentence == "." or "/" in sentence:
            raise ElmoSpacyError(
                f"Line {i + 1} ({sentence!r:.60}) cannot be an HDF5 key (empty, '.' or with a "
                f"'/'): drop {flag} to key the datasets by line index"
            )
        if sentence in seen:
            raise ElmoSpacyError(
                f"Lines {seen[sentence] + 1} and {i + 1} hold the same sentence, so {flag} "
                "would give two datasets one key: drop it to key them by line index"
            )
        seen[sentence] = i
    return [lines[i] for i in indices], None
