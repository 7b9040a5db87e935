"""The LSTM kernels (bilm/runtime/recurrence.py, bilm/runtime/kernels.py,
bilm/model/lstm.py): torch's LSTM to float64 rounding, forward and backward,
the kernel pretraining runs on the CPU, the loop kernel's cell step with and
without gradients, the graph kernel, and which kernel runs when."""

import pytest
import torch

import elmo_spacy.bilm.runtime.kernels as kernels
from elmo_spacy.bilm import BiLM, BiLMConfig, WordVocab
from elmo_spacy.bilm.model.dtypes import ROW_BLOCK, padded_rows
from elmo_spacy.bilm.model.lstm import LstmStack, lstm_cell, run_lstm_layer
from elmo_spacy.bilm.runtime.graphs import GraphCache
from elmo_spacy.bilm.runtime.kernels import choose_kernel, stacks_runner
from elmo_spacy.bilm.runtime.recurrence import lstm_layer_for_training
from elmo_spacy.errors import ElmoSpacyError

from .conftest import TINY_BILM


def gradients(output: torch.Tensor, weight: torch.Tensor, tensors: list[torch.Tensor]):
    return torch.autograd.grad((output * weight).sum(), tensors)


@pytest.mark.parametrize("projected", [True, False])
@pytest.mark.parametrize("batch", [3, 50])  # 50 x 7 rows: padded past a ROW_BLOCK
def test_training_kernel_is_torchs_lstm_forward_and_backward(projected, batch):
    torch.manual_seed(0)
    dim, cell = (6, 10) if projected else (8, 8)
    lstm = torch.nn.LSTM(dim, cell, proj_size=dim if projected else 0, batch_first=True).double()
    x = torch.randn(batch, 7, dim, dtype=torch.float64, requires_grad=True)
    tensors = [x, *lstm.parameters()]
    expected = lstm(x)[0]
    weight = torch.randn_like(expected)  # a loss that weighs every output differently
    expected_grads = gradients(expected, weight, tensors)

    y = one_layer(x, lstm, torch.float64)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-12)
    for got, want in zip(gradients(y, weight, tensors), expected_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def one_layer(
    x: torch.Tensor, lstm: torch.nn.LSTM, dtype: torch.dtype, *clips: float
) -> torch.Tensor:
    """`lstm` over x (B, T, I) on the training kernel, as a batch of one
    layer; `clips`: cell_clip, proj_clip."""
    bias = lstm.bias_ih_l0 + lstm.bias_hh_l0
    weights = [lstm.weight_ih_l0, lstm.weight_hh_l0, bias]
    weights.append(lstm.weight_hr_l0 if lstm.proj_size else None)
    batched = [w if w is None else w[None] for w in weights]
    return lstm_layer_for_training(x[None], *batched, dtype, *clips)[0]


@pytest.mark.parametrize("projected", [True, False])
@pytest.mark.parametrize("cell_clip, proj_clip", [(0.3, 0.0), (0.0, 0.05), (0.3, 0.05)])
def test_clipped_training_kernel_is_the_written_out_recurrence(projected, cell_clip, proj_clip):
    """Clipped as bilm-tf clips (the cell, and the output where projected):
    the training kernel's outputs and gradients are the written-out
    recurrence's under autograd (`run_lstm_layer`, torch.clamp's gradient),
    with the clips cutting a good share of the values."""
    torch.manual_seed(0)
    dim, cell = (6, 10) if projected else (8, 8)
    lstm = torch.nn.LSTM(dim, cell, proj_size=dim if projected else 0, batch_first=True).double()
    x = torch.randn(5, 9, dim, dtype=torch.float64, requires_grad=True)
    tensors = [x, *lstm.parameters()]
    lengths = torch.full((5,), 9)
    expected, _ = run_lstm_layer(lstm, x, lengths, None, cell_clip, proj_clip, final=False)
    if projected and proj_clip:
        assert 0.2 < (expected.abs() == proj_clip).double().mean() < 0.8
    weight = torch.randn_like(expected)
    expected_grads = gradients(expected, weight, tensors)

    y = one_layer(x, lstm, torch.float64, cell_clip, proj_clip)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-12)
    for got, want in zip(gradients(y, weight, tensors), expected_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("projected", [True, False])
def test_layers_run_together_are_each_layer_alone(projected):
    """Two layers (the biLM's directions) in one call of the training kernel:
    each one's outputs and gradients are what it gives alone."""
    torch.manual_seed(0)
    dim, cell = (6, 10) if projected else (8, 8)
    lstms = [
        torch.nn.LSTM(dim, cell, proj_size=dim if projected else 0, batch_first=True).double()
        for _ in range(2)
    ]
    xs = [torch.randn(4, 7, dim, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    tensors = [*xs, *(p for lstm in lstms for p in lstm.parameters())]
    alone = torch.stack([one_layer(x, lstm, torch.float64) for x, lstm in zip(xs, lstms)])
    weight = torch.randn_like(alone)
    stacked = [
        torch.stack([lstm.weight_ih_l0 for lstm in lstms]),
        torch.stack([lstm.weight_hh_l0 for lstm in lstms]),
        torch.stack([lstm.bias_ih_l0 + lstm.bias_hh_l0 for lstm in lstms]),
        torch.stack([lstm.weight_hr_l0 for lstm in lstms]) if projected else None,
    ]
    together = lstm_layer_for_training(torch.stack(xs), *stacked, torch.float64)
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-12)
    expected_grads = gradients(alone, weight, tensors)
    for got, want in zip(gradients(together, weight, tensors), expected_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_padded_rows_rounds_up_to_whole_blocks():
    assert padded_rows(1) == ROW_BLOCK
    assert padded_rows(ROW_BLOCK) == ROW_BLOCK
    assert padded_rows(ROW_BLOCK + 1) == 2 * ROW_BLOCK


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_training_kernel_is_close_to_float32(dtype):
    """float16: GPUs without bfloat16 train clipped biLMs on this kernel."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(16, 32, proj_size=16, batch_first=True)
    x = torch.randn(5, 9, 16, requires_grad=True)
    tensors = [x, *lstm.parameters()]
    high = one_layer(x, lstm, torch.float32)
    low = one_layer(x, lstm, dtype)
    assert low.dtype == dtype
    weight = torch.randn_like(high)
    low_grads = gradients(low, weight, tensors)
    assert all(g.dtype == torch.float32 for g in low_grads)  # of the float32 weights
    for a, b in zip([low, *low_grads], [high, *gradients(high, weight, tensors)]):
        a, b = a.detach().float(), b.detach()
        cosine = torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0)
        assert float(cosine) > 0.999
        assert float((a - b).abs().max()) < 0.02 * float(b.abs().max())


def test_training_on_the_cpu_runs_the_training_kernel_and_inference_does_not(monkeypatch):
    import elmo_spacy.bilm.runtime.kernels as kernels

    calls = []
    kernel = kernels.lstm_layer_for_training
    monkeypatch.setattr(
        kernels, "lstm_layer_for_training", lambda *a: calls.append(1) or kernel(*a)
    )
    bilm = BiLM(TINY_BILM, WordVocab.build([["a", "b", "c"]], max_size=50, min_count=1))
    batch = bilm.batch([["a", "b", "c"], ["b"]])
    trained = bilm.train()(batch)
    assert len(calls) == TINY_BILM.n_layers  # both directions' layers together
    bilm.lstm_kernel = "fused"  # torch's, as pretraining ran before
    torch.testing.assert_close(trained, bilm(batch), rtol=0, atol=1e-6)
    bilm.lstm_kernel = "auto"
    with torch.no_grad():
        bilm.eval()(batch)
    assert len(calls) == TINY_BILM.n_layers


@pytest.mark.parametrize(
    "clipped, states, grad, packed, graphs, expected",
    [
        (False, False, True, False, False, {"cpu": "training", "cuda": "fused"}),
        (False, False, False, True, False, {"cpu": "loop"}),  # inference, packed weights
        (False, False, False, False, False, {"cpu": "fused", "cuda": "fused"}),
        (True, False, True, False, False, {"cpu": "training", "cuda": "training"}),
        (True, False, False, False, False, {"cpu": "loop", "cuda": "loop"}),
        (True, False, False, False, True, {"cuda": "graph"}),
        (False, True, False, False, False, {"cpu": "loop", "cuda": "loop"}),
    ],
)
def test_the_kernel_is_chosen_in_one_place_as_its_table_says(
    clipped, states, grad, packed, graphs, expected, monkeypatch
):
    run = dict(clipped=clipped, states=states, packed=packed, graphs=graphs)
    monkeypatch.setattr(kernels, "triton_available", lambda: True)
    for device, kernel in expected.items():
        with torch.set_grad_enabled(grad):
            assert choose_kernel("auto", device=torch.device(device), **run) == kernel, device
    if clipped and grad:  # a GPU without Triton trains a clipped biLM on the loop
        monkeypatch.setattr(kernels, "triton_available", lambda: False)
        assert choose_kernel("auto", device=torch.device("cuda"), **run) == "loop"
    with pytest.raises(ElmoSpacyError, match="cannot carry them"):
        choose_kernel("fused", device=torch.device("cpu"), **{**run, "states": True})


def test_the_network_alone_computes_what_the_biLM_computes_on_its_kernels():
    """`BiLMNetwork.forward` and `lm_loss`, plain torch, against the biLM on
    the runtime's kernels (the training kernel, packed weights, the type
    cache), clipped and not."""
    from elmo_spacy.bilm.model import BiLMNetwork

    docs = [["the", "bank", "rose", "."], ["a"], ["rivers", "bank", "on", "the", "left"]]
    for clip in (None, 0.5):
        config = BiLMConfig(**{**TINY_BILM.to_dict(), "cell_clip": clip, "proj_clip": clip})
        torch.manual_seed(0)
        bilm = BiLM(config, WordVocab.build(docs, max_size=50, min_count=1)).eval()
        batch = bilm.batch(docs)
        with torch.no_grad():
            fast = bilm(batch)
            plain = BiLMNetwork.forward(bilm, batch)
        torch.testing.assert_close(plain, fast, rtol=1e-5, atol=1e-5)
        bilm.train()
        fast_loss, plain_loss = bilm.lm_loss(batch), BiLMNetwork.lm_loss(bilm, batch)
        torch.testing.assert_close(plain_loss.forward_nll, fast_loss.forward_nll, rtol=1e-5, atol=0)


def test_a_bilm_trains_to_the_same_loss_on_either_kernel():
    """Ten Adam steps on the training kernel and on torch's: the same losses
    to float32 rounding (no dropout)."""
    from .conftest import DATA, tokenize

    docs = tokenize((DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines()[:16])
    config = BiLMConfig(**{**TINY_BILM.to_dict(), "dropout": 0.0})
    losses = {}
    for kernel in ("training", "fused"):
        torch.manual_seed(0)
        bilm = BiLM(config, WordVocab.build(docs, max_size=500, min_count=1)).train()
        bilm.lstm_kernel = kernel
        optimizer = torch.optim.Adam(bilm.parameters(), lr=1e-2)
        losses[kernel] = []
        for _ in range(10):
            loss = bilm.lm_loss(bilm.batch(docs)).mean
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses[kernel].append(loss.item())
    assert losses["training"][-1] < losses["training"][0] - 0.5
    assert losses["training"] == pytest.approx(losses["fused"], rel=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cell_clip", [0.0, 0.5])
def test_lstm_cell_in_place_without_gradients_is_the_cell_with_them(dtype, cell_clip):
    """The loop kernel's step: the in-place path (inference) computes what the
    autograd path computes, and leaves the cell state it is given alone."""
    torch.manual_seed(0)
    gates, c = torch.randn(5, 4 * 6).to(dtype), torch.randn(5, 6)
    c_before = c.clone()
    expected = lstm_cell(gates.clone().requires_grad_(), c, cell_clip)
    with torch.inference_mode():
        got = lstm_cell(gates.clone(), c, cell_clip)
    for g, e in zip(got, expected):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, e.detach(), rtol=0, atol=1e-6)
    assert torch.equal(c, c_before)
    if cell_clip:
        assert got[1].abs().max() <= cell_clip


@pytest.mark.parametrize("cell_dim", [10, 6])  # projected, not projected
def test_the_graph_kernel_computes_what_the_loop_kernel_does(cell_dim):
    """The graph kernel's fixed-shape recurrence (run eagerly here: on a GPU
    it is captured and replayed) against the loop's: clipped outputs, zero
    past each length, and the states after each row's last step; two batches of
    different sizes share one graph per layer, and the second sees nothing
    of the first."""
    torch.manual_seed(0)
    stack = LstmStack(2, 6, cell_dim, dropout=0.0, cell_clip=0.5, proj_clip=0.3).eval()
    graphs = GraphCache(capture=False)
    for batch, steps, lengths in ((7, 6, [6, 3, 1, 0, 6, 2, 5]), (5, 3, [1, 3, 2, 3, 0])):
        x = torch.randn(batch, steps, 6) * 3
        initial = [(torch.randn(batch, 6), torch.randn(batch, cell_dim)) for _ in range(2)]
        lengths = torch.tensor(lengths)
        initial = {"forward": initial, "backward": initial}
        with torch.inference_mode():
            expected = stacks_runner("loop")(stack, stack, x, x, lengths, initial, True)
            got = stacks_runner("graph", graphs=graphs)(stack, stack, x, x, lengths, initial, True)
        for e, g in zip(expected[0], got[0]):
            torch.testing.assert_close(g, e, rtol=0, atol=1e-6)
        for direction in ("forward", "backward"):
            for e, g in zip(expected[2][direction], got[2][direction]):
                torch.testing.assert_close(g, e, rtol=0, atol=1e-6)
        assert len(graphs) == 2  # 8 rows by 8 steps, a graph per layer


def test_the_graph_kernel_without_graphs_says_where_it_runs():
    bilm = BiLM(
        BiLMConfig(**{**TINY_BILM.to_dict(), "cell_clip": 0.5}),
        WordVocab.build([["a"]], max_size=9, min_count=1),
    ).eval()
    bilm.lstm_kernel = "graph"
    with torch.inference_mode(), pytest.raises(ElmoSpacyError, match="on a CUDA GPU"):
        bilm(bilm.batch([["a"]]))
