#!/usr/bin/env bash
# WMT'14 English-French as in fairseq's examples/translation/prepare-wmt14en2fr.sh: europarl-v7,
# commoncrawl, UN, news-commentary v9 and the 10^9 French-English corpus (~36M pairs before
# cleaning), newstest2014 "full" as test, 40k joint BPE. Run with --help for options.
set -euo pipefail

SRC=en
TGT=fr
ARCHIVES=(
    "training-parallel-europarl-v7.tgz https://statmt.org/wmt13/training-parallel-europarl-v7.tgz"
    "training-parallel-commoncrawl.tgz https://statmt.org/wmt13/training-parallel-commoncrawl.tgz"
    "training-parallel-un.tgz https://statmt.org/wmt13/training-parallel-un.tgz"
    "training-parallel-nc-v9.tgz https://statmt.org/wmt14/training-parallel-nc-v9.tgz"
    "training-giga-fren.tar https://statmt.org/wmt10/training-giga-fren.tar"
    "dev.tgz https://data.statmt.org/wmt17/translation-task/dev.tgz"
    "test-full.tgz https://statmt.org/wmt14/test-full.tgz"
)
CORPORA=(
    "training/europarl-v7.fr-en"
    "commoncrawl.fr-en"
    "un/undoc.2000.fr-en"
    "training/news-commentary-v9.fr-en"
    "giga-fren.release2.fixed"  # read gzipped as it ships: giga-fren.release2.fixed.{en,fr}.gz
)
TEST_SGM="test-full/newstest2014-fren-{T}.{L}.sgm"
DEV_SGM="dev/newstest2013-{T}.{L}.sgm"
VALID_EVERY=1333
PREP_DEFAULT=wmt14_en_fr
DEST_DEFAULT=data-bin/wmt14_en_fr
EXTRA_USAGE=""

source "$(dirname "${BASH_SOURCE[0]}")/prepare-common.sh"
prepare_main "$@"
