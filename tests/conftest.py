"""Shared fixtures: a tiny pretrained biLM and a tiny AG News corpus, built once per session.

The plugin's tests (this folder) import nothing of the study (`scripts`); the
study's tests, in tests/study/, have their own helpers in tests/study/conftest.py,
and their corpus is the one the study's own code writes."""

import csv
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import spacy
import torch
from spacy.tokens import DocBin

# Without a GPU, Triton's kernels run on its interpreter (tests/test_lstm_implementations.py):
# it must be chosen before triton is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist (`make test` runs a worker a core) each worker computes on
# one thread, so that the workers' thread pools do not fight over the cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

from elmo_spacy.bilm import BiLMConfig
from elmo_spacy.pretrain import Corpus, PretrainConfig, prepare_docs, pretrain
from elmo_spacy.pretrain.texts import read_texts

TESTS = Path(__file__).parent
DATA = TESTS / "data"
ROOT = TESTS.parent
CONFIGS = ROOT / "configs"
# The console script of the interpreter running the tests, wherever PATH points.
ELMO_SPACY = str(Path(sys.executable).parent / "elmo-spacy")

TINY_BILM = BiLMConfig(
    max_chars=20,
    char_dim=8,
    filters=[(1, 16), (2, 16), (3, 16)],
    projection_dim=16,
    lstm_dim=32,
    n_layers=2,
    dropout=0.0,
    cutoffs=[100],
    min_count=1,
)


SCALAR_MIX = {"@architectures": "elmo_spacy.ScalarMix.v1", "trainable": True}


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run a command as a user does: `elmo-spacy ...` (the plugin's console
    script); anything else as given."""
    if args[0] == "elmo-spacy":
        args = (ELMO_SPACY, *args[1:])
    return subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)


def cli(*args) -> subprocess.CompletedProcess:
    """`elmo-spacy ARGS` in this process (typer's CliRunner), as `run` would
    report it: exit code, stdout, stderr. Faster than a process of its own;
    `run("elmo-spacy", ...)` is for what needs the console script itself.
    An exception that the command does not turn into an exit is raised."""
    from typer.testing import CliRunner

    from elmo_spacy.cli import app

    result = CliRunner().invoke(app, [str(arg) for arg in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def command_names(help_text: str) -> list[str]:
    """The command names in the "Commands" box of a typer --help, in order (the
    first word of each row that starts one; continuation rows start with spaces)."""
    box = help_text.split("Commands")[1].split("╰")[0]
    return re.findall(r"^│ (\S+)  ", box, flags=re.M)


def tokenize(texts):
    tokenizer = spacy.blank("en").tokenizer
    return [[t.text for t in doc] for doc in tokenizer.pipe(texts)]


_CORPORA: dict[str, Path] = {}  # prepared corpora of this session, by their docs


def corpus_of(docs: list[list[str]]) -> Corpus:
    """The prepared corpus of tokenised docs (`prepare_docs`), written once a session."""
    key = json.dumps(docs)
    if key not in _CORPORA:
        folder = Path(tempfile.mkdtemp(prefix="corpus-", dir=_CORPUS_ROOT[0]))
        _CORPORA[key] = prepare_docs(docs, folder)
    return Corpus.open([_CORPORA[key]])


_CORPUS_ROOT: list[Path] = []


@pytest.fixture(scope="session", autouse=True)
def _corpus_root(tmp_path_factory):
    _CORPUS_ROOT.append(tmp_path_factory.mktemp("corpora"))


CLASSES = ("World", "Sports", "Business", "Sci/Tech")  # AG News' labels 1-4


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    """train.spacy and dev.spacy (every fifth row) from the fixture CSV (120
    AG News rows: "class","title","description"), docs with exclusive
    `doc.cats`, and pretrain.txt (the train rows' texts, then unlabeled.txt).
    The texts as the CSV has them: the plugin needs no cleaned AG News."""
    out = tmp_path_factory.mktemp("corpus")
    with (DATA / "train.csv").open(encoding="utf-8", newline="") as file:
        rows = [(CLASSES[int(c) - 1], f"{title}. {text}") for c, title, text in csv.reader(file)]
    splits = {"train": [r for i, r in enumerate(rows) if i % 5], "dev": rows[::5]}
    nlp = spacy.blank("en")
    for name, split in splits.items():
        docbin = DocBin()
        for (label, _), doc in zip(split, nlp.tokenizer.pipe(text for _, text in split)):
            doc.cats = {c: float(c == label) for c in CLASSES}
            docbin.add(doc)
        docbin.to_disk(out / f"{name}.spacy")
    unlabeled = (DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines()
    texts = [text for _, text in splits["train"]] + [t for t in unlabeled if t.strip()]
    (out / "pretrain.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    return out


@pytest.fixture(scope="session")
def bilm_dir(tmp_path_factory, corpus_dir) -> Path:
    """A tiny biLM pretrained for a few epochs on the fixture texts."""
    out = tmp_path_factory.mktemp("bilm")
    docs = tokenize(read_texts(corpus_dir / "pretrain.txt"))
    settings = PretrainConfig(max_epochs=3, batch_tokens=1500, learning_rate=0.005, patience=0)
    pretrain(corpus_of(docs), TINY_BILM, settings, out, show_progress=False)
    return out / "model-best"


def make_nlp(
    bilm_dir: Path,
    mix: dict = None,
    grad_factor: float = 1.0,
    textcat_model: dict = None,
    elmo: dict | None = None,
    elmo_model: dict | None = None,
):
    """An initialisable `elmo` + `textcat` pipeline on the tiny biLM; `elmo`:
    settings of the `elmo` pipe, `elmo_model`: of its model (how it runs)."""
    overrides = {
        "paths.bilm": str(bilm_dir),
        "components.textcat.model.tok2vec.grad_factor": grad_factor,
    }
    config = spacy.util.load_config(CONFIGS / "textcat_tiny.cfg", overrides=overrides)
    if mix is not None:
        config["components"]["textcat"]["model"]["tok2vec"]["mix"] = mix
    if textcat_model is not None:
        tok2vec = config["components"]["textcat"]["model"]["tok2vec"]
        config["components"]["textcat"]["model"] = {**textcat_model, "tok2vec": tok2vec}
    if elmo is not None:
        config["components"]["elmo"].update(elmo)
    if elmo_model is not None:
        config["components"]["elmo"]["model"].update(elmo_model)
    return spacy.util.load_model_from_config(config, auto_fill=True, validate=True)


def examples(nlp, path: Path):
    from spacy.tokens import DocBin
    from spacy.training import Example

    return [Example(nlp.make_doc(d.text), d) for d in DocBin().from_disk(path).get_docs(nlp.vocab)]
