#!/bin/bash
# One epoch (or the budget OPTIONS give) of a workflow's pretraining on HEAD
# (the prepared corpus) against an earlier commit's text path (read and tokenised at every start),
# one after the other, each a process of its own measured by GNU time. HEAD
# measures dev perplexity on the docs the text path held out (its seeded 2%
# of the docs), so that the two perplexities are of the same docs.
#
#   bash benchmarks/pretrain_against_text_path.sh RUN_DIR BASELINE_COMMIT [CORPUS [OPTIONS...]]
#
# RUN_DIR: the folder of a workflow's run. BASELINE_COMMIT: 0f05efe, the last
# commit with the text path. CORPUS: the text under RUN_DIR/corpus, without
# .txt ("pretrain", the `all` workflow's; "ner/pretrain" the `ner` one's),
# prepared beside it; its SVD vectors are RUN_DIR/training/<its folder>/vectors-svd.
# OPTIONS: more pretraining options, e.g. --bilm.encoder word_char
# --training.max_steps 150.
set -eu
RUN=$(realpath "$1")
BASE=$2
CORPUS=${3:-pretrain}
shift $(( $# < 3 ? $# : 3 ))
VECTORS=$RUN/training/$(dirname "$CORPUS")/vectors-svd
ROOT=$(git rev-parse --show-toplevel)
PY=$ROOT/.venv/bin/python
WORK=$(mktemp -d)
git -C "$ROOT" worktree add --detach "$WORK/baseline" "$BASE" > /dev/null
trap 'git -C "$ROOT" worktree remove --force "$WORK/baseline"; rm -rf "$WORK"' EXIT
FLAGS="--gpu-id -1 --training.max_epochs 1 --training.precision bfloat16 --training.seed 0
  --bilm.lstm_dim 512 --bilm.projection_dim 128 --init-vectors $VECTORS $*"

cat > "$WORK/head.py" <<'PY'
import random
import sys

import numpy

import elmo_spacy.pretrain.train as train
from elmo_spacy.pretrain.batches import DevSample


def text_path_dev(corpus, fraction, max_tokens, seed, held_out=True):
    """The docs the text path held out: random.Random(seed) shuffles the
    doc numbers and the first round(fraction * docs) are dev."""
    order = list(range(corpus.n_docs))
    random.Random(seed).shuffle(order)
    docs = numpy.sort(numpy.array(order[: max(1, round(corpus.n_docs * fraction))]))
    return DevSample(corpus, docs.astype("int64"), True)


train.dev_sample = text_path_dev
from elmo_spacy.cli import app  # noqa: E402

app()
PY

cd "$ROOT"
echo "HEAD $(git rev-parse --short HEAD), prepared corpus:"
/usr/bin/time -f "peak %M KB, %e s" "$PY" "$WORK/head.py" pretrain configs/bilm.cfg \
    "$RUN/corpus/$CORPUS" "$WORK/head" $FLAGS 2>&1 | tr '\r' '\n' | grep -a "dev perplexity\|tokens/s$\|Best\|peak"
cd "$WORK/baseline"
echo "$BASE, text path:"
PYTHONPATH=. /usr/bin/time -f "peak %M KB, %e s" "$PY" -c "from elmo_spacy.cli import app; app()" \
    pretrain configs/bilm.cfg "$RUN/corpus/$CORPUS.txt" "$WORK/baseline-run" $FLAGS 2>&1 \
    | tr '\r' '\n' | grep -a "dev perplexity\|Best\|peak"
