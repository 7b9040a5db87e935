"""The study behind elmo_spacy: the AG News (and later CoNLL, UD) experiments.

Run by project.yml as `python -m scripts <command>` from the repository root,
tested by the test suite, never installed. The arrows run one way: these
scripts import `elmo_spacy`; nothing in `elmo_spacy` imports them.
"""

from . import components  # noqa: E402,F401  (registers the study's pipeline parts)
