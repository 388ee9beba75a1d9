"""The chunked lm-head pass against the dense (N, V) logits it replaces.

Reference: the model's own ``(B, L, V)`` logits through ``masked_logits`` and the exact dense
adapter. The chunked pass must give the same gathered logits, log-normaliser, entropy, losses
and parameter gradients (fp32: 1e-5), with chunks that do not divide the token count.
"""

from __future__ import annotations

import pytest
import torch

from rlmix.assembly.rules import resolve_correction
from rlmix.config.schema import CorrectionConfig
from rlmix.correction.weights import Objective
from rlmix.correction import CorrectionMode
from rlmix.correction.logprobs import gather_columns, loss_columns
from rlmix.rollout import Rollouts
from rlmix.trainers import lm_head
from rlmix.trainers.lm_head import HeadPath, chunked_logits, head_path
from rlmix.trainers.loss import batch_loss
from rlmix.trainers.tokens import masked_logits, token_batch

V, K, S = 311, 6, 5


def tiny_model(vocab: int = V, seed: int = 0, **extra):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      initializer_range=0.3, tie_word_embeddings=False, pad_token_id=0, **extra)
    return LlamaForCausalLM(cfg).float()


def random_batch(b: int = 5, t: int = 9, vocab: int = V, seed: int = 1, temperature: float = 0.8) -> Rollouts:
    """Uneven prompts and completions, a top-K head and a recorded support (one row's support empty)."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(1, 6, (b,), generator=g)
    prompts = torch.randint(1, vocab, (b, int(prompt_lens.max())), generator=g)
    prompts[torch.arange(prompts.shape[1])[None] >= prompt_lens[:, None]] = 0
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0] = t
    mask = torch.arange(t)[None] < lengths[:, None]
    completion = torch.randint(1, vocab, (b, t), generator=g).masked_fill(~mask, 0)
    q = torch.log_softmax(2.0 * torch.randn(b, t, vocab, generator=g), dim=-1)
    head = torch.topk(q, K, dim=-1)
    head_ids = head.indices.clone()
    head_ids[..., -1] = -1  # a padding slot in every row
    support_ids = torch.cat([completion[..., None], head.indices[..., : S - 1]], dim=-1)
    support_ids[1] = -1  # a row with no recorded support
    support_probs = torch.softmax(torch.randn(b, t, S, generator=g), dim=-1).masked_fill(support_ids < 0, 0.0)
    return Rollouts(
        prompt_ids=prompts, prompt_lens=prompt_lens, completion_ids=completion, mask=mask,
        sampler_logprobs=q.gather(-1, completion[..., None])[..., 0].masked_fill(~mask, 0.0),
        policy_version=torch.zeros(b, dtype=torch.long), pool=("p",) * b, finish_reason=("length",) * b,
        temperature=temperature,
        head_ids=head_ids, head_logprobs=head.values.masked_fill(head_ids < 0, float("-inf")),
        support_ids=support_ids, support_probs=support_probs,
        group_ids=torch.tensor([0, 0, 0, 1, 1][:b]), rewards=torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0][:b]),
    )


def grads(model) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def assert_grads_close(a: dict, b: dict, rtol: float, atol: float) -> None:
    """Close elementwise, `atol` relative to each gradient's largest entry (fp32 sums in another order)."""
    assert a.keys() == b.keys() and len(a) > 3
    for name in a:
        scale = float(b[name].abs().max())
        torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol * max(scale, 1.0), msg=name)


@pytest.mark.parametrize("chunk_tokens", [1, 4, 1000])
def test_chunked_pass_matches_dense_logits(chunk_tokens):
    model, batch = tiny_model(), random_batch()
    sampled = batch.completion_ids[batch.mask]
    columns = loss_columns(sampled, batch.head_ids[batch.mask])
    g = torch.Generator().manual_seed(3)
    w_z, w_n = torch.randn(columns.shape, generator=g), torch.randn(sampled.shape, generator=g)

    dense = masked_logits(model, batch, pad_id=0, autocast=None)
    ref = gather_columns(dense, columns)
    ((ref.z * w_z).sum() + (ref.log_norm * w_n).sum()).backward()
    ref_grads = grads(model)
    logp = torch.log_softmax(dense.detach(), dim=-1)
    ref_entropy = -(logp.exp() * logp).sum(-1)

    gathered, entropy = chunked_logits(model, batch, columns, pad_id=0, autocast=None, chunk_bytes=4 * V * chunk_tokens)
    ((gathered.z * w_z).sum() + (gathered.log_norm * w_n).sum()).backward()
    torch.testing.assert_close(gathered.z, ref.z.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gathered.log_norm, ref.log_norm.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, rtol=1e-5, atol=1e-5)
    assert_grads_close(grads(model), ref_grads, rtol=1e-5, atol=1e-5)


CASES = {
    "none": CorrectionConfig(mode=CorrectionMode.none, replay_support=False),
    "sc_mis_head": CorrectionConfig(mode=CorrectionMode.sc_mis, replay_support=False),
    "sc_tis_support": CorrectionConfig(mode=CorrectionMode.sc_tis, replay_support=True),
    "mis_support": CorrectionConfig(mode=CorrectionMode.mis, replay_support=True),
    "ppo_clip_tis": CorrectionConfig(mode=CorrectionMode.tis, objective=Objective.ppo_clip, replay_support=False),
}


def _loss_and_grads(model, batch, cfg, bf16):
    adv = torch.tensor([1.0, -0.5, 0.25, 2.0, -1.0])
    out = batch_loss(model, batch, adv, resolve_correction(cfg), num_tokens=2 * batch.num_tokens, pad_id=0, autocast=torch.bfloat16 if bf16 else None)
    out.loss.backward()
    return out, grads(model)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("bf16", [False, True])
def test_batch_loss_chunked_equals_dense(case, bf16, monkeypatch):
    """Every objective and candidate set: same loss, stats, entropy and gradients on both paths."""
    model, batch = tiny_model(), random_batch()
    chunked, chunked_grads = _loss_and_grads(model, batch, CASES[case], bf16)
    monkeypatch.setattr(lm_head, "head_path", lambda _model: (HeadPath.dense, "reference"))
    dense, dense_grads = _loss_and_grads(model, batch, CASES[case], bf16)
    # fp32: the same sums in another order. BF16: the same BF16 logits, products in another order.
    tol = dict(rtol=2e-2, atol=2e-3) if bf16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked.loss, dense.loss, **tol)
    assert chunked.token_stats.keys() == dense.token_stats.keys() and "entropy" in dense.token_stats
    for key in dense.token_stats:
        torch.testing.assert_close(chunked.token_stats[key], dense.token_stats[key], **tol)
    assert_grads_close(chunked_grads, dense_grads, **tol)


def test_wrong_columns_are_refused():
    model, batch = tiny_model(), random_batch()
    sampled = batch.completion_ids[batch.mask]
    gathered, _ = chunked_logits(model, batch, loss_columns(sampled, None), pad_id=0, autocast=None)
    from rlmix.correction import token_loss

    with pytest.raises(ValueError, match="loss_columns"):
        token_loss(gathered, sampled, batch.sampler_logprobs[batch.mask], torch.ones(len(sampled)),
                   mode="sc", head_ids=batch.head_ids[batch.mask], head_logprobs=batch.head_logprobs[batch.mask])


def test_output_layers_that_cannot_be_chunked_fall_back():
    assert head_path(tiny_model()) == (HeadPath.chunked, "plain output layer")
    capped = tiny_model()
    capped.config.final_logit_softcapping = 30.0
    assert head_path(capped)[0] is HeadPath.dense
    biased = tiny_model()
    biased.lm_head = torch.nn.Linear(32, V, bias=True)
    path, why = head_path(biased)
    assert path is HeadPath.dense and "bias" in why
    batch = random_batch()
    tokens = token_batch(biased, batch, pad_id=0, autocast=None, replay_support=False, columns_for=True)
    assert tokens.logits.shape == (batch.num_tokens, V) and tokens.entropy.shape == (batch.num_tokens,)
    gathered = token_batch(tiny_model(), batch, pad_id=0, autocast=None, replay_support=False, columns_for=True)
    assert gathered.logits.ids.shape == (batch.num_tokens, 1 + K)  # the sampled token and the head


@pytest.mark.parametrize("case", ["none", "sc_mis_head", "ppo_clip_tis"])
def test_logit_gradient_norms_are_autograds_per_token(case, monkeypatch):
    """``logit_grad_norm`` after the backward is the norm of the loss's gradient with respect to each
    token's raw logits: the chunked backward's, the dense hook's and autograd's own retained gradient."""
    from rlmix.trainers import tokens as tokens_module

    model, batch = tiny_model(), random_batch()
    chunked, _ = _loss_and_grads(model, batch, CASES[case], bf16=False)
    kept = []

    def retained(*args, **kwargs):  # the dense logits / T, their gradient kept by autograd itself
        logits = masked_logits(*args, **kwargs)
        logits.retain_grad()
        kept.append(logits)
        return logits

    monkeypatch.setattr(tokens_module, "masked_logits", retained)
    monkeypatch.setattr(lm_head, "head_path", lambda _model: (HeadPath.dense, "reference"))
    dense, _ = _loss_and_grads(model, batch, CASES[case], bf16=False)
    oracle = kept[0].grad.norm(dim=1) / batch.temperature  # through ℓ / T
    assert oracle.shape == (batch.num_tokens,) and bool((oracle > 0).any())
    torch.testing.assert_close(dense.token_stats["logit_grad_norm"], oracle, rtol=1e-6, atol=0.0)
    torch.testing.assert_close(chunked.token_stats["logit_grad_norm"], oracle, rtol=1e-5, atol=1e-9)


def test_no_gradient_no_norms():
    model, batch = tiny_model(), random_batch()
    with torch.no_grad():
        tokens = token_batch(model, batch, pad_id=0, autocast=None, replay_support=False, columns_for=True)
        dense = token_batch(model, batch, pad_id=0, autocast=None, replay_support=False)
    assert tokens.logit_grad_norm is None and dense.logit_grad_norm is None
