"""Print the quickstart's table: encoder heads kept and BLEU, baseline against pruned model.

The operating points of Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized
Heads Do the Heavy Lifting, the Rest Can Be Pruned", ACL 2019) at the quickstart's size.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from recipes.study.records import checkpoint_info


def table(eval_dir: Path, split: str, models: list[tuple[str, str]]) -> str:
    """Rows of (name, encoder heads kept, BLEU on ``split``): the heads counted as
    the report counts them (recipes.study.records), the BLEU from evaluate.sh's JSONs."""
    lines = [f"{'model':<17} {'encoder heads':>13}   BLEU {split}"]
    for name, checkpoint in models:
        kept = checkpoint_info(Path(checkpoint))["heads"]["enc-self"][0]
        bleu = json.loads((eval_dir / name / f"{split}.json").read_text())["bleu"]
        lines.append(f"{name:<17} {kept:>13}   {bleu}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("eval_dir", type=Path, help="evaluate.sh's $WORK_DIR/eval")
    p.add_argument("baseline", help="the baseline checkpoint (evaluated as 'baseline')")
    p.add_argument("pruned", nargs="+", help="NAME=CHECKPOINT of each pruned (gated) model")
    p.add_argument("--split", default="test_2016_flickr")
    args = p.parse_args()
    if not all("=" in item for item in args.pruned):
        p.error(f"pruned models are NAME=CHECKPOINT, got {args.pruned}")
    pruned = [tuple(item.split("=", 1)) for item in args.pruned]
    print(table(args.eval_dir, args.split, [("baseline", args.baseline), *pruned]))


if __name__ == "__main__":
    main()
