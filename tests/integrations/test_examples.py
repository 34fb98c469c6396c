"""The two integration examples run (in-process, shortened to their default two steps)."""

from __future__ import annotations

import math
import os
import runpy

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name,needs", [("sentence_transformers_decoupled.py", ("sentence_transformers", "datasets")),
                                        ("hf_trainer_causal_lm.py", ("transformers", "accelerate"))])
def test_example_trains(name, needs, tmp_path):
    for mod in needs:
        pytest.importorskip(mod)
    main = runpy.run_path(os.path.join(ROOT, "examples", name), run_name="example")["main"]
    logged = main(str(tmp_path))
    assert len(logged) == 2 and all(math.isfinite(v) for v in logged)
    if name == "hf_trainer_causal_lm.py":  # patched: the same model and batches, no soft-capping
        patched = main(str(tmp_path / "patched"), patched=True)
        assert len(patched) == 2 and all(math.isfinite(v) for v in patched)
