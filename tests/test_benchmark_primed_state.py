"""benchmarks/primed_state.py, the figures of docs/benchmarks.md's primed-state
section, checked on the reference fixture."""

from .benchmark_scripts import load_benchmark
from .test_elmo_format import FIXTURES, needs_fixtures


@needs_fixtures
def test_primed_state_is_closer_to_the_reference_than_zero_state(monkeypatch):
    """The figures of benchmarks/primed_state.py, on batches 1 to 9 of the
    reference fixture (those bilm-tf ran with a carried state)."""
    benchmark = load_benchmark("primed_state", monkeypatch)
    bilm = benchmark.read_bilm_tf(FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5")
    zero = benchmark.differences(bilm, FIXTURES, "zero")
    primed = benchmark.differences(bilm, FIXTURES, "primed")
    assert benchmark.differences(bilm, FIXTURES, "carried").max() < 1e-5  # the comparison holds
    assert zero.mean() > 0.05  # zero state is far off (0.074 measured)
    assert primed.mean() < zero.mean() / 4 and primed.max() < zero.max() / 4
