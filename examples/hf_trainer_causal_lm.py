"""Train a (tiny, randomly initialised) causal LM with the Hugging Face ``Trainer`` and the
library's loss: cross-entropy + PaLM log-Z penalty, final-logit soft-capping, gradient
accumulation normalised by ``num_items_in_batch``; offline on CPU.

    python examples/hf_trainer_causal_lm.py [output_dir]

For a large vocabulary, train without the logits: ``main(dir, patched=True)`` patches the model with
``patch_causal_lm(model, logz_coef=1e-4)`` (the model computes its loss from its hidden states
through the chunked path, never building the tokens x vocabulary logits; its output has
``logits=None``) and gives the ``Trainer`` no loss function; the model's own soft-capping, if its
config has one, is read from the config.
"""

from __future__ import annotations

import sys
import tempfile


def main(output_dir: str, max_steps: int = 2, patched: bool = False) -> list:
    import torch
    import transformers

    from losses.integrations.transformers import CausalLMLoss, count_shifted_labels, patch_causal_lm

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    model = count_shifted_labels(transformers.GPT2LMHeadModel(config))  # count labels[:, 1:] as targets
    ids = torch.randint(0, 100, (8, 12))
    labels = ids.clone()
    labels[::2, -4:] = -100  # padding: no target
    rows = [{"input_ids": i, "labels": y} for i, y in zip(ids, labels)]
    args = transformers.TrainingArguments(output_dir=output_dir, per_device_train_batch_size=2,
                                          gradient_accumulation_steps=2, max_steps=max_steps, logging_steps=1,
                                          report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True)
    if patched:  # the loss inside the model, from its hidden states: no logits while training
        patch_causal_lm(model, logz_coef=1e-4)
        loss = None
    else:
        loss = CausalLMLoss(logz_coef=1e-4, softcap=30.0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, compute_loss_func=loss)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()))
