"""Where an engine step's time goes, on the CPU, at a steady batch of
decoding requests on the demo model: scheduling, input preparation, the
model forward (attention included), sampling, update_from_output, output
assembly. The target: everything outside the forward under 5% of the step.

    python benches/engine_overhead.py [--batch 64] [--steps 200]
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from ironbatch import SamplingParams
from ironbatch.engine import EngineArgs, LLMEngine
from ironbatch.model.random_model import write_random_llama


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--backend", default="torch")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_random_llama(tmp)
        engine = LLMEngine(
            EngineArgs(
                model=tmp,
                dtype="float32",
                num_blocks=64 * 32 + 1,
                max_num_seqs=a.batch,
                max_model_len=1024,
                attention_backend=a.backend,
            )
        )
        params = SamplingParams(max_tokens=a.steps + 50, temperature=0.0, ignore_eos=True)
        for i in range(a.batch):
            engine.add_request(
                f"r{i}", {"prompt_token_ids": [3 + (i * 7 + k) % 2000 for k in range(64)]}, params
            )
        engine.runner.sync_for_timings = True  # "forward" is device time here
        for _ in range(5):  # prefill, then a few decode steps
            engine.step()
        for t in (engine.timings, engine.runner.timings):
            for k in t:
                t[k] = 0.0
        for _ in range(a.steps):
            engine.step()
    e, r = engine.timings, engine.runner.timings
    step = e["step"]
    parts = {
        "schedule()": e["schedule"],
        "input preparation": r["prepare"],
        "model forward (attention incl.)": r["forward"],
        "sampling": r["sample"],
        "update_from_output()": e["update"],
        "output assembly": e["outputs"],
    }
    parts["other"] = step - sum(parts.values())
    print(
        f"batch {a.batch}, {a.steps} decode steps, {backend_note(a.backend)}; "
        f"{step / a.steps * 1e3:.2f} ms per step"
    )
    print("| phase | ms/step | share |")
    print("|---|---:|---:|")
    for k, v in parts.items():
        print(f"| {k} | {v / a.steps * 1e3:.3f} | {v / step:.1%} |")
    outside = step - r["forward"]
    print(f"| **outside the forward** | {outside / a.steps * 1e3:.3f} | **{outside / step:.1%}** |")
    return 0


def backend_note(backend: str) -> str:
    return f"attention backend {backend}, demo model (4 layers, hidden 128), float32"


if __name__ == "__main__":
    sys.exit(main())
