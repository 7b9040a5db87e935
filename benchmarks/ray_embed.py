"""Lines/s of `elmo-spacy embed --engine ray` with 1 and 2 actors against
plain `elmo-spacy embed`, on the same corpus, in one run.

    python benchmarks/ray_embed.py [--bilm PATH | --shape small] [--text FILE] [--lines N]
        [--runs 1x1 1x2 2x1] [--startup-lines K] [--lines-per-batch B] [--tokenize]

The biLM: PATH (anything `load_bilm` reads), or one of random weights of a
shape ("small": ELMo's small model, 2x1024_128 with its char CNN, as in
benchmarks/elmo_shapes.py; "tiny": the tests' sizes, for a smoke run),
saved to a temporary folder. The corpus: the first --lines lines of FILE
(default: ../shared/data/ag_news/unlabeled.txt beside the repository, else
the plugin's sample text, repeated), tokens split on white space (or
--tokenize).

Each run is the command a user types, in a process of its own, timed from
start to exit: `embed` (torch's default threads), then `embed --engine ray`
for each of --runs, AxC = A actors of C CPUs each (each actor's torch
threads), on a local Ray instance that the command starts over all cores.
A run's wall time includes starting Python, loading the biLM and, for Ray,
starting Ray and its actors; so each run is also timed on the first
--startup-lines lines (0: not), and "lines_per_second_after_startup" is the
rate over the other lines, (N - K) / (T_N - T_K). Prints one JSON line per
run, then one per Ray run with its ratios to `embed` measured in this run.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from elmo_shapes import SHAPES, elmo_config

from elmo_spacy.bilm import BiLM, BiLMConfig, WordVocab, save_bilm

ROOT = Path(__file__).resolve().parent.parent
AG_NEWS = ROOT.parent / "shared" / "data" / "ag_news" / "unlabeled.txt"
SAMPLE = ROOT / "elmo_spacy" / "data" / "sample.txt"
ELMO_SPACY = str(Path(sys.executable).parent / "elmo-spacy")
TINY = BiLMConfig(
    max_chars=20, char_dim=8, filters=[(1, 16), (2, 16), (3, 16)], projection_dim=16,
    lstm_dim=32, n_layers=2, dropout=0.0, cutoffs=[100], min_count=1,
)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bilm", type=Path, help="A biLM (default: random weights, --shape)")
    parser.add_argument("--shape", choices=["small", "tiny"], default="small")
    parser.add_argument("--text", type=Path, help="Lines of text (default: AG News unlabeled)")
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--runs", nargs="+", default=["1x1", "1x2", "2x1"], help="ACTORSxCPUS")
    parser.add_argument("--startup-lines", type=int, default=20)
    parser.add_argument("--lines-per-batch", type=int, default=256)
    parser.add_argument("--tokenize", action="store_true", help="spaCy's tokenizer, not spaces")
    args = parser.parse_args()
    runs = [parse_run(run) for run in args.runs]
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        bilm, name = prepare_bilm(args.bilm, args.shape, folder)
        lines = read_lines(args.text, args.lines)
        corpus = folder / "corpus.txt"
        corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
        startup = folder / "startup.txt"
        startup.write_text("\n".join(lines[: args.startup_lines]) + "\n", encoding="utf-8")
        common = ["--tokenize"] if args.tokenize else []
        engines = [("embed", 0, 0, [])] + [
            ("ray", actors, cpus, ["--engine", "ray", "--actors", str(actors),
             "--cpus-per-actor", str(cpus), "--lines-per-batch", str(args.lines_per_batch)])
            for actors, cpus in runs
        ]  # fmt: skip
        results = []
        for engine, actors, cpus, options in engines:
            result = {"engine": engine, "actors": actors, "cpus_per_actor": cpus, "biLM": name}
            if engine == "embed":
                result["torch_threads"] = torch.get_num_threads()
            output = folder / ("out.parquet" if engine == "ray" else "out.hdf5")
            seconds, tokens = timed_embed(bilm, corpus, output, common + options)
            result.update(lines=len(lines), tokens=tokens, seconds=round(seconds, 2))
            result["lines_per_second"] = round(len(lines) / seconds, 1)
            if args.startup_lines:
                start, _ = timed_embed(bilm, startup, output, common + options)
                result["startup_seconds"] = round(start, 2)
                rate = (len(lines) - args.startup_lines) / max(seconds - start, 1e-9)
                result["lines_per_second_after_startup"] = round(rate, 1)
            print(json.dumps(result), flush=True)
            results.append(result)
        baseline = results[0]
        for result in results[1:]:
            ratios = {"ray_run": f"{result['actors']}x{result['cpus_per_actor']}"}
            for key in ("lines_per_second", "lines_per_second_after_startup"):
                if key in result:
                    ratios[f"{key}_over_embed"] = round(result[key] / baseline[key], 2)
            print(json.dumps(ratios), flush=True)


def parse_run(run: str) -> tuple[int, int]:
    try:
        actors, cpus = (int(part) for part in run.split("x"))
    except ValueError:
        sys.exit(f"--runs {run}: give ACTORSxCPUS, e.g. 2x1")
    return actors, cpus


def prepare_bilm(path: Path | None, shape: str, folder: Path) -> tuple[Path, str]:
    if path is not None:
        return path, str(path)
    torch.manual_seed(0)
    config = TINY if shape == "tiny" else elmo_config(**SHAPES["small 2x1024_128"])
    bilm = BiLM(config, WordVocab.specials_only(), with_softmax=False)
    return save_bilm(bilm, folder / "bilm"), f"{shape}, random weights"


def read_lines(path: Path | None, n: int) -> list[str]:
    if path is None:
        path = AG_NEWS if AG_NEWS.exists() else SAMPLE
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    lines = [line for line in lines if line]
    return [lines[i % len(lines)] for i in range(n)]


def timed_embed(bilm: Path, corpus: Path, output: Path, options: list[str]) -> tuple[float, int]:
    """Seconds of `elmo-spacy embed BILM CORPUS OUTPUT OPTIONS`, start to exit,
    and the tokens it says it embedded."""
    command = [ELMO_SPACY, "embed", str(bilm), str(corpus), str(output), "--overwrite", *options]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    report = done.stdout.strip().splitlines()[-1]  # "N lines, T tokens in S s ..."
    return seconds, int(report.split(" tokens")[0].split(", ")[-1])


if __name__ == "__main__":
    main()
