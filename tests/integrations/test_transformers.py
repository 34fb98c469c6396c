"""The Hugging Face ``Trainer(compute_loss_func=...)`` callables on tiny randomly initialised models.

Oracles are float64 hand computations from the formulas (shift, soft-cap, log-sum-exp,
cross-entropy + log-Z penalty, sum over non-ignored tokens / their count). Training runs use the
real ``Trainer`` offline on CPU (SGD, no clipping, dropout off), so the gradient-accumulation check
compares parameters after one optimiser step with and without accumulation.
"""

from __future__ import annotations

import math

import pytest
import torch

import losses

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from losses.integrations.transformers import (  # noqa: E402
    CausalLMLoss,
    LinearCrossEntropyCausalLMLoss,
    MaskedLMLoss,
    SequenceClassificationLoss,
    count_shifted_labels,
)

pytestmark = pytest.mark.slow

V, T = 100, 10


def _gpt2(seed=0, hidden=False):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=V, n_positions=32, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, output_hidden_states=hidden)
    return transformers.GPT2LMHeadModel(cfg)


def _bert(cls, seed=0, num_labels=3):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=37, max_position_embeddings=32, num_labels=num_labels,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return cls(cfg)


def _lm_rows(n=4, seed=0, pad_every=True):
    """Token rows with trailing padding of different lengths (labels -100 there)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (n, T), generator=g)
    labels = ids.clone()
    att = torch.ones(n, T, dtype=torch.long)
    for i in range(n):
        pad = (3 * i) % 7 if pad_every else 0  # 0, 3, 6, 2, ... padded positions
        if pad:
            labels[i, T - pad:] = -100
            att[i, T - pad:] = 0
    return ids, att, labels


def _oracle_tokens(logits, targets, *, cap=None, coef=0.0, ignore=-100):
    """Sum of token losses and the number of targets, float64 loops over tokens."""
    total, count = 0.0, 0
    z = logits.double()
    for n in range(z.shape[0]):
        y = int(targets[n])
        if y == ignore:
            continue
        row = z[n] if cap is None else cap * torch.tanh(z[n] / cap)
        lse = float(torch.logsumexp(row, 0))
        total += lse - float(row[y]) + coef * lse * lse
        count += 1
    return total, count


def test_causal_lm_loss_equals_hand_computation_with_logz_and_softcap():
    model = _gpt2().eval()
    ids, att, labels = _lm_rows()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=att)
        got = CausalLMLoss(logz_coef=1e-2, softcap=2.0)(out, labels)
        total, count = _oracle_tokens(out.logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), cap=2.0, coef=1e-2)
        assert abs(float(got) - total / count) < 1e-5
        # num_items_in_batch divides the sum instead
        got_n = CausalLMLoss(logz_coef=1e-2, softcap=2.0)(out, labels, num_items_in_batch=torch.tensor(50))
        assert abs(float(got_n) - total / 50) < 1e-5
        # without options it is Hugging Face's own causal LM loss
        ref_hf = model(input_ids=ids, attention_mask=att, labels=labels).loss
        assert torch.allclose(CausalLMLoss()(out, labels), ref_hf, rtol=1e-5)


@pytest.mark.parametrize("name", ["cross_entropy", "z_loss", "logz_penalty", "entmax15", "sparsemax"])
def test_causal_lm_loss_takes_any_registry_logits_loss_on_hand_shifted_tokens(name):
    """``loss=`` any registered logits loss (built with ``reduction="sum"``): the mean over the
    non-ignored next tokens of that loss, shifted by hand here; cross-entropy also equals
    ``F.cross_entropy`` on the hand-shifted logits."""
    spec = losses.get_loss_spec(name)
    model = _gpt2(seed=7).eval()
    ids, att, labels = _lm_rows(seed=5)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=att).logits
    got = CausalLMLoss(loss=losses.create_loss(name, reduction="sum"))({"logits": logits}, labels)
    z, y = logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1)  # position t predicts token t + 1
    keep = y != -100
    ref = spec.function(z[keep], y[keep], **spec.function_kwargs)
    assert keep.sum() < y.numel() and torch.allclose(got, ref, rtol=1e-5, atol=1e-6)
    if name == "cross_entropy":
        hand = torch.nn.functional.cross_entropy(z, y, ignore_index=-100)
        assert torch.allclose(got, hand, rtol=1e-5) and torch.allclose(CausalLMLoss()({"logits": logits}, labels), hand,
                                                                          rtol=1e-5)


def test_linear_cross_entropy_head_equals_materialised_loss_value_and_gradient():
    model = _gpt2(hidden=True).eval()
    ids, att, labels = _lm_rows(seed=1)
    head = model.get_output_embeddings()
    out = model(input_ids=ids, attention_mask=att)
    chunked = LinearCrossEntropyCausalLMLoss(head, logz_coef=1e-2, softcap=3.0, chunk_size=7)(out, labels)
    (g_chunk,) = torch.autograd.grad(chunked, head.weight, retain_graph=True)
    dense = CausalLMLoss(logz_coef=1e-2, softcap=3.0)(out, labels)
    (g_dense,) = torch.autograd.grad(dense, head.weight)
    assert torch.allclose(chunked, dense, rtol=1e-5)
    assert torch.allclose(g_chunk, g_dense, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        total, count = _oracle_tokens(out.logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), cap=3.0, coef=1e-2)
    assert abs(float(chunked.detach()) - total / count) < 1e-5


def test_masked_lm_and_sequence_classification_equal_hand_computation():
    mlm = _bert(transformers.BertForMaskedLM).eval()
    ids, att, _ = _lm_rows(seed=2, pad_every=False)
    labels = torch.full_like(ids, -100)
    labels[:, ::3] = ids[:, ::3]  # the predicted positions
    with torch.no_grad():
        out = mlm(input_ids=ids, attention_mask=att)
        got = MaskedLMLoss(softcap=4.0)(out, labels)
        total, count = _oracle_tokens(out.logits.reshape(-1, V), labels.reshape(-1), cap=4.0)
        assert abs(float(got) - total / count) < 1e-5
    clf = _bert(transformers.BertForSequenceClassification, num_labels=3).eval()
    y = torch.tensor([0, 2, 1, -100])
    with torch.no_grad():
        out = clf(input_ids=ids, attention_mask=att)
        got = SequenceClassificationLoss(logz_coef=0.1)(out, y)
        total, count = _oracle_tokens(out.logits, y, coef=0.1)
        assert count == 3 and abs(float(got) - total / count) < 1e-6
        # any library logits loss built with reduction="sum"
        ent = SequenceClassificationLoss(loss=losses.Entmax15Loss(reduction="sum"))(out, y)
        ref = losses.entmax15_loss(out.logits[:3], y[:3], reduction="mean")
        assert torch.allclose(ent, ref, rtol=1e-6)


class _Rows(torch.utils.data.Dataset):
    def __init__(self, **columns):
        self.columns = columns

    def __len__(self):
        return len(next(iter(self.columns.values())))

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.columns.items()}


def _train(model, data, tmp_path, loss, *, batch, accumulate, steps=1, lr=0.5):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=batch, gradient_accumulation_steps=accumulate,
        max_steps=steps, learning_rate=lr, optim="sgd", max_grad_norm=0.0, lr_scheduler_type="constant",
        logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=0, dataloader_num_workers=0,
        disable_tqdm=True, weight_decay=0.0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, compute_loss_func=loss)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("make_loss", ["causal", "linear_ce"])
def test_trainer_gradient_accumulation_equals_unaccumulated_step(tmp_path, make_loss):
    ids, att, labels = _lm_rows(n=4, seed=3)
    data = _Rows(input_ids=ids, attention_mask=att, labels=labels)

    def build():
        # GPT2LMHeadModel does not declare a causal LM loss: make the Trainer count shifted targets
        model = count_shifted_labels(_gpt2(seed=5, hidden=make_loss == "linear_ce"))
        if make_loss == "causal":
            return model, CausalLMLoss(logz_coef=1e-3, softcap=5.0)
        return model, LinearCrossEntropyCausalLMLoss(model.get_output_embeddings(), logz_coef=1e-3, softcap=5.0,
                                                     chunk_size=32)

    model0, loss0 = build()
    with torch.no_grad():
        out = model0.eval()(input_ids=ids, attention_mask=att)
        total, count = _oracle_tokens(out.logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), cap=5.0,
                                      coef=1e-3)
    full_model, full_loss = build()
    logged_full = _train(full_model, data, tmp_path / "full", full_loss, batch=4, accumulate=1)
    acc_model, acc_loss = build()
    logged_acc = _train(acc_model, data, tmp_path / "acc", acc_loss, batch=2, accumulate=2)
    # the step's loss is the sum over all its tokens / their number, with or without accumulation
    assert logged_full[0] == pytest.approx(total / count, rel=1e-5)
    assert logged_acc[0] == pytest.approx(total / count, rel=1e-5)
    # and so is the gradient: one SGD step lands on the same parameters
    moved = 0.0
    for (name, a), b, c in zip(full_model.named_parameters(), acc_model.parameters(), model0.parameters()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), name
        moved = max(moved, float((a - c).detach().abs().max()))
    assert moved > 1e-4
    # per-micro-batch means (the accumulation bug the count fixes) would differ: the two halves
    # have different numbers of target tokens
    per_row = (labels[:, 1:] != -100).sum(1)
    assert len(set(per_row.tolist())) > 1


def test_trainer_sequence_classification_runs_and_logs_the_loss(tmp_path):
    model = _bert(transformers.BertForSequenceClassification, seed=1, num_labels=3)
    ids, att, _ = _lm_rows(seed=4, pad_every=False)
    y = torch.tensor([0, 2, 1, 2])
    with torch.no_grad():
        total, count = _oracle_tokens(model.eval()(input_ids=ids, attention_mask=att).logits, y, cap=3.0)
    logged = _train(model, _Rows(input_ids=ids, attention_mask=att, labels=y), tmp_path,
                    SequenceClassificationLoss(softcap=3.0), batch=4, accumulate=1, steps=2, lr=0.1)
    assert len(logged) == 2 and all(math.isfinite(v) for v in logged)
    assert logged[0] == pytest.approx(total / count, rel=1e-5)


def test_errors():
    with pytest.raises(ValueError, match=r"^CausalLMLoss: softcap must be a positive finite float"):
        CausalLMLoss(softcap=0.0)
    with pytest.raises(ValueError, match=r"^CausalLMLoss: loss must be built with reduction='sum'"):
        CausalLMLoss(loss=losses.CrossEntropyLoss())
    with pytest.raises(ValueError, match=r"^SequenceClassificationLoss: label_smoothing is not available together"):
        SequenceClassificationLoss(logz_coef=1e-4, label_smoothing=0.1)
    with pytest.raises(ValueError, match=r"^LinearCrossEntropyCausalLMLoss: the model outputs have no 'hidden_states'"):
        LinearCrossEntropyCausalLMLoss(torch.nn.Linear(4, 5))({"logits": torch.zeros(1, 2, 5)}, torch.zeros(1, 2).long())
    with pytest.raises(ValueError, match=r"^CausalLMLoss: logits must be \(B, T, V\) and labels \(B, T\)"):
        CausalLMLoss()({"logits": torch.zeros(2, 5)}, torch.zeros(2).long())
    for cls in (CausalLMLoss, MaskedLMLoss, SequenceClassificationLoss):
        for bad in (-100.0, None, True):
            with pytest.raises(TypeError, match=rf"^{cls.__name__}: ignore_index must be an int \(got {bad!r}\)"):
                cls(ignore_index=bad)
    with pytest.raises(TypeError, match=r"^LinearCrossEntropyCausalLMLoss: ignore_index must be an int"):
        LinearCrossEntropyCausalLMLoss(torch.nn.Linear(4, 5), ignore_index=-100.0)
