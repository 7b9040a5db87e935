"""Memory under load (slow, `make test-slow`): one very long doc, and 50,000 docs in a row.

Each check runs in a fresh process and reads the kernel's counters: VmRSS
(resident now) and VmHWM (peak resident, reset through /proc/self/clear_refs).
The figures are printed; run with `-s` to see them.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import SCALAR_MIX, with_bag_of_words

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc"),
]

MEASURE = """
import json, sys, spacy

def mb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

nlp = spacy.load(sys.argv[1])
"""


def run_measurement(pipeline: Path, body: str) -> dict:
    script = MEASURE + textwrap.dedent(body)
    result = subprocess.run(
        [sys.executable, "-c", script, str(pipeline)], capture_output=True, text=True, timeout=1800
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, bilm_dir, corpus_dir):
    from .conftest import examples, make_nlp

    nlp = make_nlp(bilm_dir, SCALAR_MIX, 0.0, textcat_model=with_bag_of_words())
    train = examples(nlp, corpus_dir / "train.spacy")
    nlp.initialize(lambda: train)
    path = tmp_path_factory.mktemp("memory") / "pipeline"
    nlp.to_disk(path)
    return path


def test_a_100000_token_doc_has_bounded_peak_memory(pipeline):
    figures = run_measurement(
        pipeline,
        """
        text = " ".join(["Markets", "rallied", "on", "Friday", "."] * 20_000)
        nlp(text[:5000])
        before = mb("VmRSS")
        reset_peak()
        doc = nlp(text)
        assert len(doc) == 100_000
        output_mb = (doc._.elmo.nbytes + doc.tensor.nbytes) / 2**20
        print(json.dumps({"peak_over_start_mb": mb("VmHWM") - before, "output_mb": output_mb}))
        """,
    )
    print(f"\n100,000-token doc: {figures}")
    # The layers themselves are kept; everything else must stay a small multiple.
    assert figures["peak_over_start_mb"] < 4 * figures["output_mb"] + 300


def test_50000_docs_keep_resident_memory_flat(pipeline):
    figures = run_measurement(
        pipeline,
        """
        # 1,000 distinct texts, repeated: new strings would grow spaCy's
        # StringStore, which is by design, not a leak.
        texts = [f"Story {i % 1000}: shares of company {i % 97} rose." for i in range(50_000)]
        rss = []
        for i, doc in enumerate(nlp.pipe(texts, batch_size=256)):
            if i % 5_000 == 4_999:
                rss.append(mb("VmRSS"))
        print(json.dumps({"rss_mb_every_5000_docs": rss}))
        """,
    )
    rss = figures["rss_mb_every_5000_docs"]
    print(f"\nresident MB every 5,000 docs: {[round(x) for x in rss]}")
    # After warm-up (the first 10,000 docs), growth stays under 25 MB.
    assert max(rss[2:]) - rss[1] < 25, rss
