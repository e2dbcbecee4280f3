#!/usr/bin/env bash
# WMT'14 English-German as in fairseq's examples/translation/prepare-wmt14en2de.sh: europarl-v7,
# commoncrawl and news-commentary v12 (v9 with --icml17, the data of "Convolutional Sequence to
# Sequence Learning"), newstest2014 "full" as test, 40k joint BPE. Run with --help for options.
set -euo pipefail

SRC=en
TGT=de
ARCHIVES=(
    "training-parallel-europarl-v7.tgz https://statmt.org/wmt13/training-parallel-europarl-v7.tgz"
    "training-parallel-commoncrawl.tgz https://statmt.org/wmt13/training-parallel-commoncrawl.tgz"
    "training-parallel-nc-v12.tgz https://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz"
    "dev.tgz https://data.statmt.org/wmt17/translation-task/dev.tgz"
    "test-full.tgz https://statmt.org/wmt14/test-full.tgz"
)
CORPORA=(
    "training/europarl-v7.de-en"
    "commoncrawl.de-en"
    "training/news-commentary-v12.de-en"
)
TEST_SGM="test-full/newstest2014-deen-{T}.{L}.sgm"
DEV_SGM="dev/newstest2013-{T}.{L}.sgm"
VALID_EVERY=100
PREP_DEFAULT=wmt14_en_de
DEST_DEFAULT=data-bin/wmt14_en_de
EXTRA_USAGE="  --icml17            news-commentary v9 instead of v12
"

args=()
for a in "$@"; do
    if [ "$a" = --icml17 ]; then
        ARCHIVES[2]="training-parallel-nc-v9.tgz https://statmt.org/wmt14/training-parallel-nc-v9.tgz"
        CORPORA[2]="training/news-commentary-v9.de-en"
    else
        args+=("$a")
    fi
done

source "$(dirname "${BASH_SOURCE[0]}")/prepare-common.sh"
prepare_main ${args[@]+"${args[@]}"}
