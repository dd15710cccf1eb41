"""Multi-token prediction (``models/mtp.py``): the main logits and loss are untouched, each depth's loss is the
cross-entropy of the shifted predictions computed here by hand, and backward adds the scaled MTP loss's gradient."""

import pytest
import torch
from torch.nn import functional as F

from megatron_bridge.config.decoder_names import native_module_names
from megatron_bridge.models.llama import LlamaModel
from megatron_bridge.models.mtp import set_mtp_loss_scale
from megatron_bridge.recipes import get_recipe


RECIPES = ["tiny_deepseek_v3", "tiny_llama"]


def _config(recipe: str, depths: int | None):  # noqa: ANN202
    m = get_recipe(recipe).fn().model
    m.expert_model_parallel_size = 1
    m.mtp_num_layers = depths
    return m


def _model(recipe: str, depths: int | None) -> LlamaModel:
    torch.manual_seed(0)
    return LlamaModel(_config(recipe, depths))


def _batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (2, 17), generator=g)
    mask = torch.ones(2, 16)
    mask[1, 5:9] = 0.0  # masked tokens stay masked as the mask shifts
    return tokens[:, :-1], tokens[:, 1:], mask


@pytest.mark.parametrize("recipe", RECIPES)
def test_mtp_leaves_the_main_logits_and_loss_unchanged(recipe: str) -> None:
    plain, mtp = _model(recipe, None), _model(recipe, 2)
    assert plain.mtp is None and len(mtp.mtp.layers) == 2
    tokens, labels, mask = _batch(plain.config.vocab_size)
    for model in (plain, mtp):
        model.train()
    assert torch.equal(plain(tokens), mtp(tokens))
    assert torch.equal(plain(tokens, labels=labels), mtp(tokens, labels=labels, loss_mask=mask))
    assert len(mtp.mtp.last_losses) == 2
    assert native_module_names(mtp.config) == [name for name, _ in mtp.named_modules()]
    assert set(mtp.state_dict()) - set(plain.state_dict()) == {k for k in mtp.state_dict() if k.startswith("mtp.")}


def _by_hand(model: LlamaModel, tokens: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
             hidden: torch.Tensor) -> list[torch.Tensor]:
    """Depth k on positions 0..s-1-k: the tokens k ahead embedded, the labels k ahead, by slicing."""
    s = tokens.shape[1]
    positions = torch.arange(s).unsqueeze(0)
    cos, sin = model.rotary_emb(positions)
    out = []
    for k, layer in enumerate(model.mtp.layers.values(), start=1):
        shifted = torch.cat([tokens[:, k:], torch.zeros_like(tokens[:, :k])], dim=1)
        x = layer.eh_proj(torch.cat([layer.enorm(model.embed_tokens(shifted)), layer.hnorm(hidden)], dim=-1))
        hidden = layer.final_layernorm(layer.transformer_layer(x, cos, sin))
        logits = F.linear(hidden, model.output_weight)[:, : s - k]
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels[:, k:].reshape(-1),
                             reduction="none")
        m = mask[:, k:].reshape(-1)
        out.append((ce * m).sum() / m.sum())
    return out


@pytest.mark.parametrize("recipe", RECIPES)
def test_mtp_loss_is_the_shifted_cross_entropy(recipe: str) -> None:
    model = _model(recipe, 2).train()
    tokens, labels, mask = _batch(model.config.vocab_size)
    captured = {}
    model.norm.register_forward_hook(lambda _m, _i, out: captured.setdefault("hidden", out))
    model(tokens, labels=labels, loss_mask=mask)
    expected = _by_hand(model, tokens, labels, mask, captured["hidden"])
    for got, want in zip(model.mtp.last_losses, expected, strict=True):
        assert abs(got.item() - want.item()) <= 5e-6, (got.item(), want.item())  # ~10 float32 ulps at 6.0
    assert all(float(loss) > 1.0 for loss in expected)  # real cross-entropies, not zeros


def test_backward_adds_the_scaled_mtp_loss() -> None:
    """Gradient of the model's main loss with the MTP loss attached (scale 1) = autograd of
    main + mtp_loss_scaling_factor / D * sum_k L_k written out."""
    tokens, labels, mask = _batch(_config("tiny_deepseek_v3", 2).vocab_size)
    set_mtp_loss_scale(1.0)
    auto = _model("tiny_deepseek_v3", 2).train()
    main = (auto(tokens, labels=labels, loss_mask=mask) * mask).sum() / mask.sum()
    main.backward()
    hand = _model("tiny_deepseek_v3", 2).train()
    captured = {}
    hand.norm.register_forward_hook(lambda _m, _i, out: captured.setdefault("hidden", out))
    logits = hand(tokens)  # no labels: the model attaches no MTP loss itself
    ce = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none").view_as(mask)
    hand_main = (ce * mask).sum() / mask.sum()
    losses = _by_hand(hand, tokens, labels, mask, captured["hidden"])
    factor = hand.config.mtp_loss_scaling_factor
    assert factor == 0.1
    (hand_main + factor / 2 * sum(losses)).backward(inputs=[p for p in hand.parameters()])
    worst = max((a.grad - b.grad).abs().max().item() for a, b in zip(auto.parameters(), hand.parameters(),
                                                                       strict=True) if b.grad is not None)
    assert worst <= 1e-6, worst
    assert hand.mtp.layers["4"].eh_proj.weight.grad.abs().sum() > 0


def test_mtp_runs_only_in_training_with_labels() -> None:
    model = _model("tiny_deepseek_v3", 1)
    tokens, labels, _ = _batch(model.config.vocab_size)
    model.eval()
    model(tokens, labels=labels)
    assert model.mtp.last_losses == [] and model.mtp.step_records() == ([0.0], 0)
    model.train()
    model(tokens, labels=labels)
    sums, count = model.mtp.step_records()
    assert count == 1 and sums[0] == pytest.approx(float(model.mtp.last_losses[0]))
