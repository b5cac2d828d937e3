"""Collect the recipes' BLEU scores into one table and a BLEU-vs-heads plot (Voita et al. 2019).

    python recipes/report.py [--work-dir WORK_DIR] [--model NAME=CKPT ...] [--plot-split S]

Reads every ``$WORK_DIR/eval/<NAME>/<split>.json`` (written by ``recipes/evaluate.sh``) and
writes ``$WORK_DIR/report/report.md`` (model, method, setting, encoder heads kept, BLEU per
test set; random-head runs also as mean ± sd over seeds per head count) and
``bleu_vs_heads.png`` (BLEU on ``--plot-split`` vs encoder heads kept, one marker set per
method), and BLEU by source-length bucket on ``--plot-split`` for every model whose
hypotheses (``<split>.hyp``) are there: sacreBLEU of the sentences whose source has ≤ 10,
11–15, 16–20 or > 20 words (``--length-edges``), with the bucket sizes and, per bucket, the
paired bootstrap test (below) of each model against its baseline, also written to
``length_buckets.json``. Next to the baseline and a pruned model, the ``masked`` control of
``recipes/controls.sh`` (its heads cut from the baseline, not fine-tuned) shows where
pruning loses and what fine-tuning recovers. With the scores of the model before pruning
(``--scores``, default ``$WORK_DIR/scores-baseline/heads.json`` as ``recipes/full.sh`` writes
it), two more sections for every pruning run: its surviving heads with the roles and LRP
relevance the scorer found, and Spearman's ρ between a head's LRP relevance / confidence /
positional fraction and the update at which its gate closed (from
``gate_trajectory.jsonl``); the runs made from another baseline (model.json ``"baseline"``)
are left out of these two, as the scores are not of their model. The sources and
references (length buckets, paired tests) are ``WORK_DIR/raw``'s, or ``--raw-dir``'s: with
it, a report can be made from committed evaluations alone. For the models trained from
scratch (the baseline and the ``scratch`` controls), the validation nll of their last epochs
from the ``train.log`` next to the checkpoint (or model.json's ``train_log``): whether they
converged. And whether each difference to the baseline it was made from (model.json's
``"baseline"``, else ``--paired-against``) on ``--plot-split`` is more than chance:
sacreBLEU's paired bootstrap resampling test (Koehn 2004; 1,000 resamples, sacreBLEU's fixed
seed), p-value and 95 % confidence interval per model, also written to
``paired_bootstrap.json``; and each control (masked, refit, scratch, random, michel, lrp)
against the pruning run with the same heads kept per attention type, made from the same
baseline (``paired_controls.json``): are the heads the gates kept better than the others?

Which model an evaluation belongs to, first rule that applies:

1. ``eval/<NAME>/model.json`` — ``{"method", "checkpoint", "kept_heads", "seed"?}``, written by
   ``recipes/controls.sh`` (``recipes/lib/controls.py record``); write one by hand for any
   other model. Optional keys: ``"setting"`` (the table's column), ``"heads"``
   (``{type: [kept, total]}``) with ``"gated"`` (the gated types), used when the checkpoint is
   not on this machine (then ``"kept_heads"``, if there, lists the surviving heads), and
   ``"baseline"``: the NAME of the baseline the model was made from, when that is not
   ``eval/baseline`` (the operating points' differences are to it); ``"selected": "last"``:
   the run's last checkpoint rather than its best by validation nll (random draws are
   averaged per rule; the plot shows them apart); ``"train_log"``: the
   run's fairseq-train log (its epoch lines are enough) or, for a run resumed across
   sessions, its logs in order, relative to ``eval/<NAME>/``, read when no ``train.log`` is
   next to the checkpoint; ``"run_dir"``: a pruning run's folder as committed (its
   ``gate_trajectory.jsonl``), relative to ``eval/<NAME>/``, read when the checkpoint's
   folder is gone (without ``checkpoint_last.pt``, a gate closed after the last recorded
   snapshot counts as open);
2. ``--model NAME=CKPT`` on the command line;
3. ``eval/<NAME>/checkpoint``, the path ``recipes/evaluate.sh`` records;
4. the recipes' names (for evaluations from before that record): ``baseline`` →
   ``$WORK_DIR/baseline/checkpoint_best.pt``, ``pruned-<X>`` → the one
   ``$WORK_DIR/prune/*-<X>/checkpoint_last.pt`` (``pruned-l0.05`` → ``prune/enc-self-l0.05``,
   as quickstart.sh and docs/results.md name them);
5. otherwise the row is listed with method ``?`` and no head count.

Heads kept and method when no model.json says so are read from the checkpoint: a gated model
keeps the heads whose deterministic gate is > 0 (method ``target-heads`` when its criterion
had ``--target-heads``, else ``voita``, with its λ); an exported model its ``kept_heads``; a
stock transformer all heads (method ``baseline``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

SPLITS = ["val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"]
# plot style per method: (marker, connect points with a line)
STYLE = {
    "baseline": ("*", False),
    "voita": ("o", True),
    "target-heads": ("s", True),
    "refit": ("P", True),
    "scratch": ("^", False),
    "michel": ("D", True),
    "random": ("x", True),
    "lrp": ("v", True),
    "masked": ("+", False),
}
LENGTH_EDGES = (10, 15, 20)  # source words: <= 10, 11-15, 16-20, > 20
SITES = ("enc-self", "dec-self", "dec-enc")


def checkpoint_info(path: Path, kept_heads: dict | None = None) -> dict:
    """Method, setting, kept heads per attention type ({site: [kept, total]}), gated types.

    ``kept_heads``: the heads the checkpoint's modules have (default: its ``kept_heads``)."""
    from fairseq_headprune.checkpoint_io import gates_from_state, load_checkpoint, model_args
    from fairseq_headprune.gated_transformer import layer_of, site_of
    from fairseq_headprune.pruning import parse_kept_heads

    state = load_checkpoint(path)
    args = model_args(state)
    full = {"enc-self": (args.encoder_layers, args.encoder_attention_heads)}
    full["dec-self"] = full["dec-enc"] = (args.decoder_layers, args.decoder_attention_heads)
    if kept_heads is None:
        kept_heads = parse_kept_heads(getattr(args, "kept_heads", None))
    kept = kept_heads
    kept = {s: kept.get(s) or [list(range(h)) for _ in range(n)] for s, (n, h) in full.items()}
    gates = gates_from_state(state)
    for prefix, gate in gates.items():  # gates index the heads the module has now
        site, layer = site_of(prefix), layer_of(prefix)
        det = gate.deterministic().tolist()
        kept[site][layer] = [h for h, g in zip(kept[site][layer], det) if g > 0]
    criterion = (state.get("cfg") or {}).get("criterion") or {}
    if not isinstance(criterion, dict):
        criterion = vars(criterion)
    if gates and criterion.get("target_heads"):
        method, setting = "target-heads", f"target {criterion['target_heads']}"
    elif gates:
        method, setting = "voita", f"λ={criterion.get('l0_lambda')}"
    elif getattr(args, "kept_heads", None):
        method, setting = "exported", ""
    else:
        method, setting = "baseline", ""
    gated = sorted({site_of(prefix) for prefix in gates}, key=list(full).index)
    return {
        "method": method, "setting": setting, "heads": count(kept, full), "gated": gated,
        "kept": kept,
    }  # fmt: skip


def count(kept: dict, full: dict) -> dict:
    return {s: [sum(map(len, kept.get(s, []))), n * h] for s, (n, h) in full.items()}


def collect(work: Path, models: dict[str, str]) -> list[dict]:
    rows = []
    for folder in sorted(p for p in (work / "eval").glob("*") if p.is_dir()):
        name = folder.name
        bleu = {}
        for split in SPLITS:
            f = folder / f"{split}.json"
            if f.is_file():
                bleu[split] = json.loads(f.read_text())["bleu"]
        if not bleu:
            continue
        row = {"name": name, "bleu": bleu, "method": "?", "setting": "", "heads": None}
        record = folder / "model.json"
        ckpt = None
        if record.is_file():
            rec = json.loads(record.read_text())
            row["method"] = rec["method"]
            row["setting"] = rec.get("setting") or (f"seed {rec['seed']}" if "seed" in rec else "")
            if rec.get("selected") == "last":
                row["selected"] = "last"
                row["setting"] = ", ".join(filter(None, (row["setting"], "last checkpoint")))
            if rec.get("baseline"):
                row["baseline"] = rec["baseline"]
            if rec.get("train_log"):  # relative to this folder; a list: a resumed run's logs
                logs = rec["train_log"]
                row["train_log"] = [
                    str(folder / f) for f in ([logs] if isinstance(logs, str) else logs)
                ]
            if rec.get("run_dir"):  # relative to this folder
                row["run_dir"] = str(folder / rec["run_dir"])
            ckpt = rec.get("checkpoint")
            if rec.get("heads"):  # counted where the checkpoint was: {site: [kept, total]}
                # (kept_heads are then the surviving heads, after any closed gate: a gated
                # checkpoint's gates must not be applied to them again)
                row["heads"] = {s: list(v) for s, v in rec["heads"].items()}
                row["gated"] = rec.get("gated", [])
                if rec.get("kept_heads"):  # which heads (the surviving-heads section)
                    row["kept"] = rec["kept_heads"]
            elif rec.get("kept_heads") is not None and ckpt and Path(ckpt).is_file():
                # totals (and any closed gate) from the checkpoint
                info = checkpoint_info(Path(ckpt), rec["kept_heads"])
                row["heads"], row["kept"] = info["heads"], info["kept"]
            elif rec.get("kept_heads") is not None:
                row["heads"] = {s: [sum(map(len, v)), None] for s, v in rec["kept_heads"].items()}
        else:
            recorded = folder / "checkpoint"
            recorded = recorded.read_text().strip() if recorded.is_file() else None
            ckpt = models.get(name) or recorded or default_checkpoint(work, name)
            if ckpt and Path(ckpt).is_file():
                info = checkpoint_info(Path(ckpt))
                row.update((k, info[k]) for k in ("method", "setting", "heads", "gated", "kept"))
        row["checkpoint"] = ckpt
        rows.append(row)
    return rows


def default_checkpoint(work: Path, name: str) -> str | None:
    if name == "baseline":
        return str(work / "baseline" / "checkpoint_best.pt")
    if name.startswith("pruned-"):
        found = sorted((work / "prune").glob(f"*-{name[len('pruned-') :]}/checkpoint_last.pt"))
        if len(found) == 1:
            return str(found[0])
    return None


def enc_heads(row: dict) -> int | None:
    heads = row["heads"] or {}
    return heads["enc-self"][0] if "enc-self" in heads else None


def is_joint(row: dict) -> bool:
    """A model with decoder attention gated or reduced as well (joint pruning)."""
    heads = row["heads"] or {}
    reduced = any(t is not None and k != t for s, (k, t) in heads.items() if s != "enc-self")
    return reduced or len(row.get("gated") or []) > 1


def fmt_heads(row: dict) -> str:
    heads = row["heads"]
    if not heads:
        return "?"

    def kept_of(kept: int, total: int | None) -> str:  # the total is unknown without a model
        return str(kept) if total is None else f"{kept}/{total}"

    text = kept_of(*heads["enc-self"]) if "enc-self" in heads else "?"
    gated = row.get("gated") or ()
    shown = [s for s, (k, t) in heads.items() if (t is not None and k != t) or s in gated]
    others = [f"{s} {kept_of(*heads[s])}" for s in shown if s != "enc-self"]
    return text + (f" ({', '.join(others)})" if others else "")


def random_groups(rows: list[dict]) -> dict[tuple[str, str, int], list[dict]]:
    """The random-head runs by the baseline they were made from (model.json ``"baseline"``,
    "" for eval/baseline), the checkpoint rule (``"selected"``: "" for the best by validation
    nll, "last") and encoder head count: seeds of two baselines, or a run's best and last
    checkpoints, are not one sample."""
    groups = defaultdict(list)
    for row in rows:
        if row["method"] == "random" and enc_heads(row) is not None:
            groups[row.get("baseline", ""), row.get("selected", ""), enc_heads(row)].append(row)
    return dict(sorted(groups.items()))


def mean_sd(values: list[float]) -> tuple[float, float | None]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def write_markdown(
    rows: list[dict],
    splits: list[str],
    path: Path,
    lengths: dict | None = None,
    heads: list[str] | None = None,
    paired: dict | None = None,
    controls: dict | None = None,
) -> None:
    order = list(STYLE) + ["exported", "?"]
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


PRUNING_METHODS = ("voita", "target-heads")
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


def read_logs(logs: Path | list[Path]) -> str:
    """One run's log text: a file, or the files a run resumed across sessions left, in order."""
    return "\n".join(
        f.read_text(errors="replace") for f in ([logs] if isinstance(logs, Path) else logs)
    )


def validation_curve(log: Path | list[Path]) -> list[tuple[int, int, float]]:
    """(epoch, updates, valid nll) per epoch from a fairseq-train log (``--log-format
    simple``); a resumed run's log repeats epochs: the last line of an epoch counts."""
    per_epoch: dict[int, tuple[int, int, float]] = {}
    for line in read_logs(log).splitlines():
        if "| valid on 'valid' subset |" not in line:
            continue
        fields = dict(f.split(" ", 1) for f in line.split("| ")[1:] if " " in f.strip())
        try:
            epoch = int(fields["epoch"].split()[0])
            point = (epoch, int(fields["num_updates"]), float(fields["nll_loss"]))
        except (KeyError, ValueError):
            continue
        per_epoch[epoch] = point
    return [per_epoch[e] for e in sorted(per_epoch)]


def best_epoch(
    log: Path | list[Path], curve: list[tuple[int, int, float]]
) -> tuple[int, int, float]:
    """The epoch whose checkpoint is ``checkpoint_best.pt``: the last one the log says it saved
    there. Without such a line, the lowest printed nll, the later epoch on a tie (fairseq
    keeps a new best when it is lower or equal; the printed nll is rounded to 3 digits)."""
    saved = re.findall(r"Saved checkpoint \S*checkpoint_best\.pt \(epoch (\d+)", read_logs(log))
    by_epoch = {c[0]: c for c in curve}
    if saved and int(saved[-1]) in by_epoch:
        return by_epoch[int(saved[-1])]
    return min(curve, key=lambda c: (c[2], -c[0]))


def training_markdown(rows: list[dict], last: int = 5) -> list[str]:
    """How far the models trained from scratch (the baseline, the scratch controls) got:
    the validation nll of their last epochs, read from ``train.log`` next to the checkpoint
    or, where that is not on this machine, from model.json's ``train_log``. A curve still
    falling at the end means the model is not converged."""
    lines = []
    for r in rows:
        if r["method"] not in ("baseline", "scratch"):
            continue
        log = Path(r["checkpoint"]).parent / "train.log" if r.get("checkpoint") else None
        # the run folder gone: the committed logs, all of them or none
        logs = [log] if log and log.is_file() else [Path(f) for f in r.get("train_log", [])]
        curve = validation_curve(logs) if logs and all(f.is_file() for f in logs) else []
        if not curve:
            continue
        best = best_epoch(logs, curve)
        tail = curve[-last:]
        lines.append(
            f"| {r['name']} | {curve[-1][0]} | {curve[-1][1]} | {best[2]:.3f} (epoch {best[0]}) "
            f"| {' '.join(f'{c[2]:.3f}' for c in tail)} | {tail[-1][2] - tail[0][2]:+.3f} |"
        )
    if not lines:
        return []
    return [
        "",
        "## Training from scratch: how far it got",
        "",
        f"Validation nll (base 2) from each run's `train.log`: its last {last} epochs and their",
        "change. A curve still falling at the end is not converged.",
        "",
        f"| model | epochs | updates | best valid nll | last {last} epochs | change |",
        "|---|---:|---:|---|---|---:|",
        *lines,
    ]


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
    sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))
    import gate_trajectory

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


def bucket_names(edges: tuple[int, ...]) -> list[str]:
    lows = (1, *(e + 1 for e in edges))
    return [f"{lo}–{hi}" for lo, hi in zip(lows, edges)] + [f"> {edges[-1]}"]


def bucket_of(n_words: int, edges: tuple[int, ...]) -> int:
    return next((i for i, e in enumerate(edges) if n_words <= e), len(edges))


def hypotheses(work: Path, name: str, split: str, n_refs: int) -> list[str] | None:
    """eval/NAME/<split>.hyp (evaluate.sh), one line per reference; None when not there."""
    hyp_file = work / "eval" / name / f"{split}.hyp"
    if not hyp_file.is_file():
        return None
    hyps = hyp_file.read_text(encoding="utf-8").splitlines()
    if len(hyps) != n_refs:
        raise SystemExit(f"error: {hyp_file} has {len(hyps)} lines for {n_refs} references")
    return hyps


def length_buckets(
    work: Path,
    rows: list[dict],
    split: str,
    edges: tuple[int, ...],
    src: str,
    tgt: str,
    raw: Path | None = None,
    against: str = "baseline",
    samples: int = 1000,
) -> dict:
    """sacreBLEU per source-length bucket of every row with hypotheses on ``split``; sources
    and references from ``raw`` (default ``work/raw``). Within each bucket, sacreBLEU's paired
    bootstrap (``samples`` resamples; 0: none) tests every row against the baseline it was made
    from (model.json's ``"baseline"``, else the row named ``against``): ``"p"`` {name: [p per
    bucket]}, ``"against"`` {name: baseline}, for the rows whose baseline has hypotheses."""
    from sacrebleu.metrics import BLEU

    raw = work / "raw" if raw is None else raw
    src_file = raw / f"{split}.{src}"
    refs = references(work, split, tgt, raw)
    if refs is None or not src_file.is_file():
        return {}
    sources = src_file.read_text(encoding="utf-8").splitlines()
    of = [bucket_of(len(line.split()), edges) for line in sources]
    sizes = [of.count(b) for b in range(len(edges) + 1)]
    hyps = {r["name"]: hypotheses(work, r["name"], split, len(refs)) for r in rows}
    hyps = {name: h for name, h in hyps.items() if h is not None}

    def in_bucket(lines: list[str], k: int) -> list[str]:
        return [x for x, b in zip(lines, of) if b == k]

    table = {
        name: [round(BLEU().corpus_score(in_bucket(h, k), [in_bucket(refs, k)]).score, 2)
               if sizes[k] else None for k in range(len(sizes))]
        for name, h in hyps.items()
    }  # fmt: skip
    result = {"split": split, "buckets": bucket_names(edges), "sentences": sizes, "bleu": table}
    made_from = {r["name"]: r.get("baseline") or against for r in rows}
    tested = {n: made_from[n] for n in hyps if made_from[n] != n and made_from[n] in hyps}
    if not samples or not tested:
        return result
    p_values: dict[str, list[float | None]] = {n: [None] * len(sizes) for n in tested}
    for base in sorted(set(tested.values())):
        names = sorted(n for n, b in tested.items() if b == base)
        for k in range(len(sizes)):
            if not sizes[k]:
                continue
            systems = [(n, in_bucket(hyps[n], k)) for n in names]
            reference = (base, in_bucket(hyps[base], k))
            for name, r in bootstrap(reference, systems, in_bucket(refs, k), samples).items():
                if name != base:
                    p_values[name][k] = r["p"]
    return {**result, "samples": samples, "against": tested, "p": p_values}


def length_markdown(result: dict, rows: list[dict]) -> list[str]:
    if not result.get("bleu"):
        return []
    method = {r["name"]: r["method"] for r in rows}
    p_values = result.get("p", {})
    lines = [
        "",
        f"## BLEU by source length ({result['split']})",
        "",
        "sacreBLEU of the sentences in each bucket of source words.",
    ]
    if p_values:
        lines += [
            "`*`: differs from the baseline the model was made from in that bucket "
            f"(sacreBLEU's paired bootstrap, {result['samples']} resamples, p < 0.05; the",
            "p-values in `length_buckets.json`). Small buckets test only large differences.",
        ]
    lines += [
        "",
        "| model | method | " + " | ".join(result["buckets"]) + " |",
        "|---|---|" + "---:|" * len(result["buckets"]),
        "| sentences | | " + " | ".join(map(str, result["sentences"])) + " |",
    ]
    for name, scores in result["bleu"].items():
        ps = p_values.get(name, [None] * len(scores))
        cells = [
            "–" if v is None else f"{v:.2f}" + (" *" if p is not None and p < 0.05 else "")
            for v, p in zip(scores, ps)
        ]
        lines.append(f"| {name} | {method.get(name, '?')} | " + " | ".join(cells) + " |")
    return lines


def references(work: Path, split: str, tgt: str, raw: Path | None = None) -> list[str] | None:
    """The reference lines of ``split`` (``raw``, default ``work/raw``); None when not there."""
    ref_file = (work / "raw" if raw is None else raw) / f"{split}.{tgt}"
    return ref_file.read_text(encoding="utf-8").splitlines() if ref_file.is_file() else None


def bootstrap(
    reference: tuple[str, list[str]],
    systems: list[tuple[str, list[str]]],
    refs: list[str],
    samples: int,
) -> dict[str, dict]:
    """sacreBLEU's paired bootstrap resampling of ``systems`` against ``reference`` (each a
    name and its hypotheses): {name: {"bleu", "mean", "ci", "p"}}, ``p`` None for the
    reference itself and 1 for hypotheses identical to the reference's."""
    import logging

    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # a line per system and step
    _, results = PairedTest(
        [reference] + systems, {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=samples
    )()
    # sacreBLEU (after MultEval) gives hypotheses identical to the reference's p = 1/(n+1), so
    # that "a zero difference is not attributed to chance"; here no difference is no finding
    same = {name for name, hyps in systems if hyps == reference[1]}
    return {
        name: {
            "bleu": round(r.score, 2), "mean": round(r.mean, 2), "ci": round(r.ci, 2),
            "p": None if r.p_value is None else 1.0 if name in same else round(r.p_value, 4),
        }
        for name, r in zip(results["System"], results["BLEU"])
    }  # fmt: skip


def paired_bootstrap(
    work: Path,
    rows: list[dict],
    split: str,
    against: str,
    tgt: str,
    samples: int = 1000,
    raw: Path | None = None,
) -> dict:
    """sacreBLEU's paired bootstrap test of every row with hypotheses on ``split`` against the
    baseline it was made from: model.json's ``"baseline"``, else the row named ``against``.
    {"split", "against", "samples", "models": {name: {"bleu", "mean", "ci", "p", "against"}},
    "untested": {name: baseline}} (``p`` and ``against`` None for a reference itself;
    ``untested``: rows whose baseline has no hypotheses); {} when nothing was tested."""
    refs = references(work, split, tgt, raw)
    if refs is None:
        return {}
    groups: dict[str, list[str]] = defaultdict(list)  # baseline -> the rows made from it
    for r in sorted(rows, key=lambda r: r["name"]):
        base = r.get("baseline") or against
        if r["name"] != base:
            groups[base].append(r["name"])
    models: dict[str, dict] = {}
    untested: dict[str, str] = {}
    for base in sorted(groups, key=lambda b: (b != against, b)):
        reference = hypotheses(work, base, split, len(refs))
        hyps = {n: hypotheses(work, n, split, len(refs)) for n in groups[base]}
        systems = [(n, h) for n, h in hyps.items() if h is not None]
        if reference is None:
            untested.update((n, base) for n, _ in systems)
            continue
        if not systems:
            continue
        for name, result in bootstrap((base, reference), systems, refs, samples).items():
            models.setdefault(name, {**result, "against": None if name == base else base})
    if not any(m["against"] for m in models.values()):
        return {}
    return {
        "split": split, "against": against, "samples": samples, "models": models,
        "untested": untested,
    }  # fmt: skip


CONTROL_METHODS = ("masked", "refit", "scratch", "random", "michel", "lrp")


def budget_key(row: dict) -> tuple | None:
    """The baseline a row was made from and its kept-head count per attention type."""
    if not row.get("heads"):
        return None
    return row.get("baseline", ""), tuple(sorted((s, v[0]) for s, v in row["heads"].items()))


def paired_controls(
    work: Path,
    rows: list[dict],
    split: str,
    tgt: str,
    samples: int = 1000,
    raw: Path | None = None,
) -> dict:
    """sacreBLEU's paired bootstrap of every control (``CONTROL_METHODS``) against each pruning
    run with the same heads kept per attention type, made from the same baseline: are the
    heads the gates kept better than heads chosen or trained another way? {"split",
    "samples", "pairs": [{"model", "method", "against", "bleu", "against_bleu", "p"}]};
    {} when no such pair has hypotheses on ``split``."""
    refs = references(work, split, tgt, raw)
    if refs is None:
        return {}
    controls = [r for r in rows if r["method"] in CONTROL_METHODS and budget_key(r)]
    pairs = []
    for pruned in sorted(rows, key=lambda r: r["name"]):
        if pruned["method"] not in PRUNING_METHODS or not budget_key(pruned):
            continue
        same = sorted(
            (c for c in controls if budget_key(c) == budget_key(pruned)), key=lambda c: c["name"]
        )
        reference = hypotheses(work, pruned["name"], split, len(refs)) if same else None
        systems = [(c["name"], hypotheses(work, c["name"], split, len(refs))) for c in same]
        systems = [(n, h) for n, h in systems if h is not None]
        if reference is None or not systems:
            continue
        scores = bootstrap((pruned["name"], reference), systems, refs, samples)
        method = {c["name"]: c["method"] for c in same}
        for name, _ in systems:
            pairs.append({
                "model": name, "method": method[name], "against": pruned["name"],
                "bleu": scores[name]["bleu"], "against_bleu": scores[pruned["name"]]["bleu"],
                "p": scores[name]["p"],
            })  # fmt: skip
    return {"split": split, "samples": samples, "pairs": pairs} if pairs else {}


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
        p = "–" if m["p"] is None else f"{m['p']:.3f}" + (" *" if m["p"] < 0.05 else "")
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
        p = "–" if m["p"] is None else f"{m['p']:.3f}" + (" *" if m["p"] < 0.05 else "")
        lines.append(
            f"| {name} | {method.get(name, '?')} | {base or '–'} | {m['bleu']:.2f} | {diff} | "
            f"{m['mean']:.2f} ± {m['ci']:.2f} | {p} |"
        )
    untested = result.get("untested") or {}
    if untested:
        lines += ["", "Not tested, as the baseline they were made from has no hypotheses here: "
                  + ", ".join(f"{n} ({b})" for n, b in sorted(untested.items())) + "."]  # fmt: skip
    return lines


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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--work-dir",
        default=os.environ.get("WORK_DIR", str(Path.home() / "headprune-runs" / "multi30k")),
    )
    p.add_argument("--model", action="append", default=[], metavar="NAME=CKPT",
                   help="the checkpoint evaluated as eval/NAME (repeatable)")  # fmt: skip
    p.add_argument("--plot-split", default="test_2016_flickr")
    p.add_argument("--out-dir", help="default: WORK_DIR/report")
    p.add_argument("--length-edges", default=",".join(map(str, LENGTH_EDGES)),
                   help="upper ends of the source-length buckets, in words")  # fmt: skip
    p.add_argument(
        "--scores",
        help="heads.json of `fairseq-headprune score` on the model "
        "before pruning (default: WORK_DIR/scores-baseline/heads.json if there)",
    )
    p.add_argument("--paired-against", default="baseline", metavar="NAME",
                   help="the evaluation (eval/NAME) each model is tested against with "
                   "sacreBLEU's paired bootstrap on --plot-split, unless its model.json "
                   "names the baseline it was made from")  # fmt: skip
    p.add_argument("--raw-dir", help="the splits' raw source and reference text "
                   "(<split>.<lang>, as prepare.sh writes; default: WORK_DIR/raw)")  # fmt: skip
    p.add_argument("--src", default=os.environ.get("SRC", "en"))
    p.add_argument("--tgt", default=os.environ.get("TGT", "de"))
    args = p.parse_args(argv)
    edges = tuple(int(e) for e in args.length_edges.split(","))
    if not edges or list(edges) != sorted(set(edges)) or edges[0] < 1:
        p.error(f"--length-edges: increasing positive word counts, got {args.length_edges!r}")
    work = Path(args.work_dir)
    models = dict(m.split("=", 1) for m in args.model)
    rows = collect(work, models)
    if not rows:
        sys.exit(f"error: no evaluations under {work / 'eval'} (run recipes/evaluate.sh)")
    splits = [s for s in SPLITS if any(s in r["bleu"] for r in rows)]
    out = Path(args.out_dir) if args.out_dir else work / "report"
    out.mkdir(parents=True, exist_ok=True)
    plot_split = args.plot_split if args.plot_split in splits else splits[0]
    raw = Path(args.raw_dir) if args.raw_dir else work / "raw"
    if args.raw_dir and not raw.is_dir():
        p.error(f"--raw-dir: no folder {raw}")
    lengths = length_buckets(
        work, rows, plot_split, edges, args.src, args.tgt, raw, args.paired_against
    )
    if lengths:
        (out / "length_buckets.json").write_text(json.dumps(lengths, indent=1) + "\n")
    scores_file = Path(args.scores) if args.scores else work / "scores-baseline" / "heads.json"
    if args.scores and not scores_file.is_file():
        p.error(f"--scores: no file {scores_file}")
    scores = json.loads(scores_file.read_text()) if scores_file.is_file() else None
    paired = paired_bootstrap(work, rows, plot_split, args.paired_against, args.tgt, raw=raw)
    paired_file = out / "paired_bootstrap.json"
    if paired:
        paired_file.write_text(json.dumps(paired, indent=1) + "\n")
    else:
        paired_file.unlink(missing_ok=True)  # not a test of these evaluations
    controls = paired_controls(work, rows, plot_split, args.tgt, raw=raw)
    controls_file = out / "paired_controls.json"
    if controls:
        controls_file.write_text(json.dumps(controls, indent=1) + "\n")
    else:
        controls_file.unlink(missing_ok=True)
    heads = heads_markdown(rows, scores, args.paired_against)
    write_markdown(rows, splits, out / "report.md", lengths, heads, paired, controls)
    plot(rows, plot_split, out / "bleu_vs_heads.png")
    print(f"wrote {out / 'report.md'} and {out / 'bleu_vs_heads.png'} ({len(rows)} models)")


if __name__ == "__main__":
    main()
