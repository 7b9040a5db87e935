"""benchmarks/pretrain_throughput.py: the training step it times, and its split
into phases."""

import itertools
import random

import pytest
import torch

from elmo_spacy.bilm import BiLM, WordVocab
from elmo_spacy.pretrain import PretrainConfig, bucketed_batches

from .benchmark_scripts import load_benchmark
from .conftest import DATA, TINY_BILM, tokenize

DOCS = tokenize((DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines()[:40])


@pytest.fixture
def benchmark(monkeypatch):
    return load_benchmark("pretrain_throughput", monkeypatch)


def tiny_bilm() -> BiLM:
    torch.manual_seed(0)
    return BiLM(TINY_BILM, WordVocab.build(DOCS, max_size=1000, min_count=1))


def test_the_phases_of_a_step_add_up_to_its_speed_and_the_step_trains(benchmark):
    batches = list(bucketed_batches(DOCS, 600, random.Random(0)))
    bilm = tiny_bilm()
    before = {k: v.clone() for k, v in bilm.state_dict().items()}
    steps = 4

    speed, ms_per_step = benchmark.train_steps(bilm, batches, steps, PretrainConfig())

    assert list(ms_per_step) == ["forward", "backward", "optimizer"]
    assert all(ms > 0 for ms in ms_per_step.values())
    timed = itertools.islice(itertools.cycle(batches), 3, 3 + steps)  # after 3 warm-up steps
    tokens = sum(len(doc) + 1 for batch in timed for doc in batch)  # words and </S>
    seconds = sum(ms_per_step.values()) * steps / 1e3
    assert speed == pytest.approx(tokens / seconds, rel=0.05)  # phases are rounded to 0.1 ms
    after = bilm.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_the_profile_covers_every_step(benchmark):
    batches = list(bucketed_batches(DOCS, 600, random.Random(0)))
    steps = 2
    operators = benchmark.profiled_steps(tiny_bilm(), batches, steps, PretrainConfig())
    kernel = [op for op in operators if op.key == "_LstmLayers"]  # the CPU's training kernel
    # one call per layer for both directions, in each timed and warm-up step
    assert kernel and kernel[0].count == (steps + 3) * TINY_BILM.n_layers
