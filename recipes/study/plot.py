"""The BLEU-vs-heads plot of the study (Voita et al. 2019, Fig. 7): one marker set per method."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from recipes.study.records import enc_heads, is_joint, mean_sd, random_groups

# plot style per method (recipes.study.records.METHODS): (marker, connect points with a line)


STYLE = {
    "baseline": ("*", False),
    "voita": ("o", True),
    "target-heads": ("s", True),
    "two-phase": ("p", True),
    "refit": ("P", True),
    "scratch": ("^", False),
    "michel": ("D", True),
    "random": ("x", True),
    "lrp": ("v", True),
    "masked": ("+", False),
}


def plot(rows: list[dict], split: str, path: Path) -> None:
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's logging is verbose
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(9.0, 4.8))
    # one series per (method, joint, baseline): joint runs prune the decoder too, and the x axis
    # counts only encoder heads, so they get their own unconnected series, listed last; models
    # made from another baseline than eval/baseline (model.json "baseline"), and last
    # checkpoints of runs otherwise evaluated at their best (model.json "selected"), are series
    # apart
    by_series = defaultdict(list)
    for r in rows:
        if split in r["bleu"] and enc_heads(r) is not None:
            series = (r["method"], is_joint(r), r.get("baseline", ""), r.get("selected", ""))
            by_series[series].append((enc_heads(r), r["bleu"][split]))
    rank = {m: i for i, m in enumerate(STYLE)}

    def order(series: tuple[str, bool, str, str]) -> tuple[int, str, str]:
        method, joint, base, selected = series
        return (len(rank) if joint else rank.get(method, len(rank)), base, selected)

    for series, points in sorted(by_series.items(), key=lambda kv: order(kv[0])):
        method, joint, base, selected = series
        marker, line = STYLE.get(method, (".", False))
        line = line and not joint
        face = {"markerfacecolor": "none"} if base else {}  # another baseline: hollow markers
        label = f"{method} (joint)" if joint else method
        apart = "".join(f", {tag}" for tag in (base, selected and "last checkpoints") if tag)
        if method == "random" and not joint:
            with_split = [r for r in rows if split in r["bleu"]]
            groups = {
                k: g for (b, sel, k), g in random_groups(with_split).items()
                if (b, sel) == (base, selected)
            }  # fmt: skip
            label = "random (mean ± sd)" + apart
            xs = list(groups)
            stats = [mean_sd([r["bleu"][split] for r in g]) for g in groups.values()]
            ax.errorbar(
                xs, [m for m, _ in stats], yerr=[sd or 0.0 for _, sd in stats],
                marker=marker, capsize=3, label=label, **face,
                linestyle="-" if line and len(xs) > 1 else "none",
            )  # fmt: skip
            continue
        points.sort()
        label += apart
        ax.plot(
            [x for x, _ in points], [y for _, y in points], marker=marker,
            linestyle="-" if line and len(points) > 1 else "none", label=label, **face,
        )  # fmt: skip
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("encoder heads kept")
    ax.set_ylabel(f"BLEU ({split})")
    ax.grid(alpha=0.3)
    if by_series:
        # beside the axes: with two baselines the series are many and would hide points
        ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
