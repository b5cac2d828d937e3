"""The surviving heads of each pruning run and when their gates closed (Voita et al. 2019, §5–6).

With the scores of the model before pruning (``fairseq-headprune score``'s heads.json): each
kept head's roles and LRP relevance, and Spearman's ρ between a head's score and the update at
which its gate closed (``recipes.study.gate_trajectory``).
"""

from __future__ import annotations

from pathlib import Path

from recipes.study import gate_trajectory
from recipes.study.records import PRUNING_METHODS


def role_tags(record: dict) -> list[str]:
    """The roles the scorer found for a head (Voita et al. §5): positional, syntactic, rare."""
    tags = ["positional"] if record.get("positional") else []
    tags += [f"syntactic ({', '.join(record['syntactic'])})"] if record.get("syntactic") else []
    return tags + (["rare words"] if record.get("rare") else [])


def heads_markdown(rows: list[dict], scores: dict | None, against: str = "baseline") -> list[str]:
    """The surviving heads of every pruning run with their roles and LRP relevance in the
    model before pruning, and when the gates closed against that relevance (Voita et al. §6).
    ``scores`` are those of the baseline ``against``: runs made from another baseline
    (model.json ``"baseline"``, compared with ``against``'s own) are left out."""
    scored = next((r.get("baseline", against) for r in rows if r["name"] == against), against)
    pruned = [
        r for r in rows
        if r["method"] in PRUNING_METHODS and r.get("kept")
        and r.get("baseline", against) == scored
    ]  # fmt: skip
    if not pruned or scores is None:
        return []
    by_key = {(h["site"], h["layer"], h["head"]): h for h in scores["heads"]}
    lines = [
        "",
        "## The surviving heads",
        "",
        f"Scores of the model before pruning (`{scores.get('checkpoint')}`, "
        f"{scores.get('subset')} set): the roles `fairseq-headprune score` found and each",
        "kept head's LRP relevance (normalised over its layer's heads). LRP share: the kept",
        "heads' part of the gated types' total relevance.",
        "",
        "| model | type | kept heads (layer:head, roles) | LRP share |",
        "|---|---|---|---:|",
    ]
    for r in pruned:
        for site in r.get("gated") or ["enc-self"]:
            kept = r["kept"].get(site) or []
            kept_n, all_n = r["heads"][site]
            if kept_n == all_n:
                lines.append(f"| {r['name']} | {site} | all {all_n} kept | 1.00 |")
                continue
            cells, share, total = [], 0.0, 0.0
            for layer, heads in enumerate(kept):
                for head in heads:
                    rec = by_key.get((site, layer, head), {})
                    tags = role_tags(rec)
                    lrp = rec.get("lrp")
                    text = f"{layer}:{head}" + (f" lrp {lrp:.2f}" if lrp is not None else "")
                    cells.append(text + (f" ({'; '.join(tags)})" if tags else ""))
            for (s, layer, head), rec in by_key.items():
                if s == site and rec.get("lrp") is not None:
                    total += rec["lrp"]
                    share += rec["lrp"] if layer < len(kept) and head in kept[layer] else 0.0
            share_text = f"{share / total:.2f}" if total else "–"
            lines.append(f"| {r['name']} | {site} | {', '.join(cells) or '–'} | {share_text} |")
    closing = []
    for r in pruned:
        # the checkpoint's folder, or where that is gone, the run's committed files
        folders = [Path(r["checkpoint"]).parent] if r.get("checkpoint") else []
        folders += [Path(r["run_dir"])] if r.get("run_dir") else []
        run = next((d for d in folders if (d / gate_trajectory.TRAJECTORY_FILE).exists()), None)
        if run is None:
            continue
        result = gate_trajectory.trajectory(run)
        metrics = gate_trajectory.CLOSING_METRICS
        corr = gate_trajectory.closing_correlations(result, scores, list(metrics))
        cells = []
        for metric in metrics:
            rho = corr[metric]["rho"]
            within = [v for v in corr[metric]["rho_by_layer"].values() if v is not None]
            cells.append("–" if rho is None else f"{rho:+.2f}")
            cells.append(f"{min(within):+.2f} … {max(within):+.2f}" if within else "–")
        closing.append(f"| {r['name']} | {len(result['updates'])} | " + " | ".join(cells) + " |")
    if closing:  # only runs that recorded their gates (--gate-trajectory-interval)
        lines += [
            "",
            "## When the gates closed",
            "",
            "Spearman's ρ between a head's score before pruning and the update at which its gate",
            "closed (heads that closed between the same two snapshots ordered by their P(open) in",
            "the snapshot before, the lower the earlier; heads open at the end tie last; > 0:",
            "higher score, later closing), over all gated heads and, as range, within each layer",
            "(free of layer-wide trends).",
            "",
            "| model | snapshots | "
            + " | ".join(f"ρ({m}) | within layers" for m in gate_trajectory.CLOSING_METRICS)
            + " |",
            "|---|---:" + "|---:|---" * len(gate_trajectory.CLOSING_METRICS) + "|",
        ]
        lines += closing
    return lines
