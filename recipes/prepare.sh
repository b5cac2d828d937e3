#!/usr/bin/env bash
# Step 1: raw Multi30k -> joint SentencePiece -> fairseq-preprocess binaries.
#
# Settings (environment variables):
#   RAW_DIR     folder with Multi30k raw text: {train,val,test_2016_flickr,test_2017_flickr,
#               test_2017_mscoco}.{en,de,fr}. Default: ../shared/data/multi30k if it exists,
#               otherwise the files are downloaded from the public multi30k/dataset repository.
#   WORK_DIR    where everything is written (default: $HOME/headprune-runs/multi30k)
#   SRC, TGT    languages (default: en, de)
#   VOCAB_SIZE  joint SentencePiece vocabulary (default: 8000)
#   TRAIN_LINES use only the first N training pairs (default: all; the smoke test uses a few hundred)
#   EVAL_LINES  use only the first N lines of each evaluation split (default: all)
#   VOCAB_FROM  a folder with spm.model and dict.$SRC.txt (e.g. models/multi30k-en-de, next to
#               the committed baseline): use that SentencePiece model and dictionary instead of
#               training new ones, so that token ids match a model trained on them (default: unset)
# Resumable: every step is skipped when its output exists.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib/common.sh"

RAW_DIR="${RAW_DIR:-}"
if [[ -z "$RAW_DIR" && -d "$HERE/../../shared/data/multi30k" ]]; then
  RAW_DIR="$(cd "$HERE/../../shared/data/multi30k" && pwd)"
fi
VOCAB_SIZE="${VOCAB_SIZE:-8000}"
TRAIN_LINES="${TRAIN_LINES:-0}"
EVAL_LINES="${EVAL_LINES:-0}"
SPLITS=(train val test_2016_flickr test_2017_flickr test_2017_mscoco)

raw="$WORK_DIR/raw"
spmdir="$WORK_DIR/spm"
mkdir -p "$raw" "$spmdir"

# 1a. raw text (local copy or download), optionally truncated
for split in "${SPLITS[@]}"; do
  for lang in "$SRC" "$TGT"; do
    out="$raw/$split.$lang"
    [[ -s "$out" ]] && continue
    n=$EVAL_LINES; [[ "$split" == train ]] && n=$TRAIN_LINES
    if [[ -n "$RAW_DIR" ]]; then
      src_file="$RAW_DIR/$split.$lang"
      [[ -f "$src_file" ]] || die "RAW_DIR=$RAW_DIR has no $split.$lang"
      take "$n" < "$src_file" > "$out.tmp"
    else
      url="https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/$split.$lang.gz"
      log "downloading $url"
      # offline, a connection can hang instead of failing: give up after 20 s and say why
      curl -fsSL --connect-timeout 20 "$url" | gunzip -c | take "$n" > "$out.tmp" ||
        die "could not download $url; give a local copy of Multi30k with RAW_DIR=<folder>"
    fi
    mv "$out.tmp" "$out"
  done
done

# every split is parallel: line i of the source translates to line i of the target
for split in "${SPLITS[@]}"; do
  n_src=$(wc -l < "$raw/$split.$SRC"); n_tgt=$(wc -l < "$raw/$split.$TGT")
  [[ "$n_src" -eq "$n_tgt" ]] ||
    die "$raw/$split.$SRC has $n_src lines but $raw/$split.$TGT has $n_tgt: the source and target files of a split must be line-aligned: fix RAW_DIR and remove $raw/$split.*"
done

# 1b. joint SentencePiece model on the training data of both languages
VOCAB_FROM="${VOCAB_FROM:-}"
dict_args=()
if [[ -n "$VOCAB_FROM" ]]; then
  [[ -s "$VOCAB_FROM/spm.model" && -s "$VOCAB_FROM/dict.$SRC.txt" ]] \
    || die "VOCAB_FROM=$VOCAB_FROM has no spm.model and dict.$SRC.txt"
  if [[ -s "$spmdir/spm.model" ]] && ! cmp -s "$VOCAB_FROM/spm.model" "$spmdir/spm.model"; then
    die "$spmdir/spm.model differs from $VOCAB_FROM/spm.model: use a new WORK_DIR"
  fi
  cp "$VOCAB_FROM/spm.model" "$spmdir/spm.model"
  dict_args=(--srcdict "$VOCAB_FROM/dict.$SRC.txt")
fi
if [[ ! -s "$spmdir/spm.model" ]]; then
  log "training SentencePiece (vocab $VOCAB_SIZE)"
  study spm train --model-prefix "$spmdir/spm" --vocab-size "$VOCAB_SIZE" \
    "$raw/train.$SRC" "$raw/train.$TGT"
fi
for split in "${SPLITS[@]}"; do
  for lang in "$SRC" "$TGT"; do
    out="$spmdir/$split.$lang"
    [[ -s "$out" ]] && continue
    study spm encode --model "$spmdir/spm.model" "$raw/$split.$lang" "$out.tmp"
    mv "$out.tmp" "$out"
  done
done

# 1c. fairseq binaries with one joint dictionary
if [[ ! -s "$DATA_BIN/dict.$SRC.txt" ]]; then
  log "fairseq-preprocess -> $DATA_BIN"
  rm -rf "$DATA_BIN.tmp"
  fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" \
    --trainpref "$spmdir/train" --validpref "$spmdir/val" \
    --testpref "$spmdir/test_2016_flickr,$spmdir/test_2017_flickr,$spmdir/test_2017_mscoco" \
    --joined-dictionary "${dict_args[@]}" --destdir "$DATA_BIN.tmp" --workers 2
  mv "$DATA_BIN.tmp" "$DATA_BIN"
fi
log "prepared: $DATA_BIN (test=test_2016_flickr, test1=test_2017_flickr, test2=test_2017_mscoco)"
