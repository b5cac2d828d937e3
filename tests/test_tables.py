"""The tables the docs show (recipes/study/tables*.py), built from summary.csv rows: heads only
at equal head counts, and the pruning study's joint and encoder-only runs against their λ = 0
controls."""

from __future__ import annotations

from recipes.study.summary import COLUMNS
from recipes.study.tables_posttrain import heads_markdown
from recipes.study.tables_two_phase import encoder_markdown, joint_markdown


def summary_row(model: str, method: str, kept: tuple[int, int, int], **cells: str) -> dict:
    """A row of summary.csv with these heads kept (enc-self / dec-self / dec-enc), on dataset
    d, baseline b, unless ``cells`` say otherwise."""
    r = dict.fromkeys(COLUMNS, "")
    r.update({"dataset": "d", "baseline": "b", "model": model, "method": method} | cells)
    r["enc_self_kept"], r["dec_self_kept"], r["dec_enc_kept"] = map(str, kept)
    return r


def test_heads_table_compares_equal_head_counts_on_a_posttrain_baseline():
    """tables --heads: heads-only rows (every FFN neuron kept) of the baselines with
    post-training rows, grouped by head count, with their references; FFN-pruned rows and
    other baselines left out."""

    def row(baseline, model, method, kept, ffn=("", "", ""), reference="baseline"):
        r = summary_row(model, method, kept, baseline=baseline, reference=reference,
                        test_2016_flickr="30")  # fmt: skip
        r["enc_ffn_kept"], r["dec_ffn_kept"], r["ffn_total"] = ffn
        return r

    table = heads_markdown([
        row("b", "baseline", "baseline", (8, 4, 4), reference=""),
        row("b", "michel-heads3", "michel", (3, 4, 4)),
        row("b", "posttrain-heads3", "posttrain", (3, 4, 4), ("6", "6", "12")),
        row("b", "gated-k3", "target-heads", (3, 4, 4)),
        row("b", "gated-k3-s1", "two-phase", (3, 4, 4), reference="gated-k3"),
        row("b", "posttrain-heads6", "posttrain", (6, 4, 4), ("6", "6", "12")),
        row("b", "posttrain-macs0.5", "posttrain", (8, 4, 4), ("3", "6", "12")),
        row("other", "michel-k3", "michel", (3, 4, 4)),
    ])  # fmt: skip
    models = [line.split(" | ")[1] for line in table.splitlines()[2:]]
    assert models == ["baseline", "posttrain-heads6", "gated-k3", "gated-k3-s1",
                      "posttrain-heads3", "michel-heads3"]  # fmt: skip
    assert "| 3 / 4 / 4 | michel-heads3 | michel |" in table


def test_joint_table_lists_joint_runs_with_their_seed_mean():
    """tables --joint: every pruned-joint-* row with the share of all heads removed and its
    difference to the reference, encoder-only rows left out, and the phase-2 seeds' mean ± sd
    computed from the rows."""

    def row(model, method, kept, test, delta="", reference=""):
        return summary_row(
            model, method, kept, heads_total="16", test_2016_flickr=test, valid=test,
            delta_test_2016_flickr=delta, delta_valid=delta, reference=reference,
            p_test_2016_flickr="0.5" if delta else "",
        )  # fmt: skip

    table = joint_markdown([
        row("baseline", "baseline", (8, 4, 4), "30"),
        row("pruned-k2", "target-heads", (2, 4, 4), "29"),
        row("pruned-joint-l0-s1", "two-phase", (8, 4, 4), "31"),
        row("pruned-joint-k4", "target-heads", (0, 1, 3), "26"),
        row("pruned-joint-k4-s1", "two-phase", (0, 1, 3), "27", "-4.00", "pruned-joint-l0-s1"),
        row("pruned-joint-k4-s2", "two-phase", (0, 1, 3), "28", "-3.00", "pruned-joint-l0-s2"),
    ])  # fmt: skip
    lines = table.splitlines()
    models = [line.split(" | ")[0][2:] for line in lines[2:]]
    assert models == ["pruned-joint-l0-s1", "pruned-joint-k4", "pruned-joint-k4-s1",
                      "pruned-joint-k4-s2", "pruned-joint-k4, 2 seeds"]  # fmt: skip
    assert "| 0 / 1 / 3 | 75 % |" in lines[3] and "| 8 / 4 / 4 | 0 % |" in lines[2]
    assert "| -4.00 (0.5) | pruned-joint-l0-s1 |" in lines[4]
    # 27 and 28: mean 27.50, sd 0.71; differences -4 and -3: -3.50 ± 0.71
    assert "| 27.50 ± 0.71 |" in lines[-1] and "| -3.50 ± 0.71 |" in lines[-1]


def test_encoder_table_lists_two_phase_encoder_runs_against_their_control():
    """tables --encoder: the encoder-only runs of the two-phase protocol (phase 1, whose
    setting says so, and phase 2 per seed), the λ = 0 control among them, then the controls
    given the phase-2 budget; one-phase runs of the same names, one-phase controls and joint
    runs left out; the seeds' and the random draws' mean ± sd."""

    def row(model, method, kept, setting, test, delta="", reference=""):
        return summary_row(
            model, method, kept, setting=setting, heads_total="16", test_2016_flickr=test,
            valid=test, delta_test_2016_flickr=delta, delta_valid=delta, reference=reference,
            p_test_2016_flickr="0.2" if delta else "",
        )  # fmt: skip

    table = encoder_markdown([
        row("baseline", "baseline", (8, 4, 4), "", "30"),
        row("pruned-k2", "target-heads", (2, 4, 4), "target 2", "25"),  # one-phase
        row("pruned-l0", "voita", (8, 4, 4), "λ=0 (enc-self control), phase 1: 8 epochs", "30"),
        row("pruned-l0-s1", "two-phase", (8, 4, 4), "λ=0, phase 2 (seed 1)", "31"),
        row("pruned-k2", "target-heads", (2, 4, 4), "target 2, phase 1: 8 epochs", "28",
            "-2.00", "pruned-l0"),
        row("pruned-k2-s1", "two-phase", (2, 4, 4), "target 2, phase 2 (seed 1)", "30",
            "-1.00", "pruned-l0-s1"),
        row("pruned-k2-s2", "two-phase", (2, 4, 4), "target 2, phase 2 (seed 2)", "29",
            "-2.00", "pruned-l0-s2"),
        row("pruned-joint-k4-s1", "two-phase", (0, 1, 3), "phase 2 (seed 1)", "27"),
        row("random-s1-k2", "random", (2, 4, 4), "seed 1", "29"),  # one-phase control
        row("random-s2-k2", "random", (2, 4, 4), "phase-2 budget, seed 2", "26", "-4.00",
            "pruned-k2-s1"),
        row("lrp-k2", "lrp", (2, 4, 4), "phase-2 budget", "28", "-2.00", "pruned-k2-s1"),
        row("random-s1-k2-dec-enc2", "random", (2, 4, 2), "phase-2 budget, seed 1", "20"),
        row("random-s3-k2", "random", (2, 4, 4), "phase-2 budget, seed 3", "27", "-3.00",
            "pruned-k2-s1"),
    ])  # fmt: skip
    lines = table.splitlines()
    models = [line.split(" | ")[0][2:] for line in lines[2:]]
    assert models == ["pruned-l0", "pruned-l0-s1", "pruned-k2", "pruned-k2-s1", "pruned-k2-s2",
                      "lrp-k2", "random-s2-k2", "random-s3-k2", "pruned-k2, 2 seeds",
                      "random-k2, 2 draws"]  # fmt: skip
    assert "| 2 / 4 / 4 | 38 % |" in lines[4]  # 6 of 16 heads removed
    assert "| -1.00 (0.2) | pruned-l0-s1 |" in lines[5]
    assert "| -4.00 (0.2) | pruned-k2-s1 |" in lines[8]
    # 30 and 29: mean 29.50, sd 0.71; differences -1 and -2: -1.50 ± 0.71
    assert "| 29.50 ± 0.71 |" in lines[-2] and "| -1.50 ± 0.71 |" in lines[-2]
    # the draws 26 and 27: 26.50 ± 0.71; differences -4 and -3: -3.50 ± 0.71
    assert "| 26.50 ± 0.71 |" in lines[-1] and "| -3.50 ± 0.71 |" in lines[-1]
