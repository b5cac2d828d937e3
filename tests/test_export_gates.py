"""Export of a gated checkpoint whose gates do not decide the heads: refused, or forced to the
run's budget with the gates it folded reported; and checkpoints saved before the gate scale
existed. Voita et al. 2019 (Hard Concrete gates, Louizos et al. 2018)."""

import json

import pytest
import torch

import fairseq_headprune  # noqa: F401  registers the plugin, as --user-dir does
from fairseq_headprune.gated_attention import head_gates
from tests.export_helpers import THETAS, export, logits
from tests.helpers import cli, load_model, load_state


def _with(gated_checkpoint, path, criterion=None, **thetas):
    """The gated checkpoint with other gates (``enc0``: encoder layer 0's θ) or a budget."""
    state = load_state(gated_checkpoint)
    if criterion:
        state["cfg"]["criterion"] = dict(state["cfg"]["criterion"] or {}, **criterion)
    for name, row in thetas.items():
        state["model"][f"encoder.layers.{name[-1]}.self_attn.head_gate.theta"] = torch.tensor(row)
    torch.save(state, path)
    return path


def test_export_refuses_gates_that_do_not_decide(gated_checkpoint, tiny_data, tmp_path):
    # without a budget: a kept head at gate 0.22 (log α −1) is neither removed nor kept
    half = _with(gated_checkpoint, tmp_path / "half.pt", enc0=[-6.0, -1.0, 1.0, 6.0])
    proc = export("--path", half, "--out", tmp_path / "p.pt")
    assert proc.returncode != 0 and not (tmp_path / "p.pt").exists()
    assert "the gates do not decide which heads to keep: enc-self 0.1 gate 0.22." in proc.stderr
    assert "--force-budget" in proc.stderr
    forced = export("--path", half, "--out", tmp_path / "p.pt", "--force-budget").stdout
    assert "largest change folded into a kept head's gate: 0," in forced  # folded as it is
    # the case: --target-heads 3 and every P(open) within 0.002 (log α ≈ 2)
    alike = _with(
        gated_checkpoint, tmp_path / "alike.pt", {"target_heads": "enc-self:3"},
        enc0=[2.0, 2.01, 2.02, 2.0], enc1=[2.03, 2.0, 2.0, 2.0],
    )  # fmt: skip
    proc = export("--path", alike, "--out", tmp_path / "q.pt")
    assert proc.returncode != 0 and not (tmp_path / "q.pt").exists()
    assert "under the run's --target-heads enc-self:3 do not decide" in proc.stderr
    assert (
        "P(open) of the kept heads down to 0.943, of the removed heads up to 0.942" in proc.stderr
    )
    assert "enc-self 0.0 removed but gate 0.96" in proc.stderr


def test_forced_budget_export_equals_the_gated_model_with_the_gates_it_folded(
    gated_checkpoint, tiny_data, tmp_path
):
    """--target-heads enc-self:4 whose deterministic gates keep 3: refused; forced, the top 4
    by P(open) are kept, a closed head among them opened to 1, and export says so."""
    path = _with(gated_checkpoint, tmp_path / "budget.pt", {"target_heads": "enc-self:4"})
    proc = export("--path", path, "--out", tmp_path / "p.pt")
    assert proc.returncode != 0 and "enc-self 0.0 kept but gate 0.00" in proc.stderr
    out = export("--path", path, "--out", tmp_path / "p.pt", "--force-budget").stdout
    assert "deterministic gates leave 3 budgeted heads open; keeping the 4" in out
    assert "largest change folded into a kept head's gate: 1, largest gate of a removed" in out
    kept = json.loads((tmp_path / "p.pt.heads.json").read_text())
    # enc-self P(open) is monotone in θ: 6, 1, 0.1 and then one of the -6 heads (the first)
    assert kept["enc-self"] == [[0, 1, 2, 3], []]
    assert kept["dec-enc"] == [[1, 3], [0, 2, 3]]  # not budgeted: the open gates decide
    # the reference: the gated model with the gate export folded (head 0.0 open, θ 6 → 1)
    gated, task = load_model(path, tiny_data)
    gated.encoder.layers[0].self_attn.head_gate.theta.data[0] = 6.0
    pruned, _ = load_model(tmp_path / "p.pt", tiny_data)
    d = task.source_dictionary
    torch.manual_seed(0)
    src = torch.randint(d.nspecial, len(d), (5, 9))
    prev = torch.randint(d.nspecial, len(d), (5, 7))
    assert (logits(pruned, src, prev) - logits(gated, src, prev)).abs().max() <= 1e-5


@pytest.mark.parametrize("saved", ["absent", "None"])
def test_a_checkpoint_saved_without_the_gate_scale_keeps_its_gates(
    saved, gated_checkpoint, tiny_data, tmp_path
):
    """Trained when the default scale was 1: its θ is log α, whatever today's default."""
    state = load_state(gated_checkpoint)
    if saved == "None":
        state["cfg"]["model"].head_gate_lr_scale = None
    assert getattr(state["cfg"]["model"], "head_gate_lr_scale", None) is None
    path = tmp_path / "old.pt"
    torch.save(state, path)
    expected = (torch.sigmoid(torch.tensor(THETAS["enc-self"])) * 1.2 - 0.1).clamp(0, 1)
    table = json.loads(cli("fairseq-headprune", "gates", path, "--json").stdout)
    torch.testing.assert_close(torch.tensor(table["sites"]["enc-self"]["gate"]), expected)
    model, _ = load_model(path, tiny_data)  # fairseq's loader (fairseq-generate, --restore-file)
    gates = [g for site, _, g in head_gates(model) if site == "enc-self"]
    assert [g.lr_scale for g in gates] == [1.0, 1.0]
    torch.testing.assert_close(torch.stack([g.deterministic() for g in gates]), expected)
