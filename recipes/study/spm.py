"""Train and apply a joint SentencePiece model for the Multi30k recipes.

A thin command-line wrapper around the ``sentencepiece`` Python API (the pip
package ships no ``spm_train`` binary). Used by ``recipes/prepare.sh``.
"""

from __future__ import annotations

import argparse
import sys

import sentencepiece as spm


def train(inputs: list[str], model_prefix: str, vocab_size: int) -> None:
    """Train one joint unigram model on all ``inputs`` (source and target)."""
    spm.SentencePieceTrainer.train(
        input=",".join(inputs),
        model_prefix=model_prefix,
        vocab_size=vocab_size,
        character_coverage=1.0,
        model_type="unigram",
        # fairseq's dictionary adds its own <s>, <pad>, </s>, <unk>.
        bos_id=-1,
        eos_id=-1,
        unk_id=0,
        input_sentence_size=1_000_000,
        shuffle_input_sentence=True,
        num_threads=2,
        # a soft limit: a small corpus gets the vocabulary it can fill (smoke tests)
        hard_vocab_limit=False,
    )


def encode(model: str, src: str, dst: str) -> None:
    """Write ``src`` as space-separated pieces, one sentence per line."""
    sp = spm.SentencePieceProcessor(model_file=model)
    with open(src, encoding="utf-8") as fin, open(dst, "w", encoding="utf-8") as fout:
        for line in fin:
            fout.write(" ".join(sp.encode(line.rstrip("\n"), out_type=str)) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_train = sub.add_parser("train", help="train a joint model")
    p_train.add_argument("--model-prefix", required=True)
    p_train.add_argument("--vocab-size", type=int, default=8000)
    p_train.add_argument("inputs", nargs="+")
    p_enc = sub.add_parser("encode", help="apply a model to a raw text file")
    p_enc.add_argument("--model", required=True)
    p_enc.add_argument("src")
    p_enc.add_argument("dst")
    args = parser.parse_args(argv)
    if args.cmd == "train":
        train(args.inputs, args.model_prefix, args.vocab_size)
    else:
        encode(args.model, args.src, args.dst)


if __name__ == "__main__":
    sys.exit(main())
