"""The report's markdown tables: BLEU per model, operating points, paired tests.

Operating points as in Voita et al. 2019's Table 1: the full model, about 10 and about 4
encoder heads, and joint pruning with the heads kept per attention type.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from recipes.study.lengths import length_markdown
from recipes.study.records import (
    METHODS,
    PRUNING_METHODS,
    enc_heads,
    fmt_heads,
    is_joint,
    mean_sd,
    random_groups,
)
from recipes.study.significance import format_p
from recipes.study.summary import heads_kept
from recipes.study.tables_posttrain import heads_markdown, posttrain_markdown
from recipes.study.tables_two_phase import encoder_markdown, joint_markdown
from recipes.study.training import training_markdown


def write_markdown(
    rows: list[dict],
    splits: list[str],
    path: Path,
    lengths: dict | None = None,
    heads: list[str] | None = None,
    paired: dict | None = None,
    controls: dict | None = None,
) -> None:
    order = list(METHODS) + ["exported", "?"]
    rows = sorted(
        rows,
        key=lambda r: (order.index(r["method"]) if r["method"] in order else len(order),
                       -(enc_heads(r) or 0), r["name"]),
    )  # fmt: skip
    lines = [
        "# BLEU vs heads kept",
        "",
        "sacreBLEU of `recipes/evaluate.sh` (beam search, detokenised); encoder heads kept /",
        "encoder heads of the full model (other attention types listed when gated or reduced).",
        "",
        "| model | method | setting | encoder heads | " + " | ".join(splits) + " |",
        "|---|---|---|---:|" + "---:|" * len(splits),
    ]
    for r in rows:
        cells = [str(r["bleu"].get(s, "–")) for s in splits]
        lines.append(
            f"| {r['name']} | {r['method']} | {r['setting']} | {fmt_heads(r)} | "
            + " | ".join(cells)
            + " |"
        )
    groups = random_groups(rows)
    if groups:
        lines += [
            "",
            "## Random heads: mean ± sd over seeds",
            "",
            "| made from | encoder heads | seeds | " + " | ".join(splits) + " |",
            "|---|---:|---:|" + "---:|" * len(splits),
        ]
        for (base, selected, k), group in groups.items():
            cells = []
            for s in splits:
                vals = [r["bleu"][s] for r in group if s in r["bleu"]]
                if not vals:
                    cells.append("–")
                    continue
                m, sd = mean_sd(vals)
                cells.append(f"{m:.2f} ± {sd:.2f}" if sd is not None else f"{m:.2f} (1 seed)")
            made_from = (base or "baseline") + (", last checkpoints" if selected else "")
            lines.append(f"| {made_from} | {k} | {len(group)} | " + " | ".join(cells) + " |")
    lines += operating_points(rows, splits)
    lines += length_markdown(lengths or {}, rows)
    lines += paired_markdown(paired or {}, rows)
    lines += paired_controls_markdown(controls or {})
    lines += heads or []
    lines += training_markdown(rows)
    lines += ["", "Plot: `bleu_vs_heads.png`.", ""]
    path.write_text("\n".join(lines))


OPERATING_POINTS = (10, 4)  # encoder heads of Voita et al.'s Table 1 operating points


def point_label(n_heads: int) -> str:
    """``~10``/``~4 encoder heads`` for a count within half of the point (the nearer one)."""
    near = [k for k in OPERATING_POINTS if abs(n_heads - k) <= k / 2]
    if not near:
        return f"{n_heads} encoder heads"
    return f"~{min(near, key=lambda k: (abs(n_heads - k), -k))} encoder heads"


def operating_points(rows: list[dict], splits: list[str]) -> list[str]:
    """Voita et al.'s operating points: the full model, the encoder-only pruning runs labelled
    by the point (~10 or ~4 encoder heads) they are near, and every joint run with its heads
    kept per attention type; BLEU and the difference to the baseline."""
    pruning = [r for r in rows if r["method"] in PRUNING_METHODS]
    encoder_only = [r for r in pruning if r.get("gated") == ["enc-self"] and not is_joint(r)]
    joint = [r for r in pruning if is_joint(r)]
    # the baseline, and encoder-only runs that kept every head (λ = 0: fine-tuning alone)
    full = [r for r in rows if r["method"] == "baseline"]
    full += [r for r in encoder_only if enc_heads(r) == r["heads"]["enc-self"][1]]
    points = [("full model", r) for r in full]
    pruned = sorted((r for r in encoder_only if r not in full), key=lambda r: -enc_heads(r))
    points += [(point_label(enc_heads(r)), r) for r in pruned]
    points += [("joint pruning", r) for r in joint]
    if not points:
        return []
    by_name = {r["name"]: r for r in rows}
    base = by_name.get("baseline") or next((r for r in rows if r["method"] == "baseline"), None)
    lines = [
        "",
        "## Operating points",
        "",
        "As in Voita et al.'s Table 1: the full model (the baseline, and fine-tuned with every",
        "head kept), the encoder-only pruning runs (~10 / ~4: within half of that count), and",
        "the joint runs with the heads kept per attention type. In brackets: BLEU minus that",
        "of the baseline the model was made from.",
        "",
        "| operating point | model | method | heads kept | " + " | ".join(splits) + " |",
        "|---|---|---|---|" + "---:|" * len(splits),
    ]
    for label, r in points:
        ref = by_name.get(r.get("baseline", "")) or base  # the baseline it was made from
        cells = []
        for s in splits:
            if s not in r["bleu"]:
                cells.append("–")
            elif ref is None or r is ref or s not in ref["bleu"]:
                cells.append(f"{r['bleu'][s]:.2f}")
            else:
                cells.append(f"{r['bleu'][s]:.2f} ({r['bleu'][s] - ref['bleu'][s]:+.2f})")
        lines.append(
            f"| {label} | {r['name']} | {r['method']} | {fmt_heads(r)} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def paired_controls_markdown(result: dict) -> list[str]:
    if not result.get("pairs"):
        return []
    lines = [
        "",
        f"## Controls against the pruning run ({result['split']})",
        "",
        "Each control against the pruning run with the same heads kept (and the same",
        f"baseline): sacreBLEU's paired bootstrap ({result['samples']} resamples); difference:",
        "the control's BLEU minus the pruning run's (> 0: the control is ahead; * p < 0.05).",
        "",
        "| model | method | against | BLEU | against's BLEU | difference | p |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for m in result["pairs"]:
        p = format_p(m["p"], result["samples"]) + (" *" if (m["p"] or 1) < 0.05 else "")
        lines.append(
            f"| {m['model']} | {m['method']} | {m['against']} | {m['bleu']:.2f} | "
            f"{m['against_bleu']:.2f} | {m['bleu'] - m['against_bleu']:+.2f} | {p} |"
        )
    return lines


def paired_markdown(result: dict, rows: list[dict]) -> list[str]:
    if not result.get("models"):
        return []
    method = {r["name"]: r["method"] for r in rows}
    models = result["models"]
    lines = [
        "",
        f"## Paired bootstrap against the baseline ({result['split']})",
        "",
        f"sacreBLEU's paired bootstrap resampling ({result['samples']} resamples of the test "
        f"sentences) of each model against the baseline it was made from: the mean BLEU ± its "
        f"95 % confidence interval, and the p-value of the difference (* below 0.05: unlikely "
        f"to be chance).",
        "",
        "| model | method | against | BLEU | difference | mean ± 95 % CI | p |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for name, m in models.items():
        base = m["against"]
        diff = "" if base is None else f"{m['bleu'] - models[base]['bleu']:+.2f}"
        p = format_p(m["p"], result["samples"]) + (" *" if (m["p"] or 1) < 0.05 else "")
        lines.append(
            f"| {name} | {method.get(name, '?')} | {base or '–'} | {m['bleu']:.2f} | {diff} | "
            f"{m['mean']:.2f} ± {m['ci']:.2f} | {p} |"
        )
    untested = result.get("untested") or {}
    if untested:
        lines += ["", "Not tested, as the baseline they were made from has no hypotheses here: "
                  + ", ".join(f"{n} ({b})" for n, b in sorted(untested.items())) + "."]  # fmt: skip
    return lines


SUMMARY_HEADER = (
    "| baseline | model | method | heads kept (enc / dec-self / dec-enc) | checkpoint "
    "| valid | test 2016 | test 2017 | MSCOCO 2017 | BP 2016 | Δ 2016 (vs) | p |"
)


def summary_markdown(rows: list[dict]) -> str:
    """The results document's final table, one line per row of results/summary.csv: BLEU on
    validation and the three test sets, brevity penalty, difference to the fair reference."""
    order = list(METHODS) + ["exported", "?"]

    def key(r: dict) -> tuple:
        method = order.index(r["method"]) if r["method"] in order else len(order)
        return r["dataset"], r["baseline"], method, -int(r["enc_self_kept"] or 0), r["model"]

    lines = [SUMMARY_HEADER, "|---|---|---|---|---|" + "---:|" * 7]
    for r in sorted(rows, key=key):
        method = r["method"] + (f" ({r['setting']})" if r["setting"] else "")
        delta = f"{r['delta_test_2016_flickr']} ({r['reference']})" if r["reference"] else "–"
        splits = ("valid", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
        bleu = [f"{float(r[s]):.2f}" if r[s] else "–" for s in splits]
        bp = f"{float(r['bp_test_2016_flickr']):.3f}" if r["bp_test_2016_flickr"] else "–"
        cells = [
            r["baseline"], r["model"], method, heads_kept(r), r["checkpoint"] or "–", *bleu, bp,
            delta,
            r["p_test_2016_flickr"] or "–",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """``python -m recipes.study.tables results/summary.csv [--posttrain | --heads | --joint |
    --encoder]``: print a table."""
    p = argparse.ArgumentParser(description=summary_markdown.__doc__.split("\n")[0])
    p.add_argument("summary", type=Path, help="results/summary.csv")
    p.add_argument(
        "--posttrain",
        action="store_true",
        help="the post-training pruning table instead of the table of every model",
    )
    p.add_argument(
        "--heads",
        action="store_true",
        help="heads only at equal head counts: post-training (heads:K), Michel et al., gated",
    )
    p.add_argument(
        "--joint",
        action="store_true",
        help="joint pruning of all three attention types against the joint λ = 0 control",
    )
    p.add_argument(
        "--encoder",
        action="store_true",
        help="encoder-only pruning, two-phase protocol, against the encoder-only λ = 0 control; "
        "the controls given its phase-2 budget",
    )
    args = p.parse_args(argv)
    with args.summary.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if args.joint:
        print(joint_markdown(rows))
    elif args.encoder:
        print(encoder_markdown(rows))
    elif args.heads:
        print(heads_markdown(rows))
    else:
        print(posttrain_markdown(rows) if args.posttrain else summary_markdown(rows))


if __name__ == "__main__":
    main()
