"""Fine-tuning the biLM inside spaCy (`elmo_spacy.FineTuning.v1`): its own
optimizer and rates by layer, layers unfrozen by step, the schedules, and the
settings through `to_disk`, `spacy.load` and `replace_listeners`."""

import copy
import itertools
import json
import subprocess
import sys

import numpy
import pytest
import spacy
import torch
from spacy.training import Example

from elmo_spacy.errors import ElmoSpacyError
from elmo_spacy.layers import get_bilm
from elmo_spacy.schedules import gradual_unfreezing, slanted_triangular

from .conftest import examples, make_nlp

RATE = 0.001


def fine_tuning(rate=RATE, divisor=2.6, trainable_layers=None, grad_clip=0.0) -> dict:
    """An `elmo_spacy.FineTuning.v1` block: Adam at `rate` (a number or a
    schedule block) without clipping, unless asked, so that a first step
    moves each weight by its layer's rate."""
    block = {
        "@misc": "elmo_spacy.FineTuning.v1",
        "layer_rate_divisor": divisor,
        "optimizer": {
            "@optimizers": "Adam.v1",
            "learn_rate": rate,
            "use_averages": False,
            "grad_clip": grad_clip,
            "L2": 0.0,
        },
    }
    if trainable_layers is not None:
        block["trainable_layers"] = trainable_layers
    return block


def unfreezing(frozen_steps: int, steps_per_layer: int) -> dict:
    return {
        "@schedules": "elmo_spacy.gradual_unfreezing.v1",
        "frozen_steps": frozen_steps,
        "steps_per_layer": steps_per_layer,
    }


def fine_tuned_nlp(bilm_dir, block: dict | None, grad_factor: float = 1.0, **elmo):
    nlp = make_nlp(bilm_dir, grad_factor=grad_factor, elmo=elmo or None)
    if block is not None:
        config = nlp.config.copy()
        config["components"]["elmo"]["model"]["fine_tuning"] = block
        nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    return nlp


def train_step(nlp, batch, optimizer) -> None:
    """One step of `spacy train`'s loop: every pipe's update, then every
    pipe's `finish_update`, then the optimizer's schedules."""
    nlp.update(batch, sgd=False)
    for _, pipe in nlp.pipeline:
        pipe.finish_update(optimizer)
    optimizer.step_schedules()


def layer_weights(nlp) -> list[torch.Tensor]:
    """The biLM's weights by layer (token encoder, LSTM 1, LSTM 2), flat."""
    bilm = get_bilm(nlp.get_pipe("elmo").model)
    return [
        torch.cat([p.detach().flatten().clone() for _, p in group])
        for group in bilm.layer_parameters()
    ]


def distances(before, after) -> list[float]:
    return [float((a - b).norm()) for a, b in zip(after, before)]


@pytest.fixture(scope="module")
def train(bilm_dir, corpus_dir):
    return examples(make_nlp(bilm_dir), corpus_dir / "train.spacy")


def trained_distances(bilm_dir, train, block, steps, grad_factor=1.0) -> list[list[float]]:
    """What each layer moved at each of `steps` training steps."""
    nlp = fine_tuned_nlp(bilm_dir, block, grad_factor)
    optimizer = nlp.initialize(lambda: train)
    moved = []
    for step in range(steps):
        before = layer_weights(nlp)
        train_step(nlp, train[8 * step : 8 * step + 8], optimizer)
        moved.append(distances(before, layer_weights(nlp)))
    return moved


# -- the rates -------------------------------------------------------------------


def test_each_layer_steps_at_its_configured_rate(bilm_dir, train):
    """After one update with a known gradient, every weight of layer i has
    moved by rate / 2.6^(L - i): Adam's first step is the rate times the
    gradient's sign (bias correction), here scaled by the layer's share."""
    nlp = fine_tuned_nlp(bilm_dir, fine_tuning())
    optimizer = nlp.initialize(lambda: train)
    model = nlp.get_pipe("elmo").model
    bilm = get_bilm(model)
    generator = torch.Generator().manual_seed(0)
    before = layer_weights(nlp)
    for group in bilm.layer_parameters():
        for _, parameter in group:
            parameter.grad = torch.randn(parameter.shape, generator=generator) + 0.5
    model.finish_update(optimizer)
    for layer, (a, b) in enumerate(zip(before, layer_weights(nlp))):
        expected = RATE / 2.6 ** (2 - layer)
        numpy.testing.assert_allclose((b - a).abs().numpy(), expected, rtol=0.01)  # float32 weights
    # The pipeline's optimizer stepped nothing of the biLM's.
    assert not any(key[0] == model.shims[0].id for key in optimizer.mom1)


def test_a_rate_ten_times_smaller_moves_the_biLM_ten_times_less_where_grad_factor_does_not(
    bilm_dir, train
):
    """The old knob and the new one, under Adam, in the first steps through
    spaCy's loop: a 10x smaller biLM rate moves it about 10x less; a 10x
    smaller grad_factor (the pipeline's optimizer stepping the biLM) does
    not come close, as Adam divides the scale out."""

    def moved(block, grad_factor):
        return sum(sum(d) for d in trained_distances(bilm_dir, train, block, 3, grad_factor))

    rate_ratio = moved(fine_tuning(RATE), 1.0) / moved(fine_tuning(RATE / 10), 1.0)
    assert 7 < rate_ratio < 13
    factor_ratio = moved(None, 1.0) / moved(None, 0.1)
    assert factor_ratio < 3


def test_grad_factor_0_still_moves_nothing(bilm_dir, train):
    moved = trained_distances(bilm_dir, train, fine_tuning(), 2, grad_factor=0.0)
    assert moved == [[0.0, 0.0, 0.0]] * 2


# -- unfreezing --------------------------------------------------------------------


def test_layers_unfreeze_from_the_top_each_at_its_step(bilm_dir, train):
    """Frozen for 2 steps, then the top layer, then one more every 2 steps: a
    frozen layer does not move, and moves at the first step after its own."""
    block = fine_tuning(trainable_layers=unfreezing(2, 2))
    moved = trained_distances(bilm_dir, train, block, 7)
    trains = [[d > 0 for d in step] for step in moved]
    assert trains == [
        [False, False, False],
        [False, False, False],
        [False, False, True],
        [False, False, True],
        [False, True, True],
        [False, True, True],
        [True, True, True],
    ]


def test_while_every_layer_is_frozen_the_biLM_runs_as_a_frozen_one(bilm_dir, train):
    """No training forward pass (the frozen path and its cache) until the
    top layer's step: a frozen biLM costs nothing new."""
    nlp = fine_tuned_nlp(bilm_dir, fine_tuning(trainable_layers=unfreezing(2, 1)))
    optimizer = nlp.initialize(lambda: train)
    elmo = nlp.get_pipe("elmo")
    calls = []
    shim = elmo.model.shims[0]
    begin_update = shim.begin_update
    shim.begin_update = lambda inputs: calls.append(inputs) or begin_update(inputs)
    for step in range(3):
        train_step(nlp, train[:8], optimizer)
        assert len(calls) == (step == 2)
        assert len(elmo.frozen_cache) == (0 if step == 2 else 8)


def test_the_layers_kept_may_all_be_below_the_trainable_ones(bilm_dir, train):
    """A pipe that hands out the token encoding alone, with the top layer
    training: nothing to backpropagate, and nothing moves."""
    block = fine_tuning(trainable_layers=1)
    nlp = make_nlp(bilm_dir, grad_factor=1.0, elmo_model={"layers": [0]})
    config = nlp.config.copy()
    config["components"]["elmo"]["model"]["fine_tuning"] = block
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    optimizer = nlp.initialize(lambda: train)
    before = layer_weights(nlp)
    train_step(nlp, train[:8], optimizer)
    assert distances(before, layer_weights(nlp)) == [0.0, 0.0, 0.0]


# -- the schedules -----------------------------------------------------------------


def test_the_slanted_triangular_rate_at_chosen_steps():
    rates = list(itertools.islice(slanted_triangular(0.01, 100, cut_frac=0.1, ratio=32), 150))
    low = 0.01 / 32
    assert rates[0] == pytest.approx(low + (0.01 - low) * 0.1)  # step 1 of 10 up
    assert rates[9] == pytest.approx(0.01)  # the peak, at step cut = 10
    assert rates[54] == pytest.approx(low + (0.01 - low) * 0.5)  # half way down
    assert rates[99] == pytest.approx(low)  # num_steps
    assert rates[100:] == [pytest.approx(low)] * 50  # held: thinc's goes negative
    with pytest.raises(ElmoSpacyError, match="cut_frac"):
        next(slanted_triangular(0.01, 100, cut_frac=1.5))


def test_gradual_unfreezing_at_chosen_steps():
    values = list(itertools.islice(gradual_unfreezing(3, 2), 10))
    assert values == [0, 0, 0, 1, 1, 2, 2, 3, 3, 4]
    with pytest.raises(ElmoSpacyError, match="steps_per_layer"):
        next(gradual_unfreezing(0, 0))


def test_the_rate_follows_its_schedule_step_by_step(bilm_dir, train):
    """The biLM's rate is its own schedule's at the biLM's step, whatever the
    pipeline's optimizer does."""
    schedule = {"@schedules": "elmo_spacy.slanted_triangular.v1", "max_rate": 0.01}
    schedule["num_steps"] = 4
    nlp = fine_tuned_nlp(bilm_dir, fine_tuning(schedule))
    optimizer = nlp.initialize(lambda: train)
    shim = nlp.get_pipe("elmo").model.shims[0]
    pipeline_rate = optimizer.learn_rate
    expected = list(itertools.islice(slanted_triangular(0.01, 4), 5))
    for step in range(5):
        train_step(nlp, train[:8], optimizer)
        assert shim.fine_tuning.optimizer.learn_rate == pytest.approx(expected[step])
        assert shim.fine_tuning.step == step + 1
    assert optimizer.learn_rate == pipeline_rate  # the pipeline's, as configured


def test_settings_that_cannot_work_are_refused(bilm_dir):
    block = fine_tuning()
    block["optimizer"]["use_averages"] = True
    with pytest.raises(ElmoSpacyError, match="use_averages = false"):
        fine_tuned_nlp(bilm_dir, block)
    with pytest.raises(ElmoSpacyError, match="layer_rate_divisor"):
        fine_tuned_nlp(bilm_dir, fine_tuning(divisor=0.0))


# -- the settings through to_disk, spacy.load and replace_listeners ----------------

READ_SETTINGS = """
import json, sys, spacy
nlp = spacy.load(sys.argv[1])
found = {}
for name, pipe in nlp.pipeline:
    for node in pipe.model.walk():
        for shim in node.shims:
            ft = getattr(shim, "fine_tuning", None)
            if ft is not None:
                found[name] = [ft.layer_rate_divisor, ft.schedules["learn_rate"][3],
                               ft.trainable_layers[1], ft.trainable_layers[2]]
print(json.dumps(found))
"""


def settings(fine_tuning) -> list:
    return [
        fine_tuning.layer_rate_divisor,
        fine_tuning.schedules["learn_rate"][3],
        fine_tuning.trainable_layers[1],
        fine_tuning.trainable_layers[2],
    ]


def test_the_settings_survive_to_disk_spacy_load_and_replace_listeners(bilm_dir, train, tmp_path):
    """Saved, loaded in a fresh process, and after `replace_listeners` (whose
    copy of the biLM goes on from the same step, with its own optimizer), the
    fine-tuning is the config's: divisor, rate schedule, unfreezing."""
    schedule = {"@schedules": "elmo_spacy.slanted_triangular.v1", "max_rate": 0.01}
    schedule["num_steps"] = 10
    block = fine_tuning(schedule, divisor=3.0, trainable_layers=unfreezing(2, 5))
    nlp = fine_tuned_nlp(bilm_dir, block)
    optimizer = nlp.initialize(lambda: train)
    train_step(nlp, train[:8], optimizer)
    expected = [3.0, next(itertools.islice(slanted_triangular(0.01, 10), 3, None)), 0, 1]
    assert settings(nlp.get_pipe("elmo").model.shims[0].fine_tuning) == expected

    replaced = copy.deepcopy(nlp.config)
    nlp.replace_listeners("elmo", "textcat", ["model.tok2vec"])
    own = next(s for n in nlp.get_pipe("textcat").model.walk() for s in n.shims)
    assert settings(own.fine_tuning) == expected
    assert own.fine_tuning.step == 1 and own.fine_tuning.optimizer.mom1 == {}
    assert (
        own.fine_tuning.optimizer is not nlp.get_pipe("elmo").model.shims[0].fine_tuning.optimizer
    )
    textcat_tok2vec = nlp.config["components"]["textcat"]["model"]["tok2vec"]
    assert (
        textcat_tok2vec["bilm"]["fine_tuning"]
        == replaced["components"]["elmo"]["model"]["fine_tuning"]
    )
    nlp.to_disk(tmp_path / "pipeline")
    result = subprocess.run(
        [sys.executable, "-c", READ_SETTINGS, str(tmp_path / "pipeline")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert loaded == {"elmo": expected, "textcat": expected}


def test_the_replaced_listeners_own_biLM_fine_tunes_on_its_schedule(bilm_dir, train):
    nlp = fine_tuned_nlp(bilm_dir, fine_tuning(trainable_layers=unfreezing(1, 1)))
    optimizer = nlp.initialize(lambda: train)
    nlp.replace_listeners("elmo", "textcat", ["model.tok2vec"])
    own = next(s for n in nlp.get_pipe("textcat").model.walk() for s in n.shims)
    moved = []
    for step in range(3):
        before = [
            torch.cat([p.detach().flatten().clone() for _, p in g])
            for g in own._model.layer_parameters()
        ]
        train_step(
            nlp,
            [Example(eg.predicted, eg.reference) for eg in train[8 * step : 8 * step + 8]],
            optimizer,
        )
        after = [
            torch.cat([p.detach().flatten().clone() for _, p in g])
            for g in own._model.layer_parameters()
        ]
        moved.append([d > 0 for d in distances(before, after)])
    assert moved == [[False, False, False], [False, False, True], [False, True, True]]
