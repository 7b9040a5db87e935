"""Data-parallel pretraining: two ranks under torchrun, each mapping the same
prepared corpus and building its own share of each batch, train the
single-process model, and a killed two-rank run resumes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from elmo_spacy.bilm import BiLM, WordVocab, load_bilm
from elmo_spacy.pretrain import start_workers
from elmo_spacy.pretrain.run_folder import LATEST
from elmo_spacy.pretrain.train import ShareLoss

from .conftest import DATA, TINY_BILM, cli, tokenize

CONFIG = DATA.parent.parent / "configs" / "bilm_tiny.cfg"
OPTIONS = [
    "--training.max_epochs", "4", "--training.batch_tokens", "500",
    "--training.checkpoint_every", "3",
]  # fmt: skip
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}  # a crash shows where


def pretrain_command(output: Path, corpus: Path, ranks: int, *extra: str) -> list[str]:
    program = [str(Path(sys.executable).parent / "elmo-spacy"), "pretrain"]
    if ranks > 1:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        logs = ["--log-dir", str(rank_logs(output)), "--redirects", "3"]
        program = [*torchrun, *logs, "--nproc_per_node", str(ranks), "--no-python", *program]
    return [*program, str(CONFIG), str(corpus), str(output), *OPTIONS, *extra]


def rank_logs(output: Path) -> Path:
    """Where torchrun writes each rank's stdout and stderr: beside `output`."""
    return output.with_name(f"{output.name}-ranks")


def run_pretrain(output: Path, corpus: Path, ranks: int, *extra: str) -> dict:
    """Run `elmo-spacy pretrain` to the end; returns its log."""
    done = subprocess.run(
        pretrain_command(output, corpus, ranks, *extra), capture_output=True, text=True, env=ENV
    )
    if done.returncode != 0:  # each rank's own last words, then torchrun's
        logs = {log: log.read_text(errors="replace") for log in rank_logs(output).glob("**/*.log")}
        said = [
            f"--- {log.relative_to(rank_logs(output))}:\n{text[-3000:]}"
            for log, text in logs.items()
            if text
        ]
        pytest.fail("\n".join([*sorted(said), "--- torchrun:", done.stderr[-1200:]]))
    return json.loads((output / "pretrain_log.json").read_text())


def assert_same_weights(a: Path, b: Path) -> None:
    """Equal up to float rounding: the ranks sum the batch's gradient in another order."""
    a_weights, b_weights = load_bilm(a).state_dict(), load_bilm(b).state_dict()
    for key in a_weights:
        torch.testing.assert_close(a_weights[key], b_weights[key], rtol=0, atol=1e-4, msg=key)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, corpus_dir) -> Path:
    """The fixture text as a prepared corpus."""
    output = tmp_path_factory.mktemp("prepared") / "corpus"
    assert cli("prepare", corpus_dir / "pretrain.txt", output).returncode == 0
    return output


@pytest.fixture(scope="module")
def single_process_run(tmp_path_factory, prepared) -> Path:
    output = tmp_path_factory.mktemp("single")
    run_pretrain(output, prepared, 1)
    return output


def test_shard_losses_average_to_the_whole_batch_gradient():
    docs = tokenize((DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines()[:6])
    torch.manual_seed(0)
    bilm = BiLM(TINY_BILM, WordVocab.build(docs, max_size=500, min_count=1))
    batch_tokens = sum(len(doc) + 1 for doc in docs)

    def gradients(docs, world_size):
        bilm.zero_grad()
        loss, _ = ShareLoss(bilm, world_size)(bilm.batch(docs), batch_tokens, 1.0)
        loss.backward()
        return [p.grad.clone() for p in bilm.parameters()]

    whole = gradients(docs, 1)
    halves = [gradients(docs[rank::2], 2) for rank in range(2)]
    for full, first, second in zip(whole, *halves):
        torch.testing.assert_close((first + second) / 2, full, rtol=1e-4, atol=1e-6)
    assert bilm.lm_loss(bilm.batch(docs)).n_tokens == batch_tokens


def test_two_ranks_train_the_single_process_model(tmp_path, prepared, single_process_run):
    log = run_pretrain(tmp_path, prepared, 2)
    assert_same_weights(single_process_run / "model-last", tmp_path / "model-last")
    single = json.loads((single_process_run / "pretrain_log.json").read_text())
    assert log["world_size"] == 2 and single["world_size"] == 1
    assert log["steps"] == single["steps"]
    assert [e["dev_perplexity"]["mean"] for e in log["epochs"]] == pytest.approx(
        [e["dev_perplexity"]["mean"] for e in single["epochs"]], rel=1e-3
    )
    assert [e["train_tokens"] for e in log["epochs"]] == [
        e["train_tokens"] for e in single["epochs"]
    ]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [f"checkpoint-{log['steps']}"]


@pytest.mark.slow  # two more runs: make test-slow
def test_two_ranks_train_the_single_process_model_on_padded_batches(tmp_path, prepared):
    """With shape_buckets each rank pads its own share of each batch: the
    same training as one process padding the whole batch."""
    padded = ("--training.shape_buckets", "4")
    single = run_pretrain(tmp_path / "single", prepared, 1, *padded)
    log = run_pretrain(tmp_path / "two", prepared, 2, *padded)
    assert_same_weights(tmp_path / "single" / "model-last", tmp_path / "two" / "model-last")
    assert log["steps"] == single["steps"] and log["training"]["shape_buckets"] == 4
    assert [e["train_tokens"] for e in log["epochs"]] == [
        e["train_tokens"] for e in single["epochs"]
    ]


@pytest.mark.slow  # over 30 s: make test-slow
def test_two_ranks_killed_then_resumed_match_the_single_process_model(
    tmp_path, prepared, single_process_run
):
    run = subprocess.Popen(
        pretrain_command(tmp_path, prepared, 2),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
        start_new_session=True,
    )
    pointer = tmp_path / LATEST
    deadline = time.monotonic() + 120
    while not pointer.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGKILL)  # torchrun and both ranks
    run.wait()
    assert run.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (tmp_path / "pretrain_log.json").exists()
    log = run_pretrain(tmp_path, prepared, 2, "--resume")
    assert log["resumed_from"] is not None and log["world_size"] == 2
    assert_same_weights(single_process_run / "model-last", tmp_path / "model-last")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_gpu_asked_for_without_one_says_what_to_do():
    with pytest.raises(ValueError, match="no CUDA device.*--gpu-id -1"):
        start_workers(gpu_id=0)
