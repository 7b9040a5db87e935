"""ELMo on Ray Data (the extra `elmo_spacy[ray]`): `EmbedBatches`,
`AnnotateBatches` and `elmo-spacy embed --engine ray`. See docs/embedding.md."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy

from .bilm.formats.locate import BiLMPath
from .bilm.runner import RunSettings
from .embedder import OUTPUTS, Embedder, shape_vectors, tokenizer_for
from .errors import ElmoSpacyError

RAY_EXTRA = "pip install elmo_spacy[ray]"
DTYPES = ("float32", "float16")
# What AnnotateBatches can write: the column each annotation becomes.
ANNOTATIONS = ("tokens", "cats", "ents", "tags", "tensor", "docbin")
# What a pipe must assign (its factory's `assigns`) for each annotation.
ASSIGNS = {"cats": "doc.cats", "ents": "doc.ents", "tags": "token.tag", "tensor": "doc.tensor"}


def require_ray():
    """The `ray` module with Ray Data, or an error that says how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as err:
        raise ElmoSpacyError(
            f"Ray Data is not installed ({err}): install the plugin's Ray extra, "
            f"`{RAY_EXTRA}` (it brings ray[data])"
        ) from err
    return ray


def check_choice(name: str, value: str, choices: Sequence[str], origin: str = "") -> None:
    if value not in choices:
        raise ElmoSpacyError(f"{origin}{name} = {value!r}: use one of {', '.join(choices)}")


class EmbedBatches:
    """Adds `vectors_column` (and with `tokens_column`, the tokens) to pyarrow
    batches: `Embedder.embed`'s vectors of the texts (or `tokenized` token
    lists) of `column`, as docs/embedding.md says."""

    def __init__(
        self,
        path: str | Path,
        *,
        column: str = "text",
        tokenized: bool = False,
        vectors_column: str = "vectors",
        tokens_column: str | None = None,
        output: str = "all",
        dtype: str = "float32",
        run: RunSettings | None = None,
        tokenization: Any = None,
        device: str | None = None,
        num_threads: int | None = None,
        **settings: Any,
    ) -> None:
        from .bilm.inputs.tokenization import Tokenization

        check_choice("output", output, OUTPUTS, "EmbedBatches: ")
        check_choice("dtype", dtype, DTYPES, "EmbedBatches: ")
        self.threads = set_actor_threads(num_threads)
        self.embedder = Embedder(path, run, device=device or actor_device(), **settings)
        if isinstance(tokenization, dict):
            tokenization = Tokenization.from_dict(tokenization)
        self.tokenizer = tokenizer_for(tokenization or self.embedder.tokenization)
        self.column, self.tokenized = column, tokenized
        self.vectors_column, self.tokens_column = vectors_column, tokens_column
        self.output, self.dtype = output, dtype

    def __call__(self, batch):
        values = input_column(batch, self.column, "EmbedBatches").to_pylist()
        if self.tokenized:
            sentences = [list(tokens or []) for tokens in values]
        else:
            sentences = self.tokenizer([text or "" for text in values])
        vectors = [
            shape_vectors(layers, self.output).astype(self.dtype, copy=False)
            for layers in self.embedder.embed(sentences)
        ]
        added = {}
        if self.tokens_column is not None:
            import pyarrow

            added[self.tokens_column] = pyarrow.array(sentences, pyarrow.list_(pyarrow.string()))
        ndim = 3 if self.output == "all" else 2
        added[self.vectors_column] = tensor_array(vectors, self.dtype, ndim)
        return with_columns(batch, added, "EmbedBatches")


class AnnotateBatches:
    """Runs `spacy.load(path)`'s `nlp.pipe` (with `batch_size`, without the
    pipes `disable` names) over the text `column` of pyarrow batches, and
    adds a column per name of `annotations` (docs/embedding.md)."""

    def __init__(
        self,
        path: str | Path,
        *,
        annotations: Sequence[str] = ("cats",),
        column: str = "text",
        batch_size: int | None = None,
        disable: Sequence[str] = (),
        device: str | None = None,
        num_threads: int | None = None,
    ) -> None:
        import spacy

        annotations = [annotations] if isinstance(annotations, str) else list(annotations)
        for name in annotations:
            check_choice("annotations", name, ANNOTATIONS, "AnnotateBatches: ")
        if not annotations:
            raise ElmoSpacyError(f"AnnotateBatches: name an annotation, one of {ANNOTATIONS}")
        self.threads = set_actor_threads(num_threads)
        device = device or actor_device()
        if device.startswith("cuda"):
            spacy.require_gpu(int(device.partition(":")[2] or 0))
        self.nlp = spacy.load(path, disable=list(disable))
        assigned = {a for name in self.nlp.pipe_names for a in self.nlp.get_pipe_meta(name).assigns}
        for name in annotations:
            if name in ASSIGNS and ASSIGNS[name] not in assigned:
                raise ElmoSpacyError(
                    f"AnnotateBatches: annotations include {name!r}, but no pipe of {path} sets "
                    f"{ASSIGNS[name]} (its pipes: {', '.join(self.nlp.pipe_names)})"
                )
        self.annotations, self.column, self.batch_size = annotations, column, batch_size

    def __call__(self, batch):
        texts = input_column(batch, self.column, "AnnotateBatches").to_pylist()
        docs = list(self.nlp.pipe((text or "" for text in texts), batch_size=self.batch_size))
        added = {name: self._column(name, docs) for name in self.annotations}
        return with_columns(batch, added, "AnnotateBatches")

    def _column(self, name: str, docs: list):
        import pyarrow
        from spacy.tokens import DocBin
        from thinc.api import to_numpy

        strings = pyarrow.list_(pyarrow.string())
        if name == "tokens":
            return pyarrow.array([[t.text for t in doc] for doc in docs], strings)
        if name == "tags":
            return pyarrow.array([[t.tag_ for t in doc] for doc in docs], strings)
        if name == "cats":
            return pyarrow.array([doc.cats for doc in docs])
        if name == "ents":
            offset = pyarrow.int64()
            entity = [("start_char", offset), ("end_char", offset), ("label", pyarrow.string())]
            ents = [[(e.start_char, e.end_char, e.label_) for e in doc.ents] for doc in docs]
            return pyarrow.array(ents, pyarrow.list_(pyarrow.struct(entity)))
        if name == "tensor":
            tensors = [numpy.asarray(to_numpy(doc.tensor), dtype="float32") for doc in docs]
            for doc, tensor in zip(docs, tensors):
                if tensor.ndim != 2 or tensor.shape[0] != len(doc):
                    raise ElmoSpacyError(
                        f"AnnotateBatches: doc.tensor of {doc.text[:40]!r} is {tensor.shape}, not "
                        f"(len(doc) = {len(doc)}, width): does a pipe set it (the elmo pipe's store "
                        'is "nothing"?)'
                    )
            return tensor_array(tensors, "float32", 2)
        docbins = [DocBin(docs=[doc], store_user_data=True).to_bytes() for doc in docs]
        return pyarrow.array(docbins, pyarrow.binary())


def set_actor_threads(num_threads: int | None) -> int:
    """Set torch's threads: `num_threads`, or in a Ray actor its CPUs (at least 1)."""
    import torch

    if num_threads is None:
        ray = _ray_if_running()
        if ray is None:
            return torch.get_num_threads()
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
        num_threads = max(1, int(cpus))
    if num_threads < 1:
        raise ElmoSpacyError(f"num_threads = {num_threads}: give 1 or more (or None)")
    torch.set_num_threads(num_threads)
    return num_threads


def actor_device() -> str:
    """ "cuda" where Ray gave this actor a GPU (it sees only that one), else "cpu"."""
    ray = _ray_if_running()
    return "cuda" if ray is not None and ray.get_gpu_ids() else "cpu"


def _ray_if_running():
    """The ray module if this process is a Ray actor, else None."""
    try:
        import ray
    except ImportError:
        return None
    return ray if ray.is_initialized() and ray.get_runtime_context().get_actor_id() else None


def input_column(batch, column: str, who: str):
    """The column `column` of a pyarrow batch, or an error saying what to give."""
    import pyarrow

    if not isinstance(batch, pyarrow.Table):
        raise ElmoSpacyError(
            f"{who} takes pyarrow batches, not {type(batch).__name__}: pass "
            'batch_format="pyarrow" to map_batches'
        )
    if column not in batch.column_names:
        raise ElmoSpacyError(
            f"{who}: the batch has no column {column!r} (it has {', '.join(batch.column_names)}): "
            "name the input with column=..."
        )
    return batch[column]


def with_columns(batch, added: dict, who: str):
    for name, values in added.items():
        if name in batch.column_names:
            raise ElmoSpacyError(
                f"{who}: the batch already has a column {name!r}: choose another name for the output"
            )
        batch = batch.append_column(name, values)
    return batch


def tensor_array(arrays: list[numpy.ndarray], dtype: str, ndim: int):
    """Ray's variable-shaped tensor column of `arrays` (each `ndim`
    dimensions of `dtype`), also of none."""
    import pyarrow
    from ray.data.extensions import ArrowVariableShapedTensorArray, ArrowVariableShapedTensorType

    if arrays:
        return ArrowVariableShapedTensorArray.from_numpy(arrays)
    kind = ArrowVariableShapedTensorType(pyarrow.from_numpy_dtype(numpy.dtype(dtype)), ndim)
    return pyarrow.ExtensionArray.from_storage(kind, pyarrow.array([], kind.storage_type))


def tensors_to_numpy(column) -> list[numpy.ndarray]:
    """The arrays of a column of Ray's variable-shaped tensors, read without
    Ray too (pyarrow alone reads a struct of `data`, flat, and `shape`)."""
    import pyarrow

    chunks = column.chunks if isinstance(column, pyarrow.ChunkedArray) else [column]
    arrays = []
    for chunk in chunks:
        storage = chunk.storage if isinstance(chunk, pyarrow.ExtensionArray) else chunk
        data, shapes = storage.field("data"), storage.field("shape").to_pylist()
        values = data.values.to_numpy(zero_copy_only=False)
        offsets = data.offsets.to_numpy()
        for i, shape in enumerate(shapes):
            arrays.append(values[offsets[i] : offsets[i + 1]].reshape(shape))
    return arrays


def embed_to_parquet(
    bilm_path: BiLMPath,
    lines: Sequence[str],
    indices: Sequence[int],
    output_file: str | Path,
    *,
    embed_options: dict[str, Any],
    actors: int = 1,
    cpus_per_actor: float = 1,
    gpus_per_actor: float = 0,
    lines_per_batch: int = 256,
    address: str | None = None,
) -> tuple[int, int]:
    """`elmo-spacy embed --engine ray`: `lines[i]` for each i of `indices`
    through `EmbedBatches(**embed_options)` into the Parquet file
    `output_file`. Joins the Ray at `address`, or the one running, or starts
    a local one (stopped after). Returns (lines, tokens) written."""
    import pyarrow

    from .files import write_file

    ray = require_ray()
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, **({"include_dashboard": False} if address is None else {}))
    context = ray.data.DataContext.get_current()
    kept_order = context.execution_options.preserve_order
    context.execution_options.preserve_order = True  # blocks come back in line order
    try:
        table = pyarrow.table(
            {
                "line": pyarrow.array(indices, pyarrow.int64()),
                "text": pyarrow.array([lines[i] for i in indices], pyarrow.string()),
            }
        )
        blocks = [table.slice(a, lines_per_batch) for a in range(0, len(table), lines_per_batch)]
        dataset = ray.data.from_arrow(blocks or [table]).map_batches(
            EmbedBatches,
            fn_constructor_kwargs={
                "path": _plain_path(bilm_path),
                "tokens_column": "tokens",
                **embed_options,
            },
            batch_format="pyarrow",
            batch_size=lines_per_batch,
            compute=ray.data.ActorPoolStrategy(size=actors),
            num_cpus=cpus_per_actor,
            **({"num_gpus": gpus_per_actor} if gpus_per_actor else {}),
        )
        ndim = 3 if embed_options.get("output", "all") == "all" else 2
        no_tokens = pyarrow.array([], pyarrow.list_(pyarrow.string()))
        no_vectors = tensor_array([], embed_options.get("dtype", "float32"), ndim)
        empty = with_columns(table.slice(0, 0), {"tokens": no_tokens, "vectors": no_vectors}, "")
        counts: list[tuple[int, int]] = []
        write_file(
            output_file, lambda path: counts.append(write_in_order(dataset, path, indices, empty))
        )
    finally:
        context.execution_options.preserve_order = kept_order
        if started_here:
            ray.shutdown()
    return counts[0]


def write_in_order(dataset, path: Path, indices: Sequence[int], empty) -> tuple[int, int]:
    """Write `dataset`'s rows (or else `empty`) to `path`, checking that their
    lines are `indices`, once, in order (Ray reruns a dead actor's task)."""
    import pyarrow.compute
    import pyarrow.parquet

    n_lines = n_tokens = 0
    writer = None
    try:
        for batch in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
            got = batch["line"].to_pylist()
            expected = list(indices[n_lines : n_lines + len(got)])
            if got != expected:
                raise RuntimeError(
                    f"Ray gave lines {got[:5]}... where {expected[:5]}... were expected: the "
                    "output would lose or repeat lines (a bug)"
                )
            if writer is None:
                writer = pyarrow.parquet.ParquetWriter(path, batch.schema)
            writer.write_table(batch)
            n_lines += len(batch)
            n_tokens += (
                pyarrow.compute.sum(pyarrow.compute.list_value_length(batch["tokens"])).as_py() or 0
            )
        if writer is None:
            pyarrow.parquet.write_table(empty, path)
    finally:
        if writer is not None:
            writer.close()
    if n_lines != len(indices):
        raise RuntimeError(
            f"Ray gave {n_lines} of {len(indices)} lines: the output would lose lines (a bug)"
        )
    return n_lines, n_tokens


def _plain_path(path: BiLMPath) -> str | list[str]:
    """A biLM path (or a bilm-tf pair, as a list) as strings, for the actors."""
    if isinstance(path, (tuple, list)):
        return [str(p) for p in path]
    return str(path)
