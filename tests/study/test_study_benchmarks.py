"""The benchmarks that run the study (scripts/), as tests/test_benchmarks.py
runs the others: the study's head's BiLSTM (benchmarks/head_bilstm.py) and the
fine-tuning study (benchmarks/finetune_study.py, `python -m scripts train` and
`evaluate`). Marked `benchmark`: `make test-benchmarks`, not `make test`."""

import json

import pytest

from ..test_benchmarks import TRAIN_CSV, benchmark_output, run_benchmark

pytestmark = pytest.mark.benchmark


def test_head_bilstm():
    assert run_benchmark("head_bilstm", "--text", TRAIN_CSV, "--docs", "50", "--rounds", "1")


def test_finetune_study_runs_the_recipe_its_baseline_and_resumes(bilm_dir, corpus_dir, tmp_path):
    data = tmp_path / "data"
    (data / "training" / "bilm").mkdir(parents=True)
    (data / "corpus").symlink_to(corpus_dir)
    (data / "training" / "bilm" / "model-best").symlink_to(bilm_dir)
    unfreezing = "components.elmo.model.fine_tuning.trainable_layers"
    args = ["textcat", "--workdir", tmp_path / "work", "--data", data, "--seeds", "0"]
    args += ["--variants", "frozen", "finetune", "--tfidf"]
    for key, value in [
        ("training.max_steps", 4),
        ("training.eval_frequency", 2),
        (f"{unfreezing}.frozen_steps", 1),
        (f"{unfreezing}.steps_per_layer", 1),
    ]:
        args += ["--override", key, value]
    frozen, finetune, tfidf = run_benchmark("finetune_study", *args)
    assert [frozen["variant"], finetune["variant"], tfidf["variant"]] == [
        "frozen",
        "finetune",
        "tfidf-svm",
    ]
    for run in (frozen, finetune):
        assert 0 <= run["dev_accuracy"] <= 1 and run["minutes"] > 0
        assert run["peak_rss_mb"] > 100
    assert "--training.max_steps 4" in finetune["command"]
    assert 0 < tfidf["dev_accuracy"] <= 1
    # Stopped and run again, a study reads the runs it has.
    output = benchmark_output("finetune_study", *args)
    assert "| finetune | 1 |" in output
    assert [json.loads(line)["minutes"] for line in output.splitlines()[:2]] == [
        frozen["minutes"],
        finetune["minutes"],
    ]
