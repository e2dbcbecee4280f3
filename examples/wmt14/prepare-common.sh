# Shared by prepare-wmt14en2de.sh and prepare-wmt14en2fr.sh (sourced, not run): the steps of
# fairseq's WMT'14 recipes (examples/translation/prepare-wmt14en2*.sh), made safe to re-run.
#
# The caller sets, before `prepare_main "$@"`:
#   SRC TGT              language codes
#   ARCHIVES             "FILE URL" entries to download
#   CORPORA              training corpora, paths without the language suffix (as extracted)
#   TEST_SGM DEV_SGM     newstest2014 / newstest2013 SGML, with {L} standing for the language
#                        and {T} for "src" or "ref" (the test set's file names carry both)
#   VALID_EVERY          --valid split: every VALID_EVERY-th training line goes to valid
#   PREP_DEFAULT DEST_DEFAULT
#   EXTRA_USAGE          the caller's own options, for --help
#
# A caller that brings its own tokenised text (examples/multi30k/prepare-lc-bpe.sh) uses the steps
# from learn_and_apply_bpe on, with TMP, PREP, DEST, TRAIN, BPE_TOKENS, WORKERS and USER_DIR set, and
# EVAL_SETS naming its evaluation sets (default: valid test; more test sets: test1, test2, ...).
#
# Every step writes its outputs under a temporary name and renames them when complete; a step
# whose outputs exist is skipped. Inputs (archives, --raw-dir) are only read.

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
TEXT=("$PYTHON" "$HERE/wmt14_text.py")
CHECKSUMS="$HERE/checksums.txt"

say() { printf '==> %s\n' "$*"; }
skip() { printf '    (skip: %s)\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
have() { local f; for f in "$@"; do [ -f "$f" ] || return 1; done; }

usage() {
    cat <<EOF
Usage: $(basename "$0") [options]

Downloads (or reads from --raw-dir) the WMT'14 $SRC-$TGT corpora of fairseq's recipe, then:
normalise + tokenise (Moses -a, via sacremoses), joint BPE (subword-nmt), clean (1-250
tokens, ratio 1.5), binarise (fairseq-preprocess --joined-dictionary). Re-running skips every
finished step.

Options:
  --raw-dir DIR       extracted raw files (plain parallel text and SGML, with the archives'
                      file names); nothing is downloaded          (default: download)
  --download-dir DIR  where archives are downloaded and extracted (default: orig)
  --prep-dir DIR      tokenised/BPE text, BPE codes, raw test set (default: $PREP_DEFAULT)
  --dest-dir DIR      binarised data for fairseq-train            (default: $DEST_DEFAULT)
  --bpe-tokens N      joint BPE merge operations                  (default: 40000)
  --valid SET         newstest2013 | split (one training pair in $VALID_EVERY, as fairseq's
                      recipe)                                     (default: newstest2013)
  --workers N         processes for tokenisation, BPE, binarising (default: nproc)
  --no-checksum       check downloaded archives for integrity only, not against
                      checksums.txt (e.g. if statmt.org re-packed an archive)
  --user-dir DIR      the fairseq_realformer package folder       (default: this repository's)
$EXTRA_USAGE  -h, --help
EOF
}

parse_args() {
    RAW_DIR=""
    DOWNLOAD_DIR="orig"
    PREP="$PREP_DEFAULT"
    DEST="$DEST_DEFAULT"
    BPE_TOKENS=40000
    VALID="newstest2013"
    WORKERS="$(nproc 2>/dev/null || echo 4)"
    USER_DIR="$(cd "$HERE/../.." && pwd)/fairseq_realformer"
    USE_CHECKSUMS=1
    while [ $# -gt 0 ]; do
        case "$1" in
            --raw-dir) RAW_DIR="$2"; shift 2 ;;
            --download-dir) DOWNLOAD_DIR="$2"; shift 2 ;;
            --prep-dir) PREP="$2"; shift 2 ;;
            --dest-dir) DEST="$2"; shift 2 ;;
            --bpe-tokens) BPE_TOKENS="$2"; shift 2 ;;
            --valid) VALID="$2"; shift 2 ;;
            --workers) WORKERS="$2"; shift 2 ;;
            --user-dir) USER_DIR="$2"; shift 2 ;;
            --no-checksum) USE_CHECKSUMS=0; shift ;;
            -h|--help) usage; exit 0 ;;
            *) usage >&2; die "unknown option: $1" ;;
        esac
    done
    case "$VALID" in newstest2013|split) ;; *) die "--valid must be newstest2013 or split" ;; esac
    TMP="$PREP/tmp"
}

# The raw files the recipe reads, relative to the raw folder.
sgm_path() {  # sgm_path PATTERN src|ref LANG
    local p="${1//\{T\}/$2}"
    printf '%s\n' "${p//\{L\}/$3}"
}
needed_files() {  # needed_files [all]: "all" includes newstest2013 even with --valid split
    local c l
    for c in "${CORPORA[@]}"; do for l in "$SRC" "$TGT"; do echo "$c.$l"; done; done
    sgm_path "$TEST_SGM" src "$SRC"; sgm_path "$TEST_SGM" ref "$TGT"
    if [ "$VALID" = newstest2013 ] || [ "${1:-}" = all ]; then
        sgm_path "$DEV_SGM" src "$SRC"; sgm_path "$DEV_SGM" ref "$TGT"
    fi
}
# A corpus may ship gzipped (giga-fren): FILE or FILE.gz will do.
raw_exists() { [ -f "$1" ] || [ -f "$1.gz" ]; }

checksum_of() {  # checksum_of FILE -> "ALGO HASH SIZE", empty when not listed
    awk -v f="$1" '$1 == f { print $2, $3, $4 }' "$CHECKSUMS"
}

download() {  # download FILE URL: resumable; the file gets its name only once complete
    local file="$1" url="$2" dst="$DOWNLOAD_DIR/$1" algo sum size
    if [ -f "$dst" ]; then skip "$file already downloaded"; return; fi
    read -r algo sum size <<<"$(checksum_of "$file")"
    if [ -n "${size:-}" ] && [ "$size" != - ] && [ -f "$dst.part" ] \
        && [ "$(stat -c %s "$dst.part")" = "$size" ]; then
        skip "$file.part is complete"
    else
        say "download $url (resumes $dst.part)"
        if command -v curl >/dev/null; then
            curl -fL --retry 5 --retry-delay 10 -C - -o "$dst.part" "$url"
        else
            wget -c -O "$dst.part" "$url"
        fi
    fi
    mv "$dst.part" "$dst"
}

verify() {  # verify FILE: archive integrity, then the checksum when checksums.txt lists one
    local file="$1" path="$DOWNLOAD_DIR/$1" algo sum size
    if [ -f "$path.verified" ]; then skip "$file already verified"; return; fi
    say "verify $file"
    case "$file" in
        *.tgz) gzip -t "$path" && tar -tzf "$path" >"$path.list.part" ;;
        *.tar) tar -tf "$path" >"$path.list.part" ;;
        *) die "unknown archive type: $file" ;;
    esac || die "$path is damaged: delete it and run again"
    read -r algo sum size <<<"$(checksum_of "$file")"
    if [ "$USE_CHECKSUMS" = 0 ]; then
        echo "    (--no-checksum: checked archive integrity only)"
    elif [ -n "${algo:-}" ]; then
        echo "$sum  $path" | "${algo}sum" -c --quiet - \
            || die "$path: $algo checksum differs from $CHECKSUMS: delete it and run again" \
                "(or pass --no-checksum if the archive was re-published)"
    else
        echo "    (no published checksum for $file: checked archive integrity only)"
    fi
    mv "$path.list.part" "$path.list"
    touch "$path.verified"
}

extract() {  # extract FILE: the members the recipe reads, nothing else (europarl has 20 languages)
    local file="$1" path="$DOWNLOAD_DIR/$1" marker="$DOWNLOAD_DIR/$1.extracted.$SRC-$TGT" f m
    if [ -f "$marker" ]; then skip "$file already extracted"; return; fi
    local members=()
    while read -r f; do
        # archives list members as "a/b" or "./a/b"; giga-fren's corpus is "X.gz"
        for m in "$f" "./$f" "$f.gz" "./$f.gz"; do
            if grep -qxF -- "$m" "$path.list"; then members+=("$m"); fi
        done
    done < <(needed_files all)
    say "extract ${#members[@]} files from $file"
    if [ ${#members[@]} -gt 0 ]; then
        tar -xf "$path" -C "$DOWNLOAD_DIR" "${members[@]}"
    fi
    touch "$marker"
}

fetch_all() {
    mkdir -p "$DOWNLOAD_DIR"
    local entry file url
    for entry in "${ARCHIVES[@]}"; do
        read -r file url <<<"$entry"
        download "$file" "$url"
        verify "$file"
        extract "$file"
    done
}

check_raw() {
    local f missing=()
    while read -r f; do raw_exists "$RAW/$f" || missing+=("$RAW/$f"); done < <(needed_files)
    if [ ${#missing[@]} -gt 0 ]; then
        printf '  missing: %s\n' "${missing[@]}" >&2
        die "${#missing[@]} raw files missing (see above)"
    fi
}

tokenize_train() {
    TRAIN_TOK="$TMP/train.tags.$SRC-$TGT.tok"
    if have "$TRAIN_TOK.$SRC" "$TRAIN_TOK.$TGT"; then
        skip "training data already tokenised: $TRAIN_TOK.{$SRC,$TGT}"
        return
    fi
    local c out parts=()
    for c in "${CORPORA[@]}"; do
        out="$TMP/tok.$(basename "$c")"
        parts+=("$out")
        if have "$out.$SRC" "$out.$TGT"; then skip "$c already tokenised"; continue; fi
        say "normalise punctuation, remove non-printing characters, tokenise -a: $c"
        "${TEXT[@]}" tokenize "$RAW/$c" "$out" --langs "$SRC" "$TGT" --workers "$WORKERS"
    done
    say "concatenate the corpora: $TRAIN_TOK.{$SRC,$TGT}"
    local l p
    for l in "$SRC" "$TGT"; do
        for p in "${parts[@]}"; do cat "$p.$l"; done >"$TRAIN_TOK.$l.part"
    done
    for l in "$SRC" "$TGT"; do mv "$TRAIN_TOK.$l.part" "$TRAIN_TOK.$l"; done
    for p in "${parts[@]}"; do rm -f "$p.$SRC" "$p.$TGT"; done
}

tokenize_sgm() {  # tokenize_sgm PATTERN RAW_OUT TOK_OUT: extract both sides, then tokenise
    local pattern="$1" raw="$2" tok="$3" l t
    if have "$raw.$SRC" "$raw.$TGT"; then
        skip "$(basename "$pattern") already extracted: $raw.{$SRC,$TGT}"
    else
        for l in "$SRC" "$TGT"; do
            if [ "$l" = "$SRC" ]; then t=src; else t=ref; fi
            say "extract segments: $RAW/$(sgm_path "$pattern" "$t" "$l") -> $raw.$l"
            "${TEXT[@]}" sgm "$RAW/$(sgm_path "$pattern" "$t" "$l")" "$raw.$l"
        done
    fi
    if have "$tok.$SRC" "$tok.$TGT"; then skip "already tokenised: $tok.{$SRC,$TGT}"; return; fi
    say "tokenise -a: $raw.{$SRC,$TGT}"
    "${TEXT[@]}" tokenize "$raw" "$tok" --langs "$SRC" "$TGT" --test --workers "$WORKERS"
}

split_valid() {
    if [ "$VALID" = newstest2013 ]; then
        TRAIN="$TRAIN_TOK"  # all of it: valid is newstest2013
        tokenize_sgm "$DEV_SGM" "$TMP/valid.raw" "$TMP/valid"
        return
    fi
    TRAIN="$TMP/train"
    if have "$TMP/train.$SRC" "$TMP/train.$TGT" "$TMP/valid.$SRC" "$TMP/valid.$TGT"; then
        skip "train/valid already split"
        return
    fi
    say "split off one training pair in $VALID_EVERY as valid"
    local l
    for l in "$SRC" "$TGT"; do
        awk -v n="$VALID_EVERY" 'NR % n == 0' "$TRAIN_TOK.$l" >"$TMP/valid.$l.part"
        awk -v n="$VALID_EVERY" 'NR % n != 0' "$TRAIN_TOK.$l" >"$TMP/train.$l.part"
    done
    for l in "$SRC" "$TGT"; do
        mv "$TMP/valid.$l.part" "$TMP/valid.$l"
        mv "$TMP/train.$l.part" "$TMP/train.$l"
    done
}

learn_and_apply_bpe() {
    BPE_CODE="$PREP/code"
    if have "$BPE_CODE"; then
        skip "BPE codes exist: $BPE_CODE"
    else
        say "learn joint BPE ($BPE_TOKENS merges) on $TRAIN.{$SRC,$TGT}"
        cat "$TRAIN.$SRC" "$TRAIN.$TGT" \
            | subword-nmt learn-bpe -s "$BPE_TOKENS" --num-workers "$WORKERS" >"$BPE_CODE.part"
        mv "$BPE_CODE.part" "$BPE_CODE"
    fi
    local set l in
    for set in train "${EVAL_SETS[@]}"; do
        for l in "$SRC" "$TGT"; do
            if [ "$set" = train ]; then in="$TRAIN.$l"; else in="$TMP/$set.$l"; fi
            if have "$TMP/bpe.$set.$l"; then skip "BPE already applied: $TMP/bpe.$set.$l"; continue; fi
            say "apply BPE: $in -> $TMP/bpe.$set.$l"
            subword-nmt apply-bpe -c "$BPE_CODE" --num-workers "$WORKERS" \
                -i "$in" -o "$TMP/bpe.$set.$l.part"
            mv "$TMP/bpe.$set.$l.part" "$TMP/bpe.$set.$l"
        done
    done
}

clean_or_copy() {  # clean_or_copy SET clean|copy
    local set="$1" how="$2" l
    if have "$PREP/$set.$SRC" "$PREP/$set.$TGT"; then skip "$PREP/$set.{$SRC,$TGT} exist"; return; fi
    if [ "$how" = clean ]; then
        say "clean $set: drop empty pairs, pairs over 250 tokens, length ratio over 1.5"
        "${TEXT[@]}" clean "$TMP/bpe.$set" "$PREP/$set" --langs "$SRC" "$TGT" \
            --min 1 --max 250 --ratio 1.5
    else
        say "copy $set as is (every segment is kept, in order)"
        for l in "$SRC" "$TGT"; do cp "$TMP/bpe.$set.$l" "$PREP/$set.$l.part"; done
        for l in "$SRC" "$TGT"; do mv "$PREP/$set.$l.part" "$PREP/$set.$l"; done
    fi
}

binarize() {
    local tests=("${EVAL_SETS[@]:1}")  # after valid: test, test1, ... (fairseq-preprocess's names)
    local last="$DEST/${tests[-1]}.$SRC-$TGT.$TGT.idx"  # fairseq-preprocess writes it last
    if have "$last" "$DEST/dict.$SRC.txt"; then skip "binarised data exist: $DEST"; return; fi
    say "binarise with a joined dictionary: $DEST"
    rm -rf "$DEST.part"
    local testpref
    testpref=$(printf "$PREP/%s," "${tests[@]}")
    fairseq-preprocess --user-dir "$USER_DIR" --source-lang "$SRC" --target-lang "$TGT" \
        --trainpref "$PREP/train" --validpref "$PREP/valid" --testpref "${testpref%,}" \
        --destdir "$DEST.part" --joined-dictionary --workers "$WORKERS"
    mkdir -p "$DEST"
    mv "$DEST.part"/* "$DEST"/
    rmdir "$DEST.part"
}

prepare_main() {
    parse_args "$@"
    EVAL_SETS=(valid test)
    if [ -n "$RAW_DIR" ]; then
        RAW="$RAW_DIR"
        say "raw files from $RAW (no download)"
    else
        RAW="$DOWNLOAD_DIR"
        fetch_all
    fi
    check_raw
    mkdir -p "$TMP"

    tokenize_train
    # the raw test set stays in PREP: sacreBLEU scores detokenised output against it
    tokenize_sgm "$TEST_SGM" "$PREP/test.raw" "$TMP/test"
    split_valid
    learn_and_apply_bpe
    clean_or_copy train clean
    if [ "$VALID" = split ]; then clean_or_copy valid clean; else clean_or_copy valid copy; fi
    clean_or_copy test copy
    binarize

    say "done: $DEST (binarised), $PREP/code (BPE codes)"
    say "raw newstest2014 reference for sacreBLEU: $PREP/test.raw.$TGT"
}
