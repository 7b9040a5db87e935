"""Dev scores of downstream recipes over seeds: the frozen biLM against the
fine-tuned recipe (configs/textcat_finetune.cfg, `elmo_spacy.FineTuning.v1`)
and the recipe with each of its parts taken away, with each run's minutes
and peak memory.

    cd benchmarks && python finetune_study.py textcat --workdir /work/bench/finetune --seeds 0 1 2 --variants frozen finetune
    cd benchmarks && python finetune_study.py ner --workdir /work/bench/finetune-ner --seeds 0 --variants ner-frozen ner-finetune

Each run is `python -m scripts train CONFIG WORKDIR/VARIANT-SEED --system.seed
SEED --paths.* ... OVERRIDES` from the repository root, then `python -m
scripts evaluate` (textcat) or `evaluate-tokens` (ner) on dev; the runs go one
after the other, each alone. A run whose metrics are in WORKDIR already is
read, not run again, so that a study can be stopped and resumed. `--data`
points at the workflow's outputs (corpus/, training/bilm/, ...; the
repository root by default). Prints one JSON line per run, then a markdown
table per variant: the mean and range over seeds of the dev score (textcat:
accuracy, and each part of the head alone; ner: entity F1), minutes of
training and peak resident memory of the training process. `--tfidf` adds
the TF-IDF + linear SVM baseline with C tuned on dev.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FINETUNE = "configs/textcat_finetune.cfg"
FINE_TUNING = "components.elmo.model.fine_tuning"
NER_LISTENER = "components.ner.model.tok2vec.embed.first"
# name -> (task, config, overrides, what it is)
VARIANTS = {
    "frozen": (
        "textcat",
        "configs/textcat_frozen.cfg",
        {},
        "the biLM frozen, the `all` workflow's frozen-λ textcat (with the bag of n-grams)",
    ),
    "frozen-recipe-head": (
        "textcat",
        FINETUNE,
        {"components.textcat.model.tok2vec.grad_factor": 0.0},
        "the biLM frozen, under the recipe's head",
    ),
    "finetune": ("textcat", FINETUNE, {}, "the fine-tuning recipe"),
    "head-rate": (
        "textcat",
        FINETUNE,
        {FINE_TUNING: None},
        "the recipe's head, the biLM stepped by the pipeline's optimizer at the head's rate",
    ),
    "no-layer-rates": (
        "textcat",
        FINETUNE,
        {f"{FINE_TUNING}.layer_rate_divisor": 1.0},
        "the recipe, one rate for every layer",
    ),
    "no-unfreezing": (
        "textcat",
        FINETUNE,
        {
            f"{FINE_TUNING}.trainable_layers.frozen_steps": 0,
            f"{FINE_TUNING}.trainable_layers.steps_per_layer": 1,
        },
        "the recipe, every layer training from the first steps",
    ),
    "no-slanted-rate": (
        "textcat",
        FINETUNE,
        {f"{FINE_TUNING}.optimizer.learn_rate.ratio": 1.0},
        "the recipe, a constant rate (its peak)",
    ),
    "no-concat-pooling": (
        "textcat",
        FINETUNE,
        {"components.textcat.model.pooling": ["mean", "max"]},
        "the recipe, [mean; max] pooling",
    ),
    "ner-frozen": ("ner", "configs/ner_elmo.cfg", {}, "the NER biLM frozen"),
    "ner-finetune": (
        "ner",
        "configs/ner_elmo.cfg",
        {f"{NER_LISTENER}.grad_factor": 1.0},
        "the NER biLM fine-tuned with the recipe",
    ),
}
TASK_PATHS = {
    "textcat": {
        "paths.train": "corpus/train.spacy",
        "paths.dev": "corpus/dev.spacy",
        "paths.bilm": "training/bilm/model-best",
    },
    "ner": {
        "paths.train": "corpus/ner/train.spacy",
        "paths.dev": "corpus/ner/dev.spacy",
        "paths.bilm": "training/ner/bilm-adapted/model-best",
    },
}


def run_logged(command: list[str], log: Path) -> tuple[float, float]:
    """Run `command` from the repository root, its output to `log`; returns
    (seconds, peak resident memory of the process in MB)."""
    started = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        sys.exit(f"{' '.join(command)} failed ({process.returncode}): see {log}")
    return time.perf_counter() - started, usage.ru_maxrss / 1024


def settings_in(config: Path, overrides: dict) -> dict:
    """The `overrides` (dotted names) whose setting `config` has: an override
    of the fine-tuning block reaches the recipe's runs, not the frozen config's."""
    from confection import Config

    tree = Config().from_disk(config, interpolate=False)
    sections = _sections(tree)
    kept = {}
    for key, value in overrides.items():
        node = tree
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None or key.rsplit(".", 1)[0] in sections:
            kept[key] = value
    return kept


def _sections(tree: dict, prefix: str = "") -> set[str]:
    found = set()
    for name, value in tree.items():
        if isinstance(value, dict):
            found |= {prefix + name} | _sections(value, f"{prefix}{name}.")
    return found


def one_run(variant: str, seed: int, data: Path, workdir: Path, extra: dict) -> dict:
    task, config, overrides, _ = VARIANTS[variant]
    out = workdir / f"{variant}-{seed}"
    metrics_path = out / "metrics.json"
    if metrics_path.is_file():
        return json.loads(metrics_path.read_text())
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: str(data / v) for k, v in TASK_PATHS[task].items()}
    settings.update({"system.seed": seed, **overrides, **settings_in(ROOT / config, extra)})
    train = [sys.executable, "-m", "scripts", "train", config, str(out / "training")]
    for key, value in settings.items():
        train += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    seconds, peak_mb = run_logged(train, out / "train.log")
    model = out / "training" / "model-best"
    corpus = Path(settings["paths.dev"]).parent
    command = "evaluate" if task == "textcat" else "evaluate-tokens"
    evaluate = [sys.executable, "-m", "scripts", command, str(model), str(corpus)]
    evaluate += [str(out / "evaluation.json"), "--name", variant]
    run_logged(evaluate, out / "evaluate.log")
    evaluation = json.loads((out / "evaluation.json").read_text())
    result = {"variant": variant, "seed": seed, "minutes": seconds / 60, "peak_rss_mb": peak_mb}
    if task == "textcat":
        dev = evaluation["splits"]["dev"]
        result["dev_accuracy"] = dev["accuracy"]
        for part, accuracy in dev.get("branch_accuracy", {}).items():
            result[f"dev_accuracy_{part}"] = accuracy
    else:
        result["dev_ents_f"] = evaluation["dev"]["ents_f"]
    result["command"] = " ".join(train)
    metrics_path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def tfidf_tuned_on_dev(data: Path) -> dict:
    """TF-IDF + linear SVM (the study's baseline), C and the n-gram range
    chosen on dev: the best dev accuracy of the grid."""
    sys.path.insert(0, str(ROOT))
    import spacy
    from spacy.tokens import DocBin

    from scripts.baselines.tfidf import TfidfClassifier

    vocab = spacy.blank("en").vocab
    train, dev = (
        list(DocBin().from_disk(data / f"corpus/{split}.spacy").get_docs(vocab))
        for split in ("train", "dev")
    )
    gold = [max(doc.cats, key=doc.cats.get) for doc in dev]
    best = {"dev_accuracy": -1.0}
    for ngram_max in (1, 2, 3):
        for c in (0.1, 0.25, 0.5, 1.0, 2.0):
            model = TfidfClassifier(ngram_max=ngram_max, C=c).fit(
                [doc.text for doc in train], [max(doc.cats, key=doc.cats.get) for doc in train]
            )
            predicted = model.predict([doc.text for doc in dev])
            accuracy = sum(p == g for p, g in zip(predicted, gold)) / len(gold)
            if accuracy > best["dev_accuracy"]:
                best = {"variant": "tfidf-svm", "ngram_max": ngram_max, "C": c}
                best["dev_accuracy"] = accuracy
    return best


COLUMNS = {  # result key -> (column, decimals, scale)
    "dev_accuracy": ("dev accuracy", 2, 100),
    "dev_accuracy_bilstm": ("ELMo BiLSTM part alone", 2, 100),
    "dev_accuracy_linear_model": ("n-grams part alone", 2, 100),
    "dev_ents_f": ("dev entity F1", 2, 100),
    "minutes": ("minutes", 1, 1),
    "peak_rss_mb": ("peak RSS (MB)", 0, 1),
}


def table(results: list[dict]) -> str:
    """Mean and range over seeds, a row per variant."""
    keys = [k for k in COLUMNS if any(k in r for r in results)]
    header = ["variant", "seeds", *(COLUMNS[k][0] for k in keys)]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for variant in dict.fromkeys(r["variant"] for r in results):
        runs = [r for r in results if r["variant"] == variant]
        cells = [variant, str(len(runs))]
        for key in keys:
            _, decimals, scale = COLUMNS[key]
            values = [r[key] * scale for r in runs if key in r]
            cells.append(_spread(values, decimals) if values else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _spread(values: list[float], decimals: int) -> str:
    """The mean, and the range where there is more than one value."""
    mean = f"{statistics.fmean(values):,.{decimals}f}"
    if len(values) == 1:
        return mean
    return f"{mean} ({min(values):,.{decimals}f}-{max(values):,.{decimals}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=sorted(TASK_PATHS))
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=ROOT, help="Holds corpus/ and training/")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), required=True)
    parser.add_argument("--tfidf", action="store_true", help="Add TF-IDF + SVM tuned on dev")
    parser.add_argument(
        "--override",
        nargs=2,
        action="append",
        default=[],
        metavar=("KEY", "VALUE"),
        help="A config setting for every run whose config has it or its section, e.g. "
        "training.max_steps 20 (tests)",
    )
    args = parser.parse_args()
    extra = {key: value for key, value in args.override}
    results = []
    for variant in args.variants:
        if VARIANTS[variant][0] != args.task:
            parser.error(f"{variant} is a {VARIANTS[variant][0]} variant, not {args.task}")
        for seed in args.seeds:
            result = one_run(variant, seed, args.data.resolve(), args.workdir.resolve(), extra)
            print(json.dumps(result), flush=True)
            results.append(result)
    if args.tfidf:
        baseline = tfidf_tuned_on_dev(args.data.resolve())
        print(json.dumps(baseline), flush=True)
        results.append(baseline)
    print()
    print(table(results))


if __name__ == "__main__":
    main()
