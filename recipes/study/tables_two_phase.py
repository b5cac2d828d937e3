"""The runs of ``recipes/full.sh``'s pruning study, as in Voita et al. 2019 ("Analyzing
Multi-Head Self-Attention: Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned"),
against their λ = 0 control, from ``results/summary.csv``: joint pruning of all three attention
types (``python -m recipes.study.tables results/summary.csv --joint``) and encoder-only pruning
with the two-phase protocol and its controls (``--encoder``).
"""

from __future__ import annotations

import re

from recipes.study.records import CONTROL_METHODS, PHASE2_BUDGET, mean_sd
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
    its phase 2 with one seed; or an encoder-only control of ``recipes/controls.sh`` given the
    phase-2 budget (its setting says so). One-phase runs of the same names are left out."""
    if is_two_phase_control(r):
        return "-dec-" not in r["model"]  # a joint budget's tag names the decoder types
    run = r["model"].startswith("pruned-") and not is_joint_run(r)
    return run and (r["method"] == "two-phase" or "phase 1:" in r["setting"])


def is_two_phase_control(r: dict) -> bool:
    """A control of ``recipes/controls.sh`` (random, Michel, LRP, refit, scratch) fine-tuned
    with a two-phase run's phase-2 budget (``controls record --phase2-budget-of``)."""
    return r["method"] in CONTROL_METHODS and r["setting"].startswith(PHASE2_BUDGET)


def removed(r: dict) -> str:
    """The share of all heads removed, e.g. ``75 %``."""
    kept = sum(int(r[k] or 0) for k in HEADS_KEPT)
    total = int(r["heads_total"] or 0)
    return f"{100 * (total - kept) / total:.0f} %" if total else "–"


def difference(r: dict, split: str) -> str:
    delta, p = r[f"delta_{split}"], r[f"p_{split}"]
    return f"{delta} ({p})" if delta else "–"


def seed_means(shown: list[dict]) -> list[str]:
    """Mean ± sd over the phase-2 seeds of each run that has two or more, and over the draws
    of each random control (``random-s<S>-<tag>``, as ``random-<tag>``)."""
    groups: dict[tuple, list[dict]] = {}
    for r in shown:
        run = re.fullmatch(r"(.+)-s\d+", r["model"])
        draw = re.fullmatch(r"random-s\d+-(.+)", r["model"])
        if r["method"] == "two-phase" and run:
            groups.setdefault((r["baseline"], run.group(1), "seeds"), []).append(r)
        elif r["method"] == "random" and draw:
            groups.setdefault((r["baseline"], f"random-{draw.group(1)}", "draws"), []).append(r)
    lines = []
    for (baseline, run, what), group in sorted(groups.items()):
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
            f"| {run}, {len(group)} {what} | mean ± sd | {baseline} | | | {cells[0]} | "
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
    phase and seed by seed; then the controls given its phase-2 budget, each against the
    pruned model of the same fine-tuning seed, and the random draws' mean ± sd."""
    return runs_markdown([r for r in rows if is_encoder_two_phase_run(r)])


def runs_markdown(shown: list[dict]) -> str:
    """The table of ``joint_markdown`` and ``encoder_markdown`` for the rows ``shown``."""

    def order(r: dict) -> tuple:  # per head count: phase 1, phase 2, then the controls
        kept = -sum(int(r[k] or 0) for k in HEADS_KEPT)
        stage = 2 if is_two_phase_control(r) else int(r["method"] == "two-phase")
        return r["dataset"], r["baseline"], kept, stage, r["model"]

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
