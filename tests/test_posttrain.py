"""``fairseq-headprune prune`` (Kwon et al. 2022): Fisher importance, budgeted search,
rearrangement, least-squares tuning and a physically smaller checkpoint that the real
fairseq-generate and fairseq-train load."""

import copy
import json
from argparse import Namespace

import pytest
import torch
import torch.nn.functional as F

import fairseq_headprune  # noqa: F401  registers the plugin, as --user-dir does
from fairseq_headprune.errors import HeadpruneError
from fairseq_headprune.macs import mac_terms
from fairseq_headprune.posttrain.fisher import calibration_batches, fisher
from fairseq_headprune.posttrain.masks import Masks
from fairseq_headprune.posttrain.search import (
    parse_budget,
    search_cost,
)
from fairseq_headprune.posttrain.tuning import tune
from fairseq_headprune.sites import UNIT_SITES
from tests.helpers import TINY_ARCH, TRAIN_COMMON, USER_DIR, cli, load_model, load_state, train
from tests.posttrain_helpers import (
    assert_same_logits,
    prune,
    report_masks,
    unit_output,
)


@pytest.fixture(scope="module")
def pruned(stock_checkpoint, tiny_data, tmp_path_factory):
    """The stock model pruned to 50% of its attention + FFN multiply-adds by Kwon et al.'s
    steps (rearrangement, mask tuning), and its report."""
    out = tmp_path_factory.mktemp("posttrain") / "p50.pt"
    proc = prune(tiny_data, stock_checkpoint, out, "--budget", "macs:0.5", "--rearrange",
                  "--tune", "masks", "--json-out", f"{out}.json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads(out.with_name(out.name + ".json").read_text())


def _loss(model, batch):
    net = batch["net_input"]
    logits = model(net["src_tokens"], net["src_lengths"], net["prev_output_tokens"])[0]
    pad = model.decoder.dictionary.pad()
    return F.cross_entropy(logits.transpose(1, 2), batch["target"], ignore_index=pad)


def test_fisher_matches_an_independent_gradient(stock_checkpoint, tiny_data):
    """diag Fisher = Σ_batches (∂L/∂m)². Independently: a mask m on head h scales the columns
    of out_proj that head h feeds (on neuron j: fc2's column j), so ∂L/∂m = Σ W ⊙ ∂L/∂W over
    those columns, from ordinary weight gradients of a model without masks or hooks."""
    model, task = load_model(stock_checkpoint, tiny_data)
    model = model.double()
    batches = calibration_batches(task, "train", 16, 8)
    plain = copy.deepcopy(model)
    diag, blocks = fisher(model, Masks(model), batches)
    checks = [("enc-self", 0, 2), ("dec-enc", 1, 0), ("dec-self", 0, 3)]
    checks += [("enc-ffn", 1, 5), ("dec-ffn", 0, 17)]
    expected = {c: 0.0 for c in checks}
    for batch in batches:
        plain.zero_grad()
        _loss(plain, batch).backward()
        for site, i, j in checks:
            layer = (plain.encoder if site.startswith("enc") else plain.decoder).layers[i]
            if site.endswith("ffn"):
                w, cols = layer.fc2.weight, slice(j, j + 1)
            else:
                attn = layer.encoder_attn if site == "dec-enc" else layer.self_attn
                w, cols = attn.out_proj.weight, slice(j * attn.head_dim, (j + 1) * attn.head_dim)
            expected[site, i, j] += float((w.grad[:, cols] * w.data[:, cols]).sum()) ** 2
    for (site, i, j), value in expected.items():
        assert value > 0
        assert diag[site, i][j].item() == pytest.approx(value, rel=1e-5)
        assert blocks[site, i][j, j].item() == pytest.approx(diag[site, i][j].item())
    # the blocks are sums of outer products: symmetric and positive semi-definite
    block = blocks["enc-ffn", 0]
    assert torch.allclose(block, block.t())
    assert float(torch.linalg.eigvalsh(block).min()) >= -1e-12 * float(block.diagonal().max())


def test_least_squares_tuning_lowers_every_layer_reconstruction_error(stock_checkpoint, tiny_data):
    """Each tuned layer, fed the pruned model's inputs, reproduces the unpruned model's
    residual sum (what its layer norm receives) at least as well as the 0/1 masks."""
    model, task = load_model(stock_checkpoint, tiny_data)
    batches = calibration_batches(task, "train", 48, 16)
    masks = Masks(model)
    diag, _ = fisher(model, masks, batches)
    src, tgt = 7, 7
    _, terms = mac_terms(model, src, tgt, 5)
    cost = {u: float(c) for u, (c, _) in terms.items()}
    keep = search_cost(diag, cost, 0.5 * sum(c * n for c, n in terms.values()))
    masks.set({u: k.float() for u, k in keep.items()})
    report = tune(model, masks, batches)
    tuned = masks.snapshot()
    teacher = {}
    for unit in report:  # the unpruned model's outputs: every mask 1
        masks.set(masks.ones())
        teacher[unit] = unit_output(model, masks, unit, batches, torch.ones_like(tuned[unit]))
    lowered = 0
    for unit in report:
        masks.set(tuned)
        errs = []
        for values in (keep[unit].float(), tuned[unit]):
            outs = unit_output(model, masks, unit, batches, values)
            errs.append(sum(float(((o - t) ** 2).sum()) for o, t in zip(outs, teacher[unit])))
        assert errs[1] <= errs[0] * (1 + 1e-5), unit
        lowered += errs[1] < 0.99 * errs[0]
    assert lowered >= len(report) // 2


def test_exported_model_equals_the_masked_tuned_model(pruned, stock_checkpoint, tiny_data):
    out, report = pruned
    small, task = load_model(out, tiny_data)
    model, _ = load_model(stock_checkpoint, tiny_data)
    report_masks(model, report)  # installed on the model
    assert_same_logits(small, model, task)
    # physically smaller: widths and parameters follow the kept units
    state = load_state(out)["model"]
    kept = report["kept_heads"]
    for i, rows in enumerate(kept["enc-ffn"]):
        assert state[f"encoder.layers.{i}.fc1.weight"].shape[0] == len(rows)
    assert report["params_after"] < report["params_before"]
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in model.parameters())
    # the MAC budget holds for the exported model, counted by the plugin's MAC model
    lengths = report["lengths"]
    args = (lengths["src"], lengths["tgt"], lengths["beam"])
    full = sum(c * n for c, n in mac_terms(model, *args)[1].values())
    assert sum(c * n for c, n in mac_terms(small, *args)[1].values()) <= 0.5 * full
    assert all(len(rows) >= 1 for rows in kept["dec-enc"])


def test_pruned_checkpoint_generates_and_trains_with_stock_clis(pruned, tiny_data, tmp_path):
    out, _ = pruned
    gen = cli("fairseq-generate", tiny_data, "--user-dir", USER_DIR, "--path", out, "--cpu",
              "--beam", "4", "--batch-size", "8").stdout  # fmt: skip
    assert sum(line.startswith("H-") for line in gen.splitlines()) == 24
    ft = tmp_path / "ft"
    cli(
        "fairseq-train", tiny_data, "--user-dir", USER_DIR, "--arch", "gated_transformer",
        *TINY_ARCH, *TRAIN_COMMON, "--kept-heads", f"{out}.heads.json", "--head-gates", "none",
        "--finetune-from-model", out, "--max-update", "3", "--save-dir", ft,
    )  # fmt: skip
    before, after = load_state(out)["model"], load_state(ft / "checkpoint_last.pt")["model"]
    for key in ("decoder.layers.1.fc1.weight", "encoder.layers.0.self_attn.q_proj.weight"):
        if key in before:
            assert after[key].shape == before[key].shape


def test_stock_arch_preset_and_head_budget(tiny_data, tmp_path):
    ckpt = train(tiny_data, tmp_path / "iwslt", "--max-update", "10",
                 arch="transformer_iwslt_de_en")  # fmt: skip
    out = tmp_path / "h5.pt"
    proc = prune(tiny_data, ckpt, out, "--budget", "heads:5", "--json-out", f"{out}.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = json.loads(out.with_name("h5.pt.json").read_text())["kept_heads"]
    assert sum(len(r) for s in ("enc-self", "dec-self", "dec-enc") for r in kept[s]) == 5
    assert [len(r) for r in kept["dec-ffn"]] == [32, 32]
    cli("fairseq-generate", tiny_data, "--user-dir", USER_DIR, "--path", out, "--cpu")


def test_sites_limit_what_the_search_prunes(stock_checkpoint, tiny_data, tmp_path):
    """--sites: heads:K counts only the named attention types; a MAC budget charges the kinds
    left whole first and prunes only the named ones."""
    full = load_state(stock_checkpoint)["model"]
    out = tmp_path / "enc3.pt"
    proc = prune(tiny_data, stock_checkpoint, out, "--budget", "heads:3", "--sites", "enc-self",
                  "--json-out", f"{out}.json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.with_name("enc3.pt.json").read_text())
    kept = report["kept_heads"]
    assert sum(map(len, kept["enc-self"])) == 3 and report["sites"] == ["enc-self"]
    n_heads = 4  # TINY_ARCH
    for site in ("dec-self", "dec-enc"):
        assert kept[site] == [list(range(n_heads))] * len(kept[site])
    for site, key in (("enc-ffn", "encoder"), ("dec-ffn", "decoder")):
        assert [len(r) for r in kept[site]] == [full[f"{key}.layers.0.fc1.weight"].shape[0]] * 2

    out = tmp_path / "ffn.pt"
    proc = prune(tiny_data, stock_checkpoint, out, "--budget", "macs:0.8", "--sites",
                  "enc-ffn,dec-ffn", "--json-out", f"{out}.json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.with_name("ffn.pt.json").read_text())
    assert all(len(r) == n_heads for s in ("enc-self", "dec-self", "dec-enc")
               for r in report["kept_heads"][s])  # fmt: skip
    assert sum(map(len, report["kept_heads"]["dec-ffn"])) < 2 * 32
    assert report["prunable_kept"] <= 0.8 + 1e-9

    for sites, budget, message in (
        ("enc-slef", "heads:3", "--sites: unknown name(s) ['enc-slef']"),
        ("enc-ffn", "heads:3", "--sites enc-ffn: nothing for --budget heads:3 to prune"),
        ("enc-self", "heads:99", "--budget heads:99: the model has 8 prunable heads"),
        ("dec-ffn", "macs:0.1", "--budget: too small: the units kept whole (--sites)"),
    ):
        out = tmp_path / "bad.pt"
        proc = prune(tiny_data, stock_checkpoint, out, "--budget", budget, "--sites", sites)
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode != 0 and message in last, proc.stderr[-2000:]
        assert not out.exists()


def test_bad_input(stock_checkpoint, tiny_data, tmp_path):
    out = tmp_path / "x.pt"
    for budget in ("macs:0", "macs:1.5", "flops:0.5", "heads:0", "heads:99"):
        proc = prune(tiny_data, stock_checkpoint, out, "--budget", budget)
        assert proc.returncode != 0 and "--budget" in proc.stderr, proc.stderr[-2000:]
        assert len(proc.stderr.strip().splitlines()) == 1 or "error: --budget" in proc.stderr
    proc = prune(tiny_data, stock_checkpoint, out, "--budget", "macs:0.5", "--subset", "nope")
    assert proc.returncode != 0 and "--subset nope" in proc.stderr
    lm = tmp_path / "lm.pt"
    torch.save({"model": {"decoder.layers.0.fc1.weight": torch.zeros(2, 2)},
                "cfg": {"model": Namespace(arch="transformer_lm")}}, lm)  # fmt: skip
    proc = prune(tiny_data, lm, out, "--budget", "macs:0.5")
    assert proc.returncode != 0 and f"--path {lm}" in proc.stderr
    assert not out.exists()
    out.write_text("keep me")
    proc = prune(tiny_data, stock_checkpoint, out, "--budget", "macs:0.5")
    assert proc.returncode != 0 and "--force" in proc.stderr and out.read_text() == "keep me"
    with pytest.raises(HeadpruneError):
        parse_budget("macs:abc")


def test_latency_budget(stock_checkpoint, tiny_data, tmp_path, monkeypatch):
    """latency:F times the full model, the floor (no heads or neurons) and each kind removed on
    this machine and searches with the seconds per unit; a budget below the floor is refused
    before anything is written."""
    from fairseq_headprune.posttrain import latency

    model, task = load_model(stock_checkpoint, tiny_data)
    floor = latency.without(model, UNIT_SITES)
    assert set(latency.unit_counts(floor).values()) == {0}
    assert latency.unit_counts(latency.without(model, ["dec-enc"]))["enc-ffn", 0] == 32
    batch = calibration_batches(task, "valid", 8, 8)[0]
    full, constant, terms = latency.latency_terms(task, model, batch, beam=2, steps=4, repeats=1)
    assert full > 0 and 0 <= constant <= full
    assert sum(c * n for c, n in terms.values()) == pytest.approx(full - constant)
    assert {n for (site, _), (_, n) in terms.items() if site.endswith("ffn")} == {32}

    # the arithmetic, on given times: each kind's saving over its units, scaled to full - floor
    times = {"full": 10.0, "floor": 4.0, "enc-self": 9.0, "dec-self": 8.0, "dec-enc": 9.5}
    times.update({"enc-ffn": 9.0, "dec-ffn": 11.0})  # slower without: noise, saves nothing
    monkeypatch.setattr(latency, "best_of", lambda runs, *_: {n: times[n] for n in runs})
    full, constant, terms = latency.latency_terms(task, model, batch, beam=2, steps=4)
    units = latency.unit_counts(model)
    scale = 6.0 / (1.0 + 2.0 + 0.5 + 1.0)
    for kind, saved in {"enc-self": 1.0, "dec-self": 2.0, "dec-enc": 0.5, "dec-ffn": 0.0}.items():
        n = sum(k for (site, _), k in units.items() if site == kind)
        for (site, _), (c, _) in terms.items():
            assert site != kind or c == pytest.approx(saved * scale / n)
    assert (full, constant) == (10.0, 4.0)

    args = Namespace(subset="valid", latency_batch_size=4, seed=1, beam=5)
    with pytest.raises(HeadpruneError, match="latency:0.3: no mask can meet it: 40%"):
        latency.latency_budget(args, task, model, 0.3, 7)
    cost, allowed, report = latency.latency_budget(args, task, model, 0.75, 7)
    assert allowed == pytest.approx(3.5) and report["seconds_unprunable"] == 4.0
    assert cost == {u: c for u, (c, _) in terms.items()}

    # End to end with this machine's timings: how much of a tiny model's time heads and
    # neurons explain is timing noise, so only latency:1 (the full model's own time, which
    # every measurement allows) is feasible on every machine, and it keeps everything.
    out = tmp_path / "lat.pt"
    proc = prune(tiny_data, stock_checkpoint, out, "--budget", "latency:1",
                  "--latency-batch-size", "4", "--json-out", f"{out}.json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.with_name("lat.pt.json").read_text())
    assert report["latency"]["seconds_pruned"] == pytest.approx(report["latency"]["seconds_full"])
    assert report["params_after"] == report["params_before"]
    assert "latency model for the pruned model" in proc.stdout


def test_bench_predicts_the_decoder_speedup_of_pruned_neurons(pruned, stock_checkpoint, tiny_data):
    out, report = pruned
    proc = cli(
        "fairseq-headprune", "bench", tiny_data, "--full", stock_checkpoint, "--pruned", out,
        "--batch-sizes", "4", "--repeats", "1", "--max-sentences", "8",
        "--json-out", f"{out}.bench.json",
    )  # fmt: skip
    bench = json.loads(out.with_name(out.name + ".bench.json").read_text())
    rows = {r["what"]: r for r in bench["rows"]}
    assert rows["decoder (beam-enc)"]["predicted"] > 1
    assert bench["params"]["pruned"] < bench["params"]["full"]
    assert bench["mac_allowed_speedup"] > rows["generate beam 5"]["predicted"] > 1
    assert "the MAC model's limit for beam search" in proc.stdout
