"""Print the README's loss table from the registry (tests/test_readme.py keeps them equal).

    python scripts/loss_table.py
"""

from __future__ import annotations

import warnings

import losses

KIND = {"logits": "logits", "embeddings": "embeddings", "scores": "scores", "pairs": "pos/neg scores",
        "model": "model + inputs"}


def table() -> str:
    rows = [
        "| registry name | function | module | input | paper | arXiv | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in losses.list_losses():
        extra = []
        if s.owns_head:
            extra.append("owns head")
        if s.auxiliary:
            extra.append("auxiliary")
        kind = KIND[s.kind] + (f" ({', '.join(extra)})" if extra else "")
        arxiv = f"[{s.arxiv}](https://arxiv.org/abs/{s.arxiv})" if s.arxiv else "—"
        status = "experimental" if s.experimental else "stable"
        rows.append(f"| `{s.name}` | `{s.function.__name__}` | `{s.module.__name__}` | {kind} | {s.paper} | "
                    f"{arxiv} | {status} |")
    return "\n".join(rows)


if __name__ == "__main__":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        print(table())
