#!/usr/bin/env bash
# Step 4: fairseq-generate + sacreBLEU on the three Multi30k test sets.
#
#   recipes/evaluate.sh NAME CHECKPOINT
# Settings: BEAM [5], LENPEN [1: fairseq's length penalty, chosen on validation only and
# then the same for every model compared; recorded in eval/NAME/lenpen when not 1],
# BATCH_SIZE [64], SUBSETS ["test test1 test2"] (= test_2016_flickr,
# test_2017_flickr, test_2017_mscoco), WORK_DIR, DATA_BIN. Writes
# $WORK_DIR/eval/NAME/<split>.{gen,hyp,json} and eval/NAME/checkpoint (the checkpoint's path,
# which recipes/report.sh reads); skips splits already scored, and refuses a NAME already
# used for another checkpoint.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib/common.sh"
[[ $# -eq 2 ]] || die "usage: $0 NAME CHECKPOINT"
name="$1"; ckpt="$2"
[[ -f "$ckpt" ]] || die "no checkpoint at $ckpt"
BEAM="${BEAM:-5}"
LENPEN="${LENPEN:-1}"
BATCH_SIZE="${BATCH_SIZE:-64}"
SUBSETS="${SUBSETS:-test test1 test2}"
out="$WORK_DIR/eval/$name"
mkdir -p "$out"
ckpt="$(cd "$(dirname "$ckpt")" && pwd)/$(basename "$ckpt")"
if [[ -s "$out/checkpoint" && "$(cat "$out/checkpoint")" != "$ckpt" ]]; then
  die "$out has the scores of $(cat "$out/checkpoint"), not of $ckpt: use another NAME"
fi
echo "$ckpt" > "$out/checkpoint"
if [[ "$LENPEN" != 1 || -s "$out/lenpen" ]]; then
  [[ ! -s "$out/lenpen" || "$(cat "$out/lenpen")" == "$LENPEN" ]] \
    || die "$out was scored with LENPEN=$(cat "$out/lenpen"), not $LENPEN: use another NAME"
  echo "$LENPEN" > "$out/lenpen"
fi
declare -A SPLIT=([valid]=val [test]=test_2016_flickr [test1]=test_2017_flickr [test2]=test_2017_mscoco)
for subset in $SUBSETS; do
  split="${SPLIT[$subset]}"
  [[ -s "$out/$split.json" ]] && { log "$name $split: $(cat "$out/$split.json" | tr -d '\n ')"; continue; }
  fairseq-generate "$DATA_BIN" --user-dir "$USER_DIR" --path "$ckpt" --gen-subset "$subset" \
    --source-lang "$SRC" --target-lang "$TGT" --beam "$BEAM" --lenpen "$LENPEN" \
    --batch-size "$BATCH_SIZE" \
    --required-batch-size-multiple 1 --post-process sentencepiece > "$out/$split.gen.tmp"
  mv "$out/$split.gen.tmp" "$out/$split.gen"
  study bleu "$out/$split.gen" "$WORK_DIR/raw/$split.$TGT" \
    --hyp-out "$out/$split.hyp" --json-out "$out/$split.json" | sed "s/^/$name $split: /"
done
