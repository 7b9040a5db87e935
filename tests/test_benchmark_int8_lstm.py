"""The int8 LSTM of the benchmarks' --int8-lstm (elmo_shapes.py,
precision_downstream.py; step_gemm_rates.int8_lstm_products): the LSTM's
products in int8 inside its scope, and float32 again after it."""

import pytest
import torch

from elmo_spacy.bilm.products import onednn_packing

from .benchmark_scripts import load_benchmark
from .test_precision import SENTENCES, layers_of, tiny_bilm


@pytest.mark.skipif(not onednn_packing(), reason="the LSTM keeps packed weights with oneDNN only")
def test_int8_lstm_moves_the_lstm_layers_a_little_and_only_in_its_scope(monkeypatch):
    benchmark = load_benchmark("step_gemm_rates", monkeypatch)
    bilm = tiny_bilm("char_cnn")
    float32 = layers_of(bilm, SENTENCES)
    with benchmark.int8_lstm_products():
        int8 = layers_of(bilm, SENTENCES)
    assert torch.equal(layers_of(bilm, SENTENCES), float32)
    assert torch.equal(int8[0], float32[0])  # the token encoder is not quantized
    for a, b in zip(int8[1:], float32[1:]):
        assert not torch.equal(a, b)
        # 0.021 and 0.024 of the largest |value| on this tiny random biLM (2026-11-25)
        assert float((a - b).abs().max()) < 0.05 * float(b.abs().max())
