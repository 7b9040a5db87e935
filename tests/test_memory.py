"""Memory under load (slow, `make test-slow`): one very long doc, and 50,000 docs in a row.

Each check runs benchmarks/memory.py in a fresh process on a tiny pipeline;
the figures are printed (run with `-s` to see them).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import SCALAR_MIX

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc"),
]

BENCHMARK = Path(__file__).parents[1] / "benchmarks" / "memory.py"


def run_benchmark(*args: str) -> dict:
    """Run benchmarks/memory.py in a fresh process; its last line of output is JSON."""
    command = [sys.executable, str(BENCHMARK), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, bilm_dir, corpus_dir):
    from .conftest import examples, make_nlp

    nlp = make_nlp(bilm_dir, SCALAR_MIX, 0.0)  # the plugin's own: a fresh process loads it
    train = examples(nlp, corpus_dir / "train.spacy")
    nlp.initialize(lambda: train)
    path = tmp_path_factory.mktemp("memory") / "pipeline"
    nlp.to_disk(path)
    return path


def test_a_100000_token_doc_has_bounded_peak_memory(pipeline):
    figures = run_benchmark("long-doc", str(pipeline), "--tokens", "100000")
    print(f"\n100,000-token doc: {figures}")
    assert figures["tokens"] == 100_000
    # The layers themselves are kept; everything else must stay a small multiple.
    assert figures["peak_over_start_mb"] < 4 * figures["output_mb"] + 300


def test_50000_docs_keep_resident_memory_flat(pipeline):
    figures = run_benchmark("many-docs", str(pipeline), "--docs", "50000")
    rss = figures["rss_mb_every_5000_docs"]
    print(f"\nresident MB every 5,000 docs: {[round(x) for x in rss]}")
    # After warm-up (the first 10,000 docs), growth stays under 25 MB.
    assert max(rss[2:]) - rss[1] < 25, rss
