"""A biLM as a program to serve outside Python and spaCy: an ONNX model and a
`torch.export` program, with inputs.json, which says what the inputs mean
(docs/embedding.md, "Serving outside Python", has the table of inputs).

`ServingBiLM` computes what `Embedder` gives on the same tokens (to float32
rounding), with shapes that all come from the inputs (the recurrence a
`scan`, lengths a mask), so batch size and tokens stay free in the graph.
Positions past a sentence's length are padding, whatever type_ids holds there.
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
from ..model.encoders import CharCNNEncoder
from ..model.lstm import Product, lstm_step
from ..model.network import States
from .onnx_inputs import INPUTS_FILE, VOCAB_FILE, type_index

FORMATS = ("onnx", "torch-export")
ONNX_FILE, PROGRAM_FILE = "bilm.onnx", "bilm.pt2"
# What an export folder holds: what an earlier export left, which `export --overwrite` replaces.
EXPORT_FILES = (ONNX_FILE, PROGRAM_FILE, INPUTS_FILE, VOCAB_FILE)
ONNX_OPSET = 18
QUANTIZATIONS = (None, "int8")
INT8_PRODUCTS = (
    "int8: MatMul and Gemm as onnxruntime's dynamic quantization (weights int8, "
    "activations uint8 per product); convolutions and the cell float32"
)


class ServingBiLM(nn.Module):
    """The layers of `bilm` from per-token ids (see the module docstring).

    initial_states: the state every sentence starts from, per direction and
        layer (h (1, P), c (1, H)); None: zeros. Not with `with_states`.
    batched_input_products: both directions' input products as one batched
        product (faster under int8 quantization); else one Gemm a direction
        (faster in float32: docs/results.md, "Serving outside Python").
    """

    def __init__(
        self,
        bilm: BiLM,
        initial_states: States | None = None,
        with_states: bool = False,
        batched_input_products: bool = False,
    ) -> None:
        super().__init__()
        self.batched_input_products = batched_input_products
        if with_states and initial_states is not None:
            raise ElmoSpacyError("A program with state inputs starts from the states it is given")
        config = bilm.config
        self.encoder = bilm.encoder
        self.reads_chars = config.encoder != "word"
        self.reads_words = config.encoder != "char_cnn"
        self.with_states = with_states
        self.n_layers = config.n_layers
        if self.reads_chars:
            boundaries, _ = bilm.chars.char_ids([])  # the rows of <S> and </S>: 3 ids each
            self.register_buffer("boundary_chars", boundaries[:, :3].clone(), persistent=False)
            self.padding = bilm.chars.padding
            self.max_chars = config.max_chars
        self.register_buffer(
            "boundary_words", torch.tensor([BOS_ID, EOS_ID], dtype=torch.int64), persistent=False
        )
        forward_stack, backward_stack = bilm.forward_lstm, bilm.backward_lstm
        self.cell_clip, self.proj_clip = forward_stack.cell_clip, forward_stack.proj_clip
        self.skip_connections = forward_stack.skip_connections
        self.projects = bool(forward_stack.layers[0].proj_size)
        for i, pair in enumerate(zip(forward_stack.layers, backward_stack.layers)):
            # Both directions' weights stacked: (2, in, out), transposed for x @ w.
            def stacked(name: str, layers: tuple[nn.LSTM, ...] = pair) -> torch.Tensor:
                return torch.stack(
                    [getattr(layer, name).detach() for layer in layers]
                ).mT.contiguous()

            bias = torch.stack([layer.bias_ih_l0 + layer.bias_hh_l0 for layer in pair]).detach()
            self.register_buffer(f"weight_ih{i}", stacked("weight_ih_l0"), persistent=False)
            self.register_buffer(f"bias{i}", bias[:, None, :], persistent=False)  # (2, 1, 4H)
            for d, direction in enumerate(("forward", "backward")):  # read at every step
                self.register_buffer(
                    f"{direction}_hh{i}", stacked("weight_hh_l0")[d].clone(), persistent=False
                )
                if self.projects:
                    self.register_buffer(
                        f"{direction}_hr{i}", stacked("weight_hr_l0")[d].clone(), persistent=False
                    )
            starts = []
            for direction in ("forward", "backward"):
                h, c = (
                    (torch.zeros(1, config.projection_dim), torch.zeros(1, config.lstm_dim))
                    if initial_states is None
                    else initial_states[direction][i]
                )
                starts.append((h.detach().float(), c.detach().float()))
            self.register_buffer(f"h{i}", torch.stack([h for h, _ in starts]), persistent=False)
            self.register_buffer(f"c{i}", torch.stack([c for _, c in starts]), persistent=False)

    @property
    def input_names(self) -> list[str]:
        names = ["char_ids"] if self.reads_chars else []
        names += ["word_ids"] if self.reads_words else []
        names += ["type_ids", "lengths"]
        return names + (["initial_h", "initial_c"] if self.with_states else [])

    @property
    def output_names(self) -> list[str]:
        return ["layers", "final_h", "final_c"] if self.with_states else ["layers"]

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        given = dict(zip(self.input_names, inputs))
        lengths, type_ids = given["lengths"], given["type_ids"]
        batch, steps = type_ids.shape[0], type_ids.shape[1]
        types = self._encode(given)  # (2 + U, P): <S>, </S>, then each type once
        positions = torch.arange(steps, device=lengths.device)
        inside = positions[None, :] < lengths[:, None]
        index = torch.cat(  # (B, T + 2): <S> tokens </S>, then </S> as padding
            [
                torch.zeros_like(lengths)[:, None],
                torch.where(inside, type_ids + 2, torch.ones_like(type_ids)),
                torch.ones_like(lengths)[:, None],
            ],
            dim=1,
        )
        framed = lengths + 2
        reverse = reverse_index(framed, steps + 2)
        mask = torch.arange(steps + 2, device=lengths.device)[None, :] < framed[:, None]
        encoded = types[index]  # (B, T + 2, P)
        x = torch.stack([encoded, types[index.gather(1, reverse)]])  # (2, B, T + 2, P)
        layers, finals_h, finals_c = [], [], []
        for i in range(self.n_layers):
            h0, c0 = self._initial(given, i, batch)
            y, h, c = self._lstm_layer(i, x, mask, h0, c0)
            x = y + x if i > 0 and self.skip_connections else y
            layers.append(torch.cat([x[0], gather_time(x[1], reverse)], dim=-1))
            finals_h.append(h)
            finals_c.append(c)
        stacked = [torch.cat([encoded, encoded], dim=-1), *layers]
        result = torch.stack(stacked)[:, :, 1:-1]
        if not self.with_states:
            return result
        # (2L, B, .): forward layers, then backward ones
        final_h = torch.cat([torch.stack([h[d] for h in finals_h]) for d in range(2)])
        final_c = torch.cat([torch.stack([c[d] for c in finals_c]) for d in range(2)])
        return result, final_h, final_c

    def _encode(self, given: dict[str, torch.Tensor]) -> torch.Tensor:
        """The encodings (2 + U, P) of <S>, </S> and the U types given."""
        words = None
        if self.reads_words:
            words = torch.cat([self.boundary_words, given["word_ids"]])
        if not self.reads_chars:
            return self.encoder(words, torch.ones_like(words))
        char_ids = given["char_ids"]
        boundaries = nn.functional.pad(
            self.boundary_chars, (0, char_ids.shape[1] - 3), value=self.padding
        )
        chars = torch.cat([boundaries, char_ids])  # (2 + U, W)
        n_chars = (chars != self.padding).sum(-1)
        if self.reads_words:  # the word embedding beside the char CNN (`WordCharEncoder`)
            cnn = self.encoder.chars
            both = [self.encoder.embed(words), _char_cnn(cnn, chars, n_chars, self.max_chars)]
            return self.encoder.projection(torch.cat(both, dim=-1))
        return _char_cnn(self.encoder, chars, n_chars, self.max_chars)

    def _initial(
        self, given: dict[str, torch.Tensor], layer: int, batch: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s starting state of both directions, h (2, B, P) and
        c (2, B, H): forward, then backward."""
        if self.with_states:
            rows = [layer, self.n_layers + layer]  # forward, backward
            h, c = given["initial_h"][rows], given["initial_c"][rows]
        else:
            h, c = getattr(self, f"h{layer}"), getattr(self, f"c{layer}")
            h, c = h.expand(-1, batch, -1).contiguous(), c.expand(-1, batch, -1).contiguous()
        return h, c

    def _lstm_layer(
        self, i: int, x: torch.Tensor, mask: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer i of both directions over x (2, B, T, I) from h0 (2, B, P), c0
        (2, B, H), in one `scan` of `lstm_step`s; zeros where `mask` (B, T) is
        false. Returns y (2, B, T, P) and the final h (2, B, P), c (2, B, H)
        (with states, each row's after its last position)."""
        from torch._higher_order_ops.scan import scan

        directions, batch, steps, width = x.shape
        weight_ih, bias = getattr(self, f"weight_ih{i}"), getattr(self, f"bias{i}")
        weight_hh = [getattr(self, f"{d}_hh{i}") for d in ("forward", "backward")]
        weight_hr = [getattr(self, f"{d}_hr{i}", None) for d in ("forward", "backward")]
        if self.batched_input_products:  # (2, T, B, 4H)
            gates_x = x.reshape(directions, batch * steps, width) @ weight_ih + bias
            gates_x = gates_x.reshape(directions, batch, steps, -1).transpose(1, 2)
        else:  # each direction's (T, B, 4H), time-major before the product (the narrow side)
            x = x.transpose(1, 2).reshape(directions, steps * batch, width)  # (2, T * B, I)
            gates_x = [
                torch.addmm(bias[d, 0], x[d], weight_ih[d]).reshape(steps, batch, -1)
                for d in range(directions)
            ]
        cell_clip, proj_clip, with_states = self.cell_clip, self.proj_clip, self.with_states

        def products(d: int) -> tuple[Product, Product | None]:
            def recur(h: torch.Tensor, gates_t: torch.Tensor) -> torch.Tensor:
                return gates_t + h @ weight_hh[d]

            def project(cell_out: torch.Tensor, _: None) -> torch.Tensor:
                return cell_out @ weight_hr[d]

            return recur, (project if self.projects else None)

        directions_products = [products(d) for d in range(directions)]

        def step(carry, inputs):
            *gates, real = inputs  # each direction's (B, 4H), then (B, 1)
            carried = []
            for d, (recur, project) in enumerate(directions_products):
                h, c = carry[2 * d], carry[2 * d + 1]  # (B, P), (B, H)
                out, cell = lstm_step(gates[d], h, c, recur, project, cell_clip, proj_clip)
                if with_states:  # a row's state stops at its last position
                    out, cell = torch.where(real, out, h), torch.where(real, cell, c)
                # else padding comes after a row's real positions: what it computes is not read
                carried += [out, cell]
            return tuple(carried), tuple(h.clone() for h in carried[::2])

        real = mask.transpose(0, 1)[..., None]  # (T, B, 1)
        starts = tuple(state[d].clone() for d in range(directions) for state in (h0, c0))
        finals, ys = scan(step, starts, (*gates_x, real))
        y = torch.stack([torch.where(real, y, torch.zeros_like(y)) for y in ys])  # (2, T, B, P)
        return y.transpose(1, 2), torch.stack(finals[::2]), torch.stack(finals[1::2])


def _char_cnn(
    cnn: CharCNNEncoder, chars: torch.Tensor, n_chars: torch.Tensor, max_chars: int
) -> torch.Tensor:
    """What `CharCNNEncoder` gives (U, D) for chars (U, W) of n_chars (U,) ids,
    for any W up to max_chars, without its branch on W: with bilm-tf's
    unmasked ids a token pools as if padded to max_chars."""
    embedded = cnn.embed(chars).transpose(1, 2)  # (U, char_dim, W)
    if not cnn.masked:
        padding = cnn.embed.weight[cnn.padding][None, :, None]  # (1, char_dim, 1)
    pooled = []
    for conv in cnn.convs:
        width = conv.kernel_size[0]
        windows = conv(embedded)  # (U, n, W - width + 1)
        if cnn.masked:
            starts = torch.arange(windows.shape[2], device=windows.device)
            outside = starts[None, None, :] >= n_chars[:, None, None]
            best = windows.masked_fill(outside, float("-inf")).amax(-1)
        else:
            best = windows.amax(-1)
            all_padding = conv(padding.expand(-1, -1, width))[:, :, 0]  # (1, n)
            has_one = (n_chars + width <= max_chars)[:, None]
            best = torch.where(has_one, torch.maximum(best, all_padding), best)
        pooled.append(cnn.activation(best))
    return cnn.projection(cnn.highway(torch.cat(pooled, dim=-1)))


def serving_inputs(
    bilm: BiLM, sentences: Sequence[Sequence[str]], with_states: bool = False
) -> dict[str, numpy.ndarray]:
    """The inputs of an exported `bilm` for tokenised sentences, numpy arrays
    by input name (zero states with `with_states`): what a server computes
    from tokens as inputs.json says."""
    config = bilm.config
    type_ids, types = type_index(sentences)
    inputs: dict[str, numpy.ndarray] = {}
    if config.encoder != "word":
        ids, _ = bilm.chars.char_ids(types)  # <S>, </S>, then the types, as wide as they need
        inputs["char_ids"] = ids[2:].numpy()
    if config.encoder != "char_cnn":
        cut = config.max_chars - 2 if config.char_ids == "char_vocab" else None
        looked_up = [t[:cut] for t in types] if cut else types
        inputs["word_ids"] = bilm.vocab.word_ids(looked_up)[2:].numpy()
    inputs["type_ids"] = type_ids
    inputs["lengths"] = numpy.array([len(s) for s in sentences], dtype="int64")
    if with_states:
        n = 2 * config.n_layers
        inputs["initial_h"] = numpy.zeros((n, len(sentences), config.projection_dim), "float32")
        inputs["initial_c"] = numpy.zeros((n, len(sentences), config.lstm_dim), "float32")
    return inputs


def check_export(formats: Sequence[str], quantize: str | None, dtype=torch.float32) -> None:
    """Refuse formats and quantizations that `export_bilm` does not write."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ElmoSpacyError(
            f"Export format {unknown[0]!r} (--format {unknown[0]}): use {' or '.join(FORMATS)}"
        )
    if quantize not in QUANTIZATIONS:
        raise ElmoSpacyError(
            f"Quantization {quantize!r} (--quantize {quantize}): use int8, or none (float32)"
        )
    if quantize and ("onnx" not in formats or dtype != torch.float32):
        raise ElmoSpacyError(
            "int8 quantizes the float32 ONNX model, bilm.onnx: export the onnx format "
            "(--format onnx)"
        )


def export_bilm(
    bilm: BiLM,
    output: Path,
    *,
    formats: Sequence[str] = FORMATS,
    initial_states: States | None = None,
    with_states: bool = False,
    dtype: torch.dtype = torch.float32,
    quantize: str | None = None,
) -> list[Path]:
    """Write `bilm` into the folder `output` in `formats`, with inputs.json and,
    for word encoders, vocab.txt; returns the files written. `dtype`: of
    weights, states and layers; `quantize`: see `quantize_int8`."""
    check_export(formats, quantize, dtype)
    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if "onnx" in formats and missing:
        raise ElmoSpacyError(
            f"The onnx format needs {' and '.join(missing)}, which are not installed: "
            "pip install 'elmo_spacy[export]', or export the torch-export format alone "
            "(--format torch-export)"
        )
    bilm = copy.deepcopy(bilm).to(device="cpu", dtype=dtype).eval()
    # int8 runs the input products faster batched; float32, a direction at a time (see ServingBiLM)
    batched = quantize == "int8"
    module = ServingBiLM(bilm, initial_states, with_states, batched).to(dtype).eval()
    sample = serving_inputs(bilm, [["A", "sentence", "."], ["Two", "."]], with_states)
    args = tuple(
        torch.from_numpy(sample[name]).to(dtype if name.startswith("initial") else torch.int64)
        for name in module.input_names
    )
    config = bilm.config  # the char ids: at least <S>'s 3 and the widest filter - 1
    min_chars = min(config.max_chars, 2 + max(width for width, _ in config.filters))
    batch, types = torch.export.Dim("batch", min=1), torch.export.Dim("types")
    chars = torch.export.Dim("chars", min=min_chars, max=config.max_chars)
    shapes = {
        "char_ids": {0: types, 1: chars},
        "word_ids": {0: types},
        "type_ids": {0: batch, 1: torch.export.Dim("tokens")},
        "lengths": {0: batch},
        "initial_h": {1: batch},
        "initial_c": {1: batch},
    }
    dynamic = {"inputs": tuple(shapes[name] for name in module.input_names)}  # forward's *inputs
    written = []
    with torch.no_grad(), _quiet():
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
    if quantize:
        quantize_int8(output / ONNX_FILE)
    state = "zero" if initial_states is None else "primed"  # the state the program holds
    description = inputs_description(bilm, module, state, str(dtype).removeprefix("torch."))
    if quantize:
        description["onnx_products"] = INT8_PRODUCTS
    (output / INPUTS_FILE).write_text(json.dumps(description, indent=2) + "\n")
    written.append(output / INPUTS_FILE)
    if module.reads_words:
        words = "".join(f"{word}\n" for word in bilm.vocab.words)
        (output / VOCAB_FILE).write_text(words, encoding="utf-8", errors="surrogatepass")
        written.append(output / VOCAB_FILE)
    return written


def quantize_int8(path: Path) -> None:
    """Rewrite the ONNX model at `path` with its MatMul and Gemm products (the scan's too)
    in int8 by onnxruntime's dynamic quantization; convolutions stay float32 (faster)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = path.with_suffix(".int8.onnx")
    with _quiet(""):  # the root logger, where quantize_dynamic advises pre-processing
        quantize_dynamic(
            path,
            quantized,
            op_types_to_quantize=["MatMul", "Gemm"],
            weight_type=QuantType.QInt8,
            extra_options={"EnableSubgraph": True},
        )
    quantized.replace(path)


def session_options(threads: int | None = None) -> Any:
    """onnxruntime's `SessionOptions` measured fastest for an exported biLM on
    the CPU (docs/results.md, "Serving outside Python"); `threads` per operator."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    if threads:
        options.intra_op_num_threads = threads
    return options


@contextlib.contextmanager
def _quiet(logger: str = "torch.onnx._internal.exporter._registration") -> Iterator[None]:
    """`logger` at level ERROR and FutureWarnings ignored: the exporters'
    notes that do not concern a biLM (torchvision's operators, torch's deprecations)."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        log.setLevel(level)


def inputs_description(
    bilm: BiLM, module: ServingBiLM, state: str, dtype: str = "float32"
) -> dict[str, Any]:
    """What inputs.json says: each input and output, how to make the ids
    from tokens, and how the biLM's text was tokenised."""
    config = bilm.config
    inputs: dict[str, Any] = {}
    if module.reads_chars:
        chars = bilm.chars
        widest = max(width for width, _ in config.filters)
        inputs["char_ids"] = {
            "shape": ["types", "chars"],
            "dtype": "int64",
            "rows": "the batch's distinct tokens (types), each once, in any order",
            "chars": f"from the longest row (at least 3) + {widest - 1} up to "
            f"{config.max_chars} (max_chars): the same layers for each",
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
            "padding to chars]",
            "sentence_boundary_tokens": {
                token: [chars.begin_of_word, mark, chars.end_of_word]
                for token, mark in chars.boundary_tokens.items()
            },
        }
        if chars.scheme == "char_vocab":
            inputs["char_ids"]["char_vocab"] = bilm.char_vocab
    if module.reads_words:
        inputs["word_ids"] = {
            "shape": ["types"],
            "dtype": "int64",
            "vocabulary": VOCAB_FILE,
            "id": "the token's line in vocabulary (from 0); unknown words: 1",
            "cut_words_at": config.max_chars - 2 if config.char_ids == "char_vocab" else None,
        }
    inputs["type_ids"] = {
        "shape": ["batch", "tokens"],
        "dtype": "int64",
        "meaning": "each token's type: its row in "
        + " and ".join(name for name in ("char_ids", "word_ids") if name in inputs),
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
        "format": "elmo_spacy serving biLM, version 2",
        "encoder": config.encoder,
        "inputs": inputs,
        "outputs": outputs,
        "state": "given as inputs" if module.with_states else state,
        "precision": dtype,
        "tokenization": None if tokenization is None else tokenization.to_dict(),
        "config": config.to_dict(),
    }
