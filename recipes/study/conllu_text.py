"""Write the words of every CoNLL-U sentence, joined by spaces, one sentence per line.

Used by ``recipes/score_syntax.sh`` to build the MT source text for gold dependency trees
(the syntactic heads of Voita et al. 2019, "Analyzing Multi-Head Self-Attention: Specialized
Heads Do the Heavy Lifting, the Rest Can Be Pruned", ACL 2019, §5.2). The words are read with
the scorer's own reader (``fairseq_headprune.scoring.syntax.read_conllu``: multiword-token
lines and empty nodes skipped), so line i holds exactly the words that tree i will be matched
against.
"""

from __future__ import annotations

import argparse
import sys

from fairseq_headprune.scoring.syntax import read_conllu


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("conllu", help="a CoNLL-U file")
    p.add_argument("out", help="the text file to write")
    p.add_argument("--max-sentences", type=int, default=0, help="only the first N (0: all)")
    a = p.parse_args(argv)
    trees = read_conllu(a.conllu)
    if a.max_sentences > 0:
        trees = trees[: a.max_sentences]
    with open(a.out, "w", encoding="utf-8") as f:
        for tree in trees:
            if any(not w or w != w.strip() or "\n" in w for w in tree.words):
                raise ValueError(f"{a.conllu}: a word with surrounding whitespace: {tree.words}")
            f.write(" ".join(tree.words) + "\n")
    print(f"{len(trees)} sentences -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
