"""Helpers of the post-training pruning tests (test_posttrain, test_refit): running
``fairseq-headprune prune``, layer outputs and logits compared."""

import torch

from fairseq_headprune.posttrain.fisher import calibration_batches
from fairseq_headprune.posttrain.masks import Masks
from fairseq_headprune.sites import module_prefix
from tests.helpers import cli


def prune(data, ckpt, out, *args):
    return cli(
        "fairseq-headprune", "prune", data, "--path", ckpt, "--out", out,
        "--calibration-sentences", "96", *args, check=False,
    )  # fmt: skip


NORM_AFTER = {"enc-self": "self_attn_layer_norm", "dec-self": "self_attn_layer_norm",
               "dec-enc": "encoder_attn_layer_norm", "enc-ffn": "final_layer_norm",
               "dec-ffn": "final_layer_norm"}  # fmt: skip


def unit_output(model, masks, unit, batches, values):
    """What the unit's layer norm receives (residual + the unit's output; the tiny model is
    post-norm), at the real positions of every batch, with the unit's masks ``values``."""
    site, i = unit
    layer = (model.encoder if site.startswith("enc") else model.decoder).layers[i]
    norm = getattr(layer, NORM_AFTER[site])
    masks.set({unit: values})
    outs = []
    handle = norm.register_forward_pre_hook(lambda m, i: outs.append(i[0].detach().clone()))
    pad = model.decoder.dictionary.pad()
    real = []
    with torch.no_grad():
        for b in batches:
            n = b["net_input"]
            tokens = n["src_tokens"] if site.startswith("enc") else n["prev_output_tokens"]
            real.append((tokens != pad).t())  # (T, B) like the layer's tensors
            model(n["src_tokens"], n["src_lengths"], n["prev_output_tokens"])
    handle.remove()
    return [o[r] for o, r in zip(outs, real)]


def refit_errors(model, masks, unit, batches, reference, originals, weights):
    """([squared error with ``unit``'s original projection, with its refit one], ‖teacher‖²):
    the distance of what ``unit``'s layer norm receives in ``model`` to the same in the
    unpruned ``reference`` (model, masks), at the unit's current masks."""
    ref_model, ref_masks = reference
    teacher = unit_output(ref_model, ref_masks, unit, batches, ref_masks.values[unit])
    params = dict(model.named_parameters())
    proj = [n for n in weights if n.startswith(module_prefix(unit) + ".")
            and (".fc2." in n) == unit[0].endswith("ffn")]  # fmt: skip
    errs = []
    for use_original in (True, False):
        with torch.no_grad():
            for n in proj:
                params[n].copy_(originals[n] if use_original else weights[n])
        outs = unit_output(model, masks, unit, batches, masks.values[unit])
        errs.append(sum(float(((o - t) ** 2).sum()) for o, t in zip(outs, teacher)))
    return errs, sum(float((t**2).sum()) for t in teacher)


def report_masks(model, report: dict) -> Masks:
    """Masks on ``model`` set to the values a prune report lists."""
    masks = Masks(model)
    masks.set({(k.rsplit(".", 1)[0], int(k.rsplit(".", 1)[1])): torch.tensor(v)
               for k, v in report["masks"].items()})  # fmt: skip
    return masks


def assert_same_logits(small, model, task) -> None:
    for batch in calibration_batches(task, "valid", 40, 20):
        n = batch["net_input"]
        with torch.no_grad():
            a = small(n["src_tokens"], n["src_lengths"], n["prev_output_tokens"])[0]
            b = model(n["src_tokens"], n["src_lengths"], n["prev_output_tokens"])[0]
        assert (a - b).abs().max() <= 1e-4
