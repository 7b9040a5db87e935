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
from elmo_spacy.layers.fine_tuning import ConfigSettingError
from elmo_spacy.schedules import (
    gradual_unfreezing,
    set_fine_tuning_steps,
    slanted_triangular,
    training_steps,
)

from .conftest import CONFIGS, examples, make_nlp

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
    nlp = make_nlp(bilm_dir, grad_factor=1.0, elmo_model={"run": {"layers": [0]}})
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


# -- a schedule over the whole run, however training ends ---------------------

RUN_RATE = {"@schedules": "elmo_spacy.slanted_triangular.v1", "max_rate": 0.01, "num_steps": 0}
SET_STEPS = {"@callbacks": "elmo_spacy.fine_tuning_steps.v1"}


def training_config(bilm_dir, corpus_dir, after_init=SET_STEPS, **training):
    """textcat_tiny.cfg fine-tuned by the recipe's rate over the whole run
    (num_steps = 0), batches of 8 docs (so that an epoch's count does not
    depend on the order), [training] as given."""
    overrides = {
        "paths.bilm": str(bilm_dir),
        "paths.train": str(corpus_dir / "train.spacy"),
        "paths.dev": str(corpus_dir / "dev.spacy"),
        "components.textcat.model.tok2vec.grad_factor": 1.0,
        "training.eval_frequency": 1000,
        **{f"training.{name}": value for name, value in training.items()},
    }
    config = spacy.util.load_config(CONFIGS / "textcat_tiny.cfg", overrides=overrides)
    config["components"]["elmo"]["model"]["fine_tuning"] = fine_tuning(dict(RUN_RATE))
    config["training"]["batcher"] = {"@batchers": "spacy.batch_by_sequence.v1", "size": 8}
    config["initialize"]["after_init"] = after_init
    return config


def train_as_spacy_train(config):
    """`spacy train`'s own initialisation and loop; returns the elmo pipe's fine-tuning."""
    import io

    from spacy.training.initialize import init_nlp
    from spacy.training.loop import train as training_loop

    nlp = init_nlp(config)
    training_loop(nlp, None, stdout=io.StringIO(), stderr=io.StringIO())
    return nlp.get_pipe("elmo").model.shims[0].fine_tuning


@pytest.mark.parametrize("ends_by", ["max_steps", "max_epochs"])
def test_a_rate_over_the_run_spans_a_run_that_ends_by_steps_or_by_epochs(
    bilm_dir, corpus_dir, ends_by
):
    """num_steps = 0: the rate rises over the run's first tenth and is at its
    lowest at the run's last step, whether [training] ends it by max_steps
    (spaCy's loop then makes max_steps + 1 updates) or by max_epochs (spaCy's
    default max_steps = 0), the steps of the epochs counted at initialisation."""
    from spacy.tokens import DocBin

    if ends_by == "max_steps":
        config = training_config(bilm_dir, corpus_dir, max_steps=12, max_epochs=0)
        expected = 12
    else:
        config = training_config(bilm_dir, corpus_dir, max_steps=0, max_epochs=2)
        docs = len(DocBin().from_disk(corpus_dir / "train.spacy"))
        expected = 2 * -(-docs // 8)
    block = train_as_spacy_train(config)
    assert block.run_steps == expected
    rates = [block.schedules["learn_rate"][step] for step in range(block.step)]
    assert block.step == expected + (ends_by == "max_steps")  # the updates spaCy made
    assert rates == [
        pytest.approx(r) for r in itertools.islice(slanted_triangular(0.01, expected), block.step)
    ]
    assert max(rates) == pytest.approx(0.01)  # the peak, reached
    assert rates[expected - 1] == pytest.approx(0.01 / 32)  # the lowest, at the run's end


def test_a_rate_over_the_run_without_the_callback_says_what_to_add(bilm_dir, corpus_dir):
    config = training_config(bilm_dir, corpus_dir, after_init=None, max_steps=4)
    with pytest.raises(ConfigSettingError) as refused:
        train_as_spacy_train(config)
    message = str(refused.value)
    assert message.startswith("[...fine_tuning.optimizer.learn_rate] num_steps = 0: the ")
    assert '[initialize.after_init] @callbacks = "elmo_spacy.fine_tuning_steps.v1"' in message
    assert "or give num_steps the schedule's length in steps" in message
    # A pipeline trained in Python gives the length itself.
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    train = examples(nlp, corpus_dir / "train.spacy")
    optimizer = nlp.initialize(lambda: train)
    assert set_fine_tuning_steps(nlp, 4) == 4
    train_step(nlp, train[:8], optimizer)
    assert nlp.get_pipe("elmo").model.shims[0].fine_tuning.step == 1


def test_a_run_with_no_length_or_no_corpus_to_count_is_refused_at_initialisation(
    bilm_dir, corpus_dir, tmp_path
):
    endless = training_config(bilm_dir, corpus_dir, max_steps=0, max_epochs=0)
    nlp = spacy.util.load_model_from_config(endless, auto_fill=True, validate=True)
    with pytest.raises(
        ConfigSettingError, match=r"^\[training\] max_steps = 0: with max_epochs = 0"
    ):
        nlp.initialize(lambda: examples(nlp, corpus_dir / "train.spacy"))
    no_corpus = training_config(bilm_dir, corpus_dir, max_steps=0, max_epochs=2)
    no_corpus["paths"]["train"] = str(tmp_path / "missing.spacy")
    nlp = spacy.util.load_model_from_config(no_corpus, auto_fill=True, validate=True)
    with pytest.raises(ConfigSettingError) as refused:
        nlp.initialize(lambda: examples(nlp, corpus_dir / "train.spacy"))
    assert str(refused.value).startswith('[training] train_corpus = "corpora.train": the ')
    assert "--paths.train" in str(refused.value)


def test_counting_the_epochs_leaves_the_random_state_as_it_was(bilm_dir, corpus_dir):
    import random

    config = training_config(bilm_dir, corpus_dir, max_steps=0, max_epochs=3)
    lower = {"@augmenters": "spacy.lower_case.v1", "level": 0.5}  # draws from Python's random
    config["corpora"]["train"]["augmenter"] = lower
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    random.seed(7)
    numpy.random.seed(7)
    expected = random.random(), numpy.random.random()
    random.seed(7)
    numpy.random.seed(7)
    steps, how = training_steps(nlp)
    assert (random.random(), numpy.random.random()) == expected
    assert steps % 3 == 0 and "max_epochs = 3" in how


# -- settings that cannot work: the setting, its section, the value, what to give


@pytest.mark.parametrize(
    "where, value, message",
    [
        (
            "optimizer.use_averages",
            True,
            "[...fine_tuning.optimizer] use_averages = true: the biLM's optimizer would keep "
            "parameter averages",
        ),
        (
            "layer_rate_divisor",
            0.0,
            "[...fine_tuning] layer_rate_divisor = 0.0: give a positive number",
        ),
        ("trainable_layers", -1, "[...fine_tuning] trainable_layers = -1: (its value at step 0)"),
        ("trainable_layers", [], "[...fine_tuning] trainable_layers = []: an empty schedule"),
        (
            "optimizer.learn_rate.num_steps",
            -3,
            "[...learn_rate] num_steps = -3: the schedule's length in steps: give a whole "
            "number from 1, or 0 for the training run's length",
        ),
        ("optimizer.learn_rate.cut_frac", 1.5, "[...learn_rate] cut_frac = 1.5: the share of"),
        ("optimizer.learn_rate.ratio", 0.5, "[...learn_rate] ratio = 0.5: how many times"),
        ("optimizer.learn_rate.max_rate", 0.0, "[...learn_rate] max_rate = 0.0: the peak rate"),
    ],
)
def test_a_setting_that_cannot_work_names_its_section_value_and_what_to_give(
    bilm_dir, where, value, message
):
    block = fine_tuning(dict(RUN_RATE))
    *sections, name = where.split(".")
    node = block
    for section in sections:
        node = node[section]
    node[name] = value
    with pytest.raises(ConfigSettingError) as refused:
        fine_tuned_nlp(bilm_dir, block)
    assert str(refused.value).startswith(message)
    assert isinstance(refused.value, ElmoSpacyError)


def test_gradual_unfreezing_settings_name_their_section():
    with pytest.raises(ConfigSettingError, match=r"^\[...trainable_layers\] frozen_steps = -1: "):
        gradual_unfreezing(-1, 2)
    with pytest.raises(ConfigSettingError, match=r"^\[...trainable_layers\] steps_per_layer = 0: "):
        gradual_unfreezing(0, 0)


@pytest.mark.slow  # spacy train in a process of its own (6 s)
def test_spacy_train_shows_a_bad_setting_as_one_line_without_a_traceback(
    bilm_dir, corpus_dir, tmp_path
):
    config = training_config(bilm_dir, corpus_dir, max_steps=4)
    config["components"]["elmo"]["model"]["fine_tuning"]["optimizer"]["use_averages"] = True
    config.to_disk(tmp_path / "config.cfg")
    done = subprocess.run(
        [sys.executable, "-m", "spacy", "train", str(tmp_path / "config.cfg")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert "✘ [...fine_tuning.optimizer] use_averages = true: the biLM's optimizer" in said
    assert "set use_averages = false" in said


def test_the_shipped_recipe_runs_over_the_whole_run_however_it_ends(corpus_dir):
    """configs/ner_elmo.cfg: the rate over the run (num_steps = 0) and the
    callback that gives it the run's length, [training] max_steps as shipped
    or max_epochs passes of its batcher (sizes compounding across epochs)."""
    config = spacy.util.load_config(
        CONFIGS / "ner_elmo.cfg", overrides={"paths.train": str(corpus_dir / "train.spacy")}
    )
    assert config["initialize"]["after_init"] == SET_STEPS
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    block = nlp.get_pipe("elmo").model.shims[0].fine_tuning
    assert block.waiting == ["learn_rate"]
    assert training_steps(nlp) == (4000, "[training] max_steps")
    config["training"].update(max_steps=0, max_epochs=3)
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    steps, how = training_steps(nlp)
    docs = examples(nlp, corpus_dir / "train.spacy")
    batcher = spacy.registry.resolve({"b": config["training"]["batcher"]})["b"]
    assert steps == sum(len(list(batcher(docs))) for _ in range(3))
    assert how.startswith("[training] max_epochs = 3 passes")
    block = nlp.get_pipe("elmo").model.shims[0].fine_tuning
    assert set_fine_tuning_steps(nlp, steps) == steps and block.waiting == []
    assert block.schedules["learn_rate"][steps - 1] == pytest.approx(0.001 / 32)
