#!/usr/bin/env bash
# Syntactic heads on gold trees: score a trained model's encoder self-attention against the
# gold dependency trees of a CoNLL-U treebank (Voita et al. 2019, §5.2).
#
# Multi30k has no gold trees, so the model reads the treebank's sentences instead: each
# sentence's words (CoNLL-U FORMs, multiword-token lines and empty nodes skipped) joined by
# spaces are the source text, encoded with the recipe's SentencePiece model and binarised with
# fairseq-preprocess against the model's own data-bin dictionaries (--srcdict/--tgtdict), then
# `fairseq-headprune score --conllu` runs on that split. Tree i matches source line i when the
# words recovered from the SentencePiece tokens equal the tree's words (<unk> matches any
# word); the others are skipped and counted (`syntax.skipped` in heads.json).
#
# The placeholder target: fairseq's translation task needs a target side, and a treebank has
# none. The Multi30k dictionary is joint (dict.en.txt = dict.de.txt), so a copy of the source
# binarised with the target dictionary serves as the target. The encoder never sees the
# target, so encoder self-attention scores (syntax, confidence, entropy, positional, rare-word)
# are those of the real model on this text; everything the decoder computes reads the
# placeholder and means nothing, so only encoder self-attention is reported (--sites
# enc-self). The treebank is also off the model's domain (Multi30k: image captions).
#
# Settings (environment variables, defaults in brackets):
#   WORK_DIR [$HOME/headprune-runs/multi30k]   DATA_BIN [$WORK_DIR/data-bin] (its dict.*.txt)
#   CKPT [$WORK_DIR/baseline/checkpoint_best.pt]   the model to score
#   SPM_MODEL [$WORK_DIR/spm/spm.model]          the SentencePiece model of recipes/prepare.sh
#   RAW_UD_DIR [../shared/data/ud_english, relative to the repository]
#   CONLLU [$RAW_UD_DIR/en_ewt-ud-test.conllu]   the trees. When the default file is missing it
#            is downloaded from GitHub UniversalDependencies/UD_English-EWT at UD_EWT_REF
#            [15d613d8447b3478787d4c278730a1e48a945efb, UD v2.16] into $WORK_DIR/ud/
#   SYNTAX_DIR [$WORK_DIR/syntax/<CONLLU name>]  text/, spm/, data-bin/ and scores/ (the
#            score command's heads.json, heads.csv, summary.md, heatmaps)
#   MAX_SENTENCES [0 = all]   only the first N sentences of the treebank (the steps below
#            are skipped when their output exists: use another SYNTAX_DIR for another N)
#   METRICS [syntax,confidence,entropy,positional,rare]   BATCH_SIZE [32]
#   EXTRA_ARGS: appended to `fairseq-headprune score` (e.g. "--syntactic-margin 0.05")
# Resumable: every step is skipped when its output exists.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/lib/common.sh"

CKPT="${CKPT:-$WORK_DIR/baseline/checkpoint_best.pt}"
SPM_MODEL="${SPM_MODEL:-$WORK_DIR/spm/spm.model}"
RAW_UD_DIR="${RAW_UD_DIR:-$REPO_ROOT/../shared/data/ud_english}"
[[ -d "$RAW_UD_DIR" ]] && RAW_UD_DIR="$(cd "$RAW_UD_DIR" && pwd)"
UD_EWT_REF="${UD_EWT_REF:-15d613d8447b3478787d4c278730a1e48a945efb}"
DEFAULT_CONLLU="en_ewt-ud-test.conllu"
CONLLU="${CONLLU:-}"
MAX_SENTENCES="${MAX_SENTENCES:-0}"
METRICS="${METRICS:-syntax,confidence,entropy,positional,rare}"
BATCH_SIZE="${BATCH_SIZE:-32}"
EXTRA_ARGS="${EXTRA_ARGS:-}"

[[ -f "$CKPT" ]] || die "no checkpoint at $CKPT (set CKPT)"
[[ -f "$SPM_MODEL" ]] || die "no SentencePiece model at $SPM_MODEL (run recipes/prepare.sh or set SPM_MODEL)"
for lang in "$SRC" "$TGT"; do
  [[ -f "$DATA_BIN/dict.$lang.txt" ]] || die "no $DATA_BIN/dict.$lang.txt (set DATA_BIN)"
done

# 1. the trees: given, the shared copy, or downloaded
if [[ -z "$CONLLU" ]]; then
  CONLLU="$RAW_UD_DIR/$DEFAULT_CONLLU"
  if [[ ! -f "$CONLLU" ]]; then
    CONLLU="$WORK_DIR/ud/$DEFAULT_CONLLU"
    if [[ ! -s "$CONLLU" ]]; then
      url="https://raw.githubusercontent.com/UniversalDependencies/UD_English-EWT/$UD_EWT_REF/$DEFAULT_CONLLU"
      log "no $RAW_UD_DIR/$DEFAULT_CONLLU: downloading $url"
      mkdir -p "$WORK_DIR/ud"
      curl -fsSL "$url" -o "$CONLLU.tmp" \
        || { rm -f "$CONLLU.tmp"; die "cannot download $url (offline?): set RAW_UD_DIR or CONLLU"; }
      mv "$CONLLU.tmp" "$CONLLU"
    fi
  fi
fi
[[ -f "$CONLLU" ]] || die "no CoNLL-U file at $CONLLU"
name="$(basename "$CONLLU" .conllu)"
SYNTAX_DIR="${SYNTAX_DIR:-$WORK_DIR/syntax/$name}"
mkdir -p "$SYNTAX_DIR/text" "$SYNTAX_DIR/spm"

# 2. source text: the words of each sentence joined by spaces; a copy as the placeholder target
text="$SYNTAX_DIR/text/test.$SRC"
if [[ ! -s "$text" ]]; then
  study conllu_text "$CONLLU" "$text.tmp" --max-sentences "$MAX_SENTENCES"
  mv "$text.tmp" "$text"
fi
for lang in "$SRC" "$TGT"; do
  out="$SYNTAX_DIR/spm/test.$lang"
  [[ -s "$out" ]] && continue
  study spm encode --model "$SPM_MODEL" "$text" "$out.tmp"  # target = source
  mv "$out.tmp" "$out"
done

# 3. binarised with the model's dictionaries, as split "test"
bin="$SYNTAX_DIR/data-bin"
if [[ ! -s "$bin/test.$SRC-$TGT.$SRC.bin" ]]; then
  log "fairseq-preprocess -> $bin"
  rm -rf "$bin.tmp"
  fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" \
    --srcdict "$DATA_BIN/dict.$SRC.txt" --tgtdict "$DATA_BIN/dict.$TGT.txt" \
    --testpref "$SYNTAX_DIR/spm/test" --destdir "$bin.tmp" --workers 1 >/dev/null
  mv "$bin.tmp" "$bin"
fi

# 4. encoder self-attention scores against the trees
scores="$SYNTAX_DIR/scores"
if [[ ! -s "$scores/heads.json" ]]; then
  log "fairseq-headprune score ($METRICS) -> $scores"
  # shellcheck disable=SC2086
  fairseq-headprune score "$bin" --path "$CKPT" --subset test --conllu "$CONLLU" \
    --metrics "$METRICS" --sites enc-self --batch-size "$BATCH_SIZE" --out "$scores" \
    $EXTRA_ARGS
fi
python - "$scores/heads.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s = r["syntax"]
heads = [h for h in r["heads"] if h["syntactic"]]
print(f"{r['sentences']} sentences: {s['matched']} matched their tree, {s['skipped']} skipped; "
      f"{len(heads)} syntactic encoder heads")
PY
log "scores: $scores/summary.md"
