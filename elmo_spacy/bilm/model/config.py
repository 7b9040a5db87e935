"""Sizes of the biLM (`BiLMConfig`)."""

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ...errors import ElmoSpacyError

ENCODERS = ("char_cnn", "word", "word_char")
SOFTMAXES = ("adaptive", "full")
CHAR_IDS = ("masked", "bilm_tf", "char_vocab")
ACTIVATIONS = ("relu", "tanh")
SIZES = ("char_dim", "word_dim", "projection_dim", "lstm_dim", "max_vocab_size", "min_count")


@dataclass
class BiLMConfig:
    """Every size of the biLM. Defaults are small enough to train on two CPU cores.

    encoder: "char_cnn" (ELMo's character CNN + highway layers), "word" (a word
        embedding) or "word_char" (both, projected to P, as ELMoForManyLangs).
    max_chars: characters per token for the char CNN, word marks included.
    char_ids: "masked", "bilm_tf" or "char_vocab" (see `elmo_spacy.bilm.inputs.chars`).
    char_dim: width of a character embedding.
    filters: (width, count) pairs of the char CNN convolutions.
    char_activation: "relu" or "tanh", after the max-pooling.
    n_highway: highway layers after the char CNN (then a projection to P; with
        char_ids = "bilm_tf" only where the filters' widths add up to another).
    word_dim: width of a word embedding (encoder "word" or "word_char").
    projection_dim: width P of the token encoding and of each LSTM direction.
    lstm_dim: LSTM cell size.
    n_layers: LSTM layers per direction (L).
    cell_clip, proj_clip: clip the LSTM cell, and its projection (where lstm_dim
        != projection_dim), to [-clip, clip] at every step; null for none.
    skip_connections: add each LSTM layer's input to its output, from the
        second layer on.
    forget_bias: null trains two LSTM biases (torch's LSTM); a number trains one
        and adds this constant to the forget gate (TensorFlow's LSTMCell: 1.0).
    dropout: dropout rate between layers, in training.
    softmax: "adaptive" (torch's adaptive softmax, exactly normalised) or "full".
    cutoffs: word ranks where the adaptive softmax's clusters start; "auto":
        fitted to the vocabulary (docs/pretraining.md).
    div_value: tail cluster i projects to projection_dim / div_value^(i + 1).
    max_vocab_size: most frequent word types kept as softmax targets.
    min_count: word types seen fewer times map to <UNK>.
    """

    encoder: str = "char_cnn"
    max_chars: int = 50
    char_ids: str = "masked"
    char_dim: int = 16
    filters: list[tuple[int, int]] = field(
        default_factory=lambda: [(1, 32), (2, 32), (3, 64), (4, 128), (5, 256)]
    )
    char_activation: str = "relu"
    n_highway: int = 1
    word_dim: int = 256
    projection_dim: int = 128
    lstm_dim: int = 512
    n_layers: int = 2
    cell_clip: float | None = None
    proj_clip: float | None = None
    skip_connections: bool = True
    forget_bias: float | None = None
    dropout: float = 0.1
    softmax: str = "adaptive"
    cutoffs: list[int] | str = "auto"
    div_value: float = 4.0
    max_vocab_size: int = 40000
    min_count: int = 2

    def __post_init__(self) -> None:
        problems = self._check_types()
        if problems:
            raise ElmoSpacyError("Invalid biLM config: " + "; ".join(problems))
        if self.encoder not in ENCODERS:
            problems.append(f"encoder = {self.encoder!r}; use one of {ENCODERS}")
        if self.softmax not in SOFTMAXES:
            problems.append(f"softmax = {self.softmax!r}; use one of {SOFTMAXES}")
        if self.char_ids not in CHAR_IDS:
            problems.append(f"char_ids = {self.char_ids!r}; use one of {CHAR_IDS}")
        if self.char_activation not in ACTIVATIONS:
            problems.append(f"char_activation = {self.char_activation!r}; use one of {ACTIVATIONS}")
        for name in ("cell_clip", "proj_clip"):
            value = getattr(self, name)
            if isinstance(value, float) and not value > 0:
                problems.append(f"{name} = {value}: a positive number, or null for no clipping")
        problems += [f"{n} = {getattr(self, n)}: at least 1" for n in SIZES if getattr(self, n) < 1]
        if self.n_highway < 0:
            problems.append(f"n_highway = {self.n_highway}: at least 0")
        if any(width < 1 or count < 1 for width, count in self.filters):
            problems.append(f"filters = {self.filters}: widths and counts of at least 1")
        if self.max_chars < 3:
            problems.append("max_chars must be >= 3 (begin mark, one char, end mark)")
        if self.n_layers < 1:
            problems.append("n_layers must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            problems.append("dropout must be in [0, 1)")
        if self.div_value < 1:
            problems.append(f"div_value = {self.div_value}: at least 1")
        if self.encoder != "word" and not self.filters:
            problems.append("filters must name at least one (width, count) pair")
        if problems:
            raise ElmoSpacyError("Invalid biLM config: " + "; ".join(problems))

    def _check_types(self) -> list[str]:
        """Give each setting its type (whole numbers as int, numbers as float),
        or say which are not of it."""
        problems = []
        for spec in fields(self):
            name, value = spec.name, getattr(self, spec.name)
            if spec.type is int:
                if _whole(value) is None:
                    problems.append(f"{name} = {value!r}: a whole number")
                else:
                    setattr(self, name, _whole(value))
            elif spec.type in (float, float | None):
                optional = spec.type is not float
                if value is None and optional:
                    continue
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    problems.append(f"{name} = {value!r}: a number" + (", or null" * optional))
                else:
                    setattr(self, name, float(value))
            elif spec.type is bool and not isinstance(value, bool):
                problems.append(f"{name} = {value!r}: true or false")
            elif spec.type is str and not isinstance(value, str):
                problems.append(f"{name} = {value!r}: a string")
        pairs = self.filters if isinstance(self.filters, (list, tuple)) else [None]
        filters = [
            (_whole(pair[0]), _whole(pair[1]))
            if isinstance(pair, (list, tuple)) and len(pair) == 2
            else (None, None)
            for pair in pairs
        ]
        if any(None in pair for pair in filters):
            problems.append(
                f"filters = {self.filters!r}: a list of [width, count] pairs of whole numbers"
            )
        else:
            self.filters = filters
        if self.cutoffs != "auto":
            listed = isinstance(self.cutoffs, (list, tuple))
            cutoffs = [_whole(c) for c in self.cutoffs] if listed else [None]
            if None in cutoffs:
                problems.append(f'cutoffs = {self.cutoffs!r}: a list of whole numbers, or "auto"')
            else:
                self.cutoffs = cutoffs
        return problems

    @property
    def width(self) -> int:
        """Width of every output layer: [forward; backward]."""
        return 2 * self.projection_dim

    @property
    def n_output_layers(self) -> int:
        """L + 1: the token encoding and each LSTM layer."""
        return self.n_layers + 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "BiLMConfig":
        return from_known_fields(cls, values, "biLM config")


def _whole(value: Any) -> int | None:
    """`value` as an int if it is a whole number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value)


def from_known_fields(cls, values: dict[str, Any], what: str):
    """`cls(**values)` for a dataclass, refusing keys that are not its fields."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ElmoSpacyError(f"Unknown {what} keys {unknown}; known keys are {sorted(known)}")
    return cls(**values)
