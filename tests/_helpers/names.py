"""The one list of expected public names of ``losses``, written out by hand from the spec
(docs/conventions.md, Registry; the family pages under docs/losses/): every test that needs the
names of the registered losses or of the public API takes them from here, and
``tests/test_names.py`` checks that the registry, ``losses.__all__`` and this list agree.

Adding a registered loss adds one row to :data:`LOSSES` (and its file's own test file); a
public function or class that is not a registry entry's goes into :data:`HELPERS`.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Tuple

# ----------------------------------------------------------------------------------------------
# the registry table of docs/conventions.md:
# name -> (function, module, inputs, owns_head, auxiliary, unit, example_kwargs)
# ----------------------------------------------------------------------------------------------
HEAD_KWARGS = {"embedding_dim": 8, "num_classes": 5}
LOGITS, EMBEDDINGS, SCORES, PAIRS, MODEL = ("input", "target"), ("embeddings", "target"), ("scores", "target"), \
    ("pos_scores", "neg_scores"), ("model", "inputs", "target")
#: The input kind names (``losses.InputKind``) of those argument tuples, as registry entries report them.
KIND_NAMES = {LOGITS: "logits", EMBEDDINGS: "embeddings", SCORES: "scores", PAIRS: "pairs", MODEL: "model"}

LOSSES: Dict[str, tuple] = {
    "z_loss": ("z_loss", "ZLoss", LOGITS, False, False, "position", {}),
    "logz_penalty": ("cross_entropy_with_logz_penalty", "CrossEntropyWithLogZPenalty", LOGITS, False, False,
                     "position", {}),
    "sparsemax": ("sparsemax_loss", "SparsemaxLoss", LOGITS, False, False, "position", {}),
    "entmax15": ("entmax15_loss", "Entmax15Loss", LOGITS, False, False, "position", {}),
    "entmax_bisect": ("entmax_bisect_loss", "EntmaxBisectLoss", LOGITS, False, False, "position", {}),
    "comp_sum": ("comp_sum_loss", "CompSumLoss", LOGITS, False, False, "position", {"tau": 0.5}),
    "cross_entropy": ("cross_entropy_loss", "CrossEntropyLoss", LOGITS, False, False, "position", {}),
    "gol": ("gumbel_bce_loss", "GumbelBCELoss", LOGITS, False, False, "element", {}),
    "bce_with_logits": ("bce_with_logits_loss", "BCEWithLogitsLoss", LOGITS, False, False, "element", {}),
    # unit "class; (image, class)": the registry's unit is "class", the (image, class) shape is the
    # "image"/"class" aggregation's "none" shape (the unit-weight rule, docs/conventions.md)
    "dice_semimetric": ("dice_semimetric_loss", "DiceSemimetricLoss", LOGITS, False, False, "class", {}),
    "jaccard_metric": ("jaccard_metric_loss", "JaccardMetricLoss", LOGITS, False, False, "class", {}),
    "soft_dice": ("soft_dice_loss", "SoftDiceLoss", LOGITS, False, False, "class", {}),
    "adversarial_comp_sum": ("adversarial_comp_sum_loss", "AdversarialCompSumLoss", MODEL, False, False, "row",
                             {"nu": 1.0}),
    "wcdas": ("wcdas_loss", "WCDASLoss", EMBEDDINGS, True, False, "row", HEAD_KWARGS),
    "nbc_softmax": ("nbc_softmax_loss", "NBCSoftmaxLoss", EMBEDDINGS, True, False, "batch", HEAD_KWARGS),
    "margin_softmax": ("margin_softmax_loss", "MarginSoftmaxLoss", EMBEDDINGS, True, False, "row", HEAD_KWARGS),
    # "the same, margin=(1.0, 0.0, 0.0) preset": the preset is part of what builds it
    "cosine_softmax": ("margin_softmax_loss", "MarginSoftmaxLoss", EMBEDDINGS, True, False, "row",
                       {**HEAD_KWARGS, "margin": (1.0, 0.0, 0.0)}),
    "partial_fc": ("partial_fc_loss", "PartialFCLoss", EMBEDDINGS, True, False, "row",
                   {**HEAD_KWARGS, "sample_rate": 0.5, "seed": 0}),
    "linear_cross_entropy": ("linear_cross_entropy", "LinearCrossEntropyLoss", EMBEDDINGS, True, False, "row",
                             HEAD_KWARGS),
    "opl": ("opl_loss", "OrthogonalProjectionLoss", EMBEDDINGS, False, True, "batch", {}),
    "psl": ("psl_loss", "PSLLoss", PAIRS, False, False, "row", {}),
    "sampled_softmax": ("sampled_softmax_loss", "SampledSoftmaxLoss", PAIRS, False, False, "row", {}),
    "bpr": ("bpr_loss", "BPRLoss", PAIRS, False, False, "pair", {}),
    "decoupled_softmax": ("decoupled_softmax_loss", "DecoupledSoftmaxLoss", SCORES, False, False, "row", {}),
    "infonce": ("infonce_loss", "InfoNCELoss", SCORES, False, False, "row", {}),
    "soft_topk": ("soft_topk_loss", "SoftTopKLoss", SCORES, False, False, "row", {"k": 2}),
}
EXPERIMENTAL: FrozenSet[str] = frozenset({"adversarial_comp_sum"})  # docs/losses/adversarial_comp_sum.md is the only section marked experimental

#: The registry names (the keys of :data:`LOSSES`).
LOSS_NAMES: FrozenSet[str] = frozenset(LOSSES)

# ----------------------------------------------------------------------------------------------
# the rest of the public API
# ----------------------------------------------------------------------------------------------

#: The registry and validation API (docs/conventions.md Registry, Errors, Randomness) and the
#: two sub-modules.
API: Tuple[str, ...] = (
    "ExperimentalWarning", "set_validation", "is_validation_enabled", "validation", "LossSpec", "INPUT_KINDS",
    "InputKind", "register", "unregister", "spec_for_module", "create_loss", "get_loss_spec", "list_losses",
    "functional", "testing",
)

#: Public functions and classes that are not a registry entry's function or module: activations,
#: building blocks the family pages document, and aliases.
HELPERS: Tuple[str, ...] = (
    "logz_penalty",  # docs/losses/z_loss.md (the penalty alone)
    "sparsemax", "entmax15", "entmax_bisect",  # docs/losses/sparsemax.md (the activations)
    "gumbel_activation", "gumbel_prior_bias",  # docs/losses/gol.md
    "in_batch_scores",  # docs/losses/decoupled_softmax.md
    "nbc_loss",  # docs/losses/nbc_softmax.md (the NBC term alone)
    "wcdas_logits",  # docs/losses/wcdas.md
    "margin_logits",  # docs/losses/partial_fc.md (the margin head's logits)
    "GOLLoss",  # docs/losses/gol.md: alias of GumbelBCELoss
)

#: The functional forms of the registered losses.
LOSS_FUNCTIONS: FrozenSet[str] = frozenset(row[0] for row in LOSSES.values())
#: The modules of the registered losses.
LOSS_MODULES: FrozenSet[str] = frozenset(row[1] for row in LOSSES.values())

#: Every name ``losses.__all__`` must hold, and nothing else.
PUBLIC_NAMES: FrozenSet[str] = frozenset(API) | frozenset(HELPERS) | LOSS_FUNCTIONS | LOSS_MODULES
