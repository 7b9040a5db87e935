"""A biLM as a program to serve outside Python and spaCy: an ONNX model and a
`torch.export` program, with a JSON file that says what the inputs mean.

`ServingBiLM` computes the biLM's layers from per-token ids, in float32, with
torch operations whose shapes all come from the inputs: the recurrence is a
`scan` over the time steps and a sentence's length is a mask, so the batch
size and the number of tokens stay free in the exported graph. It runs the
network's own parameters, so it gives what `Embedder` gives on the same
tokens (to float32 rounding).

Inputs, by encoder (B sentences, T tokens, W = max_chars):

- char_ids (B, T, W) int64: each token's character ids, word marks
  included, padded with the scheme's padding id to W (encoders that read
  characters: "char_cnn", "word_char");
- word_ids (B, T) int64: each token's vocabulary id (encoders "word",
  "word_char");
- lengths (B,) int64: the tokens of each sentence (positions past it are
  padding, whatever they hold);
- with states, initial_h (2L, B, P) and initial_c (2L, B, H) float32: the
  LSTM states to start from, forward layers then backward ones.

Outputs: layers (L + 1, B, T, 2P) float32: layer 0 the token encoding
[x; x], layers 1..L [forward; backward] (padding positions are zero from the
LSTMs on); with states, also final_h and final_c: the states after each
sentence, as `BiLM.forward_with_states` gives them, to feed to the next
batch as bilm-tf's stateful models ran.

Without states, every sentence starts from zeros or, exported with
state = "primed", from the primed state, held in the program as constants.
"""

import contextlib
import copy
import importlib.util
import json
import logging
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy
import torch
from torch import nn

from ...errors import ElmoSpacyError
from ..bilm import BiLM
from ..inputs.batch import gather_time, reverse_index
from ..inputs.vocab import BOS_ID, EOS_ID
from ..model.lstm import lstm_step
from ..model.network import States

FORMATS = ("onnx", "torch-export")
ONNX_FILE, PROGRAM_FILE, INPUTS_FILE, VOCAB_FILE = (
    "bilm.onnx",
    "bilm.pt2",
    "inputs.json",
    "vocab.txt",
)
ONNX_OPSET = 18


class ServingBiLM(nn.Module):
    """The layers of `bilm` from per-token ids (see the module docstring).

    initial_states: the state every sentence starts from, per direction and
        layer (h (1, P), c (1, H)), e.g. `Runner.initial_states()`; None:
        zeros. Not with `with_states`, which takes the states as inputs.
    """

    def __init__(
        self, bilm: BiLM, initial_states: States | None = None, with_states: bool = False
    ) -> None:
        super().__init__()
        if with_states and initial_states is not None:
            raise ElmoSpacyError("A program with state inputs starts from the states it is given")
        config = bilm.config
        self.encoder = bilm.encoder
        self.stacks = nn.ModuleList([bilm.forward_lstm, bilm.backward_lstm])
        self.reads_chars = config.encoder != "word"
        self.reads_words = config.encoder != "char_cnn"
        self.with_states = with_states
        self.n_layers = config.n_layers
        if self.reads_chars:
            boundaries, _ = bilm.chars.char_ids([])  # the rows of <S> and </S>
            padded = torch.full((2, config.max_chars), bilm.chars.padding, dtype=torch.int64)
            padded[:, : boundaries.shape[1]] = boundaries
            self.register_buffer("boundary_chars", padded, persistent=False)
            self.padding = bilm.chars.padding
        self.register_buffer(
            "boundary_words", torch.tensor([BOS_ID, EOS_ID], dtype=torch.int64), persistent=False
        )
        for direction in ("forward", "backward"):
            for i in range(config.n_layers):
                h, c = (
                    (torch.zeros(1, config.projection_dim), torch.zeros(1, config.lstm_dim))
                    if initial_states is None
                    else initial_states[direction][i]
                )
                self.register_buffer(f"{direction}_h{i}", h.detach().float(), persistent=False)
                self.register_buffer(f"{direction}_c{i}", c.detach().float(), persistent=False)

    @property
    def input_names(self) -> list[str]:
        names = ["char_ids"] if self.reads_chars else []
        names += ["word_ids"] if self.reads_words else []
        names += ["lengths"]
        return names + (["initial_h", "initial_c"] if self.with_states else [])

    @property
    def output_names(self) -> list[str]:
        return ["layers", "final_h", "final_c"] if self.with_states else ["layers"]

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        given = dict(zip(self.input_names, inputs))
        lengths = given["lengths"]
        ids = given.get("char_ids", given.get("word_ids"))
        batch, steps = ids.shape[0], ids.shape[1]
        types = self._encode(given)  # (2 + B * T, P): <S>, </S>, then every position
        positions = torch.arange(steps, device=lengths.device)
        tokens = (
            2 + positions[None, :] + steps * torch.arange(batch, device=lengths.device)[:, None]
        )
        inside = positions[None, :] < lengths[:, None]
        index = torch.cat(  # (B, T + 2): <S> tokens </S>, then </S> as padding
            [
                torch.zeros_like(lengths)[:, None],
                torch.where(inside, tokens, torch.ones_like(tokens)),
                torch.ones_like(lengths)[:, None],
            ],
            dim=1,
        )
        framed = lengths + 2
        reverse = reverse_index(framed, steps + 2)
        mask = torch.arange(steps + 2, device=lengths.device)[None, :] < framed[:, None]
        encoded = types[index]
        runs = [(encoded, index), (types[index.gather(1, reverse)], None)]
        outputs, finals_h, finals_c = [], [], []
        for d, (stack, (x, _)) in enumerate(zip(self.stacks, runs)):
            layers = []
            for i, layer in enumerate(stack.layers):
                h0, c0 = self._initial(given, d, i, batch)
                y, h, c = _lstm_layer(layer, x, mask, h0, c0, stack.cell_clip, stack.proj_clip)
                x = y + x if i > 0 and stack.skip_connections else y
                layers.append(x)
                finals_h.append(h)
                finals_c.append(c)
            outputs.append(layers if d == 0 else [gather_time(y, reverse) for y in layers])
        stacked = [torch.cat([encoded, encoded], dim=-1)]
        stacked += [torch.cat(pair, dim=-1) for pair in zip(*outputs)]
        result = torch.stack(stacked)[:, :, 1:-1]
        if not self.with_states:
            return result
        return result, torch.stack(finals_h), torch.stack(finals_c)

    def _encode(self, given: dict[str, torch.Tensor]) -> torch.Tensor:
        chars = n_chars = words = None
        if self.reads_chars:
            char_ids = given["char_ids"]
            chars = torch.cat([self.boundary_chars, char_ids.reshape(-1, char_ids.shape[-1])])
            n_chars = (chars != self.padding).sum(-1)
        if self.reads_words:
            words = torch.cat([self.boundary_words, given["word_ids"].reshape(-1)])
        if chars is None:
            return self.encoder(words, torch.ones_like(words))
        return self.encoder(chars, n_chars, words)

    def _initial(
        self, given: dict[str, torch.Tensor], direction: int, layer: int, batch: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.with_states:
            row = direction * self.n_layers + layer
            return given["initial_h"][row], given["initial_c"][row]
        name = ("forward", "backward")[direction]
        h, c = getattr(self, f"{name}_h{layer}"), getattr(self, f"{name}_c{layer}")
        return h.expand(batch, -1).contiguous(), c.expand(batch, -1).contiguous()


def _lstm_layer(
    layer: nn.LSTM,
    x: torch.Tensor,
    mask: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor,
    cell_clip: float,
    proj_clip: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One LSTM layer (torch's parameters, gates i, f, g, o) over x (B, T, I)
    as a `scan` over time: positions where `mask` (B, T) is false keep the
    state and output zeros. Returns y (B, T, P) and the final h (B, P), c (B, H)."""
    from torch._higher_order_ops.scan import scan

    gates_x = x @ layer.weight_ih_l0.T + (layer.bias_ih_l0 + layer.bias_hh_l0)
    weight_hh = layer.weight_hh_l0
    weight_hr = layer.weight_hr_l0 if layer.proj_size else None

    def recur(h: torch.Tensor, gates_t: torch.Tensor) -> torch.Tensor:
        return gates_t + h @ weight_hh.T

    def project(h: torch.Tensor, _: None) -> torch.Tensor:
        return h @ weight_hr.T

    projected = project if weight_hr is not None else None

    def step(carry, inputs):
        h, c = carry
        gates_t, real = inputs  # (B, 4H), (B, 1)
        out, cell = lstm_step(gates_t, h, c, recur, projected, cell_clip, proj_clip)
        h_next, c_next = torch.where(real, out, h), torch.where(real, cell, c)
        return (h_next, c_next), torch.where(real, out, torch.zeros_like(out))

    (h, c), ys = scan(step, (h0, c0), (gates_x.transpose(0, 1), mask.transpose(0, 1)[..., None]))
    return ys.transpose(0, 1), h, c


def serving_inputs(
    bilm: BiLM, sentences: Sequence[Sequence[str]], with_states: bool = False
) -> dict[str, numpy.ndarray]:
    """The inputs of an exported `bilm` for tokenised sentences, as numpy
    arrays by input name (see the module docstring), zero states included
    with `with_states`: what a server computes from tokens (inputs.json
    says how)."""
    config = bilm.config
    steps = max((len(s) for s in sentences), default=0)
    lengths = numpy.array([len(s) for s in sentences], dtype="int64")
    inputs: dict[str, numpy.ndarray] = {}
    if config.encoder != "word":
        char_ids = numpy.full(
            (len(sentences), steps, config.max_chars), bilm.chars.padding, dtype="int64"
        )
        for row, tokens in enumerate(sentences):
            if tokens:
                ids, _ = bilm.chars.char_ids(list(tokens))
                char_ids[row, : len(tokens), : ids.shape[1]] = ids[2:].numpy()
        inputs["char_ids"] = char_ids
    if config.encoder != "char_cnn":
        cut = config.max_chars - 2 if config.char_ids == "char_vocab" else None
        word_ids = numpy.zeros((len(sentences), steps), dtype="int64")
        for row, tokens in enumerate(sentences):
            looked_up = [t[:cut] for t in tokens] if cut else list(tokens)
            word_ids[row, : len(tokens)] = bilm.vocab.word_ids(looked_up)[2:].numpy()
        inputs["word_ids"] = word_ids
    inputs["lengths"] = lengths
    if with_states:
        rows = 2 * config.n_layers
        inputs["initial_h"] = numpy.zeros((rows, len(sentences), config.projection_dim), "float32")
        inputs["initial_c"] = numpy.zeros((rows, len(sentences), config.lstm_dim), "float32")
    return inputs


def export_bilm(
    bilm: BiLM,
    output: Path,
    *,
    formats: Sequence[str] = FORMATS,
    initial_states: States | None = None,
    with_states: bool = False,
    dtype: torch.dtype = torch.float32,
) -> list[Path]:
    """Write `bilm` to the folder `output` (which the caller owns) as the
    given `formats` ("onnx": bilm.onnx, "torch-export": bilm.pt2, load with
    `torch.export.load(path).module()`), with inputs.json and, for word
    encoders, vocab.txt. Returns the files written. `dtype`: of the weights,
    states and layers (float64 shows a model whose float32 rounding moves
    its outputs computing what the network computes)."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ElmoSpacyError(f"Export formats {unknown}: use {', '.join(FORMATS)}")
    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if "onnx" in formats and missing:
        raise ElmoSpacyError(
            f"The onnx format needs {' and '.join(missing)}, which are not installed: "
            "pip install 'elmo_spacy[export]', or export the torch-export format alone (--format torch-export)"
        )
    bilm = copy.deepcopy(bilm).to(device="cpu", dtype=dtype).eval()
    module = ServingBiLM(bilm, initial_states, with_states).to(dtype).eval()
    sample = serving_inputs(bilm, [["A", "sentence", "."], ["Two", "."]], with_states)
    args = tuple(
        torch.from_numpy(sample[name]).to(dtype if name.startswith("initial") else torch.int64)
        for name in module.input_names
    )
    dynamic = _dynamic_shapes(module.input_names)
    written = []
    with torch.no_grad(), _quiet_exporter():
        program = torch.export.export(module, args, dynamic_shapes=dynamic)
        if "torch-export" in formats:
            torch.export.save(program, output / PROGRAM_FILE)
            written.append(output / PROGRAM_FILE)
        if "onnx" in formats:
            onnx_program = torch.onnx.export(
                program,
                args,
                input_names=module.input_names,
                output_names=module.output_names,
                opset_version=ONNX_OPSET,
                dynamo=True,
                verbose=False,
            )
            onnx_program.save(str(output / ONNX_FILE))
            written.append(output / ONNX_FILE)
    state = "zero" if initial_states is None else "primed"  # the state the program holds
    description = inputs_description(bilm, module, state, str(dtype).removeprefix("torch."))
    (output / INPUTS_FILE).write_text(json.dumps(description, indent=2) + "\n")
    written.append(output / INPUTS_FILE)
    if module.reads_words:
        words = "".join(f"{word}\n" for word in bilm.vocab.words)
        (output / VOCAB_FILE).write_text(words, encoding="utf-8", errors="surrogatepass")
        written.append(output / VOCAB_FILE)
    return written


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """torch's exporters without their notes on what does not concern a biLM
    (torchvision's operators, deprecations inside torch)."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        registration.setLevel(level)


def _dynamic_shapes(names: Sequence[str]) -> dict[str, tuple[dict[int, Any], ...]]:
    batch, tokens = torch.export.Dim("batch"), torch.export.Dim("tokens")
    shapes = {
        "char_ids": {0: batch, 1: tokens},
        "word_ids": {0: batch, 1: tokens},
        "lengths": {0: batch},
        "initial_h": {1: batch},
        "initial_c": {1: batch},
    }
    return {"inputs": tuple(shapes[name] for name in names)}  # forward's *inputs


def inputs_description(
    bilm: BiLM, module: ServingBiLM, state: str, dtype: str = "float32"
) -> dict[str, Any]:
    """What inputs.json says: each input and output, how to make the ids
    from tokens, and how the biLM's text was tokenised."""
    config = bilm.config
    inputs: dict[str, Any] = {}
    if module.reads_chars:
        chars = bilm.chars
        inputs["char_ids"] = {
            "shape": ["batch", "tokens", config.max_chars],
            "dtype": "int64",
            "scheme": chars.scheme,
            "units": "characters" if chars.scheme == "char_vocab" else "UTF-8 bytes",
            "unit_id": {
                "masked": "byte b -> b + 1",
                "bilm_tf": "byte b -> b",
                "char_vocab": "character -> its index in char_vocab (<oov> if absent)",
            }[chars.scheme],
            "begin_of_word": chars.begin_of_word,
            "end_of_word": chars.end_of_word,
            "padding": chars.padding,
            "max_units": config.max_chars - 2,
            "layout": "[begin_of_word, unit ids (the first max_units), end_of_word, "
            "padding to max_chars]",
            "sentence_boundary_tokens": {
                token: [chars.begin_of_word, mark, chars.end_of_word]
                for token, mark in chars.boundary_tokens.items()
            },
        }
        if chars.scheme == "char_vocab":
            inputs["char_ids"]["char_vocab"] = bilm.char_vocab
    if module.reads_words:
        inputs["word_ids"] = {
            "shape": ["batch", "tokens"],
            "dtype": "int64",
            "vocabulary": VOCAB_FILE,
            "id": "the token's line in vocabulary (from 0); unknown words: 1",
            "cut_words_at": config.max_chars - 2 if config.char_ids == "char_vocab" else None,
        }
    inputs["lengths"] = {"shape": ["batch"], "dtype": "int64", "meaning": "tokens a sentence"}
    outputs = {
        "layers": {
            "shape": [config.n_output_layers, "batch", "tokens", config.width],
            "dtype": dtype,
            "meaning": "layer 0: the token encoding [x; x]; 1..L: [forward; backward] LSTMs",
        }
    }
    if module.with_states:
        for name, width in (("h", config.projection_dim), ("c", config.lstm_dim)):
            shape = [2 * config.n_layers, "batch", width]
            inputs[f"initial_{name}"] = {"shape": shape, "dtype": dtype}
            outputs[f"final_{name}"] = {"shape": shape, "dtype": dtype}
    tokenization = bilm.tokenization
    return {
        "format": "elmo_spacy serving biLM, version 1",
        "encoder": config.encoder,
        "inputs": inputs,
        "outputs": outputs,
        "state": "given as inputs" if module.with_states else state,
        "precision": dtype,
        "tokenization": None if tokenization is None else tokenization.to_dict(),
        "config": config.to_dict(),
    }
