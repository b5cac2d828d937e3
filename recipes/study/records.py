"""The study's evaluations as records: one row per ``eval/<NAME>/`` folder (Voita et al. 2019).

An evaluation folder (``recipes/evaluate.sh``) holds ``<split>.json`` (sacreBLEU's score,
signature and sentence count), ``<split>.hyp`` (the detokenised hypotheses, one per reference
line) and, for the report, which model it was. Which model an evaluation belongs to, first
rule that applies:

1. ``eval/<NAME>/model.json`` — ``{"method", "checkpoint", "kept_heads", "seed"?}``, written by
   ``recipes/controls.sh`` (``python -m recipes.study.controls record``); write one by hand
   for any other model. Optional keys: ``"setting"`` (the table's column), ``"heads"``
   (``{type: [kept, total]}``) with ``"gated"`` (the gated types), used when the checkpoint is
   not on this machine (then ``"kept_heads"``, if there, lists the surviving heads),
   ``"baseline"``: the NAME of the baseline the model was made from, when that is not
   ``eval/baseline``; ``"reference"``: the NAME of the fair reference for its difference
   (``recipes.study.summary``; default: its baseline); ``"selected": "last"``: the run's last
   checkpoint rather than its best by validation nll; ``"train_log"``: the run's
   fairseq-train log, or a resumed run's logs in order, relative to ``eval/<NAME>/``;
   ``"run_dir"``: a pruning run's folder as committed (its ``gate_trajectory.jsonl``),
   relative to ``eval/<NAME>/``, read when the checkpoint's folder is gone;
2. ``--model NAME=CKPT`` on the command line;
3. ``eval/<NAME>/checkpoint``, the path ``recipes/evaluate.sh`` records;
4. the recipes' names: ``baseline`` → ``$WORK_DIR/baseline/checkpoint_best.pt``,
   ``pruned-<X>`` → the one ``$WORK_DIR/prune/*-<X>/checkpoint_last.pt``;
5. otherwise the row is listed with method ``?`` and no head count.

Heads kept and method when no model.json says so are read from the checkpoint: a gated model
keeps the heads whose deterministic gate is > 0 (method ``target-heads`` when its criterion
had ``--target-heads``, else ``voita``, with its λ); an exported model its ``kept_heads``; a
stock transformer all heads (method ``baseline``).
"""

from __future__ import annotations

import gzip
import json
import statistics
from collections import defaultdict
from pathlib import Path

SPLITS = ["val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"]
SITES = ("enc-self", "dec-self", "dec-enc")
FFN_SITES = ("enc-ffn", "dec-ffn")  # FFN neurons, pruned by fairseq-headprune prune
# every method a row can have, in the order tables list them (then "exported", "?")
METHODS = (
    "baseline", "voita", "target-heads", "two-phase", "refit", "scratch", "michel", "random",
    "lrp", "masked", "posttrain", "posttrain+ft",
)  # fmt: skip
PRUNING_METHODS = ("voita", "target-heads")
CONTROL_METHODS = ("masked", "refit", "scratch", "random", "michel", "lrp")
# the setting of a control fine-tuned with a two-phase run's phase-2 budget (controls.sh)
PHASE2_BUDGET = "phase-2 budget"


def checkpoint_info(path: Path, kept_heads: dict | None = None) -> dict:
    """Method, setting, kept heads per attention type ({site: [kept, total]}), gated types.

    ``kept_heads``: the heads the checkpoint's modules have (default: its ``kept_heads``)."""
    from fairseq_headprune.checkpoint_io import (
        gates_from_state,
        head_layout,
        load_checkpoint,
        model_args,
    )
    from fairseq_headprune.pruning import parse_kept_heads
    from fairseq_headprune.sites import layer_of, site_of

    state = load_checkpoint(path)
    args = model_args(state)
    full = head_layout(state)
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
    gated = sorted({site_of(prefix) for prefix in gates}, key=list(full).index)
    if gates and criterion.get("target_heads"):
        method, setting = "target-heads", f"target {criterion['target_heads']}"
    elif gates:
        lam = criterion.get("l0_lambda")
        method, setting = "voita", f"λ={lam:g}" if isinstance(lam, (int, float)) else f"λ={lam}"
        if lam == 0 and gated:  # every head kept: the reference of the runs of its kind
            setting += " (joint control)" if len(gated) > 1 else f" ({gated[0]} control)"
    elif getattr(args, "kept_heads", None):
        method, setting = "exported", ""
    else:
        method, setting = "baseline", ""
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
            if rec.get("selected") == "best":  # a checkpoint_best.pt saved under another name
                row["selected"] = "best"
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


def budget_key(row: dict) -> tuple | None:
    """The baseline a row was made from and its kept-head count per attention type."""
    if not row.get("heads"):
        return None
    return row.get("baseline", ""), tuple(sorted((s, v[0]) for s, v in row["heads"].items()))


def read_hypotheses(folder: Path, split: str) -> tuple[Path, list[str]] | None:
    """``folder/<split>.hyp`` (evaluate.sh), or gzipped as committed (``<split>.hyp.gz``): the
    file and its lines; None when neither is there."""
    for hyp_file in (folder / f"{split}.hyp", folder / f"{split}.hyp.gz"):
        if hyp_file.is_file():
            data = hyp_file.read_bytes()
            data = gzip.decompress(data) if hyp_file.suffix == ".gz" else data
            return hyp_file, data.decode("utf-8").splitlines()
    return None


def hypotheses(work: Path, name: str, split: str, n_refs: int) -> list[str] | None:
    """eval/NAME/<split>.hyp, one line per reference; None when not there."""
    found = read_hypotheses(work / "eval" / name, split)
    if found is None:
        return None
    hyp_file, hyps = found
    if len(hyps) != n_refs:
        raise SystemExit(f"error: {hyp_file} has {len(hyps)} lines for {n_refs} references")
    return hyps


def references(work: Path, split: str, tgt: str, raw: Path | None = None) -> list[str] | None:
    """The reference lines of ``split`` (``raw``, default ``work/raw``); None when not there."""
    ref_file = (work / "raw" if raw is None else raw) / f"{split}.{tgt}"
    return ref_file.read_text(encoding="utf-8").splitlines() if ref_file.is_file() else None
