"""Gate trajectories (Voita et al. 2019, Fig. 8): the L0 criterion's gate_trajectory.jsonl
against the checkpoints fairseq saves at the same updates, and the closing-update reader."""

import json

import pytest
import torch

from fairseq_headprune.cli import gate_table
from recipes.study import gate_trajectory
from tests.helpers import TINY_ARCH, TRAIN_COMMON, USER_DIR, cli, load_state, train

PRUNE = [
    "--criterion", "label_smoothed_cross_entropy_l0", "--label-smoothing", "0.1",
    "--l0-lambda", "0.5", "--freeze-decoder", "--head-gates", "enc-self",
    "--head-gate-lr-scale", "50", "--best-checkpoint-metric", "nll_loss",
]  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tiny_data, stock_checkpoint, tmp_path_factory):
    save = tmp_path_factory.mktemp("trajectory")
    train(
        tiny_data, save, *PRUNE, "--max-epoch", "6", "--finetune-from-model", stock_checkpoint,
        "--gate-trajectory-interval", "5", "--save-interval-updates", "5",
        "--keep-interval-updates", "-1", "--no-save-optimizer-state", arch="gated_transformer",
    )  # fmt: skip
    return save


def _records(run_dir) -> dict[int, dict]:
    lines = (run_dir / "gate_trajectory.jsonl").read_text().splitlines()
    return {r["num_updates"]: r["sites"] for r in map(json.loads, lines)}


def test_records_match_the_checkpoints_of_the_same_update(run_dir):
    records = _records(run_dir)
    last = load_state(run_dir / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"]
    # a record before every 5th update's forward pass, from the first on
    assert sorted(records) == list(range(0, last, 5))
    snapshots = sorted(run_dir.glob("checkpoint_*_*.pt"))
    assert len(snapshots) >= 4
    for path in snapshots:
        state = load_state(path)
        updates = state["optimizer_history"][-1]["num_updates"]
        if updates not in records:  # the update after the last forward pass
            continue
        expected = gate_table(state)["sites"]["enc-self"]
        got = records[updates]["enc-self"]
        torch.testing.assert_close(
            torch.tensor(got["prob_open"]), torch.tensor(expected["prob_open"])
        )
        assert got["gate"] == expected["gate"] and got["open"] == expected["open"]


def test_gates_close_during_the_run_and_the_reader_finds_when(run_dir):
    records = _records(run_dir)
    # the .jsonl's records, then checkpoint_last.pt: the end of training, after the last one
    state = load_state(run_dir / "checkpoint_last.pt")
    last = state["optimizer_history"][-1]["num_updates"]
    assert last > max(records)
    records[last] = gate_table(state)["sites"]
    first, final = records[min(records)]["enc-self"], records[last]["enc-self"]
    assert first["open"] == 8 and final["open"] < 8  # λ = 0.5 closed some
    result = gate_trajectory.trajectory(run_dir)
    assert result["updates"] == sorted(records)
    assert result["snapshots"][last]["file"] == "checkpoint_last.pt"
    for layer, row in enumerate(result["closed"]["enc-self"]):
        for head, cell in enumerate(row):
            if final["gate"][layer][head] > 0:
                assert cell is None
                continue
            u = cell["closed_at"]
            assert records[u]["enc-self"]["gate"][layer][head] == 0
            assert all(records[v]["enc-self"]["gate"][layer][head] == 0 for v in records if v >= u)
            prev = cell["closed_after"]
            assert prev is None or records[prev]["enc-self"]["gate"][layer][head] > 0


def test_a_resumed_run_rewrites_its_updates_and_the_reader_keeps_the_last(tmp_path, run_dir):
    log = run_dir / "gate_trajectory.jsonl"
    lines = log.read_text().splitlines()
    copy = tmp_path / "run"
    copy.mkdir()
    (copy / "checkpoint_last.pt").symlink_to(run_dir / "checkpoint_last.pt")
    stale = json.loads(lines[1])
    stale["sites"]["enc-self"]["gate"] = [[0.0] * 4 for _ in range(2)]
    (copy / "gate_trajectory.jsonl").write_text("\n".join([json.dumps(stale), *lines]) + "\n")
    assert (
        gate_trajectory.trajectory(copy)["closed"] == gate_trajectory.trajectory(run_dir)["closed"]
    )


def test_bad_interval_is_refused(tiny_data, stock_checkpoint, tmp_path):
    proc = cli(
        "fairseq-train", tiny_data, "--user-dir", USER_DIR, "--arch", "gated_transformer",
        *TINY_ARCH, *TRAIN_COMMON, *PRUNE, "--gate-trajectory-interval", "-1",
        "--save-dir", tmp_path, "--max-epoch", "1", check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "--gate-trajectory-interval must be >= 0, got -1" in proc.stderr


def test_spearman_with_ties_against_hand_computed_values():
    assert gate_trajectory.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert gate_trajectory.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks x = 1, 2.5, 2.5, 4: cov 4.5, var 4.5 and 5
    assert gate_trajectory.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / 22.5**0.5)
    assert gate_trajectory.spearman([1, 1, 1], [1, 2, 3]) is None


def test_closing_correlation_counts_open_heads_as_closing_last():
    closed = [[{"closed_at": 5}, None], [{"closed_at": 10}, {"closed_at": 5}]]
    result = {"updates": [0, 5, 10], "closed": {"enc-self": closed}}
    # the order of closure: (0,0) and (1,1) at 5, (1,0) at 10, (0,1) open at the end
    lrp = {(0, 0): 0.1, (1, 1): 0.2, (1, 0): 0.3, (0, 1): 0.4}
    heads = [{"site": "enc-self", "layer": i, "head": h, "lrp": v, "confidence": -v}
             for (i, h), v in lrp.items()]  # fmt: skip
    out = gate_trajectory.closing_correlations(result, {"heads": heads}, ["lrp", "confidence"])
    # ranks of the closing updates 1.5, 1.5, 3, 4 against 1, 2, 3, 4
    expected = gate_trajectory.spearman([1, 2, 3, 4], [1.5, 1.5, 3, 4])
    assert expected == pytest.approx(4.5 / (5 * 4.5) ** 0.5)
    assert out["lrp"]["rho"] == pytest.approx(expected) and out["lrp"]["heads"] == 4
    # within each layer the higher score closes later: (0,0) 0.1 at 5, (0,1) 0.4 open;
    # (1,1) 0.2 at 5, (1,0) 0.3 at 10
    assert out["lrp"]["rho_by_layer"] == {"enc-self 0": pytest.approx(1.0),
                                          "enc-self 1": pytest.approx(1.0)}  # fmt: skip
    assert out["confidence"]["rho_by_layer"]["enc-self 1"] == pytest.approx(-1.0)
    assert out["confidence"]["rho"] == pytest.approx(-expected)


def test_heads_closing_in_one_burst_are_ordered_by_their_last_p_open(tmp_path):
    """Gates closing between the same two snapshots: the lower P(open) before, the earlier."""
    # update: P(open) of heads 0-3, then their deterministic gates
    records = [
        (0, [0.9, 0.9, 0.9, 0.9], [1.0, 1.0, 1.0, 1.0]),
        (5, [0.2, 0.6, 0.4, 0.9], [0.5, 0.8, 0.7, 1.0]),
        (10, [0.01, 0.02, 0.01, 0.95], [0.0, 0.0, 0.0, 1.0]),
    ]
    with open(tmp_path / "gate_trajectory.jsonl", "w") as f:
        for updates, prob, gate in records:
            site = {"prob_open": [prob], "gate": [gate], "open": sum(g > 0 for g in gate)}
            f.write(json.dumps({"num_updates": updates, "sites": {"enc-self": site}}) + "\n")
    result = gate_trajectory.trajectory(tmp_path)
    cells = result["closed"]["enc-self"][0]
    assert [c["closed_at"] for c in cells[:3]] == [10, 10, 10] and cells[3] is None
    assert [c["prob_before"] for c in cells[:3]] == [0.2, 0.6, 0.4]
    # closing order: head 0, head 2, head 1, then head 3 (open); the scores follow it exactly
    heads = [{"site": "enc-self", "layer": 0, "head": h, "lrp": v}
             for h, v in enumerate([0.1, 0.3, 0.2, 0.4])]  # fmt: skip
    out = gate_trajectory.closing_correlations(result, {"heads": heads}, ["lrp"])
    assert out["lrp"]["rho"] == pytest.approx(1.0)
    # by the closing update alone, heads 0-2 would tie: ranks 2, 2, 2, 4
    assert gate_trajectory.spearman([0.1, 0.3, 0.2, 0.4], [10, 10, 10, 11]) < 0.8
