"""Pretraining's one stop rule (elmo_spacy/pretrain/limits.py): every limit
of [training] has its row and is checked where its row says; the loop
stopping on each is tested in tests/test_pretrain.py."""

import dataclasses

import pytest

from elmo_spacy.pretrain.checkpoint import RunState
from elmo_spacy.pretrain.config import PretrainConfig
from elmo_spacy.pretrain.limits import CHECK_POINTS, LIMITS, limits_reached

SIZES = {"max_dev_tokens", "max_length"}  # the dev sample's and a doc piece's, not limits
LIMIT_SETTINGS = {
    f.name for f in dataclasses.fields(PretrainConfig) if f.name.startswith("max_")
} - SIZES | {"patience"}


def test_every_limit_of_the_config_has_one_row():
    settings = [limit.setting for limit in LIMITS]
    assert sorted(settings) == sorted(LIMIT_SETTINGS)
    assert all(limit.checked in CHECK_POINTS for limit in LIMITS)


def test_the_rule_says_which_limits_are_reached_where_they_are_checked():
    config = PretrainConfig(max_epochs=2, max_steps=10, max_tokens=0, max_hours=0.5, patience=2)
    state = RunState(step=10, epoch=3, tokens=10**9, train_seconds=1800.0, bad_evaluations=1)
    assert limits_reached(state, config) == [
        "max_epochs = 2, 2 epochs done",
        "max_steps = 10, 10 steps done",
        "max_hours = 0.5, 0.50 hours done",
    ]  # max_tokens = 0: no limit, however many tokens
    assert limits_reached(state, config, at="step") == ["max_steps = 10, 10 steps done"]
    assert limits_reached(state, config, at="log") == ["max_hours = 0.5, 0.50 hours done"]
    assert limits_reached(state, config, at="evaluation") == []
    state.bad_evaluations = 2
    assert limits_reached(state, config, at="evaluation") == [
        "patience = 2, 2 evaluations without a better dev perplexity"
    ]
    assert limits_reached(RunState(), config) == []
    with pytest.raises(ValueError, match="at = 'batch'"):
        limits_reached(state, config, at="batch")
