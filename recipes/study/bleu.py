"""Score fairseq-generate output with sacreBLEU, refusing incomplete output.

fairseq-generate can silently skip sentences (e.g. the last partial batch when
``--required-batch-size-multiple`` > 1): a BLEU over fewer hypotheses than references is not
the test-set BLEU. This script takes the detokenised ``D-`` lines, checks that every
reference line has exactly one hypothesis, and prints sacreBLEU's score and signature.
Part of the Multi30k recipes reproducing Voita et al. 2019.
"""

from __future__ import annotations

import argparse
import json
import sys

from sacrebleu.metrics import BLEU


def read_hypotheses(generate_output: str) -> dict[int, str]:
    hyps = {}
    with open(generate_output, encoding="utf-8") as f:
        for line in f:
            if line.startswith("D-"):
                tag, _score, text = (line.rstrip("\n").split("\t") + [""])[:3]
                hyps[int(tag[2:])] = text
    return hyps


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument(
        "generate_output", help="stdout of fairseq-generate --post-process sentencepiece"
    )
    p.add_argument("reference", help="raw reference text, one sentence per line")
    p.add_argument("--hyp-out", help="write the hypotheses in reference order here")
    p.add_argument("--json-out", help="write score, signature and counts here")
    args = p.parse_args(argv)
    with open(args.reference, encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    hyps = read_hypotheses(args.generate_output)
    missing = [i for i in range(len(refs)) if i not in hyps]
    if missing or len(hyps) != len(refs):
        sys.exit(
            f"error: {len(hyps)} hypotheses for {len(refs)} references "
            f"(missing ids {missing[:10]}…); pass --required-batch-size-multiple 1"
        )
    ordered = [hyps[i] for i in range(len(refs))]
    bleu = BLEU()
    score = bleu.corpus_score(ordered, [refs])
    result = {
        "bleu": round(score.score, 2),
        "signature": str(bleu.get_signature()),
        "sentences": len(refs),
    }
    if args.hyp_out:
        with open(args.hyp_out, "w", encoding="utf-8") as f:
            f.write("\n".join(ordered) + "\n")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    print(f"BLEU {result['bleu']:.2f}  ({result['sentences']} sentences)  {result['signature']}")


if __name__ == "__main__":
    main()
