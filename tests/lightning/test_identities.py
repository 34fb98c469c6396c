"""Synthetic identities (``lightning_modules/data/identities.py``), the identity embedder and the
many-class recipes (``configs/many_class/``): generator determinism and counts, the open-set
metric against hand computations, every recipe through the real CLI at a tiny size (fit, then
test from the checkpoint, the open-set metric recomputed by hand from the checkpoint), and the
2-process gloo DDP recipe with sharded Partial FC centres against a single-process run."""

from __future__ import annotations

import csv
import glob
import math
import os
import subprocess
import sys

import pytest
import torch

from lightning_modules.data.identities import IdentitiesDataModule, identification_metrics, make_identities
from lightning_modules.models import IdentityEmbedder
from tests.lightning.recipe_utils import SHORT, assert_same_state, find_checkpoint, run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = sorted(p for p in glob.glob(os.path.join(ROOT, "configs", "many_class", "*.yaml"))
                 if not os.path.basename(p).startswith("ddp_"))
DDP_RECIPE = os.path.join(ROOT, "configs", "many_class", "ddp_arcface_pfc01.yaml")
# 2,000 identities, 1 training sample each: at rate 0.1, k = 200 > the <= 32 positives of a batch
TINY = ["--data.init_args.num_classes=2000", "--data.init_args.train_per_class=1", "--data.init_args.open_classes=20",
        "--data.init_args.batch_size=32", "--data.init_args.eval_batch_size=256"]


# -- generator -------------------------------------------------------------------------------
def test_generator_is_deterministic_per_seed_and_counts_add_up():
    kw = dict(train_per_class=3, val_per_class=1, test_per_class=2, open_classes=7, gallery_per_class=2,
              probes_per_class=3, noise=0.5, nuisance_dim=4)
    a, b, c = make_identities(50, 8, seed=3, **kw), make_identities(50, 8, seed=3, **kw), make_identities(50, 8, seed=4, **kw)
    for name in a.__dataclass_fields__:
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.allclose(a.train_x, c.train_x)
    assert a.train_x.shape == (150, 12) and a.val_x.shape == (50, 12) and a.test_x.shape == (100, 12)
    assert torch.equal(torch.bincount(a.train_y), torch.full((50,), 3))
    assert torch.equal(torch.bincount(a.test_y), torch.full((50,), 2))
    for x, ident, role in ((a.val_open_x, a.val_open_id, a.val_open_role), (a.test_open_x, a.test_open_id, a.test_open_role)):
        assert x.shape == (7 * 5, 12)
        assert torch.equal(torch.bincount(ident), torch.full((7,), 5))
        assert int((role == 0).sum()) == 14 and int((role == 1).sum()) == 21
        assert role[:5].tolist() == [0, 0, 1, 1, 1] and ident[:5].tolist() == [0] * 5  # identity by identity
    # the signal part lies on the unit sphere; the nuisance part is noise of std 1
    assert torch.allclose(a.train_x[:, :8].norm(dim=1), torch.ones(150), atol=1e-5)
    assert 0.8 < float(a.train_x[:, 8:].std()) < 1.2


def test_noise_free_samples_are_the_centres_and_the_held_out_identities_are_new():
    s = make_identities(30, 6, train_per_class=2, val_per_class=1, test_per_class=1, open_classes=5, noise=0.0)
    x = s.train_x.view(30, 2, 6)
    assert torch.allclose(x[:, 0], x[:, 1]) and torch.allclose(s.val_x, x[:, 0]) and torch.allclose(s.test_x, x[:, 0])
    centres = x[:, 0]
    held_out = torch.cat([s.val_open_x, s.test_open_x])
    # no held-out sample coincides with a training centre; the val and test open sets differ
    assert float((held_out @ centres.T).max()) < 1 - 1e-4
    assert float((s.val_open_x @ s.test_open_x.T).max()) < 1 - 1e-4
    # noise-free: the open-set search is perfect
    g = s.test_open_role == 0
    res = identification_metrics(s.test_open_x[g], s.test_open_id[g], s.test_open_x[~g], s.test_open_id[~g])
    assert res["rank1"] == 1.0 and res["probes"] == 10 and res["gallery"] == 5


# -- open-set metric against hand computations ------------------------------------------------
def _angle(deg):
    t = math.radians(deg)
    return [math.cos(t), math.sin(t)]


def test_square_leak_is_the_documented_map_fixed_across_data_seeds():
    """``mixing="square"``: signal += gain * (z * z - 1) / sqrt(2 * dim), z = (nuisance @ A) /
    nuisance_std, with the unmixed sample of the same seed and A (unit-norm Gaussian columns) drawn
    from mixing_seed alone; the nuisance coordinates and the labels are unchanged; bad arguments are
    named."""
    from lightning_modules.data.identities import mixing_matrix

    kw = dict(train_per_class=2, open_classes=5, noise=0.5, nuisance_dim=4, nuisance_std=0.5)
    plain = make_identities(30, 8, seed=3, **kw)
    mixed = make_identities(30, 8, seed=3, mixing="square", mixing_gain=2.0, mixing_seed=11, **kw)
    a = mixing_matrix(4, 8, 11).double()
    assert torch.allclose(a.norm(dim=0), torch.ones(8, dtype=torch.float64), atol=1e-6)
    assert torch.equal(mixing_matrix(4, 8, 11), mixing_matrix(4, 8, 11))
    for p_x, m_x in ((plain.train_x, mixed.train_x), (plain.test_open_x, mixed.test_open_x)):
        z = (p_x[:, 8:].double() @ a) / 0.5
        want = p_x[:, :8].double() + 2.0 * (z * z - 1) / math.sqrt(16)
        assert torch.allclose(m_x[:, :8].double(), want, atol=1e-5)
        assert torch.equal(m_x[:, 8:], p_x[:, 8:])
    assert torch.equal(mixed.train_y, plain.train_y)
    for bad, match in ((dict(mixing="relu"), "mixing must be one of"),
                       (dict(mixing="square", mixing_gain=0), "mixing_gain")):
        with pytest.raises(ValueError, match=match):
            make_identities(30, 8, seed=3, **kw, **bad)
    with pytest.raises(ValueError, match="nuisance_dim >= 1"):
        make_identities(30, 8, seed=3, mixing="square")
    with pytest.raises(ValueError, match="mixing must be one of"):
        IdentitiesDataModule(num_classes=30, mixing="sin")


def test_test_seed_fixes_the_test_split_and_the_seed_draws_the_rest():
    """With test_seed the centres, the closed-set test samples and the test open set are the same for
    every seed (and the fingerprint with them); the training and validation samples and the
    validation open set change with the seed; without it everything follows the seed as before."""
    kw = dict(train_per_class=2, val_per_class=1, test_per_class=1, open_classes=6, noise=0.5, nuisance_dim=4,
              mixing="square")
    a = make_identities(40, 8, seed=1, test_seed=7, **kw)
    b = make_identities(40, 8, seed=2, test_seed=7, **kw)
    for name in ("test_x", "test_y", "test_open_x", "test_open_id", "test_open_role"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for name in ("train_x", "val_x", "val_open_x"):
        assert not torch.allclose(getattr(a, name), getattr(b, name)), name
    # the closed-set test samples are samples of the same identities the training samples come from
    assert torch.equal(a.train_y.unique(), a.test_y.unique())
    old = make_identities(40, 8, seed=1, **kw)
    assert torch.equal(old.train_x, make_identities(40, 8, seed=1, test_seed=None, **kw).train_x)
    dms = [IdentitiesDataModule(num_classes=40, dim=8, nuisance_dim=4, open_classes=6, seed=s, test_seed=7) for s in (1, 2)]
    assert dms[0].test_split_fingerprint() == dms[1].test_split_fingerprint()
    assert IdentitiesDataModule(num_classes=40, dim=8, seed=1).test_split_fingerprint() != \
        IdentitiesDataModule(num_classes=40, dim=8, seed=2).test_split_fingerprint()
    with pytest.raises(ValueError, match="test_seed"):
        IdentitiesDataModule(num_classes=40, test_seed=1.5)
    with pytest.raises(ValueError, match="test_seed"):
        make_identities(40, 8, test_seed=True)


def test_floor_metrics_hand_computed_and_a_fixed_projection_no_longer_solves_the_mixed_data():
    """The no-training floors: the open-set search on the raw input and on the generator's fixed
    projection, and nearest class mean in that projection, recomputed by hand; without the sensor the
    fixed projection nearly solves the task (what made the old design's full-softmax arm look
    trained), with it the projection falls far below."""
    kw = dict(num_classes=400, dim=16, nuisance_dim=16, nuisance_std=0.3, noise=0.7, train_per_class=4,
              open_classes=100, seed=0)
    plain, mixed = IdentitiesDataModule(**kw), IdentitiesDataModule(**kw, mixing="square")
    fp, fm = plain.floor_metrics("test"), mixed.floor_metrics("test")
    assert set(fp) == set(fm) == {"open_rank1_raw", "open_rank1_fixed", "top1_fixed"}
    s = mixed.splits
    proj = lambda x: x.double()[:, :16]
    g, p = s.test_open_role == 0, s.test_open_role == 1

    def rank1(feat):
        f = torch.nn.functional.normalize(feat, dim=1)
        nearest = (f[p] @ f[g].T).argmax(1)
        return float((s.test_open_id[g][nearest] == s.test_open_id[p]).double().mean())

    assert fm["open_rank1_raw"] == pytest.approx(rank1(s.test_open_x.double()), abs=1e-6)
    assert fm["open_rank1_fixed"] == pytest.approx(rank1(proj(s.test_open_x)), abs=1e-6)
    means = torch.zeros(400, 16, dtype=torch.float64).index_add_(
        0, s.train_y, torch.nn.functional.normalize(proj(s.train_x), dim=1))
    pred = (torch.nn.functional.normalize(proj(s.test_x), dim=1) @ torch.nn.functional.normalize(means, dim=1).T).argmax(1)
    assert fm["top1_fixed"] == pytest.approx(float((pred == s.test_y).double().mean()), abs=1e-9)
    # measured at this size: unmixed 0.755 / 0.848 (raw 0.210), mixed 0.185 / 0.233 (raw 0.090)
    assert fp["open_rank1_fixed"] > 0.7 and fp["top1_fixed"] > 0.8  # unmixed: nearly solved without training
    assert fm["open_rank1_fixed"] < 0.5 * fp["open_rank1_fixed"] and fm["top1_fixed"] < 0.6 * fp["top1_fixed"]  # mixed: not
    assert fm["open_rank1_raw"] < fm["open_rank1_fixed"]
    assert mixed.floor_metrics("test") == fm  # cached, the same numbers
    with pytest.raises(ValueError, match="stage"):
        mixed.floor_metrics("train")


@pytest.mark.parametrize("use_faiss", [False, None])
def test_identification_metrics_against_a_hand_computation(use_faiss):
    if use_faiss is None:
        pytest.importorskip("faiss")
    # gallery: identities 0, 1, 2 at 0, 90 and 180 degrees (scaled: cosine ignores the norm)
    gallery = torch.tensor([_angle(0), [0.0, 3.0], _angle(180)])
    gid = torch.tensor([0, 1, 2])
    # probes: id 0 at 10 deg (nearest 0: hit), id 1 at 50 deg (nearest 1: hit, cos 40 > cos 50),
    # id 2 at 80 deg (nearest 1: miss), id 7 (no gallery sample: dropped)
    probes = torch.tensor([_angle(10), _angle(50), _angle(80), _angle(30)])
    pid = torch.tensor([0, 1, 2, 7])
    res = identification_metrics(gallery, gid, probes, pid, far=1 / 6, use_faiss=use_faiss)
    assert res["probes"] == 3 and res["gallery"] == 3
    assert res["rank1"] == pytest.approx(2 / 3)
    # genuine cosines: cos 10, cos 40, cos 100; impostors (6): cos 80, cos 170, cos 50, cos 130,
    # cos 80, cos 10. FAR 1/6 admits one impostor above the threshold: the threshold is the
    # second largest impostor cos 50 = 0.643, and genuine scores above it: cos 10 and cos 40 -> 2/3
    assert res["tar_at_far"] == pytest.approx(2 / 3)
    strict = identification_metrics(gallery, gid, probes, pid, far=0.0, use_faiss=use_faiss)
    # FAR 0: threshold = the largest impostor cos 10 = 0.985, no genuine score is strictly above it
    assert strict["tar_at_far"] == 0.0 and strict["rank1"] == pytest.approx(2 / 3)


def test_faiss_and_torch_search_agree():
    pytest.importorskip("faiss")
    s = make_identities(20, 16, open_classes=200, noise=1.2, probes_per_class=3, seed=5)
    g = s.val_open_role == 0
    a = identification_metrics(s.val_open_x[g], s.val_open_id[g], s.val_open_x[~g], s.val_open_id[~g], use_faiss=True)
    b = identification_metrics(s.val_open_x[g], s.val_open_id[g], s.val_open_x[~g], s.val_open_id[~g], use_faiss=False)
    assert a == b and 0.05 < a["rank1"] < 1.0


# -- DataModule --------------------------------------------------------------------------------
def test_datamodule_sizes_loaders_and_training_order():
    dm = IdentitiesDataModule(num_classes=40, dim=8, nuisance_dim=3, train_per_class=2, open_classes=6,
                              probes_per_class=2, batch_size=16, eval_batch_size=9, seed=2)
    assert dm.num_classes == 40 and dm.input_dim == 11 and dm.splits is None  # generated in setup
    assert dm.split_sizes() == {"train": 80, "val": 40, "test": 40, "val_open": 18, "test_open": 18}
    closed, open_ = dm.test_dataloader()
    x, y = next(iter(closed))
    assert x.shape == (9, 11) and y.tolist() == list(range(9))
    ox, oid, role, idx = next(iter(open_))
    assert oid.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and role.tolist() == [0, 1, 1] * 3 and idx.tolist() == list(range(9))
    order = [torch.cat([b[1] for b in dm.train_dataloader()]) for _ in range(2)]
    again = IdentitiesDataModule(num_classes=40, dim=8, nuisance_dim=3, train_per_class=2, open_classes=6,
                                 probes_per_class=2, batch_size=16, seed=2)
    assert torch.equal(torch.cat([b[1] for b in again.train_dataloader()]), order[0])  # (seed, epoch) only
    assert not torch.equal(order[0], order[1])  # a new order each epoch
    assert torch.equal(torch.sort(order[0]).values, torch.sort(dm.splits.train_y).values)


# -- recipes through the real CLI --------------------------------------------------------------
def test_the_recipes_cover_rates_margins_and_sizes():
    import yaml

    seen = set()
    for path in RECIPES + [DDP_RECIPE]:
        with open(path) as fh:
            cfg = yaml.safe_load(fh)
        loss = cfg["model"]["init_args"]["loss"]
        assert loss["class_path"] == "losses.PartialFCLoss"
        a = loss["init_args"]
        kind = "arcface" if a["margin"][1] > 0 else "cosface" if a["margin"][2] > 0 else "none"
        seen.add((kind, a["sample_rate"], cfg["data"]["init_args"]["num_classes"], a.get("distributed", False)))
    for kind in ("arcface", "cosface"):
        for rate in (0.1, 0.3, 1.0):
            assert (kind, rate, 10000, False) in seen, (kind, rate)
    assert ("cosface", 0.1, 100000, False) in seen and ("arcface", 0.1, 10000, True) in seen


def _open_rank1_by_hand(model, dm) -> float:
    s = dm.splits
    with torch.no_grad():
        emb = torch.nn.functional.normalize(model(s.test_open_x), dim=1)
    g = s.test_open_role == 0
    sims = emb[~g] @ emb[g].T
    return float((s.test_open_id[g][sims.argmax(1)] == s.test_open_id[~g]).float().mean())


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=[os.path.basename(p) for p in RECIPES])
def test_recipe_fits_and_tests_from_its_checkpoint(recipe, tmp_path):
    extra = TINY if "c1e5" not in recipe else TINY[1:] + ["--data.init_args.num_classes=3000"]
    fit = run_cli("fit", recipe, tmp_path, [*extra, "--trainer.num_sanity_val_steps=0"])
    model, dm = fit.model, fit.datamodule
    rate = model.loss.sample_rate
    assert model.loss.weight.shape == (dm.num_classes, model.embedding_dim)
    if rate < 1.0:  # the regime of the paper: the batch's positives are a small part of the sample
        assert model.loss.last_index.numel() == int(rate * dm.num_classes)
    else:
        assert model.loss.last_index.numel() == dm.num_classes
    m = {k: float(v) for k, v in fit.trainer.callback_metrics.items()}
    assert {"val/top1", "val/top5", "val/open_rank1", "val/open_tar_far", "train/step_ms", "train/peak_rss_mb"} <= set(m)
    # the centres each step's softmax saw and the positives' share of them (< 1: negatives were sampled)
    assert m["train/softmax_classes"] == model.loss.last_index.numel()
    assert 1 <= m["train/positive_classes"] <= min(32, m["train/softmax_classes"])  # a batch of 32
    assert 0 < m["train/positive_share"] < 1
    ckpt = find_checkpoint(tmp_path)
    test = run_cli("test", recipe, tmp_path, [*extra, f"--ckpt_path={ckpt}"])
    t = {k: float(v) for k, v in test.trainer.callback_metrics.items()}
    assert {"test/top1", "test/top5", "test/open_rank1", "test/open_tar_far", "test/train_step_ms",
            "test/train_peak_rss_mb", "test/train_rss_increase_mb"} <= set(t)
    assert t["test/train_step_ms"] > 0 and t["test/train_peak_rss_mb"] > 50
    assert 0.0 <= t["test/top1"] <= t["test/top5"] <= 1.0
    # the logged open-set rate equals a search by hand with the checkpoint's model
    assert t["test/open_rank1"] == pytest.approx(_open_rank1_by_hand(test.model.eval(), test.datamodule), abs=1e-6)
    # load_from_checkpoint rebuilds the module with its loss (hyperparameters, centres, sampler state)
    loaded = IdentityEmbedder.load_from_checkpoint(ckpt)
    assert type(loaded.loss) is type(model.loss) and loaded.loss.sample_rate == rate
    assert tuple(loaded.loss.margin) == tuple(model.loss.margin) and loaded.loss.scale == model.loss.scale
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    assert set(loaded.state_dict()) == set(saved)
    for k, v in loaded.state_dict().items():  # tensors, and the sampler's generator state (extra state)
        assert_same_state(v, saved[k], k)


# -- DDP ---------------------------------------------------------------------------------------
def _csv_logger(path, save_dir) -> str:
    with open(path, "w") as fh:
        fh.write("trainer:\n  logger:\n    class_path: pytorch_lightning.loggers.CSVLogger\n"
                 f"    init_args:\n      save_dir: {save_dir}\n      name: csv\n")
    return str(path)


def _last_metrics(save_dir) -> dict:
    out: dict = {}
    with open(os.path.join(str(save_dir), "csv", "version_0", "metrics.csv")) as fh:
        for row in csv.DictReader(fh):
            out.update({k: float(v) for k, v in row.items() if v not in ("", None)})
    return out


@pytest.mark.slow
def test_ddp_recipe_with_two_gloo_processes_matches_one_process(tmp_path):
    """2 gloo processes, sharded centres, batch 16 per rank, unshuffled (rank r reads r, r + 2, ...),
    rate 1.0 (where the sharded loss equals the single-process one) against one process with batch
    32 and distributed: false: the same global batches, so the same losses, metrics and centres
    after two AdamW steps (tolerance 1e-4 absolute; on the full validation sets, two flips allowed
    on the closed set and one on the open set: float reduction order differs). Then the DDP
    checkpoint (the full gathered centres) is tested in one process."""
    ddp_dir, single_dir = tmp_path / "ddp", tmp_path / "single"
    ddp_dir.mkdir()
    single_dir.mkdir()
    common = [*TINY[:-2], "--data.init_args.shuffle=false", "--model.init_args.loss.init_args.sample_rate=1.0",
              "--trainer.num_sanity_val_steps=0", "--data.init_args.eval_batch_size=64"]
    full_val = ["--trainer.limit_val_batches=1.0"]  # a truncated pass would see different samples per rank
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "lightning_modules", "fit", "--config", DDP_RECIPE,
           "--config", _csv_logger(tmp_path / "ddp_logger.yaml", ddp_dir), f"--trainer.default_root_dir={ddp_dir}",
           *SHORT, *common, *full_val, "--data.init_args.batch_size=16"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = proc.stdout + proc.stderr
    assert "distributed_backend=gloo" in log and "Starting with 2 processes" in log, log[-4000:]

    single = run_cli("fit", DDP_RECIPE, single_dir, [
        "--config", _csv_logger(tmp_path / "single_logger.yaml", single_dir), "--trainer.strategy=auto",
        "--trainer.devices=1", *common, *full_val, "--data.init_args.batch_size=32",
        "--model.init_args.loss.init_args.distributed=false"])
    assert single.trainer.world_size == 1
    d, s = _last_metrics(ddp_dir), _last_metrics(single_dir)
    assert d["step"] == s["step"] == 1
    assert abs(d["train/loss_epoch"] - s["train/loss_epoch"]) <= 1e-4
    for k in ("val/top1", "val/top5", "val/open_rank1", "val/open_tar_far"):
        assert k in d and k in s, k
        tol = 2.0 / 2000 if k in ("val/top1", "val/top5") else 1.0 / 40  # 2,000 closed samples, 40 probes
        assert abs(d[k] - s[k]) <= tol + 1e-6, (k, d[k], s[k])
    ckpt = find_checkpoint(ddp_dir)
    w_ddp = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]["loss.weight"]
    w_single = torch.load(find_checkpoint(single_dir), map_location="cpu", weights_only=False)["state_dict"]["loss.weight"]
    assert w_ddp.shape == w_single.shape == (2000, 128)
    assert torch.allclose(w_ddp, w_single, atol=1e-4, rtol=0)
    test = run_cli("test", DDP_RECIPE, tmp_path / "test", [
        *common, "--data.init_args.batch_size=32", "--trainer.strategy=auto", "--trainer.devices=1",
        "--model.init_args.loss.init_args.distributed=false", f"--ckpt_path={ckpt}"])
    t = {k: float(v) for k, v in test.trainer.callback_metrics.items()}
    assert {"test/top1", "test/open_rank1", "test/train_step_ms"} <= set(t)


# -- claims ------------------------------------------------------------------------------------
def _reproduce_package():
    """The reproduction package (``benchmarks/reproduce/``), imported as its entry point imports it."""
    if os.path.join(ROOT, "benchmarks") not in sys.path:
        sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import reproduce.claims
    import reproduce.runs

    return reproduce


def _rate_and_data(arm):
    cfg = arm.recipe_config()
    rate = cfg["model"]["init_args"]["loss"]["init_args"]["sample_rate"]
    rate = dict(arm.overrides).get("model.init_args.loss.init_args.sample_rate", rate)
    return float(rate), cfg["data"]["init_args"]


def test_many_class_claims_compare_sampled_rates_with_the_full_softmax():
    rp = _reproduce_package()
    cf = rp.claims.load_claims()
    assert rp.claims.validate_claims(cf) == []
    claims = {c.key: c for c in cf.claims if c.benchmark == "many_class"}
    assert set(claims) == {"pfc_arcface", "pfc_cosface", "pfc_cosface_c1e5"}
    for c in claims.values():
        rates = {k: _rate_and_data(cf.arms[k])[0] for k in c.arms}
        (base,) = [k for k, r in rates.items() if r == 1.0]
        family = [k for k, r in rates.items() if r < 1.0]
        assert family and {"test/train_step_ms", "test/train_peak_rss_mb", "test/open_rank1", "test/top1"} <= set(c.metrics)
        for k in family:
            data = _rate_and_data(cf.arms[k])[1]
            assert data["batch_size"] < rates[k] * data["num_classes"]  # the sample is mostly uniform negatives
            for metric in ("test/open_rank1", "test/top1"):
                (ch,) = [ch for ch in c.checks if ch.family == k and ch.metric == metric]
                assert ch.baseline == base and ch.kind == "not_worse" and 0 < ch.margin <= 0.02
        args = rp.runs.run_args(cf.arms[c.arms[0]], 3, {}, phase="eval", quick=False)
        assert "--model.init_args.init_seed=3" in args and "--model.init_args.loss.init_args.seed=3" in args
