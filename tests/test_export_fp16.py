"""``fairseq-headprune export --fp16``: the pruned weights in half precision, tied embeddings
stored once, loading into an fp32 model in the real fairseq-generate."""

import json

import torch
from fairseq import checkpoint_utils

import fairseq_headprune  # noqa: F401  registers the plugin, as --user-dir does
from tests.helpers import USER_DIR, cli, load_state

MASK = {"enc-self": [[0, 2], [1, 2, 3]], "dec-enc": [[3], [0, 1]]}
TIED = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


def _export(stock, out, *extra):
    mask = out.with_name("mask.json")
    mask.write_text(json.dumps(MASK))
    cli("fairseq-headprune", "export", "--path", stock, "--out", out, "--mask", mask, *extra)


def _logits(path, data):
    (model,), _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(data)}
    )
    d = task.source_dictionary
    g = torch.Generator().manual_seed(0)
    src = torch.randint(d.nspecial, len(d), (4, 9), generator=g)
    prev = torch.randint(d.nspecial, len(d), (4, 6), generator=g)
    with torch.no_grad():
        out = model.eval()(src, torch.full((4,), 9), prev)[0]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    return out


def _float_bytes(sd):
    """Bytes of the distinct floating-point storages of a loaded state dict."""
    storages = {v.untyped_storage().data_ptr(): v.untyped_storage().nbytes() for v in sd.values()
                if v.is_floating_point()}  # fmt: skip
    return sum(storages.values())


def test_fp16_export_is_the_fp32_export_cast(stock_checkpoint, tiny_data, tmp_path):
    full, half = tmp_path / "fp32.pt", tmp_path / "fp16.pt"
    _export(stock_checkpoint, full)
    _export(stock_checkpoint, half, "--fp16")
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
    diff = (_logits(half, tiny_data) - _logits(full, tiny_data)).abs().max()
    assert 0 < diff <= 0.05
    out = cli(
        "fairseq-generate", tiny_data, "--user-dir", USER_DIR, "--path", half, "--cpu",
        "--beam", "4", "--batch-size", "8", "--required-batch-size-multiple", "1",
    ).stdout  # fmt: skip
    assert sum(line.startswith("H-") for line in out.splitlines()) == 24
