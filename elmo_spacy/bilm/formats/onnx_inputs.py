"""`ExportInputs`: the inputs of an exported biLM made from tokens, from its
inputs.json (and vocab.txt), never the model, as `exported.serving_inputs`
makes them. Only numpy and the standard library, so that the file can be
copied beside a server (docs/embedding.md, "A client with onnxruntime and numpy alone")."""

import json
from collections.abc import Sequence
from pathlib import Path

import numpy

try:  # inside the package; a copy of this file alone raises ValueError, which it is
    from ...errors import ElmoSpacyError as InputsError
except ImportError:
    InputsError = ValueError

FORMAT = "elmo_spacy serving biLM, version 2"  # inputs.json's "format" that this reads
INPUTS_FILE, VOCAB_FILE = "inputs.json", "vocab.txt"
# Byte schemes: how a lone surrogate is encoded, and the offset of byte b's id
# (b + offset). "char_vocab" looks characters up in inputs.json's char_vocab.
BYTE_SCHEMES = {"masked": ("surrogatepass", 1), "bilm_tf": ("ignore", 0)}


def type_index(sentences: Sequence[Sequence[str]]) -> tuple[numpy.ndarray, list[str]]:
    """(B, T) int64 row of each position's type, T the longest sentence (0
    past each one's end), and the distinct types in the order of their first
    appearance: each is encoded once."""
    steps = max((len(s) for s in sentences), default=0)
    rows: dict[str, int] = {}  # each type's row
    type_ids = numpy.zeros((len(sentences), steps), dtype="int64")
    for row, tokens in enumerate(sentences):
        type_ids[row, : len(tokens)] = [rows.setdefault(t, len(rows)) for t in tokens]
    return type_ids, list(rows)


class ExportInputs:
    """Tokenised sentences -> the inputs of the biLM exported to `folder`, numpy
    arrays by input name in inputs.json's order (`names`; `described`: inputs.json)."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        path = folder / INPUTS_FILE
        if not path.is_file():
            raise InputsError(f"{path} is missing: give the folder that `elmo-spacy export` wrote")
        self.described = json.loads(path.read_text(encoding="utf-8"))
        if self.described.get("format") != FORMAT:
            raise InputsError(
                f"{path} describes {self.described.get('format')!r}, not {FORMAT!r}: export "
                "the biLM again with the elmo_spacy this file came with, or use the file of "
                "the elmo_spacy that exported it"
            )
        inputs = self.described["inputs"]
        self.names = list(inputs)
        config = self.described["config"]
        self.chars = inputs.get("char_ids")
        if self.chars is not None:
            self.max_chars = config["max_chars"]
            self.widest = max(width for width, _ in config["filters"])
            self.boundaries = {
                token: numpy.array(ids, dtype="int64")
                for token, ids in self.chars["sentence_boundary_tokens"].items()
            }
            scheme = self.chars["scheme"]
            if scheme == "char_vocab":
                self.char_index = {c: i for i, c in enumerate(self.chars["char_vocab"])}
                self.oov = self.char_index["<oov>"]
            elif scheme in BYTE_SCHEMES:
                self.errors, self.offset = BYTE_SCHEMES[scheme]
            else:
                raise InputsError(f"{path}: character scheme {scheme!r} is not one this reads")
        words = inputs.get("word_ids")
        if words is not None:
            vocab = folder / words["vocabulary"]
            if not vocab.is_file():
                raise InputsError(f"{vocab} is missing: the export wrote it beside {path}")
            lines = vocab.read_text(encoding="utf-8", errors="surrogatepass").split("\n")
            self.word_index = {word: i for i, word in enumerate(lines[:-1])}
            self.unknown = 1  # inputs.json: "unknown words: 1"
            self.cut_words_at = words["cut_words_at"]
        self.words = words

    def __call__(self, sentences: Sequence[Sequence[str]]) -> dict[str, numpy.ndarray]:
        """The inputs for `sentences` (lists of tokens; at least one), with zero
        states where the export takes states (--with-states)."""
        type_ids, types = type_index(sentences)
        made: dict[str, numpy.ndarray] = {}
        if self.chars is not None:
            made["char_ids"] = self.char_ids(types)
        if self.words is not None:
            cut = self.cut_words_at
            made["word_ids"] = numpy.array(
                [self.word_index.get(t[:cut] if cut else t, self.unknown) for t in types],
                dtype="int64",
            )
        made["type_ids"] = type_ids
        made["lengths"] = numpy.array([len(s) for s in sentences], dtype="int64")
        for name in ("initial_h", "initial_c"):
            if name in self.names:
                layers, _, width = self.described["inputs"][name]["shape"]
                dtype = self.described["inputs"][name]["dtype"]
                made[name] = numpy.zeros((layers, len(sentences), width), dtype=dtype)
        return {name: made[name] for name in self.names}

    def char_ids(self, types: Sequence[str]) -> numpy.ndarray:
        """(U, W) int64: each type's character ids as inputs.json's "layout" says,
        W the longest row (at least 3) + the widest filter - 1, at most max_chars."""
        chars = self.chars
        units = [self._unit_ids(t)[: chars["max_units"]] for t in types]
        lengths = numpy.array([3] + [len(u) + 2 for u in units], dtype="int64")
        width = min(self.max_chars, int(lengths.max()) + self.widest - 1)
        ids = numpy.full((len(types), width), chars["padding"], dtype="int64")
        for row, (token, unit_ids) in enumerate(zip(types, units)):
            boundary = self.boundaries.get(token)
            if boundary is not None:
                ids[row, :3] = boundary
                continue
            ids[row, 0] = chars["begin_of_word"]
            ids[row, 1 : len(unit_ids) + 1] = unit_ids
            ids[row, len(unit_ids) + 1] = chars["end_of_word"]
        return ids

    def _unit_ids(self, token: str) -> numpy.ndarray:
        if self.chars["scheme"] == "char_vocab":
            return numpy.array([self.char_index.get(c, self.oov) for c in token], dtype="int64")
        units = numpy.frombuffer(token.encode("utf-8", errors=self.errors), dtype="uint8")
        return units.astype("int64") + self.offset
