"""Thin adapters that plug the library's losses into other trainers.

* :mod:`losses.integrations.sentence_transformers` -- in-batch ranking losses (InfoNCE, decoupled
  softmax with several positives, soft top-k) as sentence-transformers losses, for
  ``SentenceTransformerTrainer`` / ``model.fit``.
* :mod:`losses.integrations.transformers` -- ``compute_loss_func`` callables for the Hugging Face
  ``Trainer``: sequence classification, causal and masked language modelling, the chunked
  many-class head with the log-Z penalty, final-logit soft-capping, gradient accumulation by
  ``num_items_in_batch``.

Importing this package (or its sub-modules) imports neither library: the adapters only call the
model they are given. Building one checks that the library is installed and otherwise raises a
``ModuleNotFoundError`` naming the ``integrations`` extra (``pip install softmax-losses[integrations]``).
"""

__all__ = ["sentence_transformers", "transformers"]
