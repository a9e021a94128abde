"""The Rust classes, their type stub and the twin's classes offer the same
public surface, and the twin stays independent of the core."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ironbatch
import ironbatch._core as core
import ironbatch.reference as twin

PKG = Path(ironbatch.__file__).parent
CLASSES = [
    "BlockPool",
    "KVCacheManager",
    "PrefixCacheStats",
    "Scheduler",
    "Step",
    "StepUpdate",
    "FinishedRequest",
    "SchedulerStats",
    "SpecDecodingStats",
    "VllmObjects",
    "VllmStepRows",
    "VllmStepUpdate",
    "SimWorkload",
    "StepTimeModel",
]


def public(names: object) -> set[str]:
    return {n for n in dir(names) if not n.startswith("_")}


def stub_members() -> dict[str, set[str]]:
    tree = ast.parse((PKG / "_core.pyi").read_text())
    return {
        node.name: {
            item.name
            for item in node.body
            if isinstance(item, ast.FunctionDef) and not item.name.startswith("_")
        }
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }


@pytest.mark.parametrize("name", CLASSES)
def test_stub_matches_the_extension(name: str) -> None:
    assert stub_members()[name] == public(getattr(core, name))


@pytest.mark.parametrize("name", ["BlockPool", "KVCacheManager"])
def test_twin_offers_the_core_api(name: str) -> None:
    missing = public(getattr(core, name)) - public(getattr(twin, name))
    assert not missing, f"the twin's {name} lacks {sorted(missing)}"


def test_twin_scheduler_offers_what_the_facade_drives() -> None:
    for name in (
        "add_request",
        "schedule",
        "update_from_output",
        "finish_requests",
        "reset_prefix_cache",
        "make_stats",
        "debug_state",
    ):
        assert callable(getattr(twin.Scheduler, name)), name
        assert callable(getattr(core.Scheduler, name)), name


def test_the_step_columns_are_named_once() -> None:
    """The core names the columns (rust/src/step.rs); the API's typed view
    and the twin's columns must list exactly those, in that order."""
    from dataclasses import fields

    from ironbatch.reference.step import StepColumns as TwinColumns
    from ironbatch.scheduler_output import StepColumns

    names = list(core.STEP_COLUMNS)
    assert list(StepColumns.__annotations__) == names
    assert [f.name for f in fields(TwinColumns)] == names
    assert set(core.STEP_COLUMNS.values()) <= {"int32", "int64", "uint8", "bool"}


def test_the_core_and_the_twin_agree_on_kind_codes() -> None:
    from ironbatch import CacheConfig, Request, SamplingParams, Scheduler, SchedulerConfig
    from ironbatch.reference.step import Kind

    for backend in ("rust", "python"):
        s = Scheduler(
            SchedulerConfig(max_model_len=160, max_num_seqs=4, max_num_batched_tokens=512),
            CacheConfig(num_blocks=11, block_size=16),
            backend=backend,
        )
        two, three = (SamplingParams(max_tokens=n, ignore_eos=True) for n in (2, 3))
        s.add_request(Request("a", list(range(3, 83)), two, arrival_time=0.0))
        s.add_request(Request("b", list(range(103, 183)), three, arrival_time=1.0))
        kinds = []
        for _ in range(4):  # a's second token needs b's blocks: b resumes after a ends
            out = s.schedule()
            kinds.append(out.kinds.tolist())
            sampling = [rid for rid, k in zip(out.req_ids, out.samples, strict=True) if k]
            s.update_from_output(out, {rid: [9] for rid in sampling})
        assert kinds == [[Kind.NEW, Kind.NEW], [Kind.RUNNING], [Kind.RESUMED], [Kind.RUNNING]]


def test_stats_fields_match() -> None:
    assert public(core.PrefixCacheStats) == public(twin.PrefixCacheStats) - {"record"}


def test_twin_never_imports_the_core() -> None:
    for path in (PKG / "reference").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                assert not module.startswith("ironbatch") or module.startswith(
                    "ironbatch.reference"
                ), (path.name, module)
            elif isinstance(node, ast.Import):
                assert all(not a.name.startswith("ironbatch") for a in node.names), path.name


def test_the_extension_is_abi3() -> None:
    assert Path(core.__file__).name.endswith(".abi3.so")


def test_import_needs_only_numpy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, ironbatch, ironbatch.reference, ironbatch.trace, ironbatch.bench; "
        "heavy = {'torch', 'triton', 'transformers', 'vllm', 'safetensors', 'tokenizers'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_kernels_ship_inside_the_package() -> None:
    kernels = PKG / "kernels"
    assert (kernels / "unified_attention.py").is_file()
    assert (kernels / "reshape_and_cache.py").is_file()


def test_vllm_style_names_load_lazily() -> None:
    import subprocess
    import sys

    code = (
        "import sys, ironbatch; "
        "assert 'ironbatch.engine' not in sys.modules; "
        "from ironbatch import LLM, LLMEngine, EngineArgs, SamplingParams; "
        "import ironbatch.engine as e; "
        "assert (LLM, LLMEngine, EngineArgs) == (e.LLM, e.LLMEngine, e.EngineArgs); "
        "print(sorted({'torch', 'triton'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        ironbatch.Nope  # noqa: B018


def test_one_set_of_limits() -> None:
    from ironbatch.reference import limits

    assert core.LIMITS == limits.ALL


def test_the_root_kernels_folder_is_no_package_named_kernels() -> None:
    """From the repository root, ``kernels`` must not resolve to our folder as
    a package: Hugging Face's ``kernels`` has that name, and transformers
    imports whatever ``kernels`` resolves to when it probes for it."""
    import subprocess
    import sys

    pytest.importorskip("transformers")
    root = Path(__file__).resolve().parents[1]
    # Ours is the folder (resolved through the root's link); Hugging Face's
    # package, installed in a venv under the root, is not.
    folder = str((root / "kernels").resolve())
    code = (
        "import importlib.util, os, sys; "
        "spec = importlib.util.find_spec('kernels'); "
        "ours = spec is not None and spec.origin is not None and "
        f"os.path.dirname(os.path.realpath(spec.origin)) == {folder!r}; "
        "import transformers; transformers.LlamaConfig(); "
        "from transformers.utils import import_utils; import_utils.is_kernels_available(); "
        "print(ours, 'ironbatch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["False", "False"]
