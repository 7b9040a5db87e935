"""Data-parallel pretraining: two ranks under torchrun, each mapping the same
prepared corpus and building its own share of each batch, train the
single-process model, and a killed two-rank run resumes. Two torchrun
launchers (`--nnodes 2`) stand in for two machines, sharing a filesystem or
each with its own."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from elmo_spacy.bilm import BiLM, WordVocab, load_bilm
from elmo_spacy.bilm.inputs.vocab import SPECIALS
from elmo_spacy.pretrain import join_process_group
from elmo_spacy.pretrain.loop import RankLoss
from elmo_spacy.pretrain.run_folder import LATEST

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
    if done.returncode != 0:
        fail_with_logs(rank_logs(output), done.stderr)
    return json.loads((output / "pretrain_log.json").read_text())


def fail_with_logs(logs: Path, stderr: str) -> None:
    """Fail with each rank's own last words (torchrun's --log-dir), then torchrun's."""
    texts = {log: log.read_text(errors="replace") for log in logs.glob("**/*.log")}
    said = [f"--- {log.relative_to(logs)}:\n{text[-3000:]}" for log, text in texts.items() if text]
    pytest.fail("\n".join([*sorted(said), "--- torchrun:", stderr[-1200:]]))


def run_on_two_machines(
    machines: list[Path], corpus: str, output: str, *extra: str, rendezvous: str = "c10d"
) -> list[subprocess.CompletedProcess]:
    """Two torchrun launchers of one rank each (`--nnodes 2`), standing in for
    two machines: launcher k runs in `machines[k]`, where the relative paths
    `corpus` and `output` lead (one folder for both: a shared filesystem;
    two: a disk each). With the c10d rendezvous the launchers draw the
    ranks; with "static", launcher k is rank k."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
    if rendezvous == "c10d":
        meet = ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "t"]
    else:
        meet = ["--master_addr", "127.0.0.1", "--master_port", str(port)]
    program = [str(Path(sys.executable).parent / "elmo-spacy"), "pretrain", str(CONFIG)]
    launchers = []
    for k, machine in enumerate(machines):
        node = ["--node_rank", str(k)] if rendezvous == "static" else []
        logs = ["--log-dir", str(machine / f"ranks-{k}"), "--redirects", "3"]
        command = [*torchrun, *meet, *node, *logs, "--nproc_per_node", "1", "--no-python"]
        command += [*program, corpus, output, *OPTIONS, *extra]
        launchers.append(
            subprocess.Popen(
                command, cwd=machine, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
        )
    done = []
    for launcher in launchers:
        _, stderr = launcher.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(launcher.args, launcher.returncode, "", stderr))
    for k, run in enumerate(done):
        if run.returncode != 0:
            fail_with_logs(machines[k], run.stderr.decode(errors="replace"))
    return done


def machines_with_text(tmp_path: Path, corpus_dir: Path, n: int = 2) -> list[Path]:
    """n machine folders, each with its own copy of the text."""
    machines = [tmp_path / f"machine-{k}" for k in range(n)]
    for machine in machines:
        machine.mkdir()
        shutil.copy(corpus_dir / "pretrain.txt", machine / "pretrain.txt")
    return machines


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
        loss, _ = RankLoss(bilm, world_size)(bilm.batch(docs), batch_tokens, 1.0)
        loss.backward()
        return [p.grad.clone() for p in bilm.parameters()]

    whole = gradients(docs, 1)
    halves = [gradients(docs[rank::2], 2) for rank in range(2)]
    for full, first, second in zip(whole, *halves):
        torch.testing.assert_close((first + second) / 2, full, rtol=1e-4, atol=1e-6)
    assert bilm.lm_loss(bilm.batch(docs)).n_tokens == batch_tokens


def test_data_parallel_losses_reach_every_parameter():
    """DistributedDataParallel runs without searching for unused parameters
    (find_unused_parameters=False): a rank's loss must give every parameter
    a gradient, even where its share has no word of a tail cluster."""
    docs = tokenize((DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines()[:40])
    bilm = BiLM(TINY_BILM, WordVocab.build(docs, max_size=500, min_count=1))
    head = bilm.vocab.words[len(SPECIALS) : bilm.softmax.cluster_starts[0]]
    batch = bilm.batch([head[:12], head[30:40]])  # no word of the tail cluster

    def without_gradient(every_parameter: bool) -> list[str]:
        bilm.zero_grad(set_to_none=True)
        loss = bilm.lm_loss(batch, every_parameter=every_parameter)
        (loss.forward_nll + loss.backward_nll).backward()
        return [name for name, p in bilm.named_parameters() if p.grad is None]

    assert without_gradient(False), "the tail cluster should go unused on these docs"
    assert without_gradient(True) == []
    for name, parameter in bilm.softmax.named_parameters():
        if name.startswith("head.tail"):
            assert not parameter.grad.any(), name  # a zero gradient: no change to training


@pytest.mark.slow  # the two-launcher test below trains the same in the default run
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


@pytest.mark.slow  # two launchers and a single-process run to compare with (21 s)
def test_two_machines_sharing_a_filesystem_train_the_single_process_model(
    tmp_path, prepared, single_process_run
):
    run_on_two_machines([tmp_path, tmp_path], str(prepared), str(tmp_path / "run"))
    log = json.loads((tmp_path / "run" / "pretrain_log.json").read_text())
    assert log["world_size"] == 2 and log["ranks_by_folder"] == [[0, 1]]
    assert_same_weights(single_process_run / "model-last", tmp_path / "run" / "model-last")


@pytest.mark.slow  # two more runs: make test-slow
def test_two_machines_with_disks_of_their_own_train_and_resume_on_one(
    tmp_path, corpus_dir, single_process_run
):
    """Each machine prepares its own copy of the text; rank 0's machine holds
    the run, which then resumes there in one process."""
    machines = machines_with_text(tmp_path, corpus_dir)
    half = ("--training.max_epochs", "2")
    run_on_two_machines(machines, "pretrain.txt", "run", *half, rendezvous="static")
    first, second = (machine / "run" for machine in machines)
    log = json.loads((first / "pretrain_log.json").read_text())
    assert log["world_size"] == 2 and log["ranks_by_folder"] == [[0], [1]]
    assert (second / "corpus").is_dir() and not (second / "pretrain_log.json").exists()
    log = run_pretrain(first, machines[0] / "pretrain.txt", 1, "--resume")
    assert log["resumed_from"] is not None and log["world_size"] == 1
    assert_same_weights(single_process_run / "model-last", first / "model-last")


@pytest.mark.slow  # two more runs: make test-slow
def test_a_one_process_checkpoint_resumes_on_two_machines_with_disks_of_their_own(
    tmp_path, corpus_dir, single_process_run
):
    """Rank 0's machine holds the checkpoint; the other machine is sent it."""
    machines = machines_with_text(tmp_path, corpus_dir)
    first = machines[0] / "run"
    run_pretrain(first, machines[0] / "pretrain.txt", 1, "--training.max_epochs", "2")
    run_on_two_machines(machines, "pretrain.txt", "run", "--resume", rendezvous="static")
    log = json.loads((first / "pretrain_log.json").read_text())
    assert log["resumed_from"] is not None
    assert log["world_size"] == 2 and log["ranks_by_folder"] == [[0], [1]]
    assert_same_weights(single_process_run / "model-last", first / "model-last")


def test_machines_that_see_other_text_under_the_same_path_are_refused(tmp_path, corpus_dir):
    machines = machines_with_text(tmp_path, corpus_dir)
    text = machines[1] / "pretrain.txt"
    text.write_text(text.read_text(encoding="utf-8") + "one more doc\n", encoding="utf-8")
    with pytest.raises(pytest.fail.Exception, match="reads another corpus than rank 0") as failed:
        run_on_two_machines(machines, "pretrain.txt", "run", rendezvous="static")
    assert "The 2 ranks see 2 different output folders" in str(failed.value)  # rank 0 says so


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_gpu_asked_for_without_one_says_what_to_do():
    with pytest.raises(ValueError, match="no CUDA device.*--gpu-id -1"):
        join_process_group(gpu_id=0)
