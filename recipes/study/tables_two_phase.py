"""The runs of ``recipes/full.sh``'s pruning study, as in Voita et al. 2019 ("Analyzing
Multi-Head Self-Attention: Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned"),
against their λ = 0 control, from ``results/summary.csv``: joint pruning of all three attention
types (``python -m recipes.study.tables results/summary.csv --joint``) and encoder-only pruning
with the two-phase protocol (``--encoder``).
"""

from __future__ import annotations

import re

from recipes.study.records import mean_sd
from recipes.study.summary import HEADS_KEPT, heads_kept

HEADER = (
    "| model | method | setting | heads kept (enc / dec-self / dec-enc) | heads removed "
    "| valid | test 2016 | BP 2016 | length ratio 2016 | Δ valid (p) | Δ 2016 (p) | vs |"
)


def is_joint_run(r: dict) -> bool:
    """A joint run of ``recipes/full.sh`` (``pruned-joint-*``): the end of its phase 1 (the
    one-phase model) or its phase 2 with one seed (``-s<seed>``)."""
    return r["model"].startswith("pruned-joint-")


def is_encoder_two_phase_run(r: dict) -> bool:
    """An encoder-only run of ``recipes/full.sh`` with the two-phase protocol (``pruned-k<K>``
    or ``pruned-l<λ>``, the λ = 0 control among them): its phase 1, whose setting says so, or
    its phase 2 with one seed. One-phase runs of the same names are left out."""
    run = r["model"].startswith("pruned-") and not is_joint_run(r)
    return run and (r["method"] == "two-phase" or "phase 1:" in r["setting"])


def removed(r: dict) -> str:
    """The share of all heads removed, e.g. ``75 %``."""
    kept = sum(int(r[k] or 0) for k in HEADS_KEPT)
    total = int(r["heads_total"] or 0)
    return f"{100 * (total - kept) / total:.0f} %" if total else "–"


def difference(r: dict, split: str) -> str:
    delta, p = r[f"delta_{split}"], r[f"p_{split}"]
    return f"{delta} ({p})" if delta else "–"


def seed_means(shown: list[dict]) -> list[str]:
    """Mean ± sd over the phase-2 seeds of each run that has two or more."""
    groups: dict[tuple, list[dict]] = {}
    for r in shown:
        run = re.fullmatch(r"(.+)-s\d+", r["model"])
        if r["method"] == "two-phase" and run:
            groups.setdefault((r["baseline"], run.group(1)), []).append(r)
    lines = []
    for (baseline, run), group in sorted(groups.items()):
        if len(group) < 2:
            continue
        cells = []
        for column in ("valid", "test_2016_flickr", "delta_valid", "delta_test_2016_flickr"):
            values = [float(r[column]) for r in group if r[column]]
            if len(values) < 2:
                cells.append("–")
                continue
            m, sd = mean_sd(values)
            sign = "+" if column.startswith("delta") else ""
            cells.append(f"{m:{sign}.2f} ± {sd:.2f}")
        lines.append(
            f"| {run}, {len(group)} seeds | mean ± sd | {baseline} | | | {cells[0]} | "
            f"{cells[1]} | | | {cells[2]} | {cells[3]} | |"
        )
    return lines


def joint_markdown(rows: list[dict]) -> str:
    """Every joint run (gates on encoder self-, decoder self- and encoder–decoder attention),
    per baseline and heads kept: the share of all heads removed, BLEU, brevity penalty and
    length ratio, and the paired difference to its fair reference (the joint λ = 0 control
    fine-tuned alike, where it was run; else the baseline); then the seeds' mean ± sd."""
    return runs_markdown([r for r in rows if is_joint_run(r)])


def encoder_markdown(rows: list[dict]) -> str:
    """Every encoder-only run of the two-phase protocol (decoder frozen), as ``joint_markdown``
    shows the joint ones: its fair reference is the encoder-only λ = 0 control, phase by
    phase and seed by seed."""
    return runs_markdown([r for r in rows if is_encoder_two_phase_run(r)])


def runs_markdown(shown: list[dict]) -> str:
    """The table of ``joint_markdown`` and ``encoder_markdown`` for the rows ``shown``."""

    def order(r: dict) -> tuple:
        kept = -sum(int(r[k] or 0) for k in HEADS_KEPT)
        return r["dataset"], r["baseline"], kept, r["method"] == "two-phase", r["model"]

    lines = [HEADER, "|---|---|---|---|" + "---:|" * 7 + "---|"]
    for r in sorted(shown, key=order):
        cells = [
            r["model"], r["method"], f"{r['baseline']}: {r['setting']}",
            heads_kept(r), removed(r),
            *(f"{float(r[s]):.2f}" if r[s] else "–" for s in ("valid", "test_2016_flickr")),
            r["bp_test_2016_flickr"] or "–", r["len_ratio_test_2016_flickr"] or "–",
            difference(r, "valid"), difference(r, "test_2016_flickr"), r["reference"] or "–",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + seed_means(shown))
