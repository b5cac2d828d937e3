"""Physically pruned export: same function as the gated model, fewer parameters, loads in
the real fairseq-generate and fairseq-train."""

import json

import pytest
import torch

import fairseq_headprune  # noqa: F401  registers the plugin, as --user-dir does
from fairseq_headprune.gated_attention import head_gates
from fairseq_headprune.pruning import NoHeadAttention
from fairseq_headprune.sites import attention_modules
from tests.export_helpers import THETAS, export, logits
from tests.helpers import TINY_ARCH, TRAIN_COMMON, USER_DIR, cli, load_model, load_state


@pytest.fixture(scope="module")
def gated_pre_norm_checkpoint(gated_checkpoint, tmp_path_factory):
    """The same gated model with pre-norm layers (``--encoder-normalize-before
    --decoder-normalize-before``, the layout of Voita et al.'s Transformer) and the final
    LayerNorms they add, with scales other than 1 so that they matter."""
    state = load_state(gated_checkpoint)
    args = state["cfg"]["model"]
    args.encoder_normalize_before = args.decoder_normalize_before = True
    g, dim = torch.Generator().manual_seed(0), args.encoder_embed_dim
    for side in ("encoder", "decoder"):
        state["model"][f"{side}.layer_norm.weight"] = 1 + 0.2 * torch.randn(dim, generator=g)
        state["model"][f"{side}.layer_norm.bias"] = 0.2 * torch.randn(dim, generator=g)
    path = tmp_path_factory.mktemp("gated-pre-norm") / "gated.pt"
    torch.save(state, path)
    return path


def _hypotheses(path, data):
    out = cli(
        "fairseq-generate", data, "--user-dir", USER_DIR, "--path", path, "--cpu", "--beam", "4",
        "--batch-size", "8", "--required-batch-size-multiple", "1",
    ).stdout  # fmt: skip
    hyps = sorted(line.split("\t") for line in out.splitlines() if line.startswith("H-"))
    assert len(hyps) == 24
    return hyps


@pytest.mark.parametrize("norm", ["post-norm", "pre-norm"])
def test_export_equals_gated_model(norm, request, tiny_data, tmp_path):
    fixture = "gated_checkpoint" if norm == "post-norm" else "gated_pre_norm_checkpoint"
    gated_checkpoint = request.getfixturevalue(fixture)
    out = tmp_path / "pruned.pt"
    report = cli("fairseq-headprune", "export", "--path", gated_checkpoint, "--out", out).stdout
    assert "enc-self: kept 3/8 heads" in report
    # the gates decided the heads: the fractional ones are folded exactly, no open head removed
    assert "largest change folded into a kept head's gate: 0, largest gate of a removed" in report
    assert report.split("largest gate of a removed head: ")[1].startswith("0\n")
    gated, task = load_model(gated_checkpoint, tiny_data)
    pruned, _ = load_model(out, tiny_data)
    assert not list(head_gates(pruned))
    assert isinstance(pruned.encoder.layers[1].self_attn, NoHeadAttention)
    assert pruned.encoder.layers[0].normalize_before == (norm == "pre-norm")
    assert (pruned.encoder.layer_norm is not None) == (norm == "pre-norm")
    # order: enc 0, enc 1, then per decoder layer: dec-self, dec-enc
    assert [a.num_heads for _, _, a in attention_modules(pruned)] == [3, 0, 3, 2, 4, 3]
    d = task.source_dictionary
    torch.manual_seed(0)
    src = torch.randint(d.nspecial, len(d), (5, 9))
    prev = torch.randint(d.nspecial, len(d), (5, 7))
    assert (logits(pruned, src, prev) - logits(gated, src, prev)).abs().max() <= 1e-5
    # real data
    task.load_dataset("valid")
    batches = task.get_batch_iterator(task.dataset("valid"), max_tokens=400).next_epoch_itr()
    for sample in batches:
        net = sample["net_input"]
        with torch.no_grad():
            diff = pruned(**net)[0] - gated(**net)[0]
        assert diff.abs().max() <= 1e-5
    ours, theirs = _hypotheses(out, tiny_data), _hypotheses(gated_checkpoint, tiny_data)
    assert [(i, text) for i, _, text in ours] == [(i, text) for i, _, text in theirs]
    for (_, a, _), (_, b, _) in zip(ours, theirs):
        assert float(a) == pytest.approx(float(b), abs=1e-5)


def _export_mask(checkpoint, out, mask: dict, *extra) -> None:
    """``fairseq-headprune export`` of ``checkpoint`` with ``mask`` (written next to ``out``)."""
    mask_file = out.with_name(out.name + ".mask.json")
    mask_file.write_text(json.dumps(mask))
    cli("fairseq-headprune", "export", "--path", checkpoint, "--out", out, "--mask", mask_file,
        *extra)  # fmt: skip


def _attention_params(model) -> int:
    return sum(
        p.numel() for n, p in model.named_parameters() if "_attn." in n and "head_gate" not in n
    )


def test_parameter_count_falls_by_the_removed_heads(
    gated_checkpoint, stock_checkpoint, tiny_data, tmp_path
):
    out = tmp_path / "pruned.pt"
    report = cli("fairseq-headprune", "export", "--path", gated_checkpoint, "--out", out).stdout
    stock, _ = load_model(stock_checkpoint, tiny_data)
    pruned, _ = load_model(out, tiny_data)
    # the printed counts are the models' parameters (no gates, no buffers)
    n_stock, n_pruned = (sum(p.numel() for p in m.parameters()) for m in (stock, pruned))
    assert f"parameters: {n_stock:,} -> {n_pruned:,}" in report
    embed, head_dim = 16, 4  # TINY_ARCH: dim 16, 4 heads
    removed_heads = sum(row.count(-6.0) for rows in THETAS.values() for row in rows)
    # per removed head: q, k, v rows (weights E·d + biases d) and out_proj columns (E·d)
    expected = removed_heads * (3 * (embed * head_dim + head_dim) + embed * head_dim)
    total = sum(p.numel() for p in stock.parameters())
    assert total - sum(p.numel() for p in pruned.parameters()) == expected
    assert _attention_params(stock) - _attention_params(pruned) == expected


def test_stock_checkpoint_with_mask_equals_masked_model(stock_checkpoint, tiny_data, tmp_path):
    mask = {
        "enc-self": [[0, 3], [1]],  # original head indices to keep
        "dec-enc": [[True, False, True, True], [False, False, False, False]],
    }
    out = tmp_path / "masked.pt"
    _export_mask(stock_checkpoint, out, mask)
    assert json.loads((tmp_path / "masked.pt.heads.json").read_text())["enc-self"] == [[0, 3], [1]]
    pruned, task = load_model(out, tiny_data)
    reference, _ = load_model(stock_checkpoint, tiny_data)
    # the independent reference: the stock model with the masked heads' out_proj columns zeroed
    for site, i, attn in attention_modules(reference):
        if site in mask:
            row = mask[site][i]
            keep = [h for h in range(4) if (row[h] if isinstance(row[0], bool) else h in row)]
            for h in set(range(4)) - set(keep):
                attn.out_proj.weight.data[:, h * 4 : (h + 1) * 4] = 0
    d = task.source_dictionary
    src = torch.randint(d.nspecial, len(d), (3, 8))
    prev = torch.randint(d.nspecial, len(d), (3, 6))
    assert (logits(pruned, src, prev) - logits(reference, src, prev)).abs().max() <= 1e-5


def test_all_heads_pruned_is_a_valid_model_that_trains_further(
    stock_checkpoint, tiny_data, tmp_path
):
    none = {site: [[], []] for site in ("enc-self", "dec-self", "dec-enc")}
    out = tmp_path / "empty.pt"
    _export_mask(stock_checkpoint, out, none)
    _hypotheses(out, tiny_data)
    # fine-tune the pruned model further with the real fairseq-train
    kept = tmp_path / "empty.pt.heads.json"
    ckpt = tmp_path / "ft" / "checkpoint_last.pt"
    cli(
        "fairseq-train", tiny_data, "--user-dir", USER_DIR, "--arch", "gated_transformer",
        *TINY_ARCH, *TRAIN_COMMON, "--kept-heads", kept, "--head-gates", "none",
        "--finetune-from-model", out, "--max-epoch", "1", "--save-dir", tmp_path / "ft",
    )  # fmt: skip
    assert not any("q_proj" in k for k in load_state(ckpt)["model"])


def test_bad_input(stock_checkpoint, gated_checkpoint, tmp_path):
    out = tmp_path / "x.pt"
    proc = export("--path", stock_checkpoint, "--out", out)
    assert proc.returncode != 0 and "has no head gates: give a --mask" in proc.stderr
    for mask, message in [
        ({"enc-self": [[True, False]] * 2}, "has 2 entries; the layer has 4 heads"),
        ({"enc-self": [[0]]}, "the mask has 1 layers for enc-self; the model has 2"),
        ({"enc-self": [[0, 7], [1]]}, "heads [7], which the model does not have"),
        ({"cross": [[0]]}, "the mask names attention types ['cross']"),
    ]:
        (tmp_path / "m.json").write_text(json.dumps(mask))
        proc = export("--path", stock_checkpoint, "--out", out, "--mask", tmp_path / "m.json")
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert not out.exists()
    out.write_bytes(b"keep me")
    proc = export("--path", gated_checkpoint, "--out", out)
    assert proc.returncode != 0 and "exists; pass --force" in proc.stderr
    assert out.read_bytes() == b"keep me"
    export("--path", gated_checkpoint, "--out", out, "--force")
    assert "model" in load_state(out)
    assert not list(tmp_path.glob("*.tmp"))


def test_export_top_k_by_a_scorer_metric(stock_checkpoint, tiny_data, tmp_path):
    cli(
        "fairseq-headprune", "score", tiny_data, "--path", stock_checkpoint, "--subset", "valid",
        "--metrics", "importance,confidence", "--out", tmp_path / "scores",
    )  # fmt: skip
    report = json.loads((tmp_path / "scores" / "heads.json").read_text())
    enc = [r for r in report["heads"] if r["site"] == "enc-self"]
    best = sorted(enc, key=lambda r: -r["importance"])[:3]
    for metric in ("importance", "random:1"):
        out = tmp_path / f"{metric.replace(':', '')}.pt"
        cli(
            "fairseq-headprune", "export", "--path", stock_checkpoint, "--out", out,
            "--scores", tmp_path / "scores" / "heads.json", "--metric", metric, "--top-k", "3",
        )  # fmt: skip
        kept = json.loads(out.with_name(out.name + ".heads.json").read_text())
        assert sum(map(len, kept["enc-self"])) == 3 and kept["dec-enc"] == [[0, 1, 2, 3]] * 2
        if metric == "importance":
            assert {(r["layer"], r["head"]) for r in best} == {
                (i, h) for i, row in enumerate(kept["enc-self"]) for h in row
            }
    proc = export(
        "--path", stock_checkpoint, "--out", tmp_path / "x.pt",
        "--scores", tmp_path / "scores" / "heads.json", "--metric", "nope", "--top-k", "3",
    )  # fmt: skip
    assert proc.returncode != 0 and "has no metric 'nope'" in proc.stderr


# `export --fp16`: the pruned weights in half precision, tied embeddings stored once, loading
# into an fp32 model in the real fairseq-generate

FP16_MASK = {"enc-self": [[0, 2], [1, 2, 3]], "dec-enc": [[3], [0, 1]]}
TIED = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


def _fp32_logits(path, data):
    """Logits of the model fairseq loads from ``path``, which must hold fp32 parameters."""
    model, task = load_model(path, data)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    d = task.source_dictionary
    g = torch.Generator().manual_seed(0)
    src = torch.randint(d.nspecial, len(d), (4, 9), generator=g)
    prev = torch.randint(d.nspecial, len(d), (4, 6), generator=g)
    return logits(model, src, prev)


def _float_bytes(sd):
    """Bytes of the distinct floating-point storages of a loaded state dict."""
    storages = {v.untyped_storage().data_ptr(): v.untyped_storage().nbytes() for v in sd.values()
                if v.is_floating_point()}  # fmt: skip
    return sum(storages.values())


def test_fp16_export_is_the_fp32_export_cast(stock_checkpoint, tiny_data, tmp_path):
    full, half = tmp_path / "fp32.pt", tmp_path / "fp16.pt"
    _export_mask(stock_checkpoint, full, FP16_MASK)
    _export_mask(stock_checkpoint, half, FP16_MASK, "--fp16")
    a, b = load_state(full)["model"], load_state(half)["model"]
    assert a.keys() == b.keys()
    for key, value in a.items():
        expected = value.half() if value.is_floating_point() else value
        assert b[key].dtype == expected.dtype and b[key].equal(expected), key
    # the tied embedding matrix is one tensor in the file, as in the fp32 export
    assert a[TIED[0]].data_ptr() == a[TIED[1]].data_ptr()
    assert b[TIED[0]].data_ptr() == b[TIED[1]].data_ptr()
    assert _float_bytes(b) * 2 == _float_bytes(a)  # half the weights' storage, nothing doubled
    head_files = [p.with_name(p.name + ".heads.json").read_text() for p in (full, half)]
    assert head_files[0] == head_files[1]
    # fairseq loads it into an fp32 model that computes what the fp32 export computes, to
    # fp16's rounding of the weights
    diff = (_fp32_logits(half, tiny_data) - _fp32_logits(full, tiny_data)).abs().max()
    assert 0 < diff <= 0.05
    _hypotheses(half, tiny_data)  # every one of the 24 sentences translated
