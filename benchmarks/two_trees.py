"""The training step and `Embedder` of this tree against another checkout of
the package (an earlier commit), in alternating runs on one machine, so that
a change meant to move no time can be shown within noise:

    git worktree add /tmp/before <commit>
    python benchmarks/two_trees.py /tmp/before [--rounds 4] [--shape small]

Each round runs one process per tree (the order alternating), each timing
`--steps` pretraining steps (`lm_loss`, backward, Adam) and `Embedder.embed`
over the same seeded sentences with a seeded biLM; it prints tokens/s per
run, then the median of each tree and their ratio (this tree / the other).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {  # a char-CNN biLM: (lstm_dim, projection_dim, n_layers)
    "small": (1024, 128, 2),
    "original": (4096, 512, 2),
}


def measure(shape: str, steps: int) -> dict[str, float]:
    """Tokens/s of the training step and of `Embedder.embed`, in this process."""
    import random

    import torch

    from elmo_spacy import Embedder
    from elmo_spacy.bilm import BiLM, BiLMConfig
    from elmo_spacy.bilm.inputs.vocab import SPECIALS, WordVocab

    rng = random.Random(0)
    words = [f"w{i}" for i in range(2000)]
    sentences = [[rng.choice(words) for _ in range(rng.randint(5, 40))] for _ in range(64)]
    lstm_dim, projection_dim, n_layers = SHAPES[shape]
    config = BiLMConfig(
        lstm_dim=lstm_dim, projection_dim=projection_dim, n_layers=n_layers,
        cell_clip=3.0, proj_clip=3.0, cutoffs=[500], min_count=1,
    )  # fmt: skip
    torch.manual_seed(0)
    bilm = BiLM(config, WordVocab([*SPECIALS, *words]))
    optimizer = torch.optim.Adam(bilm.parameters(), lr=1e-4)
    batch = bilm.batch(sentences[:32])
    n_tokens = sum(len(s) for s in sentences[:32])
    bilm.train()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        bilm.lm_loss(batch).mean.backward()
        optimizer.step()

    step()  # warm-up
    started = time.perf_counter()
    for _ in range(steps):
        step()
    train = steps * n_tokens / (time.perf_counter() - started)
    bilm.eval()
    embedder = Embedder(bilm)
    embedder.embed(sentences)  # warm-up
    started = time.perf_counter()
    for _ in range(steps):
        embedder.embed(sentences)
    embed = steps * sum(len(s) for s in sentences) / (time.perf_counter() - started)
    return {"train": train, "embed": embed}


def run_in(tree: Path, shape: str, steps: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import json, two_trees; "
        f"import elmo_spacy; assert elmo_spacy.__file__.startswith({str(tree)!r}); "
        f"print(json.dumps(two_trees.measure({shape!r}, {steps})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tree, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", type=Path, help="another checkout of the repository")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--shape", choices=list(SHAPES), default="small")
    args = parser.parse_args()
    this = Path(__file__).resolve().parents[1]
    runs: dict[str, list[dict[str, float]]] = {"this": [], "other": []}
    for r in range(args.rounds):
        order = [("this", this), ("other", args.other)]
        for name, tree in order if r % 2 == 0 else order[::-1]:
            result = run_in(tree, args.shape, args.steps)
            runs[name].append(result)
            print(
                f"round {r} {name:5}: "
                + ", ".join(f"{k} {v:,.0f} tok/s" for k, v in result.items())
            )
    for what in ("train", "embed"):
        this_median = statistics.median(run[what] for run in runs["this"])
        other_median = statistics.median(run[what] for run in runs["other"])
        print(
            f"{what}: this {this_median:,.0f}, other {other_median:,.0f} tokens/s: "
            f"{this_median / other_median:.3f}x"
        )


if __name__ == "__main__":
    main()
