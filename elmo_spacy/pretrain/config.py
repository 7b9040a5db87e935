"""The pretraining config file: [bilm] sizes and [training] settings."""

import ast
import configparser
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from confection import Config, ConfigValidationError

from ..bilm import BiLMConfig
from ..bilm.model.config import from_known_fields
from ..bilm.runtime.precision import PRECISIONS
from ..errors import ElmoSpacyError


@dataclass
class PretrainConfig:
    """[training] settings of `elmo-spacy pretrain` (docs/pretraining.md tells how they act).

    seed: seeds torch, the dev sample and each epoch's batch order.
    dev_fraction: share of the docs held out for dev perplexity (0: a sample of
        the training docs); ignored with a dev corpus of its own.
    max_dev_tokens: the dev docs are drawn until they hold this many tokens.
    max_length: docs longer than this many tokens are cut into pieces.
    batch_tokens: padded tokens per optimizer step, all ranks together.
    learning_rate: Adam's step size.
    grad_clip: the largest norm of all gradients together.
    max_epochs: passes over the training docs.
    max_steps: optimizer steps to stop after, all runs of a resumed run (0: no limit).
    max_tokens: tokens trained on to stop after, all runs together (0: no limit).
    max_hours: hours of training to stop after, all runs together (0: no limit).
    patience: stop after this many evaluations without a better dev perplexity (0: never).
    eval_every: steps between measurements of dev perplexity (0: at each epoch's end only).
    eval_batch_tokens: padded tokens per batch when measuring perplexity.
    checkpoint_every: steps between checkpoints (0: none by steps).
    checkpoint_minutes: minutes of wall time between checkpoints (0: none by time).
    log_every: steps between the progress bar's loss figures and the checks of
        the time (`max_hours`, `checkpoint_minutes`): each waits on the device.
    precision: "float32", "bfloat16" (autocast, float32 master weights) or
        "float16" (the same, with GradScaler); what is saved is float32 either way.
    """

    seed: int = 0
    dev_fraction: float = 0.02
    max_dev_tokens: int = 200_000
    max_length: int = 200
    batch_tokens: int = 3000
    learning_rate: float = 0.002
    grad_clip: float = 5.0
    max_epochs: int = 5
    max_steps: int = 0
    max_tokens: int = 0
    max_hours: float = 0.0
    patience: int = 2
    eval_every: int = 0
    eval_batch_tokens: int = 8000
    checkpoint_every: int = 500
    checkpoint_minutes: float = 10.0
    log_every: int = 20
    precision: str = "float32"

    def __post_init__(self) -> None:
        problems = []
        for spec in fields(self):
            if spec.name == "precision":
                continue
            value = getattr(self, spec.name)
            kind = int if spec.type in (int, "int") else float
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                problems.append(f"{spec.name} = {value!r}: a number")
            elif kind is int and value != int(value):
                problems.append(f"{spec.name} = {value!r}: a whole number")
            else:
                setattr(self, spec.name, kind(value))
        if problems:
            raise ElmoSpacyError("[training] " + "; ".join(problems))
        ones = "max_epochs max_length batch_tokens eval_batch_tokens max_dev_tokens log_every"
        zeros = (
            "max_steps max_tokens max_hours patience eval_every checkpoint_every checkpoint_minutes"
        )
        at_least = dict.fromkeys(ones.split(), 1) | dict.fromkeys(zeros.split(), 0)
        problems = [
            f"{name} = {getattr(self, name)}: at least {low}"
            for name, low in at_least.items()
            if getattr(self, name) < low
        ]
        if not self.learning_rate > 0:
            problems.append(f"learning_rate = {self.learning_rate}: above 0")
        if not 0.0 <= self.dev_fraction < 1.0:
            problems.append(f"dev_fraction = {self.dev_fraction}: in [0, 1)")
        if self.precision not in PRECISIONS:
            problems.append(f"precision = {self.precision!r}: one of {', '.join(PRECISIONS)}")
        if problems:
            raise ElmoSpacyError("[training] " + "; ".join(problems))


def _syntax_error(path: str | Path, err: Exception) -> str:
    """`path:line: what is wrong` for a config that confection cannot read
    (it names the text '<string>', and raises "from None" over configparser's error)."""
    cause = err if isinstance(err, configparser.Error) else err.__context__
    fix = "sections are [name], settings are name = value, each on a line of its own"
    if isinstance(cause, configparser.DuplicateOptionError):
        return (
            f"{path}:{cause.lineno}: [{cause.section}] sets {cause.option} a second time: keep one"
        )
    if isinstance(cause, configparser.DuplicateSectionError):
        return f"{path}:{cause.lineno}: a second [{cause.section}] section: merge the two"
    if isinstance(cause, configparser.MissingSectionHeaderError):
        return f"{path}:{cause.lineno}: {cause.line.strip()!r} comes before any [section]: {fix}"
    if isinstance(cause, configparser.ParsingError) and cause.errors:
        lineno, line = cause.errors[0]
        try:
            line = ast.literal_eval(line)  # configparser keeps the line's repr
        except (ValueError, SyntaxError):
            pass
        return f"{path}:{lineno}: cannot read {str(line).strip()!r}: {fix}"
    if isinstance(err, ConfigValidationError):
        title = err.title or "invalid config"
        return f"{path}: {title}: {' '.join(str(err.desc or err).split())}"
    return f"{path}: {err}"


def load_pretrain_config(
    path: str | Path, overrides: dict[str, Any] = None
) -> tuple[BiLMConfig, PretrainConfig]:
    """Read a config file with [bilm] and [training] sections; `overrides`
    maps dotted names ("training.max_epochs") to values."""
    try:
        config = Config().from_disk(path, overrides=overrides or {})
    except UnicodeDecodeError as err:
        raise ElmoSpacyError(f"{path} is not UTF-8 text ({err.reason}): save it as UTF-8") from err
    except (configparser.Error, ConfigValidationError) as err:
        raise ElmoSpacyError(_syntax_error(path, err)) from err
    unknown = sorted(set(config) - {"bilm", "training"})
    if unknown:
        raise ElmoSpacyError(f"{path}: unknown sections {unknown}; expected [bilm] and [training]")
    try:
        training = from_known_fields(PretrainConfig, dict(config.get("training", {})), "[training]")
    except ValueError as err:
        raise ElmoSpacyError(f"{path}: {err}") from err
    try:
        bilm = BiLMConfig.from_dict(dict(config.get("bilm", {})))
    except ValueError as err:
        raise ElmoSpacyError(f"{path}: [bilm]: {err}") from err
    return bilm, training
