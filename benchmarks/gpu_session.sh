#!/usr/bin/env bash
# Every GPU check in one go, for a machine with a CUDA GPU and a CUDA build of
# torch: the GPU tests (`pytest -m gpu`), then the benchmarks on the GPU.
#
#     bash benchmarks/gpu_session.sh [STEP ...]
#
# STEP: tests, elmo_shapes, allennlp_module, pretrain_throughput, pretrain_throughput_original,
# profile_original_step, precision_perplexity, type_cache, profile_clipped
# (default: all, in that order), or the recipe's (configs/bilm_lm1b.cfg, on
# request): kernel_tests, recipe_step, recipe_profile, recipe_feed, recipe_perplexity,
# recipe_vocab. Each step has a time limit, so that one that
# hangs leaves the others their time. Its log goes to gpu-logs/ (or, where $OUT
# is set, into $OUT/logs.tgz, remade after each step: a lent machine gives a
# few files back, and what a killed run wrote so far).
#
# A machine that lacks spaCy and reaches no package index takes wheels from
# .whl/ (or the files of those wheels, tarred as .gpu/site.tar.xz: xz packs
# them in half the space, under the lent machine's 64 MiB), made where pip
# works (for the machine's Python, here 3.12):
#     pip download --no-deps --only-binary=:all: --python-version 3.12 \
#         --implementation cp --platform manylinux_2_28_x86_64 \
#         --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#         spacy thinc blis cymem preshed murmurhash srsly catalogue confection \
#         wasabi weasel spacy-legacy spacy-loggers cloudpathlib smart-open \
#         pydantic pydantic-core annotated-types typing-inspection
# (the versions of a working install: `pip freeze`), then, for the tarball
# (spaCy's languages stay: its registry imports them):
#     mkdir s && for w in .whl/*.whl; do unzip -q $w -d s; done &&
#         rm -rf s/spacy/tests s/thinc/tests && tar -cJf .gpu/site.tar.xz -C s . &&
#         rm -rf s .whl
# and `carry` names .gpu. Where ../shared/data is
# missing, a .devdata/ folder laid out like it stands in (or the same tarred as
# .gpu/devdata.tar.xz): allennlp_elmo/ (the conformance test),
# ag_news/train.csv and ag_news/unlabeled.txt (the text).
set -uo pipefail
logs=gpu-logs
[ -n "${OUT:-}" ] && logs=/tmp/gpu-logs
steps=${*:-tests elmo_shapes allennlp_module pretrain_throughput pretrain_throughput_original profile_original_step precision_perplexity type_cache profile_clipped}
mkdir -p "$logs"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
elif [ -f .gpu/site.tar.xz ]; then
    mkdir -p /tmp/site && tar -xJf .gpu/site.tar.xz -C /tmp/site || exit 1
    export PYTHONPATH=/tmp/site
fi
if [ ! -d .devdata ] && [ -f .gpu/devdata.tar.xz ]; then
    mkdir -p .devdata && tar -xJf .gpu/devdata.tar.xz -C .devdata || exit 1
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$logs/install.log" 2>&1 ||
    { tail -20 "$logs/install.log"; exit 1; }
if [ ! -d ../shared/data ] && [ -d .devdata ]; then
    mkdir -p ../shared && cp -r .devdata ../shared/data
fi
text=../shared/data/ag_news
[ -d $text ] || text=.devdata/ag_news
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$logs/gpu.txt"
python3 -c "import torch, spacy, cupy; print('torch', torch.__version__, 'spacy', spacy.__version__, 'cupy', cupy.__version__)" | tee -a "$logs/gpu.txt"

step() {  # step NAME SECONDS COMMAND...: run it with a limit, log it, say how it ended
    local name=$1 limit=$2
    shift 2
    local started=$SECONDS
    timeout "$limit" "$@" >"$logs/$name.log" 2>&1
    echo "== $name: exit $? in $((SECONDS - started)) s" | tee -a "$logs/steps.txt"
    [ -n "${OUT:-}" ] && tar -czf "$OUT/logs.tgz" -C "$logs" .
}
lm1b=configs/bilm_lm1b.cfg
for name in $steps; do
    case $name in
    tests) step tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py \
        tests/study/test_textcat_configs.py tests/test_lstm_implementations.py \
        tests/test_allennlp.py ;;
    allennlp_module) step allennlp_module 150 python3 benchmarks/allennlp_module.py \
        --device cuda --text $text/train.csv --batches 5 ;;
    elmo_shapes) step elmo_shapes 150 python3 benchmarks/elmo_shapes.py --device cuda \
        --text $text/train.csv --forwards clipped fused reference-style embedder ;;
    pretrain_throughput) step pretrain_throughput 90 python3 benchmarks/pretrain_throughput.py \
        configs/bilm.cfg $text/unlabeled.txt --device cuda --no-full-softmax \
        --precisions float32 bfloat16 float16 ;;
    pretrain_throughput_original) step pretrain_throughput_original 150 \
        python3 benchmarks/pretrain_throughput.py configs/bilm.cfg $text/unlabeled.txt \
        --device cuda --no-full-softmax --bilm.lstm_dim 4096 --bilm.projection_dim 512 \
        --training.batch_tokens 32768 --steps 20 ;;
    profile_original_step) step profile_original_step 150 \
        python3 benchmarks/pretrain_throughput.py configs/bilm_lm1b.cfg $text/unlabeled.txt \
        --device cuda --no-full-softmax --precisions bfloat16 --steps 10 --profile 5 ;;
    precision_perplexity) step precision_perplexity 120 python3 \
        benchmarks/precision_perplexity.py configs/bilm.cfg $text/unlabeled.txt --gpu-id 0 \
        --precisions float32 bfloat16 float16 ;;
    type_cache) step type_cache 150 python3 benchmarks/elmo_shapes.py --device cuda \
        --text $text/train.csv --forwards clipped fused --precisions float32 \
        --type-cache-size 0 ;;
    profile_clipped) step profile_clipped 90 python3 benchmarks/elmo_shapes.py --device cuda \
        --text $text/train.csv --shapes "original 2x4096_512" --forwards clipped \
        --precisions float32 --rounds 1 --profile ;;
    kernel_tests) step kernel_tests 120 python3 -m pytest -q -x -p no:cacheprovider \
        tests/test_lstm_implementations.py tests/test_gpu.py -k "triton or compiled or never_waits" ;;
    recipe_step) step recipe_step 240 python3 benchmarks/pretrain_throughput.py $lm1b \
        $text/unlabeled.txt --device cuda --no-full-softmax --precisions float32 bfloat16 \
        --kernels training fused loop --steps 20 ;;
    recipe_profile) step recipe_profile 120 python3 benchmarks/pretrain_throughput.py $lm1b \
        $text/unlabeled.txt --device cuda --no-full-softmax --precisions bfloat16 \
        --kernels training fused --steps 5 --profile 5 ;;
    recipe_feed) step recipe_feed 120 python3 benchmarks/pretrain_throughput.py $lm1b \
        $text/unlabeled.txt --device cuda --no-full-softmax --precisions bfloat16 \
        --kernels training --feeds built prepared --steps 30 ;;
    recipe_perplexity) step recipe_perplexity 180 python3 benchmarks/precision_perplexity.py \
        $lm1b $text/unlabeled.txt --gpu-id 0 --kernel training --steps 60 \
        --training.dev_fraction 0.05 --training.max_dev_tokens 50000 ;;
    recipe_vocab) step recipe_vocab 240 python3 benchmarks/large_corpus.py \
        --workdir /tmp/large_corpus vocab --shape original --gpu-id 0 --steps 20 \
        --cutoffs "[10000, 50000, 100000, 200000, 300000, 400000, 500000, 600000, 700000]" \
        --div-value 1.8 ;;
    *) echo "no step $name" && exit 2 ;;
    esac
done
[ -f "$logs/tests.log" ] && tail -n 25 "$logs/tests.log"
cat "$logs"/*.log | grep '^{' | cut -c1-1200
cat "$logs/steps.txt"
