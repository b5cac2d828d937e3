"""Gates at the out_proj seam against independent attention computations."""

import copy

import pytest
import torch
from fairseq.modules import MultiheadAttention

from fairseq_headprune.gated_attention import head_gates, install_head_gate
from fairseq_headprune.sites import attention_modules
from tests.helpers import build_model

E, H, T, S, B = 16, 4, 5, 7, 3


def _reference_attention(attn, query, key, keep):
    """Scaled dot-product attention written out, summing only the heads in ``keep``."""
    d = E // H
    q = attn.q_proj(query) * d**-0.5  # (T, B, E)
    k, v = attn.k_proj(key), attn.v_proj(key)  # (S, B, E)
    out = attn.out_proj.bias.expand(query.shape[0], query.shape[1], E).clone()
    for h in keep:
        sl = slice(h * d, (h + 1) * d)
        w = torch.softmax(torch.einsum("tbd,sbd->bts", q[..., sl], k[..., sl]), dim=-1)
        head = torch.einsum("bts,sbd->tbd", w, v[..., sl])  # (T, B, d)
        out = out + head @ attn.out_proj.weight[:, sl].T
    return out


@pytest.mark.parametrize("cross", [False, True])
def test_open_gates_equal_stock_and_closed_gate_removes_head(cross):
    torch.manual_seed(0)
    stock = MultiheadAttention(E, H, self_attention=not cross, encoder_decoder_attention=cross)
    gated = copy.deepcopy(stock)
    install_head_gate(gated)
    stock.eval(), gated.eval()
    query = torch.randn(T, B, E)
    key = torch.randn(S, B, E) if cross else query
    out_stock, _ = stock(query, key, key)  # the fused route for self-attention
    out_gated, _ = gated(query, key, key)
    torch.testing.assert_close(out_gated, out_stock, atol=1e-6, rtol=0)
    torch.testing.assert_close(out_stock, _reference_attention(stock, query, key, range(H)))
    gated.head_gate.theta.data[2] = -10.0  # deterministic gate 0
    out_pruned, _ = gated(query, key, key)
    torch.testing.assert_close(out_pruned, _reference_attention(stock, query, key, [0, 1, 3]))


def test_gate_acts_in_training_mode_on_the_fused_route():
    """Self-attention trains through F.multi_head_attention_forward unless the gate forces
    the explicit route; a closed gate must still remove its head there."""
    torch.manual_seed(0)
    attn = MultiheadAttention(E, H, self_attention=True)
    gate = install_head_gate(attn)
    attn.train()
    gate.override = torch.tensor([1.0, 1.0, 0.0, 1.0])
    x = torch.randn(T, B, E)
    out, _ = attn(x, x, x)
    torch.testing.assert_close(out, _reference_attention(attn, x, x, [0, 1, 3]))
    (out.sum() + 0 * gate.theta.sum()).backward()


def _sites_seen(model, src, prev):
    seen = []
    for site, _, attn in attention_modules(model):
        attn.head_gate.observer = lambda heads, g, site=site: seen.append(site)
    model(src, torch.tensor([src.shape[1]] * src.shape[0]), prev)
    return set(seen)


def test_gates_fire_on_all_three_attention_types_in_train_and_eval():
    torch.manual_seed(0)
    model, d = build_model()
    src = torch.randint(d.nspecial, len(d), (2, 6))
    prev = torch.randint(d.nspecial, len(d), (2, 5))
    for mode in (model.train, model.eval):
        mode()
        assert _sites_seen(model, src, prev) == {"enc-self", "dec-self", "dec-enc"}


def test_closed_site_equals_zeroed_output_projection_in_training():
    torch.manual_seed(0)
    model, d = build_model()
    reference, _ = build_model("transformer")
    stock_keys = reference.state_dict().keys()
    reference.load_state_dict({k: v for k, v in model.state_dict().items() if k in stock_keys})
    src = torch.randint(d.nspecial, len(d), (2, 6))
    lengths = torch.tensor([6, 6])
    prev = torch.randint(d.nspecial, len(d), (2, 5))
    for site, _, gate in head_gates(model):
        gate.override = (
            torch.zeros(gate.num_heads) if site == "dec-enc" else torch.ones(gate.num_heads)
        )
    for _, _, attn in attention_modules(reference):
        if attn.encoder_decoder_attention:
            attn.out_proj.weight.data.zero_()
    model.train(), reference.train()
    torch.testing.assert_close(model(src, lengths, prev)[0], reference(src, lengths, prev)[0])


def test_incremental_decoding_equals_full_decoding_with_gates():
    torch.manual_seed(0)
    model, d = build_model()
    for _, _, gate in head_gates(model):
        gate.theta.data.uniform_(-1.5, 1.5)  # fractional and closed gates
    model.eval()
    src = torch.randint(d.nspecial, len(d), (2, 6))
    enc = model.encoder(src, src_lengths=torch.tensor([6, 6]))
    prev = torch.randint(d.nspecial, len(d), (2, 5))
    full, _ = model.decoder(prev, encoder_out=enc)
    state = {}
    steps = [
        model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0]
        for t in range(5)
    ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_gradients_reach_every_gate():
    torch.manual_seed(0)
    model, d = build_model()
    model.train()
    src = torch.randint(d.nspecial, len(d), (2, 6))
    out, _ = model(src, torch.tensor([6, 6]), torch.randint(d.nspecial, len(d), (2, 5)))
    out.logsumexp(-1).sum().backward()
    for site, layer, gate in head_gates(model):
        assert gate.theta.grad is not None, (site, layer)
    assert any(gate.theta.grad.abs().sum() > 0 for _, _, gate in head_gates(model))
