"""Every number the biLM computes, saved to one file, so that a change meant to
move no number can be checked bit for bit against the commit before it:

    python benchmarks/outputs_snapshot.py save before.npz   # on the old commit
    python benchmarks/outputs_snapshot.py save after.npz    # on the new one
    python benchmarks/outputs_snapshot.py compare before.npz after.npz

What it saves, for seeded biLMs (char CNN clipped as bilm-tf's, char CNN
unclipped, word + char), and for the bilm-tf model in ../shared/data where
it is there:

- the training step: the LM loss and every parameter's gradient, in each
  precision, with dropout (seeded), on the kernels pretraining chooses;
- inference: `Embedder`'s layers under each run setting (state zero and
  primed, float32 and bfloat16, short windows, small batches);
- stateful replay: two batches with the state carried;
- the `elmo` pipe: `doc._.elmo` and `doc.tensor`, and the thinc model's
  gradient into the biLM (fine-tuning);
- the exported model (onnx, run by onnxruntime) where both are installed.

`compare` lists every array that differs (or is missing) and exits 1 if any
does.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import numpy
import torch

SENTENCES = [
    ["The", "cat", "sat", "on", "the", "mat", "."],
    ["Stocks", "rose", "sharply", "on", "Tuesday", "after", "the", "report", "."],
    ["Hi", "!"],
    ["A"],
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen".split(),
    ["Unseen", "wordsmithery", "zzz", "éàü", "1,234.5", "--"],
]
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "allennlp_elmo"


def seeded_bilms() -> dict:
    from elmo_spacy.bilm import BiLM, BiLMConfig
    from elmo_spacy.bilm.inputs.vocab import SPECIALS, WordVocab

    words = sorted({w for s in SENTENCES for w in s[:5]})
    vocab = WordVocab([*SPECIALS, *words])
    small = dict(
        max_chars=20,
        char_dim=8,
        filters=[(1, 8), (2, 8), (3, 16)],
        projection_dim=16,
        lstm_dim=24,
        n_layers=2,
        dropout=0.1,
        cutoffs=[8],
        min_count=1,
    )
    configs = {
        "clipped": BiLMConfig(**small, cell_clip=3.0, proj_clip=3.0, forget_bias=1.0),
        "unclipped": BiLMConfig(**small),
        "word_char": BiLMConfig(**small, encoder="word_char", word_dim=12),
    }
    bilms = {}
    for i, (name, config) in enumerate(configs.items()):
        torch.manual_seed(i)
        bilms[name] = BiLM(config, vocab)
    return bilms


def training_step(bilm, precision: str) -> dict:
    bilm.train()
    bilm.precision = precision
    bilm.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    loss = bilm.lm_loss(bilm.batch(SENTENCES))
    total = loss.mean
    total.backward()
    out = {"loss": total.detach().float().numpy()}
    for name, parameter in bilm.named_parameters():
        if parameter.grad is not None:
            out[f"grad/{name}"] = parameter.grad.float().numpy().copy()
    bilm.zero_grad(set_to_none=True)
    bilm.precision = "float32"
    bilm.eval()
    return out


def embedder_outputs(bilm) -> dict:
    from elmo_spacy import Embedder

    out = {}
    settings = {
        "default": {},
        "primed": {"state": "primed"},
        "windows": {"window": 6, "window_overlap": 1, "max_batch_tokens": 16},
        "layers": {"layers": [2, 0]},
        "bfloat16": {"precision": "bfloat16"},
        "primed_bfloat16": {"state": "primed", "precision": "bfloat16"},
    }
    for name, kwargs in settings.items():
        embedder = Embedder(bilm, **kwargs)
        for i, array in enumerate(embedder.embed(SENTENCES)):
            out[f"{name}/{i}"] = array
    bilm.precision = "float32"
    return out


def stateful_outputs(bilm) -> dict:
    bilm.eval()
    bilm.stateful = True
    bilm.reset_state()
    out = {}
    with torch.no_grad():
        for i, part in enumerate((SENTENCES[:3], SENTENCES[3:6])):
            part = part + [[]] * (3 - len(part))
            part = [s or ["."] for s in part]
            out[f"batch{i}"] = bilm(bilm.batch(part)).numpy()
    bilm.stateful = False
    bilm.reset_state()
    return out


def pipe_outputs(bilm_dir: Path) -> dict:
    import spacy
    from spacy.tokens import Doc

    out = {}
    for name, config in {"default": {}, "primed": {"model": {"run": {"state": "primed"}}}}.items():
        nlp = spacy.blank("en")
        nlp.add_pipe("elmo", config=config)
        nlp.get_pipe("elmo").initialize(lambda: [], bilm_path=str(bilm_dir))
        docs = [Doc(nlp.vocab, words=s) for s in SENTENCES]
        for i, doc in enumerate(nlp.pipe(docs)):
            out[f"{name}/elmo/{i}"] = numpy.asarray(doc._.elmo)
            out[f"{name}/tensor/{i}"] = numpy.asarray(doc.tensor)
        model = nlp.get_pipe("elmo").model
        torch.manual_seed(3)
        layers, backprop = model.begin_update([Doc(nlp.vocab, words=s) for s in SENTENCES])
        grads = [model.ops.alloc(x.shape) + 1.0 / (1 + j) for j, x in enumerate(layers)]
        backprop(grads)
        for j, x in enumerate(layers):
            out[f"{name}/train_forward/{j}"] = numpy.asarray(x)
        shims = [s for node in model.walk() for s in node.shims]
        for s, shim in enumerate(shims):
            for pname, p in shim._model.named_parameters():
                if p.grad is not None:
                    out[f"{name}/train_grad/{s}/{pname}"] = p.grad.numpy().copy()
    return out


def export_outputs(bilm, folder: Path) -> dict:
    try:
        import onnxruntime
    except ImportError:
        return {}
    from elmo_spacy.bilm.formats.exported import export_bilm, serving_inputs

    export_bilm(bilm, folder, formats=["onnx"], with_states=True)
    session = onnxruntime.InferenceSession(str(folder / "bilm.onnx"))
    inputs = serving_inputs(bilm, SENTENCES, with_states=True)
    names = [i.name for i in session.get_inputs()]
    results = session.run(None, {n: inputs[n] for n in names})
    return {f"onnx/{i}": r for i, r in enumerate(results)}


def save(path: Path) -> None:
    from elmo_spacy.bilm import load_bilm, save_bilm

    torch.set_num_threads(2)
    arrays: dict[str, numpy.ndarray] = {}
    bilms = seeded_bilms()
    if (SHARED / "options.json").exists():
        tf = load_bilm(SHARED)
        arrays.update({f"bilm_tf/embed/{k}": v for k, v in embedder_outputs(tf).items()})
        arrays.update({f"bilm_tf/stateful/{k}": v for k, v in stateful_outputs(tf).items()})
    with tempfile.TemporaryDirectory() as tmp:
        for name, bilm in bilms.items():
            for precision in ("float32", "bfloat16"):
                for k, v in training_step(bilm, precision).items():
                    arrays[f"{name}/train/{precision}/{k}"] = v
            arrays.update({f"{name}/embed/{k}": v for k, v in embedder_outputs(bilm).items()})
            arrays.update({f"{name}/stateful/{k}": v for k, v in stateful_outputs(bilm).items()})
            folder = Path(tmp) / name
            save_bilm(bilm, folder)
            arrays.update({f"{name}/pipe/{k}": v for k, v in pipe_outputs(folder).items()})
            exported = Path(tmp) / f"{name}-export"
            exported.mkdir()
            arrays.update({f"{name}/{k}": v for k, v in export_outputs(bilm, exported).items()})
    numpy.savez(path, **arrays)
    print(f"{len(arrays)} arrays -> {path}")


def compare(before: Path, after: Path) -> int:
    a, b = numpy.load(before), numpy.load(after)
    differ = []
    for key in sorted(set(a.files) | set(b.files)):
        if key not in a.files or key not in b.files:
            differ.append(f"{key}: only in {'after' if key not in a.files else 'before'}")
        elif a[key].shape != b[key].shape or a[key].tobytes() != b[key].tobytes():
            diff = (
                numpy.abs(a[key].astype("float64") - b[key].astype("float64")).max()
                if a[key].shape == b[key].shape
                else "shape"
            )
            differ.append(f"{key}: differs (max |diff| {diff})")
    print("\n".join(differ) or f"all {len(a.files)} arrays bit-identical")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("save").add_argument("path", type=Path)
    cmp = sub.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "save":
        save(args.path)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
