"""Peak memory and time of one training step of a causal LM through the Hugging Face ``Trainer``,
with the model's own loss, with the linear cross-entropy callable, and with the model patched by
:func:`losses.integrations.transformers.patch_causal_lm` (no logits while training).

Each variant runs in its own process: a Llama built from a config (vocabulary 30,522, hidden size
256, 2 layers; random weights, nothing downloaded), ``Trainer.train()`` for 3 optimiser steps of
8 x 512 = 4,096 tokens (SGD). Peak memory is the RSS high-water mark during steps 2 and 3 minus
the RSS before step 2 (glibc's mmap threshold fixed at 128 KiB, so freed blocks go back to the
system and the mark follows live memory); time is the median wall time of those steps. The
logits alone are 4,096 x 30,522 float32 = 477 MiB.

    python benchmarks/lm_patch_memory.py            # writes results/perf/lm_patch/lm_patch.md

It also times the loss alone, ``CausalLMLoss()`` against Hugging Face's ``ForCausalLMLoss`` on the
same ``(8, 512, 32000)`` float32 logits (forward + backward, data checks on as a user runs it,
medians of interleaved repetitions, one process, the machine's threads); ``--loss-only`` runs
just that part.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "perf" / "lm_patch"
VARIANTS = ("hf_loss", "linear_ce_callable", "patched")
V, HIDDEN, LAYERS, BATCH, T, STEPS = 30522, 256, 2, 8, 512, 3


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def _reset() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _cpu() -> str:
    """The CPU model and its vector extensions (the performance suite's own reading)."""
    from perf_losses import _cpu_flags, _cpu_name  # benchmarks/ is on sys.path: this script's folder

    return f"{_cpu_name()}, {_cpu_flags()}"


def worker(variant: str) -> dict:
    import tempfile

    import torch
    import transformers

    from losses.integrations.transformers import LinearCrossEntropyCausalLMLoss, patch_causal_lm

    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("LM_PATCH_THREADS", "2")))
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=HIDDEN, intermediate_size=512, num_hidden_layers=LAYERS,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=T,
                                   bos_token_id=0, eos_token_id=0, output_hidden_states=variant == "linear_ce_callable")
    model = transformers.LlamaForCausalLM(cfg)
    loss = None
    if variant == "linear_ce_callable":
        loss = LinearCrossEntropyCausalLMLoss(model.get_output_embeddings())
    elif variant == "patched":
        patch_causal_lm(model)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, V, (BATCH * STEPS, T), generator=g)

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return ids.shape[0]

        def __getitem__(self, i):
            return {"input_ids": ids[i], "labels": ids[i]}

    marks: dict = {"times": []}

    class Probe(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == 1:  # after the first step: the base and a fresh high-water mark
                import gc

                gc.collect()
                marks["base"] = _rss()
                _reset()
            marks["t0"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if state.global_step >= 2:
                marks["times"].append(time.perf_counter() - marks["t0"])
                marks["hwm"] = _hwm()

    with tempfile.TemporaryDirectory() as tmp:
        args = transformers.TrainingArguments(
            output_dir=tmp, per_device_train_batch_size=BATCH, max_steps=STEPS, learning_rate=1e-3, optim="sgd",
            lr_scheduler_type="constant", report_to=[], save_strategy="no", use_cpu=True, logging_steps=1,
            disable_tqdm=True, dataloader_num_workers=0, seed=0)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=Rows(), compute_loss_func=loss,
                                       callbacks=[Probe()])
        trainer.train()
    losses_logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"variant": variant, "peak_mb": (marks["hwm"] - marks["base"]) / 2**20,
            "step_s": statistics.median(marks["times"]), "losses": losses_logged}


def loss_only(reps: int = 7) -> str:
    import torch
    from transformers.loss.loss_utils import ForCausalLMLoss

    from losses.integrations.transformers import CausalLMLoss

    torch.manual_seed(0)
    b, t, v = 8, 512, 32000
    z = torch.randn(b, t, v, requires_grad=True)
    y = torch.randint(0, v, (b, t))
    ours = CausalLMLoss()
    impls = {"ForCausalLMLoss (Hugging Face)": lambda: ForCausalLMLoss(z, y, v),
             "CausalLMLoss (this library)": lambda: ours({"logits": z}, y)}
    values = {k: float(f()) for k, f in impls.items()}
    times: dict = {k: [] for k in impls}
    for _ in range(reps + 1):  # the first round warms up
        for k, f in impls.items():
            t0 = time.perf_counter()
            f().backward()
            times[k].append(time.perf_counter() - t0)
            z.grad = None
    med = {k: statistics.median(v[1:]) * 1000 for k, v in times.items()}
    ref = med["ForCausalLMLoss (Hugging Face)"]
    lines = ["", f"## The loss alone: ({b}, {t}, {v}) float32 logits, forward + backward", "",
             f"Medians of {reps} interleaved repetitions after one warm-up round, {torch.get_num_threads()} threads.", "",
             "| loss | ms | vs `ForCausalLMLoss` | value |", "|---|---|---|---|"]
    for k in impls:
        lines.append(f"| {k} | {med[k]:.0f} | {med[k] / ref:.2f}x | {values[k]:.6f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    if "--loss-only" in sys.argv:
        print(loss_only())
        return
    rows = []
    for variant in VARIANTS:
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", OMP_NUM_THREADS=os.environ.get("LM_PATCH_THREADS", "2"))
        out = subprocess.run([sys.executable, __file__, "--worker", variant], capture_output=True, text=True, env=env,
                             cwd=ROOT, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    base = rows[0]["peak_mb"]
    lines = [
        "# A causal LM's training step through the Trainer: peak memory with and without the logits",
        "",
        f"Generated by `python benchmarks/lm_patch_memory.py` (its docstring has the method): Llama from a config, "
        f"vocabulary {V:,}, hidden {HIDDEN}, {LAYERS} layers, {BATCH} x {T} = {BATCH * T:,} tokens a step, "
        f"`Trainer.train()` on the CPU ({_cpu()}). The logits alone are {BATCH * T * V * 4 / 2**20:.0f} MiB in "
        "float32.",
        "",
        "| variant | peak memory of a step (MiB) | vs the model's own loss | median step (s) | logged losses |",
        "|---|---|---|---|---|",
    ]
    names = {"hf_loss": "the model's own loss (`ForCausalLMLoss`)",
             "linear_ce_callable": "`compute_loss_func=LinearCrossEntropyCausalLMLoss(head)` (the model still builds its logits)",
             "patched": "`patch_causal_lm(model)` (no logits)"}
    for r in rows:
        lines.append(f"| {names[r['variant']]} | {r['peak_mb']:.0f} | {r['peak_mb'] / base:.2f}x | {r['step_s']:.2f} | "
                     + ", ".join(f"{v:.4f}" for v in r["losses"]) + " |")
    text = "\n".join(lines) + "\n" + loss_only()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "lm_patch.md").write_text(text)
    print(text)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":  # one variant of the step, in its own process
        print(json.dumps(worker(sys.argv[2])))
    else:
        main()
