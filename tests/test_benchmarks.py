"""The benchmark scripts run as a user runs them, on tiny settings: each exits 0
and prints its figures (JSON lines). Marked `benchmark`: `make test-benchmarks`
(pytest -m benchmark), not `make test`. The benchmarks that run the study
(scripts/) are tested by tests/study/test_study_benchmarks.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import CONFIGS, DATA, ROOT

pytestmark = pytest.mark.benchmark

BENCHMARKS = ROOT / "benchmarks"
SHARED = ROOT.parent / "shared" / "data"
TEXT = DATA / "unlabeled.txt"
TRAIN_CSV = DATA / "train.csv"


def benchmark_output(name: str, *args, timeout: int = 600) -> str:
    """What benchmarks/NAME.py ARGS, in a process of its own, printed."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=BENCHMARKS,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def run_benchmark(name: str, *args, timeout: int = 600) -> list[dict]:
    """The JSON lines benchmarks/NAME.py ARGS printed."""
    output = benchmark_output(name, *args, timeout=timeout)
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert lines, output[-2000:]
    return lines


def test_large_corpus_runs_every_part(tmp_path):
    work = ["--workdir", tmp_path]
    prepared = run_benchmark("large_corpus", *work, "prepare", TEXT, "--tokens", "20k")
    assert [line["tokenizer"] for line in prepared] == [
        "spacy, 1 process",
        "spacy, 2 processes",
        "pretokenized",
    ]
    memory = run_benchmark(
        "large_corpus", *work, "memory", "--sizes", "20k", "40k", "--steps", "2", "--repeats", "1"
    )
    runs = [line for line in memory if line["part"] == "memory: pretrain, prepared corpus"]
    assert len(runs) == 2 and all(r["peak_rss_mb"] > 0 and r["steps"] == 2 for r in runs)
    corpus = tmp_path / "zipf-20000"
    builder = run_benchmark("large_corpus", *work, "builder", corpus, "--batches", "3")
    assert all(line["tokens_per_second"] > 0 for line in builder)
    step = run_benchmark(
        "large_corpus",
        *work,
        "step",
        corpus,
        "--shapes",
        "default",
        "--steps",
        "2",
        "--rounds",
        "1",
    )
    assert step[0]["prepared_over_in_memory"] > 0


def test_pretrain_throughput_and_precision_perplexity(tmp_path):
    tiny = CONFIGS / "bilm_tiny.cfg"
    lines = run_benchmark(
        "pretrain_throughput", tiny, TEXT, "--steps", "2", "--no-full-softmax",
        "--precisions", "float32", "--kernels", "training", "loop", "--feeds", "built",
        "prepared", "--profile", "1", "--bilm.lstm_dim", "40",
    )  # fmt: skip
    runs = [line for line in lines if "feed" in line]  # each kernel from each feed
    assert len(runs) == 4 and len({(run["lstm_kernel"], run["feed"]) for run in runs}) == 4
    assert all(run["optimizer_state_mb"] > 0 and run["tokens_per_second"] > 0 for run in runs)
    assert any("float32_loop_prepared_over_float32" in line for line in lines)
    lines = run_benchmark(
        "precision_perplexity", tiny, TEXT, "--steps", "2", "--output-dir", tmp_path,
        "--kernel", "loop", "--bilm.lstm_dim", "40",
    )  # fmt: skip
    assert lines[0]["lstm_kernel"] == "loop"
    assert "bfloat16_dev_perplexity_over_float32" in lines[-1]


def test_matmul_and_step_product_rates():
    run_benchmark("matmul_rates", "--size", "256")  # each prints its figures
    run_benchmark("step_gemm_rates", "--rows", "8", "--shape", "pretraining")


def test_the_forward_at_the_published_shapes():
    lines = run_benchmark(
        "elmo_shapes", "--text", TRAIN_CSV, "--batches", "1", "--shapes", "small 2x1024_128",
        "--forwards", "clipped", "--rounds", "1",
    )  # fmt: skip
    assert any("tokens_per_second" in json.dumps(line) for line in lines)


@pytest.mark.skipif(
    not (SHARED / "allennlp_elmo").is_dir(), reason="needs ../shared/data/allennlp_elmo"
)
def test_primed_state_is_closer_to_the_reference_than_zero_state():
    table = benchmark_output("primed_state", SHARED / "allennlp_elmo")  # a Markdown table
    rows = {
        cells[0].split(" state")[0]: [float(c) for c in cells[1:]]
        for cells in (
            [c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
        )
        if len(cells) == 3 and cells[0].endswith(("state", "warm-up)", "replay)"))
    }
    assert rows["carried"][0] < 1e-5  # the comparison holds: max abs difference
    assert rows["primed"][1] < rows["zero"][1] / 4  # mean abs difference


@pytest.fixture
def trained_pipeline(bilm_dir, corpus_dir, tmp_path) -> Path:
    from .conftest import examples, make_nlp

    nlp = make_nlp(bilm_dir)
    train = examples(nlp, corpus_dir / "train.spacy")
    nlp.initialize(lambda: train)
    nlp.to_disk(tmp_path / "pipeline")
    return tmp_path / "pipeline"


def test_memory_and_type_cache(trained_pipeline):
    long = run_benchmark("memory", "long-doc", trained_pipeline, "--tokens", "3000")
    assert long[-1]
    assert run_benchmark("type_cache", "--text", TRAIN_CSV, "--docs", "20", "--passes", "1")


def test_doc_storage_gives_bytes_a_token_for_each_choice():
    rows = run_benchmark("doc_storage", "--shape", "small", "--texts", "5")
    by_choice = {(json.dumps(row["store"]), row["dtype"]): row for row in rows}
    assert len(by_choice) == 7
    memory = {choice: row["memory_bytes_per_token"] for choice, row in by_choice.items()}
    assert memory['"layers"', "float32"] == 4 * (3 + 1) * 256  # 3 layers and the tensor
    assert memory['"nothing"', "float32"] == 0


def test_serving_compares_onnxruntime_with_the_embedder():
    rows = run_benchmark("serving", "--shape", "small", "--sentences", "20", "--int8")
    sides, gaps = rows[:4], rows[4:]
    assert [row["side"] for row in sides] == [
        "embedder",
        "embedder, no type cache",
        "onnxruntime",
        "onnxruntime-int8",
    ]
    assert len({row["tokens"] for row in sides}) == 1 and sides[0]["tokens"] > 0
    assert all(row["tokens_per_second"] > 0 for row in sides)
    assert [row["int8_against_float32"] for row in gaps] == ["layer 0", "layer 1", "layer 2"]
    assert all(0 < row["mean"] <= row["max"] < row["largest"] for row in gaps)


def test_serving_latency_times_one_sentence_on_each_side():
    args = ["--shape", "small", "--latency", "--calls", "5", "--tokens", "8", "--text", TEXT]
    rows = run_benchmark("serving", *args)
    assert [row["side"] for row in rows] == [
        "embedder",
        "pipe nlp(text)",
        "onnxruntime",
        "onnxruntime-int8",
    ]
    assert all(row["tokens"] == 8 and 0 < row["p50_ms"] <= row["p99_ms"] for row in rows)


def test_replaced_on_disk_gives_each_components_size():
    before, after = run_benchmark("replaced_on_disk", "--pipes", "textcat", "tagger")
    assert "elmo_mb" in before and "elmo_mb" not in after
    assert after["textcat_mb"] > before["elmo_mb"] * 0.99  # its own copy of the biLM


def test_char_cnn_per_word_compares_both_encodings():
    args = ["--shapes", "ner", "--steps", "1", "--batch-tokens", "300", "--text", TEXT]
    (line,) = run_benchmark("char_cnn_per_word", *args)
    assert line["distinct_words_per_batch"] < line["tokens_per_batch"]
    assert line["tokens_per_second_once_per_word"] > 0 and line["ratio"] > 0


def test_outputs_snapshot_finds_the_same_numbers_the_same_and_a_changed_one_changed(tmp_path):
    before, after = tmp_path / "before.npz", tmp_path / "after.npz"
    benchmark_output("outputs_snapshot", "save", before)
    benchmark_output("outputs_snapshot", "save", after)
    assert "bit-identical" in benchmark_output("outputs_snapshot", "compare", before, after)
    import numpy

    arrays = dict(numpy.load(after))
    key = next(k for k in arrays if k.startswith("clipped/embed/default/"))
    arrays[key] = numpy.nextafter(arrays[key], numpy.inf)  # one ulp
    numpy.savez(after, **arrays)
    result = subprocess.run(
        [sys.executable, BENCHMARKS / "outputs_snapshot.py", "compare", before, after],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and f"{key}: differs" in result.stdout


def test_ray_embed_compares_the_ray_engine_with_embed():
    pytest.importorskip("ray", reason="Ray is not installed: pip install elmo_spacy[ray]")
    args = ["--shape", "tiny", "--lines", "30", "--runs", "1x1", "--startup-lines", "10"]
    embed, ray, ratio = run_benchmark("ray_embed", *args)
    assert (embed["engine"], ray["engine"]) == ("embed", "ray")
    assert embed["lines"] == ray["lines"] == 30 and embed["tokens"] == ray["tokens"] > 0
    assert ray["lines_per_second"] > 0 and ray["startup_seconds"] > 0
    assert ratio["lines_per_second_over_embed"] == pytest.approx(
        ray["lines_per_second"] / embed["lines_per_second"], abs=0.01
    )


def test_the_allennlp_module_against_allennlps_computation():
    lines = run_benchmark(
        "allennlp_module", "--text", TRAIN_CSV, "--shapes", "small 2x1024_128", "--batches", "1",
        "--batch-size", "2", "--rounds", "1", "--states", "zero",
    )  # fmt: skip
    summary = lines[-1]
    assert set(summary["speedup"]) == {
        "forward, zero state",
        "frozen forward+backward, zero state",
        "fine-tuned forward+backward, zero state",
        "step products",  # the LSTM step's products alone, as each computation runs them
    }
