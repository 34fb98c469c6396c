"""The gloo worker of the gathered sentence-transformers adapter test, in its own light module:
spawned processes import only torch and ``losses`` (not sentence-transformers), which keeps the
start-up of each worker short."""

from __future__ import annotations

import torch

from losses.integrations.sentence_transformers import InfoNCERankingLoss


def gather_worker(rank, world_size, payload):
    torch.manual_seed(0)
    emb = payload["emb"]  # (W * B, 3, D): anchor, positive, negative per row, all ranks

    class Fixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(emb.clone())

        def forward(self, features):
            return {"sentence_embedding": self.table[features["rows"], features["col"]]}

    model = Fixed()
    b = emb.shape[0] // world_size
    rows = torch.arange(rank * b, (rank + 1) * b)
    tokens = payload["tokens"]  # (W * B, 3, T) token ids, for false_negatives="duplicates"
    feats = [{"rows": rows, "col": torch.full_like(rows, c), "input_ids": tokens[rows, c],
              "attention_mask": torch.ones_like(tokens[rows, c])} for c in range(3)]
    labels = payload["labels"][rows]
    out = {}
    for name, kw in (("plain", {}), ("labels", {"false_negatives": "labels"}),
                     ("duplicates", {"false_negatives": "duplicates"})):
        model.zero_grad()
        loss = InfoNCERankingLoss(model, gather_distributed=True, **kw)(feats, labels)
        loss.backward()
        out[name] = (loss.detach(), model.table.grad.clone())
    return out
