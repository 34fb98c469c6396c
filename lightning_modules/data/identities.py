"""Synthetic identities: many classes, a few samples each, and held-out identities for open-set search.

The regime of Partial FC's paper (face recognition): the number of classes ``C`` dwarfs the batch,
so a batch's positives cover a small part of ``k = sample_rate * C`` and most sampled centres are
uniform negatives. Faces are replaced by feature vectors, the backbone by a small MLP
(:class:`~lightning_modules.models.IdentityEmbedder`).

Generator (:func:`make_identities`, everything drawn from one ``torch.Generator(seed)``):

* identity centres ``mu_c`` uniform on the unit sphere of ``dim`` dimensions (normalised Gaussians);
* a sample of identity ``c``: ``mu_c + noise * z / sqrt(dim)`` with ``z ~ N(0, I_dim)`` (so the
  within-class deviation has norm about ``noise``), renormalised to the sphere when
  ``normalize``, then followed by ``nuisance_dim`` coordinates of pure noise (std
  ``nuisance_std``, the same distribution for every identity) that a model must learn to ignore;
* with ``mixing="square"`` the nuisance also leaks into the signal coordinates through a fixed
  random quadratic map: ``signal += gain * (z * z - 1) / sqrt(2 * dim)`` with
  ``z = (nuisance @ A) / nuisance_std`` and ``A`` a ``(nuisance_dim, dim)`` matrix of unit-norm
  Gaussian columns drawn from ``mixing_seed`` alone (the same map for every data seed), so each
  ``z_j ~ N(0, 1)`` and the leak has norm about ``gain``. The leak is an even function of the
  nuisance: it has no linear part, so no fixed linear projection removes it (dropping the nuisance
  coordinates keeps the leak; regressing the signal on the nuisance linearly gains nothing), while
  a network that sees the nuisance coordinates can learn the squares and subtract them.
  :meth:`IdentitiesDataModule.floor_metrics` measures that fixed projection (the ``dim`` signal
  coordinates) and the raw input on the same split: the levels a trained model must beat;
* identities ``0 .. num_classes-1`` are the closed set (training classes), each with
  ``train_per_class + val_per_class + test_per_class`` samples; identities ``num_classes ..
  num_classes + 2 * open_classes - 1`` are held out (never trained on): the first ``open_classes``
  form the validation open set, the next ``open_classes`` the test open set, each identity with
  ``gallery_per_class`` gallery samples and ``probes_per_class`` probes.

Open-set evaluation (:func:`identification_metrics`): every probe is searched 1:N against the
gallery by cosine similarity (``faiss.IndexFlatIP`` over L2-normalised vectors when faiss is
installed, else a torch matmul; the two agree); rank-1 identification rate = the fraction of
probes whose most similar gallery sample has the probe's identity. TAR@FAR: all probe-gallery
pairs, genuine (same identity) and impostor; the threshold is the ``1 - far`` quantile of the
impostor scores and TAR the fraction of genuine scores above it.

Loaders: ``train`` yields ``(x, y)``; ``val`` and ``test`` are two loaders each: ``0`` the
closed-set split ``(x, y)``, ``1`` the open set ``(x, identity, role, index)`` with role 0 =
gallery, 1 = probe, ordered identity by identity (gallery first) so that a truncated pass
(``limit_val_batches``) still holds whole identities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, Sampler, TensorDataset

from ..base import BenchmarkDataModule, check_test_seed
from .image_variants import SeededEpochSampler

__all__ = ["IdentitySplits", "make_identities", "identification_metrics", "IdentitiesDataModule"]


@dataclass
class IdentitySplits:
    """Tensors of one generated data set (see the module docstring)."""

    train_x: Tensor
    train_y: Tensor
    val_x: Tensor
    val_y: Tensor
    test_x: Tensor
    test_y: Tensor
    # open sets: identities renumbered from 0 within each set; role 0 gallery, 1 probe
    val_open_x: Tensor
    val_open_id: Tensor
    val_open_role: Tensor
    test_open_x: Tensor
    test_open_id: Tensor
    test_open_role: Tensor


def _check_int(name: str, value: object, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"make_identities: {name} must be an integer >= {low} (got {value!r})")
    return value


def make_identities(
    num_classes: int,
    dim: int = 32,
    *,
    train_per_class: int = 4,
    val_per_class: int = 1,
    test_per_class: int = 1,
    open_classes: int = 500,
    gallery_per_class: int = 1,
    probes_per_class: int = 2,
    noise: float = 0.6,
    normalize: bool = True,
    nuisance_dim: int = 0,
    nuisance_std: float = 1.0,
    seed: int = 0,
    mixing: str = "none",
    mixing_gain: float = 1.0,
    mixing_seed: int = 0,
    test_seed: Optional[int] = None,
) -> IdentitySplits:
    """Generate the closed-set splits and the two open sets (module docstring). Deterministic per
    ``seed``; the draws happen in a fixed order (centres, then samples identity-major).

    ``test_seed`` (an integer): the identity centres, the closed-set test samples and the test open
    set are drawn from ``test_seed`` alone -- one test split for every ``seed`` -- and ``seed``
    draws only the training and validation samples and the validation open set. ``None``: every
    draw comes from ``seed`` (a new test split per seed)."""
    _check_int("num_classes", num_classes, 2)
    _check_int("dim", dim, 2)
    _check_int("train_per_class", train_per_class, 1)
    _check_int("val_per_class", val_per_class, 0)
    _check_int("test_per_class", test_per_class, 0)
    _check_int("open_classes", open_classes, 0)
    _check_int("gallery_per_class", gallery_per_class, 1)
    _check_int("probes_per_class", probes_per_class, 1)
    _check_int("nuisance_dim", nuisance_dim, 0)
    if not (isinstance(noise, (int, float)) and noise >= 0):
        raise ValueError(f"make_identities: noise must be >= 0 (got {noise!r})")
    if mixing not in MIXINGS:
        raise ValueError(f"make_identities: mixing must be one of {MIXINGS} (got {mixing!r})")
    if not (isinstance(mixing_gain, (int, float)) and not isinstance(mixing_gain, bool) and mixing_gain > 0):
        raise ValueError(f"make_identities: mixing_gain must be a number > 0 (got {mixing_gain!r})")
    if mixing == "square" and (nuisance_dim == 0 or not nuisance_std > 0):
        raise ValueError("make_identities: mixing='square' leaks the nuisance into the signal: it needs "
                         f"nuisance_dim >= 1 and nuisance_std > 0 (got {nuisance_dim!r}, {nuisance_std!r})")
    leak = mixing_matrix(nuisance_dim, dim, mixing_seed) if mixing == "square" else None
    if test_seed is not None and (isinstance(test_seed, bool) or not isinstance(test_seed, int)):
        raise ValueError(f"make_identities: test_seed must be an integer or None (got {test_seed!r})")
    g = torch.Generator().manual_seed(int(seed))
    g_test = g if test_seed is None else torch.Generator().manual_seed(int(test_seed))
    total = num_classes + 2 * open_classes
    centres = torch.nn.functional.normalize(torch.randn(total, dim, generator=g_test), dim=1)

    def samples(ids: Tensor, n: int, g: torch.Generator = g) -> Tensor:  # (len(ids) * n, D), identity-major
        mu = centres[ids].repeat_interleave(n, dim=0)
        x = mu + float(noise) * torch.randn(mu.shape, generator=g) / math.sqrt(dim)
        if normalize:
            x = torch.nn.functional.normalize(x, dim=1)
        if nuisance_dim:
            nu = float(nuisance_std) * torch.randn(x.shape[0], nuisance_dim, generator=g)
            if leak is not None:
                z = (nu @ leak) / float(nuisance_std)
                x = x + float(mixing_gain) * (z * z - 1.0) / math.sqrt(2.0 * dim)
            x = torch.cat([x, nu], dim=1)
        return x

    closed = torch.arange(num_classes)
    per = train_per_class + val_per_class + test_per_class
    if test_seed is None:
        x = samples(closed, per).view(num_classes, per, -1)
    else:  # train + val from seed, test from test_seed
        fit = train_per_class + val_per_class
        x = torch.cat([samples(closed, fit).view(num_classes, fit, -1),
                       samples(closed, test_per_class, g_test).view(num_classes, test_per_class, -1)], dim=1)
    y = closed[:, None].expand(num_classes, per)
    cuts = (train_per_class, train_per_class + val_per_class)

    def part(a: int, b: int):
        return x[:, a:b].reshape(-1, x.shape[-1]).contiguous(), y[:, a:b].reshape(-1).contiguous()

    train_x, train_y = part(0, cuts[0])
    val_x, val_y = part(cuts[0], cuts[1])
    test_x, test_y = part(cuts[1], per)

    def open_set(first: int, g: torch.Generator):
        ids = torch.arange(first, first + open_classes)
        n = gallery_per_class + probes_per_class
        ox = samples(ids, n, g)
        oid = torch.arange(open_classes).repeat_interleave(n)
        role = torch.tensor([0] * gallery_per_class + [1] * probes_per_class).repeat(open_classes)
        return ox, oid, role

    vo = open_set(num_classes, g)
    to = open_set(num_classes + open_classes, g_test)
    return IdentitySplits(train_x, train_y, val_x, val_y, test_x, test_y, *vo, *to)


MIXINGS = ("none", "square")


def mixing_matrix(rows: int, cols: int, seed: int) -> Tensor:
    """The leak's ``(rows, cols)`` matrix: Gaussian columns normalised to unit norm, drawn from
    ``torch.Generator(seed)`` alone."""
    gen = torch.Generator().manual_seed(int(seed))
    return torch.nn.functional.normalize(torch.randn(rows, cols, generator=gen), dim=0)


def _rank1(gallery: Tensor, gallery_id: Tensor, probes: Tensor, probe_id: Tensor, use_faiss: Optional[bool]) -> Tensor:
    """Per-probe hit (bool) of the nearest gallery sample by cosine."""
    faiss = None
    if use_faiss is not False:
        try:
            import faiss  # noqa: F811
        except ImportError:
            if use_faiss:
                raise
            faiss = None
    if faiss is not None:
        import numpy as np

        g = torch.nn.functional.normalize(gallery.detach().float().cpu(), dim=1).numpy()
        q = torch.nn.functional.normalize(probes.detach().float().cpu(), dim=1).numpy()
        index = faiss.IndexFlatIP(g.shape[1])
        index.add(np.ascontiguousarray(g))
        _, nn_idx = index.search(np.ascontiguousarray(q), 1)
        nearest = torch.from_numpy(nn_idx[:, 0]).long()
    else:
        sims = torch.nn.functional.normalize(probes.float(), dim=1) @ torch.nn.functional.normalize(
            gallery.float(), dim=1).T
        nearest = sims.argmax(dim=1).cpu()
    return gallery_id.cpu()[nearest] == probe_id.cpu()


def identification_metrics(gallery: Tensor, gallery_id: Tensor, probes: Tensor, probe_id: Tensor, *,
                           far: float = 1e-3, use_faiss: Optional[bool] = None) -> Dict[str, float]:
    """1:N search of ``probes`` against ``gallery`` by cosine (module docstring).

    Probes whose identity has no gallery sample are dropped (a truncated pass). Returns
    ``rank1`` (identification rate), ``tar_at_far`` (TAR at FAR ``far`` over all probe-gallery
    pairs), ``probes`` and ``gallery`` (the counts used). ``use_faiss``: ``None`` = faiss when
    installed, ``True`` = require it, ``False`` = torch only.
    """
    keep = torch.isin(probe_id.cpu(), gallery_id.cpu())
    probes, probe_id = probes[keep.to(probes.device)], probe_id.cpu()[keep]
    n = int(probe_id.numel())
    if n == 0 or gallery.shape[0] < 2:
        return {"rank1": float("nan"), "tar_at_far": float("nan"), "probes": float(n),
                "gallery": float(gallery.shape[0])}
    hit = _rank1(gallery, gallery_id, probes, probe_id, use_faiss)
    sims = (torch.nn.functional.normalize(probes.float(), dim=1)
            @ torch.nn.functional.normalize(gallery.float(), dim=1).T).cpu()
    genuine = probe_id[:, None] == gallery_id.cpu()[None, :]
    imp = sims[~genuine]
    if imp.numel():
        # the smallest threshold with at most `far` of the impostor scores strictly above it
        allowed = int(math.floor(far * imp.numel()))
        top = torch.topk(imp, min(allowed + 1, imp.numel())).values
        thr = float(top[-1])
        tar = float((sims[genuine] > thr).float().mean())
    else:
        tar = float("nan")
    return {"rank1": float(hit.float().mean()), "tar_at_far": tar, "probes": float(n),
            "gallery": float(gallery.shape[0])}


class IdentitiesDataModule(BenchmarkDataModule):
    """Synthetic identities (module docstring) as a DataModule.

    Sizes linked by the CLI: ``num_classes`` (the closed-set identities, the loss's head size) and
    ``input_dim = dim + nuisance_dim`` (the MLP's input width). The data are generated in
    ``setup`` (``__init__`` is cheap). ``seed`` fixes the data and the training order (a
    permutation drawn from ``(seed, epoch)``); ``eval_batch_size`` bounds the ``(B, C)`` logits of
    the closed-set evaluation.
    """

    def __init__(
        self,
        num_classes: int = 10000,
        dim: int = 32,
        train_per_class: int = 4,
        val_per_class: int = 1,
        test_per_class: int = 1,
        open_classes: int = 500,
        gallery_per_class: int = 1,
        probes_per_class: int = 2,
        noise: float = 0.6,
        normalize: bool = True,
        nuisance_dim: int = 0,
        nuisance_std: float = 1.0,
        mixing: str = "none",
        mixing_gain: float = 1.0,
        mixing_seed: int = 0,
        test_seed: Optional[int] = None,
        batch_size: int = 256,
        eval_batch_size: int = 512,
        shuffle: bool = True,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        _check_int("num_classes", num_classes, 2)
        _check_int("dim", dim, 2)
        _check_int("nuisance_dim", nuisance_dim, 0)
        self.num_classes = int(num_classes)
        self.input_dim = int(dim) + int(nuisance_dim)
        self.batch_size = int(batch_size)
        self.eval_batch_size = int(eval_batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.num_workers = int(num_workers)
        if mixing not in MIXINGS:
            raise ValueError(f"IdentitiesDataModule: mixing must be one of {MIXINGS} (got {mixing!r})")
        self.test_seed = check_test_seed("IdentitiesDataModule", test_seed,
                                         "the identity centres and the test samples")
        self.splits: Optional[IdentitySplits] = None
        self._floors: Dict[str, Dict[str, float]] = {}
        self._train_sampler: Optional[SeededEpochSampler] = None
        self.meta: Dict[str, object] = {}

    def setup(self, stage: Optional[str] = None) -> None:
        if self.splits is not None:
            return
        h = self.hparams
        self.splits = make_identities(
            h.num_classes, h.dim, train_per_class=h.train_per_class, val_per_class=h.val_per_class,
            test_per_class=h.test_per_class, open_classes=h.open_classes, gallery_per_class=h.gallery_per_class,
            probes_per_class=h.probes_per_class, noise=h.noise, normalize=h.normalize, nuisance_dim=h.nuisance_dim,
            nuisance_std=h.nuisance_std, seed=h.seed, mixing=h.mixing, mixing_gain=h.mixing_gain,
            mixing_seed=h.mixing_seed, test_seed=self.test_seed)
        s = self.splits
        self.meta = {"num_classes": self.num_classes, "input_dim": self.input_dim, "train": len(s.train_y),
                     "val": len(s.val_y), "test": len(s.test_y), "open_classes": int(h.open_classes),
                     "val_open": len(s.val_open_id), "test_open": len(s.test_open_id), "noise": float(h.noise),
                     "nuisance_dim": int(h.nuisance_dim), "generator_seed": self.seed, "mixing": h.mixing,
                     "test_seed": self.test_seed}
        if h.mixing != "none":
            self.meta.update(mixing_gain=float(h.mixing_gain), mixing_seed=int(h.mixing_seed))

    def fixed_projection(self, x: Tensor) -> Tensor:
        """The fixed projection the generator itself suggests, applied to inputs ``x``: keep the
        ``dim`` signal coordinates, drop the nuisance. Without mixing it nearly solves the task
        with no training; with ``mixing="square"`` the leak stays in it."""
        return x[:, : int(self.hparams.dim)]

    def floor_metrics(self, stage: str) -> Dict[str, float]:
        """No-training levels on the ``stage`` ("val" or "test") split, computed once per DataModule:
        the competence floors a trained model must beat (the claims file compares each run with
        them). ``open_rank1_raw``: the open-set 1:N search on the raw inputs; ``open_rank1_fixed``:
        on :meth:`fixed_projection`; ``top1_fixed``: closed-set nearest class mean by cosine in the
        fixed projection (class means over the training samples: a fixed projection, no training)."""
        if stage not in ("val", "test"):
            raise ValueError(f"IdentitiesDataModule.floor_metrics: stage must be 'val' or 'test' (got {stage!r})")
        if stage in self._floors:
            return dict(self._floors[stage])
        self.setup()
        s = self.splits
        ox, oid, role = ((s.val_open_x, s.val_open_id, s.val_open_role) if stage == "val"
                         else (s.test_open_x, s.test_open_id, s.test_open_role))
        x, y = (s.val_x, s.val_y) if stage == "val" else (s.test_x, s.test_y)
        g, p = role == 0, role == 1
        out: Dict[str, float] = {}
        if len(oid):
            out["open_rank1_raw"] = identification_metrics(ox[g], oid[g], ox[p], oid[p])["rank1"]
            fx = self.fixed_projection(ox)
            out["open_rank1_fixed"] = identification_metrics(fx[g], oid[g], fx[p], oid[p])["rank1"]
        if len(y):
            c = torch.zeros(self.num_classes, int(self.hparams.dim))
            c.index_add_(0, s.train_y, torch.nn.functional.normalize(self.fixed_projection(s.train_x), dim=1))
            c = torch.nn.functional.normalize(c, dim=1)
            q = torch.nn.functional.normalize(self.fixed_projection(x), dim=1)
            hits = 0
            for i in range(0, len(y), 4096):  # (4096, C) similarities at a time
                hits += int(((q[i:i + 4096] @ c.T).argmax(dim=1) == y[i:i + 4096]).sum())
            out["top1_fixed"] = hits / len(y)
        self._floors[stage] = out
        return dict(out)

    def test_split_fingerprint(self) -> str:
        """The first 12 hex digits of the SHA-256 of the test examples themselves (closed-set
        ``test_x``, ``test_y``, then the open-set test samples and identities): the data is generated,
        so unlike an index split this names what was tested; equal for every ``seed`` when
        ``test_seed`` is set, different between seeds otherwise."""
        import hashlib

        self.setup()
        s = self.splits
        h = hashlib.sha256()
        for t in (s.test_x, s.test_y, s.test_open_x, s.test_open_id, s.test_open_role):
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:12]

    def split_sizes(self) -> Dict[str, int]:
        self.setup()
        s = self.splits
        return {"train": len(s.train_y), "val": len(s.val_y), "test": len(s.test_y),
                "val_open": len(s.val_open_id), "test_open": len(s.test_open_id)}

    def _loader(self, data: TensorDataset, train: bool) -> DataLoader:
        sampler: Optional[Sampler] = None
        shuffle = train and self.shuffle
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # shard explicitly (Lightning keeps a DistributedSampler it is given); evaluation
            # shards are padded to equal length, the open-set metrics drop the repeats by index
            sampler = DistributedSampler(data, shuffle=shuffle, seed=self.seed, drop_last=False)
        elif shuffle:  # the order depends on (seed, epoch) only: the same batches for every arm
            if self._train_sampler is None:
                self._train_sampler = SeededEpochSampler(self.splits.train_y, self.seed)
            sampler = self._train_sampler
        return DataLoader(data, batch_size=self.batch_size if train else self.eval_batch_size, shuffle=False,
                          sampler=sampler, num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        self.setup()
        s = self.splits
        return self._loader(TensorDataset(s.train_x, s.train_y), True)

    def _eval(self, x, y, ox, oid, role):
        return [self._loader(TensorDataset(x, y), False),
                self._loader(TensorDataset(ox, oid, role, torch.arange(len(oid))), False)]

    def val_dataloader(self):
        self.setup()
        s = self.splits
        return self._eval(s.val_x, s.val_y, s.val_open_x, s.val_open_id, s.val_open_role)

    def test_dataloader(self):
        self.setup()
        s = self.splits
        return self._eval(s.test_x, s.test_y, s.test_open_x, s.test_open_id, s.test_open_role)
