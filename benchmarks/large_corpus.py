"""Pretraining on a large corpus: preparation's rates, pretraining's memory and
start-up on corpora of growing size, the step fed from a prepared corpus
against the same batches built in memory, and the batch builder alone.

    python benchmarks/large_corpus.py prepare TEXT [--tokens 5000000]
    python benchmarks/large_corpus.py memory [--sizes 2M 20M 200M] [--steps 20]
        [--baseline-commit 0f05efe] [--baseline-sizes 2M 20M]
    python benchmarks/large_corpus.py step CORPUS [--shapes default original] [--steps 12]
    python benchmarks/large_corpus.py builder CORPUS [--batches 100]
    python benchmarks/large_corpus.py vocab [--caps 40000 0] [--cutoffs JSON] [--div-value 4]
        [--shape small|original] [--gpu-id 0]

`prepare`: TEXT (a doc per line) repeated to about --tokens tokens, prepared
three ways, each run as a user runs it (`elmo-spacy prepare`, start-up
included): spaCy's tokenizer in 1 process, in 2, and --pretokenized.

`memory`: synthetic corpora of Zipf-distributed words (1M word types,
exponent 1.07, docs of 5 to 45 tokens) of each size, written as text and
prepared with --pretokenized; then `elmo-spacy pretrain configs/bilm.cfg` on
each for --steps steps, a process of its own: its peak resident memory
(GNU time's maximum resident set size), the seconds from its start to its first step (when the epoch's
progress bar appears, and the log's own count from `pretrain()`'s start), and
the whole run's wall time. With --baseline-commit, the text path of that
commit (the text read and tokenised at every start) on the text files of
--baseline-sizes beside it, from a git worktree of that commit.

`step`: pretraining's own loop (`pretrain()`, --steps steps) on CORPUS, fed
from the prepared corpus (batches built in a thread ahead of the step) and
fed the same batches built beforehand in memory, alternately, --rounds times;
tokens/s of each and their ratio, at configs/bilm.cfg ("default") and at
ELMo's original shape ("original": char CNN of 2,048 filters, LSTM 4,096
projected to 512, 2 highway layers; --original-batch-tokens, as a CPU's step
at 32,768 tokens takes minutes).

`builder`: the batch builder alone (token ids to a `TokenBatch` with its LM
targets), tokens/s, for the word encoder (configs/bilm.cfg) and the original
shape's char CNN, at 3,000 and 32,768 tokens a batch.

`vocab`: a synthetic corpus with a rare tail (--common Zipf(1.1) words,
--rare words once each), pretraining's step with the vocabulary capped at
each of --caps (0: uncapped): a small char-CNN biLM on the CPU, or the
original shape on a GPU (--shape original).

Every figure is one JSON line. The work files go to --workdir.
"""

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy
import torch
from safetensors.torch import load_file

import elmo_spacy.pretrain.train as train_module
from elmo_spacy.bilm import BiLM, BiLMConfig
from elmo_spacy.pretrain import Corpus, load_pretrain_config, pretrain
from elmo_spacy.pretrain.batches import BatchBuilder, corpus_vocabulary, dev_sample, epoch_batches

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "bilm.cfg"
ELMO_SPACY = str(Path(sys.executable).parent / "elmo-spacy")
ORIGINAL = {
    "encoder": "char_cnn",
    "char_ids": "bilm_tf",
    "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
    "n_highway": 2,
    "lstm_dim": 4096,
    "projection_dim": 512,
    "cell_clip": 3.0,
    "proj_clip": 3.0,
    "forget_bias": 1.0,
}
ZIPF_TYPES, ZIPF_EXPONENT = 1_000_000, 1.07


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/large_corpus"))
    parser.add_argument("--threads", type=int, default=2)
    sub = parser.add_subparsers(dest="part", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("text", type=Path)
    p.add_argument("--tokens", type=size, default=5_000_000)
    m = sub.add_parser("memory")
    m.add_argument("--sizes", type=size, nargs="+", default=[2 * 10**6, 20 * 10**6, 200 * 10**6])
    m.add_argument("--steps", type=int, default=20)
    m.add_argument("--repeats", type=int, default=3, help="runs of pretrain per corpus")
    m.add_argument(
        "--max-dev-tokens",
        type=int,
        default=40_000,
        help="the dev sample of every size (the 2M corpus's 2%%), so that only the corpus differs",
    )
    m.add_argument("--baseline-commit", default=None)
    m.add_argument("--baseline-sizes", type=size, nargs="*", default=[2 * 10**6, 20 * 10**6])
    s = sub.add_parser("step")
    s.add_argument("corpus", type=Path)
    s.add_argument("--shapes", nargs="+", default=["default", "original"])
    s.add_argument("--steps", type=int, default=12)
    s.add_argument("--rounds", type=int, default=2)
    s.add_argument("--original-batch-tokens", type=int, default=2048)
    b = sub.add_parser("builder")
    b.add_argument("corpus", type=Path)
    b.add_argument("--batches", type=int, default=100)
    v = sub.add_parser("vocab")
    v.add_argument("--tokens", type=size, default=25 * 10**6)
    v.add_argument("--common", type=size, default=100_000, help="Zipf(1.1) word types")
    v.add_argument("--rare", type=size, default=850_000, help="words seen once each")
    v.add_argument("--caps", type=int, nargs="+", default=[40_000, 0], help="0: uncapped")
    v.add_argument("--steps", type=int, default=30)
    v.add_argument("--cutoffs", default="[2000, 10000, 100000]", help="the softmax's, as JSON")
    v.add_argument("--div-value", type=float, default=4.0, help="the softmax's")
    v.add_argument(
        "--shape",
        choices=("small", "original"),
        default="small",
        help="small: configs/bilm_elmo.cfg at 256/64 on the CPU; original: "
        "configs/bilm_lm1b.cfg on a GPU (--gpu-id)",
    )
    v.add_argument("--gpu-id", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.workdir.mkdir(parents=True, exist_ok=True)
    parts = {"prepare": preparation, "memory": memory, "step": step, "builder": builder}
    parts["vocab"] = vocabulary_size
    parts[args.part](args)


def size(text: str) -> int:
    """ "200M" -> 200_000_000."""
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)([kMG]?)", text).groups()
    return int(float(number) * {"": 1, "k": 10**3, "M": 10**6, "G": 10**9}[unit])


def emit(**figures) -> None:
    print(json.dumps(figures), flush=True)


def preparation(args) -> None:
    lines = [line for line in args.text.read_text(encoding="utf-8").splitlines() if line.strip()]
    per_line = sum(len(line.split()) for line in lines[:2000]) / min(len(lines), 2000)
    repeats = max(1, round(args.tokens / (per_line * len(lines))))
    text = args.workdir / f"prepare-{args.text.stem}-x{repeats}.txt"
    if not text.exists():
        text.write_text("\n".join(lines * repeats) + "\n", encoding="utf-8")
    for name, options in (
        ("spacy, 1 process", []),
        ("spacy, 2 processes", ["--n-process", "2"]),
        ("pretokenized", ["--pretokenized"]),
    ):
        output = args.workdir / f"prepared-{name.replace(' ', '').replace(',', '-')}"
        started = time.perf_counter()
        done = subprocess.run(
            [ELMO_SPACY, "prepare", str(text), str(output), "--overwrite", *options],
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
        assert done.returncode == 0, done.stderr[-2000:]
        tokens = json.loads((output / "manifest.json").read_text())["tokens"]
        emit(
            part="prepare",
            tokenizer=name,
            text_mb=round(text.stat().st_size / 1e6, 1),
            tokens=tokens,
            seconds=round(seconds, 1),
            tokens_per_second=round(tokens / seconds),
        )


def zipf_text(path: Path, n_tokens: int, seed: int = 0) -> None:
    """A text of about `n_tokens` words drawn from a Zipf distribution over
    ZIPF_TYPES made-up words, in docs of 5 to 45 words, one a line."""
    rng = numpy.random.default_rng(seed)
    lengths = rng.integers(3, 12, ZIPF_TYPES)
    letters = numpy.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype="uint8")
    pool = letters[rng.integers(0, 26, int(lengths.sum()))].tobytes()
    ends = numpy.cumsum(lengths)
    words = [pool[e - n : e] for e, n in zip(ends.tolist(), lengths.tolist())]
    spaced = numpy.array([w + b" " for w in words], dtype=object)
    ended = numpy.array([w + b"\n" for w in words], dtype=object)
    cdf = numpy.cumsum(1.0 / numpy.arange(1, ZIPF_TYPES + 1) ** ZIPF_EXPONENT)
    cdf /= cdf[-1]
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("wb") as file:
        written = 0
        while written < n_tokens:
            n = min(10_000_000, n_tokens - written)
            ranks = numpy.searchsorted(cdf, rng.random(n))
            doc_ends = numpy.cumsum(rng.integers(5, 46, n // 5 + 1))
            doc_ends = doc_ends[doc_ends <= n]
            if not len(doc_ends) or doc_ends[-1] != n:
                doc_ends = numpy.append(doc_ends, n)
            chunk = spaced[ranks]
            chunk[doc_ends - 1] = ended[ranks[doc_ends - 1]]
            file.write(b"".join(chunk))
            written += n
    os.replace(temporary, path)


def timed_run(command: list[str], env: dict | None = None) -> dict:
    """Run a pretraining command; its peak resident memory (MB), wall time,
    and the seconds to the first appearance of its epoch's progress bar.

    The peak is GNU time's (/usr/bin/time, in its own small process): a
    process that this one starts directly would inherit this one's peak
    through the exec (Linux keeps the larger of the two)."""
    env = {**(env or os.environ), "PYTHONUNBUFFERED": "1"}  # the bar's "\r" lines as written
    peak_file = Path(tempfile.mkstemp(prefix="peak-")[1])
    started = time.perf_counter()
    process = subprocess.Popen(
        ["/usr/bin/time", "-o", str(peak_file), "-f", "%M", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    bar_seen: list[float] = []
    said: list[str] = []
    for chunk in iter(lambda: os.read(process.stderr.fileno(), 65536), b""):
        said.append(chunk.decode(errors="replace"))  # what it writes, as soon as it writes it
        if not bar_seen and "epoch 1" in "".join(said[-2:]):
            bar_seen.append(time.perf_counter() - started)
    process.wait()
    wall = time.perf_counter() - started
    assert process.returncode == 0, "".join(said)[-3000:]
    peak_kb = int(peak_file.read_text().split()[-1])
    peak_file.unlink()
    return {
        "peak_rss_mb": round(peak_kb / 1024),
        "seconds_to_first_step": round(bar_seen[0], 1) if bar_seen else None,
        "wall_seconds": round(wall, 1),
    }


def memory(args) -> None:
    common = [
        "--training.max_steps", str(args.steps), "--training.checkpoint_every", "0",
        "--training.max_epochs", "1",
    ]  # fmt: skip
    options = [*common, "--training.max_dev_tokens", str(args.max_dev_tokens)]
    for n_tokens in args.sizes:
        label = human(n_tokens)
        text = args.workdir / f"zipf-{label}.txt"
        if not text.exists():
            zipf_text(text, n_tokens)
        corpus = args.workdir / f"zipf-{label}"
        started = time.perf_counter()
        prepare_pretokenized(text, corpus)
        manifest = json.loads((corpus / "manifest.json").read_text())
        emit(
            part="memory: prepare --pretokenized",
            corpus=label,
            tokens=manifest["tokens"],
            types=manifest["types"],
            seconds=round(time.perf_counter() - started, 1),
            disk_mb=round(sum(f.stat().st_size for f in corpus.rglob("*.bin")) / 1e6),
        )
        output = args.workdir / f"run-{label}"
        command = [ELMO_SPACY, "pretrain", str(CONFIG), str(corpus), str(output), "--overwrite"]
        for _ in range(args.repeats):
            run = timed_run([*command, *options])
            log = json.loads((output / "pretrain_log.json").read_text())
            emit(
                part="memory: pretrain, prepared corpus",
                corpus=label,
                steps=log["steps"],
                dev_tokens=log["dev"]["tokens"],
                **run,
                log_seconds_to_first_step=round(log["seconds_to_first_step"], 2),
            )
    if args.baseline_commit:
        tree = args.workdir / f"baseline-{args.baseline_commit}"
        if not tree.exists():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=True)
            subprocess.run(
                [
                    "git",
                    "-C",
                    str(ROOT),
                    "worktree",
                    "add",
                    "--detach",
                    str(tree),
                    args.baseline_commit,
                ],
                check=True,
                capture_output=True,
            )
        program = [sys.executable, "-c", "import sys; from elmo_spacy.cli import app; app()"]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        check = subprocess.run(
            [sys.executable, "-c", "import elmo_spacy; print(elmo_spacy.__file__)"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert check.stdout.startswith(str(tree)), check.stdout
        for n_tokens in args.baseline_sizes:
            label = human(n_tokens)
            output = args.workdir / f"baseline-run-{label}"
            text = args.workdir / f"zipf-{label}.txt"
            command = [*program, "pretrain", str(CONFIG), str(text), str(output), "--overwrite"]
            for _ in range(args.repeats):  # (that commit's dev sample: 2% of the docs, no cap)
                run = timed_run([*command, *common], env=env)
                emit(
                    part=f"memory: pretrain, text path of {args.baseline_commit}",
                    corpus=label,
                    **run,
                )


def rare_tail_text(path: Path, n_tokens: int, common: int, rare: int, seed: int = 0) -> None:
    """About `n_tokens` words: `common` made-up words drawn from Zipf(1.1),
    and `rare` other words once each at random places; docs of 5 to 45
    words, one a line."""
    rng = numpy.random.default_rng(seed)
    letters = numpy.array(list("abcdefghijklmnopqrstuvwxyz"))
    common_words = ["".join(rng.choice(letters, rng.integers(3, 10))) for _ in range(common)]
    cdf = numpy.cumsum(1.0 / numpy.arange(1, common + 1) ** 1.1)
    words = numpy.array(common_words, dtype=object)[
        numpy.searchsorted(cdf / cdf[-1], rng.random(n_tokens - rare))
    ]
    rare_words = numpy.array([f"q{i:x}z" for i in range(rare)], dtype=object)  # no common word
    words = numpy.insert(words, rng.integers(0, len(words), rare), rare_words)
    ends = numpy.cumsum(rng.integers(5, 46, len(words) // 5 + 1))
    ends = ends[ends < len(words)]
    with path.open("w", encoding="utf-8") as file:
        for doc in numpy.split(words, ends):
            file.write(" ".join(doc) + "\n")


def prepare_pretokenized(text: Path, corpus: Path) -> None:
    """`elmo-spacy prepare TEXT CORPUS --pretokenized`, in a process of its own."""
    done = subprocess.run(
        [ELMO_SPACY, "prepare", str(text), str(corpus), "--pretokenized"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def vocabulary_size(args) -> None:
    """Pretraining steps of a small char-CNN biLM (configs/bilm_elmo.cfg at
    256 / 64, --cutoffs, min_count 1) with the
    vocabulary capped and uncapped, each run a process of its own: tokens/s,
    peak memory, the softmax's parameters and Adam's state for them."""
    label = f"{human(args.tokens)}-{human(args.rare)}rare"
    text, corpus = args.workdir / f"tail-{label}.txt", args.workdir / f"tail-{label}"
    if not text.exists():
        rare_tail_text(text, args.tokens, args.common, args.rare)
    if not (corpus / "manifest.json").exists():
        prepare_pretokenized(text, corpus)
    manifest = json.loads((corpus / "manifest.json").read_text())
    emit(part="vocab: corpus", tokens=manifest["tokens"], types=manifest["types"])
    if args.shape == "original":
        return vocabulary_size_on_gpu(args, corpus)
    for cap in args.caps:
        output = args.workdir / f"tail-run-{cap}"
        command = [
            ELMO_SPACY, "pretrain", str(ROOT / "configs" / "bilm_elmo.cfg"), str(corpus),
            str(output), "--overwrite", "--bilm.lstm_dim", "256", "--bilm.projection_dim", "64",
            "--bilm.cutoffs", args.cutoffs, "--bilm.div_value", str(args.div_value),
            "--bilm.min_count", "1",
            "--bilm.max_vocab_size", str(cap or 10**8), "--training.max_steps", str(args.steps),
            "--training.batch_tokens", "3000", "--training.max_epochs", "1",
            "--training.checkpoint_every", "0", "--training.max_dev_tokens", "3000",
        ]  # fmt: skip
        run = timed_run(command)
        log = json.loads((output / "pretrain_log.json").read_text())
        weights = load_file(str(output / "model-last" / "weights.safetensors"))
        softmax = sum(w.numel() for k, w in weights.items() if k.startswith("softmax."))
        emit(
            part="vocab: pretrain",
            cap=cap or "none",
            cutoffs=json.loads(args.cutoffs),
            div_value=args.div_value,
            vocab_size=log["vocab_size"],
            steps=log["steps"],
            tokens_per_second=round(log["epochs"][-1]["tokens_per_second"]),
            softmax_parameters=softmax,
            adam_state_mb=round(2 * 4 * sum(w.numel() for w in weights.values()) / 2**20),
            **run,
        )


def vocabulary_size_on_gpu(args, corpus: Path) -> None:
    """The original shape (configs/bilm_lm1b.cfg, min_count 1) on GPU
    `--gpu-id`, in bfloat16 on the training kernel, 32,768 tokens a step, the
    vocabulary capped and uncapped: pretraining's step
    (benchmarks/pretrain_throughput.py, a process each), its tokens/s, peak
    of allocated device memory and Adam's state."""
    for cap in args.caps:
        command = [
            sys.executable, str(ROOT / "benchmarks" / "pretrain_throughput.py"),
            str(ROOT / "configs" / "bilm_lm1b.cfg"), str(corpus), "--device",
            f"cuda:{args.gpu_id}", "--no-full-softmax", "--precisions", "bfloat16",
            "--kernels", "training", "--steps", str(args.steps), "--bilm.min_count", "1",
            "--bilm.max_vocab_size", str(cap or 10**8), "--bilm.cutoffs", args.cutoffs,
            "--bilm.div_value", str(args.div_value),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        for line in done.stdout.splitlines():
            if line.startswith('{"model"') and "tokens_per_second" in line:
                figures = json.loads(line)
                emit(
                    part="vocab: pretrain, original shape",
                    cap=cap or "none",
                    cutoffs=json.loads(args.cutoffs),
                    div_value=args.div_value,
                    **{k: figures[k] for k in RECORDED_ON_GPU},
                )


RECORDED_ON_GPU = (
    "vocab", "precision", "batch_tokens", "tokens_per_second", "ms_per_step",
    "optimizer_state_mb", "peak_device_mb",
)  # fmt: skip


def human(n: int) -> str:
    return f"{n // 10**6}M" if n % 10**6 == 0 else str(n)


def step(args) -> None:
    corpus = Corpus.open([args.corpus])
    bilm_config, training = load_pretrain_config(CONFIG)
    training = replace(
        training,
        max_steps=args.steps,
        max_epochs=1,
        checkpoint_every=0,
        max_dev_tokens=2000,
        log_every=args.steps,
    )
    shapes = {
        "default": (bilm_config, training),
        "original": (
            BiLMConfig(**{**bilm_config.to_dict(), **ORIGINAL}),
            replace(training, batch_tokens=args.original_batch_tokens),
        ),
    }
    for shape in args.shapes:
        config, settings = shapes[shape]
        speeds: dict[str, list[float]] = {"prepared": [], "in memory": []}
        for _ in range(args.rounds):
            for feed in speeds:
                output = args.workdir / f"step-{shape}"
                torch.manual_seed(0)
                with prebuilt_batches(corpus, config, settings, enabled=feed == "in memory"):
                    log = pretrain(
                        corpus, config, settings, output, overwrite=True, show_progress=False
                    )
                speeds[feed].append(log["epochs"][0]["tokens_per_second"])
        emit(
            part="step",
            shape=shape,
            batch_tokens=settings.batch_tokens,
            steps=args.steps,
            tokens_per_second={k: [round(v) for v in vs] for k, vs in speeds.items()},
            prepared_over_in_memory=round(
                numpy.median(speeds["prepared"]) / numpy.median(speeds["in memory"]), 3
            ),
        )


class prebuilt_batches:
    """While active (and `enabled`), pretraining's `BatchBuilder` hands out
    the batches of epoch 1 built beforehand, in memory, instead of building
    them from the corpus: the same batches, none of the building."""

    def __init__(self, corpus, config, settings, enabled: bool) -> None:
        self.enabled = enabled
        if not enabled:
            return
        sample = dev_sample(corpus, settings.dev_fraction, settings.max_dev_tokens, settings.seed)
        vocab = corpus_vocabulary(
            corpus.types, config.max_vocab_size, config.min_count, held_out=sample
        )  # pretraining's own
        build = BatchBuilder(corpus, BiLM(config, vocab))
        plans = epoch_batches(
            corpus,
            seed=settings.seed,
            epoch=1,
            max_length=settings.max_length,
            batch_tokens=settings.batch_tokens,
            exclude=sample.excluded_from(corpus),
        )
        self.batches = {key(p): build(p) for p in itertools.islice(plans, settings.max_steps)}

    def __enter__(self):
        if self.enabled:
            batches, real = self.batches, train_module.BatchBuilder

            class Prebuilt(real):
                def __call__(self, pieces):
                    found = batches.get(key(pieces))
                    return found if found is not None else super().__call__(pieces)

            self.real = real
            train_module.BatchBuilder = Prebuilt
        return self

    def __exit__(self, *_) -> None:
        if self.enabled:
            train_module.BatchBuilder = self.real


def key(pieces) -> bytes:
    return pieces.shard.tobytes() + pieces.start.tobytes() + pieces.length.tobytes()


def builder(args) -> None:
    corpus = Corpus.open([args.corpus])
    bilm_config, _ = load_pretrain_config(CONFIG)
    for name, config in (
        ("default (words)", bilm_config),
        (
            "original (char CNN)",
            BiLMConfig(**{**bilm_config.to_dict(), **ORIGINAL, "lstm_dim": 8, "projection_dim": 8}),
        ),
    ):
        vocab = corpus_vocabulary(corpus.types, config.max_vocab_size, config.min_count)
        started = time.perf_counter()
        build = BatchBuilder(corpus, BiLM(config, vocab))
        setup = time.perf_counter() - started
        for batch_tokens in (3000, 32768):
            plans = list(
                itertools.islice(
                    epoch_batches(
                        corpus,
                        seed=0,
                        epoch=1,
                        max_length=200,
                        batch_tokens=batch_tokens,
                        exclude=numpy.zeros(0, "int64"),
                    ),
                    args.batches,
                )
            )
            started = time.perf_counter()
            for pieces in plans:
                build(pieces)
            seconds = time.perf_counter() - started
            emit(
                part="builder",
                encoder=name,
                batch_tokens=batch_tokens,
                batches=len(plans),
                setup_seconds=round(setup, 2),
                tokens_per_second=round(sum(p.predictions for p in plans) / seconds),
            )


if __name__ == "__main__":
    main()
