"""The registry on a CUDA device (docs/conventions.md: device and dtype, mixed precision).

Every test carries the ``cuda`` marker and is skipped without a CUDA device (the only permitted
skips). ``scripts/run_cuda_tests.sh`` runs exactly these on a GPU machine (``pytest -m cuda``).

* autocast fp16 and bf16: forward and backward for every entry; the loss in float32, finite
  gradients in the leaves' own dtypes, the value close to the fp32 computation on the same inputs;
* CPU and CUDA agree to 1e-5 in fp32 (value and gradients);
* ``torch.compile`` (inductor) per entry with validation off equals eager on the device.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import losses
from losses.testing import AUTOCAST_TOL, MODEL_AUTOCAST_TOL, build, call, example, float_leaves
from tests.reliability_utils import BY_NAME, NAMES, grads_of

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

#: Inside autocast the loss's maths, a head's logits included, runs in fp32 (or wider), as
#: F.cross_entropy does: the value equals the fp32 run on the same inputs up to summation order
#: (``losses.testing.AUTOCAST_TOL``). The adversarial loss calls the user's model, which autocast
#: runs in half precision (``losses.testing.MODEL_AUTOCAST_TOL``).

#: Keywords that take randomness out of the comparison across devices (a CPU and a CUDA
#: generator draw different numbers): the adversarial loss starts PGD at the input itself.
DETERMINISTIC = {"adversarial_comp_sum": {"random_init_std": 0.0, "steps": 1}}


def _to(args, kwargs, device):
    out = []
    for a in args:
        if isinstance(a, torch.nn.Module):
            out.append(copy.deepcopy(a).to(device))
        elif isinstance(a, torch.Tensor):
            b = a.detach().to(device)
            out.append(b.requires_grad_(a.requires_grad))
        else:
            out.append(a)
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    return tuple(out), kw


def _module(spec, device, **overrides):
    kw = {**DETERMINISTIC.get(spec.name, {}), **overrides}
    if "weight" in kw and isinstance(kw["weight"], torch.Tensor):
        kw["weight"] = kw["weight"].to(device)
    return build(spec, **kw).to(device)


def _check_leaf_grads(leaves, grads):
    assert grads[0] is not None, "no gradient reaches the first input"
    for leaf, g in zip(leaves, grads):
        if g is not None:
            assert g.dtype == leaf.dtype and g.device == leaf.device
            assert torch.isfinite(g).all()


def check_autocast(name, device, dtype):
    """Forward under autocast and backward after it: the fp32 value (and gradients); then
    forward and backward both inside the region: finite, in the leaves' dtypes."""
    spec = BY_NAME[name]
    args, kwargs = example(spec)
    args, kwargs = _to(args, kwargs, device)
    ref_args, _ = _to(args, kwargs, device)
    ref_module = _module(spec, device)
    ref = call(ref_module, ref_args, kwargs)
    module = _module(spec, device)
    with torch.autocast(device, dtype=dtype):
        out = call(module, args, kwargs)
    leaves = float_leaves(module, args)
    grads = grads_of(out, leaves)
    assert out.dtype == torch.float32, f"loss in {out.dtype} under {dtype} autocast"
    assert torch.isfinite(out).all()
    _check_leaf_grads(leaves, grads)
    tol = MODEL_AUTOCAST_TOL if spec.inputs[0] == "model" else AUTOCAST_TOL
    torch.testing.assert_close(out, ref.to(out.dtype), **tol)
    if spec.inputs[0] != "model":
        for g, g0 in zip(grads, grads_of(ref, float_leaves(ref_module, ref_args))):
            if g is not None and g0 is not None:
                torch.testing.assert_close(g, g0, **AUTOCAST_TOL)

    args2, kwargs2 = _to(*example(spec), device)
    module2 = _module(spec, device)
    with torch.autocast(device, dtype=dtype):
        out2 = call(module2, args2, kwargs2)
        leaves2 = float_leaves(module2, args2)
        grads2 = grads_of(out2, leaves2)
    assert out2.dtype == torch.float32 and torch.isfinite(out2).all()
    _check_leaf_grads(leaves2, grads2)


def check_cpu_device_agree(name, device):
    spec = BY_NAME[name]
    args, kwargs = example(spec)
    cpu_module = _module(spec, "cpu")
    out_cpu = call(cpu_module, args, kwargs)
    g_cpu = grads_of(out_cpu, float_leaves(cpu_module, args))
    dev_args, dev_kwargs = _to(args, kwargs, device)
    dev_module = _module(spec, device)
    if spec.name == "partial_fc":  # the same sampled classes on both devices
        dev_kwargs["index"] = cpu_module.last_index.to(device)
    out_dev = call(dev_module, dev_args, dev_kwargs)
    assert out_dev.device.type == torch.device(device).type
    g_dev = grads_of(out_dev, float_leaves(dev_module, dev_args))
    torch.testing.assert_close(out_dev.cpu(), out_cpu, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_dev, g_cpu):
        if b is None:
            assert a is None
        else:
            torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)


def check_compile(name, device):
    spec = BY_NAME[name]
    torch._dynamo.reset()
    args, kwargs = example(spec)
    args, kwargs = _to(args, kwargs, device)
    module = _module(spec, device)
    with losses.validation(False), warnings.catch_warnings():
        warnings.simplefilter("ignore", losses.ExperimentalWarning)
        eager = call(module, args, kwargs)
        eager_grads = grads_of(eager, float_leaves(module, args))
        compiled = torch.compile(module, backend="inductor")
        args2, kwargs2 = _to(args, kwargs, device)
        out = call(compiled, args2, kwargs2)
        grads = grads_of(out, float_leaves(module, args2))
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
    for g, g0 in zip(grads, eager_grads):
        if g0 is not None:
            torch.testing.assert_close(g, g0, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", NAMES)
def test_cuda_autocast_forward_backward(name, dtype):
    check_autocast(name, "cuda", dtype)


@pytest.mark.parametrize("name", NAMES)
def test_cpu_and_cuda_agree_in_float32(name):
    check_cpu_device_agree(name, "cuda")


@pytest.mark.parametrize("name", NAMES)
def test_module_to_cuda_moves_every_tensor(name):
    module = _module(BY_NAME[name], "cuda")
    for t in list(module.parameters()) + list(module.buffers()):
        assert t.device.type == "cuda"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_torch_compile_on_cuda_matches_eager(name):
    check_compile(name, "cuda")


def test_partial_fc_sparse_grad_on_cuda_matches_cpu():
    """``sparse_grad=True`` on the device: the same loss and (densified) centre gradient as on the
    CPU for the same sampled classes, and a SparseAdam step that moves only those centres."""
    torch.manual_seed(0)
    x, y = torch.randn(8, 16), torch.randint(0, 200, (8,))
    cpu = losses.PartialFCLoss(16, 200, sample_rate=0.2, seed=0, sparse_grad=True)
    dev = copy.deepcopy(cpu).to("cuda")
    out_cpu = cpu(x, y)
    out_cpu.backward()
    out_dev = dev(x.cuda(), y.cuda(), index=cpu.last_index.cuda())
    out_dev.backward()
    assert dev.weight.grad.is_sparse and dev.weight.grad.device.type == "cuda"
    torch.testing.assert_close(out_dev.cpu(), out_cpu, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dev.weight.grad.to_dense().cpu(), cpu.weight.grad.to_dense(), rtol=1e-5, atol=1e-5)
    before = dev.weight.detach().clone()
    torch.optim.SparseAdam(dev.parameters(), lr=1e-2).step()
    moved = (dev.weight.detach() != before).any(dim=1).nonzero().flatten().cpu()
    assert torch.equal(moved, cpu.last_index)


def test_candidates_from_search_of_cuda_results():
    """Search results on the GPU (e.g. a brute-force search of CUDA embeddings) give the CPU's
    candidate lists, on the GPU."""
    from lightning_modules.retrieval_metrics import candidates_from_search

    scores = torch.linspace(0.9, -0.9, 10)[None]
    ids = torch.tensor([[4, 2, 7, 11, 12, 13, 14, 15, 16, 17]])
    positives = torch.tensor([[7, 1, -1]])
    cpu = candidates_from_search(scores, ids, positives, torch.tensor([3]))
    dev = candidates_from_search(scores.cuda(), ids.cuda(), positives.cuda(), torch.tensor([3]).cuda())
    for a, b in zip(dev, cpu):
        assert a.device.type == "cuda"
        assert torch.equal(a.cpu(), b)


@pytest.mark.slow
def test_the_gpu_partial_fc_claims_recipe_trains_and_tests_on_the_device(tmp_path):
    """The 100,000-identity claim's arms as they run on a GPU (``trainer.accelerator: gpu``, the
    sampled-centre update: SparseAdam on the CUDA centres beside AdamW), at a smoke size (10,000
    identities, 2 batches): fit, validate and test from the checkpoint run on the device, the test
    logs the CUDA peak memory the claim checks and the positives' share the manipulation check reads."""
    import os

    from tests.lightning.recipe_utils import run_recipe

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = run_recipe(os.path.join(root, "configs", "many_class", "cosface_pfc01_c1e5.yaml"), tmp_path, extra=[
        "--trainer.accelerator=gpu", "--trainer.devices=1", "--data.init_args.num_classes=10000",
        "--model.init_args.loss.init_args.sparse_grad=true"])
    assert 0.0 <= out["fit"]["train/positive_share"] < 1.0
    assert out["test"]["test/train_cuda_peak_mb"] > 0 and 0.0 <= out["test"]["test/open_rank1"] <= 1.0


@pytest.mark.parametrize("recipe", ["logz_penalty", "entmax15"])
def test_the_gpu_language_model_claims_recipe_trains_and_tests_on_the_device(tmp_path, recipe):
    """The revision-4 language-model claims' recipe as its arms run it on a GPU (bf16 mixed precision,
    the 4-layer decoder, warmup + cosine) at a smoke size (40 training files, 2 batches): fit,
    validate and test from the checkpoint on the device; the per-step log Z the sensitivity study
    tracks is logged, and 1.5-entmax's support (its manipulation check) is below the vocabulary."""
    import os

    from tests.lightning.recipe_utils import run_recipe

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = run_recipe(os.path.join(root, "configs", "language_model", "claims_r4", f"{recipe}.yaml"), tmp_path, extra=[
        "--trainer.accelerator=gpu", "--trainer.devices=1", "--trainer.max_steps=4", "--trainer.log_every_n_steps=1",
        "--data.init_args.max_files=40", "--data.init_args.max_eval_tokens=16384"])
    assert torch.isfinite(torch.tensor(out["fit"]["train/logz_mean"]))
    assert 0.0 <= out["test"]["test/top1"] <= 1.0 and out["test"]["test/bigram_top1"] > 0.0
    if recipe == "entmax15":
        assert 0.0 < out["test"]["test/support"] < 8192
