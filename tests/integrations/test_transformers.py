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
    with pytest.raises(TypeError, match=r"^CausalLMLoss: stats must be a bool"):
        CausalLMLoss(stats=1)
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


# --------------------------------------------------------------------------------------
# shift_labels, one set of defaults, label smoothing with the penalty, statistics
# --------------------------------------------------------------------------------------


class _LargestTensor(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the element count of the largest tensor any operator creates in new memory (of
    those with a dimension of size ``dim``, when given), and how many have at least ``big``
    elements."""

    def __init__(self, big=None, dim=None):
        super().__init__()
        self.largest, self.count, self.big, self.dim = 0, 0, big, dim

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for t in torch.utils._pytree.tree_leaves(out):
            if (isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs  # new memory
                    and (self.dim is None or self.dim in t.shape)):
                self.largest = max(self.largest, t.numel())
                self.count += self.big is not None and t.numel() >= self.big
        return out


def test_shift_labels_are_used_as_given_and_the_shift_copies_no_logits():
    from losses.integrations.transformers import shifted_targets

    model = _gpt2(seed=2, hidden=True).eval()
    ids, att, labels = _lm_rows(seed=6)
    out = model(input_ids=ids, attention_mask=att)
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
    assert torch.equal(shifted_targets(labels), shifted)
    plain = CausalLMLoss()(out, labels)
    assert torch.equal(CausalLMLoss()(out, None, shift_labels=shifted), plain)
    assert torch.equal(CausalLMLoss()(out, labels, shift_labels=shifted), plain)
    # Hugging Face's own loss function with the same shift_labels
    from transformers.loss.loss_utils import ForCausalLMLoss

    other = shifted.clone()
    other[1, :4] = -100  # a collator's own alignment: used as given, labels not read
    hf = ForCausalLMLoss(out.logits, labels, V, shift_labels=other)
    assert torch.allclose(CausalLMLoss()(out, labels, shift_labels=other), hf, rtol=1e-6)
    head = model.get_output_embeddings()
    lin = LinearCrossEntropyCausalLMLoss(head)(out, labels, shift_labels=other)
    assert torch.allclose(lin, hf, rtol=1e-5)
    # the logits reach the loss whole: the call creates no more logits-sized tensors than the
    # loss function alone on the (B*T, V) view (the labels move); a shift of the logits would add one
    big = int(0.9 * out.logits.numel())
    z = out.logits.detach().requires_grad_(True)
    with _LargestTensor(big) as ours:
        CausalLMLoss()({"logits": z}, labels).backward()
    with _LargestTensor(big) as alone:
        losses.cross_entropy_loss(z.reshape(-1, V), shifted.reshape(-1), reduction="sum").backward()
    with _LargestTensor(big) as copy:
        out.logits[:, :-1].reshape(-1, V)
    assert copy.count == 1 and 0 < ours.count == alone.count, (ours.count, alone.count)


def test_every_callable_has_the_same_declared_defaults():
    import inspect

    from losses.integrations import transformers as tf

    for cls in (tf.SequenceClassificationLoss, tf.CausalLMLoss, tf.MaskedLMLoss, tf.LinearCrossEntropyCausalLMLoss):
        params = inspect.signature(cls.__init__).parameters
        assert params["logz_coef"].default == tf.DEFAULT_LOGZ_COEF == 0.0, cls
        assert params["label_smoothing"].default == 0.0 and params["ignore_index"].default == -100, cls
    params = inspect.signature(tf.patch_causal_lm).parameters
    assert params["logz_coef"].default == tf.DEFAULT_LOGZ_COEF
    # so the linear-CE callable equals the logits callable, and HF's loss, with no options
    model = _gpt2(seed=3, hidden=True).eval()
    ids, att, labels = _lm_rows(seed=7)
    out = model(input_ids=ids, attention_mask=att)
    ref = model(input_ids=ids, attention_mask=att, labels=labels).loss
    assert torch.allclose(LinearCrossEntropyCausalLMLoss(model.get_output_embeddings())(out, labels), ref, rtol=1e-5)
    assert torch.allclose(CausalLMLoss()(out, labels), ref, rtol=1e-6)


def test_label_smoothing_with_the_penalty_in_every_callable():
    model = _gpt2(seed=4, hidden=True).eval()
    ids, att, labels = _lm_rows(seed=8)
    out = model(input_ids=ids, attention_mask=att)
    z = out.logits[:, :-1].reshape(-1, V).double()
    y = labels[:, 1:].reshape(-1)
    keep = y != -100
    eps, coef = 0.1, 1e-2
    logp = torch.log_softmax(z[keep], 1)
    lse = torch.logsumexp(z[keep], 1)
    hand = ((1 - eps) * -logp.gather(1, y[keep, None])[:, 0] - eps * logp.mean(1) + coef * lse ** 2).mean()
    got = CausalLMLoss(logz_coef=coef, label_smoothing=eps)(out, labels)
    lin = LinearCrossEntropyCausalLMLoss(model.get_output_embeddings(), logz_coef=coef, label_smoothing=eps)(out, labels)
    assert abs(float(got) - float(hand)) < 1e-5 and abs(float(lin) - float(hand)) < 1e-5
    seq = SequenceClassificationLoss(logz_coef=coef, label_smoothing=eps)({"logits": z[keep].float()}, y[keep])
    assert abs(float(seq) - float(hand)) < 1e-5


def test_statistics_come_from_the_same_call():
    model = _gpt2(seed=5, hidden=True).eval()
    ids, att, labels = _lm_rows(seed=9)
    out = model(input_ids=ids, attention_mask=att)
    z = out.logits.reshape(-1, V).double()  # every position; the last one of each row has no target
    y = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:].reshape(-1)
    keep = y != -100
    lse = torch.logsumexp(z, 1)
    acc = float((z.argmax(1) == y)[keep].double().mean())
    for make in (lambda: CausalLMLoss(logz_coef=1e-2, stats=True),
                 lambda: LinearCrossEntropyCausalLMLoss(model.get_output_embeddings(), logz_coef=1e-2, stats=True,
                                                        chunk_size=13)):
        fn = make()
        assert fn.last_stats is None
        loss = fn(out, labels)
        st = fn.last_stats
        assert isinstance(st, losses.LossStats)
        assert int(st.count) == int(keep.sum()) and abs(float(st.accuracy) - acc) < 1e-9
        flat_lse = st.lse.reshape(-1)
        assert torch.allclose(flat_lse[keep].double(), lse[keep], atol=1e-5) and bool((flat_lse[~keep] == 0).all())
        assert abs(float(st.penalty) - 1e-2 * float((lse[keep] ** 2).sum())) < 1e-3
        assert st.loss is not None and loss.requires_grad


# --------------------------------------------------------------------------------------
# patch_causal_lm: tiny models built from configs, the Trainer, no full logits
# --------------------------------------------------------------------------------------

PV = 97


def _causal(kind, seed=0):
    torch.manual_seed(seed)
    common = dict(vocab_size=PV, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64)
    if kind == "gpt2":  # tied head
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=1, n_embd=32, n_head=2, vocab_size=PV, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    cfg = dict(bos_token_id=0, eos_token_id=0, pad_token_id=None)
    make = {
        "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, **cfg)),
        "gemma2": lambda: transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
            **common, **cfg, head_dim=8, final_logit_softcapping=3.0)),
        "cohere": lambda: transformers.CohereForCausalLM(transformers.CohereConfig(**common, **cfg, logit_scale=0.37)),
        "granite": lambda: transformers.GraniteForCausalLM(transformers.GraniteConfig(
            **common, **cfg, logits_scaling=2.5)),
        "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common, **cfg)),
        "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**common, **cfg)),
    }
    return make[kind]()


PATCH_KINDS = ["llama", "gpt2", "gemma2", "cohere", "granite", "qwen2", "mistral"]


def _token_batch(seed=0, n=4, t=12):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, PV, (n, t), generator=g)
    labels = ids.clone()
    att = torch.ones_like(ids)
    for i in range(n):
        pad = (3 * i) % 5
        if pad:
            labels[i, t - pad:] = -100
            att[i, t - pad:] = 0
    return ids, att, labels


@pytest.mark.parametrize("kind", PATCH_KINDS)
def test_patched_model_equals_its_built_in_loss_and_gradients(kind):
    from losses.integrations.transformers import logit_transform, patch_causal_lm

    model = _causal(kind).eval()
    ids, att, labels = _token_batch(seed=1)
    ref = model(input_ids=ids, attention_mask=att, labels=labels)
    g_ref = torch.autograd.grad(ref.loss, list(model.parameters()), allow_unused=True)
    transform = logit_transform(model)
    expected = {"gemma2": (1.0, 3.0), "cohere": (0.37, None), "granite": (1 / 2.5, None)}.get(kind, (1.0, None))
    assert transform.scale == pytest.approx(expected[0]) and transform.softcap == expected[1]
    assert patch_causal_lm(model) is model
    for _ in range(2):  # the first call checks the transform, the second does not
        out = model(input_ids=ids, attention_mask=att, labels=labels)
        assert out.logits is None
        assert torch.allclose(out.loss, ref.loss, rtol=1e-6, atol=1e-6), (kind, float(out.loss), float(ref.loss))
        grads = torch.autograd.grad(out.loss, list(model.parameters()), allow_unused=True)
        for (name, _p), a, b in zip(model.named_parameters(), grads, g_ref):
            if b is None:
                assert a is None or bool((a == 0).all()), name
            else:
                assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), (kind, name)
    # evaluation without labels and generation are the model's own
    plain = model(input_ids=ids, attention_mask=att)
    assert plain.logits.shape == (4, 12, PV) and torch.allclose(plain.logits, ref.logits)
    gen = model.generate(ids[:1, :5], max_new_tokens=3, do_sample=False)
    assert gen.shape == (1, 8)


def test_patch_reads_shift_labels_and_num_items_and_refuses_unknown_transforms():
    from losses.integrations.transformers import patch_causal_lm

    model = patch_causal_lm(_causal("llama", seed=2).eval())
    ids, att, labels = _token_batch(seed=2)
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
    a = model(input_ids=ids, attention_mask=att, labels=labels).loss
    b = model(input_ids=ids, attention_mask=att, shift_labels=shifted).loss
    c = model(input_ids=ids, attention_mask=att, labels=labels, num_items_in_batch=torch.tensor(100)).loss
    n = int((shifted != -100).sum())
    assert torch.equal(a, b) and torch.allclose(c, a * n / 100, rtol=1e-6)
    # a transform the config does not describe: a Llama told it soft-caps (it does not)
    odd = _causal("llama", seed=3)
    odd.config.final_logit_softcapping = 2.0
    patch_causal_lm(odd)
    with pytest.raises(ValueError, match=r"^patch_causal_lm: LlamaForCausalLM transforms its logits in a way not read"):
        odd(input_ids=ids, labels=labels)
    with pytest.raises(ValueError, match=r"^patch_causal_lm: the model is patched already"):
        patch_causal_lm(model)
    with pytest.raises(ValueError, match=r"^patch_causal_lm: loss must be built with reduction='sum'"):
        patch_causal_lm(_causal("llama"), loss=losses.Entmax15Loss())


def test_patch_takes_a_registry_logits_loss():
    from losses.integrations.transformers import patch_causal_lm

    model = _causal("gemma2", seed=4).eval()
    ids, att, labels = _token_batch(seed=3)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=att).logits  # soft-capped by the model
    z, y = logits[:, :-1].reshape(-1, PV), labels[:, 1:].reshape(-1)
    keep = y != -100
    ref = losses.entmax15_loss(z[keep], y[keep])
    patch_causal_lm(model, loss=losses.Entmax15Loss(reduction="sum"))
    got = model(input_ids=ids, attention_mask=att, labels=labels).loss
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["llama", "gemma2", "cohere", "granite", "gpt2"])
def test_trainer_with_a_patched_model_equals_the_unpatched_run_without_the_logits(tmp_path, kind):
    """A real ``Trainer.train()`` (two optimiser steps, gradient accumulation 2): the patched
    model's logged losses and final parameters equal the unpatched model's, and no operator of the
    patched run creates a tensor as large as the (tokens x vocabulary) logits."""
    from losses.integrations.transformers import patch_causal_lm

    ids, att, labels = _token_batch(seed=5, n=16, t=20)
    data = _Rows(input_ids=ids, attention_mask=att, labels=labels)
    runs = {}
    for patched in (False, True):
        model = _causal(kind, seed=6)
        if patched:  # class chunks of 32 of the 97 (at this toy size the default chunk is the vocabulary)
            patch_causal_lm(model, chunk_size=32)
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / str(patched)), per_device_train_batch_size=4, gradient_accumulation_steps=2,
            max_steps=2, learning_rate=0.5, optim="sgd", max_grad_norm=0.0, lr_scheduler_type="constant",
            logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=0, dataloader_num_workers=0,
            disable_tqdm=True, weight_decay=0.0)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
        with _LargestTensor(dim=PV) as seen:  # tensors with a vocabulary-sized dimension
            trainer.train()
        runs[patched] = ([h["loss"] for h in trainer.state.log_history if "loss" in h], model, seen.largest)
    (loss0, m0, big0), (loss1, m1, big1) = runs[False], runs[True]
    assert len(loss0) == 2 and loss1 == pytest.approx(loss0, rel=1e-5)
    for (name, a), b in zip(m0.named_parameters(), m1.parameters()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), name
    logits_size = 4 * 20 * PV  # one micro-batch's logits
    assert big0 >= logits_size > big1, (big0, big1)


def test_recurrent_gemma_soft_cap_is_read_and_checked():
    """RecurrentGemma names its cap ``logits_soft_cap``: read from the config, checked on the first
    call against the model's own logits, and the patched loss equals the built-in one."""
    from losses.integrations.transformers import logit_transform, patch_causal_lm

    torch.manual_seed(7)
    cfg = transformers.RecurrentGemmaConfig(vocab_size=PV, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=1, lru_width=32,
                                            attention_window_size=16, logits_soft_cap=5.0,
                                            block_types=["recurrent", "attention"])
    model = transformers.RecurrentGemmaForCausalLM(cfg).eval()
    assert logit_transform(model).softcap == 5.0
    ids, att, labels = _token_batch(seed=8)
    ref = model(input_ids=ids, labels=labels).loss
    patch_causal_lm(model)
    got = model(input_ids=ids, labels=labels)
    assert got.logits is None and torch.allclose(got.loss, ref, rtol=1e-5, atol=1e-6)
