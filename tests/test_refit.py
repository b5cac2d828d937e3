"""``fairseq-headprune prune --tune weights``: the layer-wise least-squares refit of the kept
units' output weights, and ``--reselect``, the choice of the kept units within each layer by
the refit's own least-squares error (greedy Optimal Brain Surgeon elimination)."""

import json

import torch

from fairseq_headprune.macs import mac_terms
from fairseq_headprune.posttrain.fisher import calibration_batches, fisher
from fairseq_headprune.posttrain.masks import Masks
from fairseq_headprune.posttrain.refit import refit, select
from fairseq_headprune.posttrain.search import search_cost
from tests.helpers import load_model, load_state, train
from tests.posttrain_helpers import (
    assert_same_logits,
    prune,
    refit_errors,
    report_masks,
)


def test_weight_refit_lowers_every_layer_reconstruction_error(stock_checkpoint, tiny_data):
    """--tune weights: with every earlier layer refit, each refit layer reproduces the
    unpruned model's residual sum at least as well as its original weights, and most much
    better; the unpruned model (another copy) is the reference."""
    model, task = load_model(stock_checkpoint, tiny_data)
    reference, _ = load_model(stock_checkpoint, tiny_data)
    batches = calibration_batches(task, "train", 48, 16)
    masks = Masks(model)
    diag, _ = fisher(model, masks, batches)
    _, terms = mac_terms(model, 7, 7, 5)
    cost = {u: float(c) for u, (c, _) in terms.items()}
    keep = search_cost(diag, cost, 0.4 * sum(c * n for c, n in terms.values()))
    masks.set({u: k.float() for u, k in keep.items()})
    originals = {n: p.detach().clone() for n, p in model.named_parameters()}
    report, weights = refit(model, masks, batches)
    assert set(weights) and all(n.endswith((".fc2.weight", ".fc2.bias", ".out_proj.weight",
                                            ".out_proj.bias")) for n in weights)  # fmt: skip
    ref_masks = Masks(reference)
    lowered = 0
    for unit in report:
        errs, scale = refit_errors(model, masks, unit, batches, (reference, ref_masks),
                                    originals, weights)  # fmt: skip
        assert errs[1] <= errs[0] * (1 + 1e-5) + 1e-7 * scale, unit
        lowered += errs[1] < 0.9 * errs[0]
    assert lowered >= len(report) // 2


def test_weight_refit_is_what_the_exported_model_computes(stock_checkpoint, tiny_data, tmp_path):
    """prune (--tune weights) writes the refit out_proj / fc2 weights and biases: the exported
    model's logits equal the masked model refit in-process on the same calibration batches
    (the defaults reselect units within layers; refitting the units they chose, without
    reselection, gives the same weights)."""
    out = tmp_path / "refit.pt"
    proc = prune(tiny_data, stock_checkpoint, out, "--budget", "macs:0.5",  # the defaults
                  "--json-out", tmp_path / "r.json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["tune"] == "weights" and report["tuning"] and not report["rearranged"]
    assert report["reselected"] and report["search_steps"] == 3
    model, task = load_model(stock_checkpoint, tiny_data)
    masks = report_masks(model, report)
    assert all(set(v) <= {0.0, 1.0} for v in report["masks"].values())  # nothing to fold
    refit(model, masks, calibration_batches(task, "train", 96, 32, 1))
    small, _ = load_model(out, tiny_data)
    assert_same_logits(small, model, task)


def test_weight_refit_of_a_gated_checkpoint(stock_checkpoint, tiny_data, tmp_path):
    """A gated_transformer whose trained gates are not 1: the refit fits the gated heads and
    export folds the gates' fixed factor into the refit columns, so the exported model still
    computes what the masked, refit model does."""
    ckpt = train(tiny_data, tmp_path / "gated", "--criterion", "label_smoothed_cross_entropy_l0",
                 "--label-smoothing", "0.1", "--l0-lambda", "0.5", "--head-gates", "enc-self",
                 "--head-gate-lr-scale", "50", "--finetune-from-model", stock_checkpoint,
                 "--max-update", "6", "--allow-slow-gates", arch="gated_transformer")  # fmt: skip
    state = load_state(ckpt)
    for name in state["model"]:
        if name.endswith("head_gate.theta"):  # log α = 50·θ in [-1, 1]: gates in (0, 1)
            state["model"][name] = torch.linspace(-1.0, 1.0, len(state["model"][name])) / 50
    ckpt = tmp_path / "gated.pt"
    torch.save(state, ckpt)
    model, task = load_model(ckpt, tiny_data)
    base = Masks(model).base(("enc-self", 0))
    assert not torch.allclose(base, torch.ones_like(base))  # the gates are a real factor
    out = tmp_path / "refit.pt"
    proc = prune(tiny_data, ckpt, out, "--budget", "macs:0.6", "--json-out", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    model, task = load_model(ckpt, tiny_data)
    masks = report_masks(model, report)
    originals = {n: p.detach().clone() for n, p in model.named_parameters()}
    batches = calibration_batches(task, "train", 96, 32, 1)
    _, weights = refit(model, masks, batches)
    small, _ = load_model(out, tiny_data)
    assert_same_logits(small, model, task)
    # the refit fits the gated heads: each gated layer, fed the same inputs, is closer to the
    # unpruned model with its refit out_proj than with the original one
    reference, _ = load_model(ckpt, tiny_data)
    ref_masks = Masks(reference)
    for unit in (("enc-self", 0), ("enc-self", 1)):
        errs, scale = refit_errors(model, masks, unit, batches, (reference, ref_masks),
                                    originals, weights)  # fmt: skip
        assert errs[1] <= errs[0] * (1 + 1e-5) + 1e-7 * scale, unit


def test_select_removes_the_group_whose_exact_refit_costs_least():
    """select() against brute force: at each count, the greedy choice of re-solving the
    least-squares problem without each remaining group in turn."""
    g = torch.Generator().manual_seed(0)
    n, d, e = 6, 2, 3
    x = torch.randn(200, n * d, generator=g, dtype=torch.float64)
    x[:, 2] = x[:, 0] + 0.01 * torch.randn(200, generator=g, dtype=torch.float64)  # redundant
    y = x[:, :4] @ torch.randn(4, e, generator=g, dtype=torch.float64)
    y += torch.randn(200, e, generator=g, dtype=torch.float64)
    gram, rhs = x.t() @ x + 1e-3 * torch.eye(n * d, dtype=torch.float64), x.t() @ y
    groups = torch.arange(n * d).view(n, d)

    def error(kept):
        c = groups[kept].flatten()
        theta = torch.linalg.solve(gram[c][:, c], rhs[c])
        return float(((x[:, c] @ theta - y) ** 2).sum() + 1e-3 * (theta**2).sum())

    alive = list(range(n))
    for k in range(n - 1, 0, -1):
        alive.remove(min(alive, key=lambda u: error([a for a in alive if a != u])))
        assert select(gram, rhs, groups, k).tolist() == alive


def test_reselect_keeps_the_counts_and_lowers_the_first_layer_error(
    stock_checkpoint, tiny_data, tmp_path
):
    """--reselect: the search's number of units per layer, other units where the refit
    fits better; the first layer it changes (same inputs either way) fits at least as well,
    and the exported model is the in-process reselected refit of the search's masks."""
    reports = {}
    for name, extra in (("plain", ("--no-reselect",)), ("reselect", ())):  # on by default
        out = tmp_path / f"{name}.pt"
        proc = prune(tiny_data, stock_checkpoint, out, "--budget", "macs:0.4", *extra,
                     "--json-out", tmp_path / f"{name}.json")  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        reports[name] = json.loads((tmp_path / f"{name}.json").read_text())
        after = "units reselected, weights refit" if name == "reselect" else "weights refit"
        assert f"search: 3 step(s), then {after}\n" in proc.stdout
    plain, chosen = reports["plain"], reports["reselect"]
    assert chosen["reselected"] and not plain["reselected"]
    for site, rows in plain["kept_heads"].items():
        assert [len(r) for r in rows] == [len(r) for r in chosen["kept_heads"][site]]
    changed = [u for u in plain["masks"] if plain["masks"][u] != chosen["masks"][u]]
    assert changed
    first = changed[0]  # report order is the tuning order
    assert chosen["tuning"][first]["after"] <= plain["tuning"][first]["after"] * (1 + 1e-6)
    model, task = load_model(stock_checkpoint, tiny_data)
    masks = report_masks(model, plain)
    refit(model, masks, calibration_batches(task, "train", 96, 32, 1), reselect=True)
    assert {f"{s}.{i}": v.tolist() for (s, i), v in masks.values.items()} == chosen["masks"]
    assert_same_logits(load_model(tmp_path / "reselect.pt", tiny_data)[0], model, task)
    proc = prune(tiny_data, stock_checkpoint, tmp_path / "x.pt", "--budget", "macs:0.4",
                 "--reselect", "--tune", "masks")  # fmt: skip
    assert proc.returncode != 0 and "--reselect needs --tune weights" in proc.stderr
    assert not (tmp_path / "x.pt").exists()
