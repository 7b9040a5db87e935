"""benchmarks/pretrain_throughput.py: the training step it times, and its split
into phases."""

import importlib.util
import itertools
import random

import pytest
import torch

from elmo_spacy.bilm import BiLM, WordVocab
from elmo_spacy.pretrain import PretrainConfig, bucketed_batches

from .conftest import DATA, ROOT, TINY_BILM, tokenize


def test_the_phases_of_a_step_add_up_to_its_speed_and_the_step_trains(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # its `import matmul_rates`
    spec = importlib.util.spec_from_file_location(
        "pretrain_throughput", ROOT / "benchmarks" / "pretrain_throughput.py"
    )
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    docs = tokenize((DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines()[:40])
    batches = list(bucketed_batches(docs, 600, random.Random(0)))
    torch.manual_seed(0)
    bilm = BiLM(TINY_BILM, WordVocab.build(docs, max_size=1000, min_count=1))
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
