"""keep_freed_memory: freed arrays serve the next allocation without new pages."""

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.benchmark  # a page-fault count: make test-benchmarks

MEASURE = """
import resource, sys, torch
from elmo_spacy.pretrain.memory import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
def faults_of_a_step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.empty(16 * 2**20).fill_(1.0)  # 64 MB, as a step's softmax arrays
    del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
for _ in range(3):  # the first steps lay out the heap
    faults_of_a_step()
print(applied, sum(faults_of_a_step() for _ in range(3)))
"""


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="needs glibc"
)
def test_keep_freed_memory_lets_the_next_step_reuse_the_pages():
    def run(mode: str) -> tuple[str, int]:
        out = subprocess.run(
            [sys.executable, "-c", MEASURE, mode], capture_output=True, text=True, check=True
        ).stdout.split()
        return out[0], int(out[1])

    applied, kept = run("keep")
    _, fresh = run("fresh")
    assert applied == "True"
    assert fresh > 30_000  # 16,384 pages of 4 KiB a step, mapped and faulted in again
    assert kept < 1_000
