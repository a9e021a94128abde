"""The model families people swap the scheduler under, each from
``VllmConfig``s built as ``vllm serve`` builds them (the deployment table's
rows, ``test_vllm_deployments.py``): random workloads through vLLM's own
EngineCore and one with ``--scheduler-cls ironbatch.vllm.Scheduler`` in
lockstep, equal at every step, at least PER_FAMILY of them per family in
each run, split over the family's rows and both flavours (``cpu-host``:
synchronous scheduling on model runner V1; ``gpu-defaults``: asynchronous
on V2).

Each row runs with a short model length, a small step budget (chunked
prefills) and a pool a few requests fill (``--num-gpu-blocks-override``), so
that its workloads preempt, hit prefixes cached by earlier ones, and cross
block boundaries of every group (``deployment_setup.random_workload``).

Each family's comparison must catch a drop-in broken in a way that only
that family shows (``deployment_setup.MUTATIONS``). And beyond the
families, every row that generates text (its connector, drafter, windows,
LoRA, images or parallelism) runs a few random workloads too, at the cache
vLLM sizes for it."""

from __future__ import annotations

from collections import Counter
from typing import Any, NamedTuple

import pytest

pytest.importorskip("vllm")

from test_vllm_deployments import FLAVORS, NOT_YET, TABLE, build_rows  # noqa: E402

from seeded import Workloads  # noqa: E402

# Workloads per family in a run, and at full size (IRONBATCH_FULL=1).
PER_FAMILY, FULL_PER_FAMILY = 100, 400
# Workloads a mutated drop-in gets to show its break.
MUTATION_WORKLOADS = 20
# Workloads per row and flavour in the sweep of every deployment row that
# generates text, and at full size.
SWEEP, FULL_SWEEP = 4, 16


class FamilyRow(NamedTuple):
    """A deployment row (a ``TABLE`` id) as the family runs it."""

    row: str
    blocks: int  # --num-gpu-blocks-override: a few requests fill the pool
    max_model_len: int = 1024


class Family(NamedTuple):
    """A model family: its deployment rows, and the mutation it must catch."""

    rows: tuple[FamilyRow, ...]
    # What a broken drop-in does (a key of deployment_setup.MUTATIONS), on
    # the first row, in the flavour named.
    mutation: str
    mutation_flavor: str = "gpu-defaults"


FAMILIES = {
    # Linear attention beside full attention, "align" and "none", with
    # MTP drafting (two drafts: 16-token attention blocks; three: 1,072,
    # with KV-cache events too).
    "qwen3-next": Family(
        (
            FamilyRow("qwen3-next-80b-a3b", 160),
            FamilyRow("qwen3-next-80b-a3b-mtp", 160),
            FamilyRow("qwen3-next-80b-a3b-mtp-3", 40, max_model_len=4096),
            FamilyRow("qwen3-next-80b-a3b-mtp-3-kv-events", 40, max_model_len=4096),
            FamilyRow("qwen3-next-80b-a3b-no-prefix-caching", 160),
            FamilyRow("qwen3-next-80b-a3b-mtp-no-prefix-caching", 160),
        ),
        "every recurrent state kept cached",
    ),
    # Mamba2 beside attention: prefill checkpoints inside a chunk.
    "nemotron-h": Family(
        (FamilyRow("nemotron-h-8b", 160), FamilyRow("nemotron-h-8b-no-prefix-caching", 160)),
        "every recurrent state kept cached",
    ),
    "granite-4.0-h": Family(
        (
            FamilyRow("granite-4.0-h-small", 160),
            FamilyRow("granite-4.0-h-small-no-prefix-caching", 160),
        ),
        "every recurrent state kept cached",
    ),
    "jamba": Family(
        (FamilyRow("jamba-v0.1", 160), FamilyRow("jamba-v0.1-no-prefix-caching", 160)),
        "every recurrent state kept cached",
        mutation_flavor="cpu-host",
    ),
    # Sliding windows beside full attention with an EAGLE-3 drafter, KV-cache
    # events and metrics; with lookahead hashes off (the block drop); and
    # KV-cache events beside windows of their own block size (fp8 full
    # attention in 64-token blocks, bf16 windows in 32).
    "gpt-oss-eagle3": Family(
        (
            FamilyRow("gpt-oss-20b-eagle3-events-metrics", 72),
            FamilyRow("gpt-oss-20b-eagle3-block-drop", 72),
            FamilyRow("gpt-oss-20b-fp8-skip-windows-kv-events", 72),
        ),
        "windows 16 tokens wider",
    ),
    "deepseek-v3-mtp3": Family(
        (FamilyRow("deepseek-v3-mtp3", 72),), "no prefill read-ahead for the MTP modules"
    ),
    "deepseek-v2-lite-tp2-dcp2": Family(
        (FamilyRow("deepseek-v2-lite-tp2-dcp2", 56),),
        "blocks not widened by decode context parallelism",
    ),
    # CPU offloading (vLLM's OffloadingConnector) of a hybrid model and a
    # dense one.
    "cpu-offloading": Family(
        (FamilyRow("gpt-oss-20b-cpu-offloading", 128), FamilyRow("cpu-offloading", 128)),
        "no shared-prefix boundary on vLLM's Request",
    ),
    # Priority scheduling on an MoE model: preemption by priority.
    "priority-policy": Family(
        (FamilyRow("priority-policy", 96),), "the priority policy taken as FCFS"
    ),
    "pipeline-parallel-2-ngram": Family(
        (FamilyRow("pipeline-parallel-2-ngram", 96),), "drafts one token short", "cpu-host"
    ),
}
ROWS = {row.id: row for row in TABLE}


def small(flags: list[str], max_model_len: int = 1024) -> list[str]:
    """A row's flags with a short model length and a 256-token step budget
    (chunked prefills)."""
    return flags + ["--max-model-len", str(max_model_len), "--max-num-batched-tokens", "256"]


def family_row(
    family: str, member: FamilyRow, flavor: str, random: dict[str, int], mutation: str = ""
) -> dict[str, Any]:
    """What deployment_setup.py builds and runs for one row of a family."""
    row = ROWS[member.row]
    flags = small(row.flags, member.max_model_len)
    flags += ["--num-gpu-blocks-override", str(member.blocks)]
    return {
        **row._asdict(),
        "id": f"{family}/{row.id}",
        "flags": flags,
        "flavor": flavor,
        "random": random,
        "mutation": mutation,
    }


def members(family: str) -> list[tuple[FamilyRow, str]]:
    """A family's rows, each in each of its flavours."""
    return [(m, f) for m in FAMILIES[family].rows for f in ROWS[m.row].flavors]


@pytest.fixture(scope="module")
def report(workloads: Workloads, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every family's rows in both flavours, each with its share of the
    family's workloads (seeded from the run's seed), in one child process."""
    rows = []
    for family in FAMILIES:
        pairs = members(family)
        count = -(-workloads.size(PER_FAMILY, FULL_PER_FAMILY) // len(pairs))
        for member, flavor in pairs:
            (seed,) = workloads.seeds(1, 1, part=f"{family}/{member.row}[{flavor}]")
            rows.append(family_row(family, member, flavor, {"seed": seed, "count": count}))
    return build_rows(rows, tmp_path_factory.mktemp("families"), timeout=1200)


def built(report: dict[str, Any], family: str, member: FamilyRow, flavor: str) -> dict[str, Any]:
    """The row's entry in the report: built, and the drop-in engaged."""
    entry = report[f"{family}/{member.row}[{flavor}]"]
    assert "error" not in entry, entry.get("error")
    assert entry["engaged"], entry["warnings"]
    return entry


@pytest.mark.parametrize("family", FAMILIES)
def test_random_workloads_agree_with_vllm(
    report: dict[str, Any], workloads: Workloads, family: str
) -> None:
    """Every workload of the family equal to vLLM's at every step (what the
    workers got, grammar masks, outputs, events, the engines' final state),
    at least PER_FAMILY of them over sync and async; and together they went
    through what the family is about: preemptions, prefix hits where prefix
    caching is on, drafts where it speculates, events where they are on."""
    totals: Counter[str] = Counter()
    needed = {"preempted", "finished_length"}
    for member, flavor in members(family):
        entry = built(report, family, member, flavor)
        assert entry["parity"]["mismatch"] is None, entry["parity"]["mismatch"]
        random = entry["random"]
        assert random["mismatch"] is None, random["mismatch"]
        totals.update(random["exercised"])
        totals[f"workloads [{flavor}]"] += random["exercised"]["workloads"]
        facts = entry["drop_in"]
        needed |= {"local_hits"} if facts["enable_prefix_caching"] else set()
        needed |= {"spec_drafts"} if facts["num_speculative_tokens"] else set()
        needed |= {"kv_events"} if facts["kv_events"] else set()
    assert totals["workloads"] >= workloads.size(PER_FAMILY, FULL_PER_FAMILY), totals
    for flavor in FLAVORS:
        assert totals[f"workloads [{flavor}]"] > 0, (flavor, totals)
    for what in needed:
        assert totals[what] > 0, (what, totals)


@pytest.fixture(scope="module")
def mutated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each family's first row, in its mutation's flavour, with the drop-in
    broken the family's way, through MUTATION_WORKLOADS random workloads."""
    rows = [
        family_row(
            family,
            spec.rows[0],
            spec.mutation_flavor,
            {"seed": 0, "count": MUTATION_WORKLOADS},
            mutation=spec.mutation,
        )
        for family, spec in FAMILIES.items()
    ]
    return build_rows(rows, tmp_path_factory.mktemp("mutations"), timeout=600)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_drop_in_broken_the_familys_way_is_caught(mutated: dict[str, Any], family: str) -> None:
    """A difference from vLLM, or the broken drop-in tripping over its own
    inconsistent state (a ValueError raised in ironbatch: e.g. more tokens
    sampled than the drafts it kept allow)."""
    spec = FAMILIES[family]
    entry = mutated[f"{family}/{spec.rows[0].row}[{spec.mutation_flavor}]"]
    if "error" in entry:
        last = entry["error"].strip().splitlines()
        assert last[-1].startswith("ValueError") and "/ironbatch/" in "".join(last[-4:]), last
        return
    assert entry["engaged"], entry["warnings"]
    mismatch = entry["parity"]["mismatch"] or (entry.get("random") or {}).get("mismatch")
    assert mismatch is not None, f"{spec.mutation!r} went unnoticed"


def generates_text(row: Any) -> bool:
    """Whether a row's engine takes the random workloads' requests: text
    generation (not pooling, Whisper's transcriptions or the encoder alone)."""
    return (
        row.expect.get("runner_type", "generate") == "generate"
        and "--runner" not in row.flags
        and not row.expect.get("is_encoder_decoder")
        and "--mm-encoder-only" not in row.flags
    )


# (Not the rows that fall back: vLLM's scheduler on both sides.)
SWEPT = [row for row in TABLE if generates_text(row) and row.id not in NOT_YET]


@pytest.fixture(scope="module")
def swept(workloads: Workloads, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every row that generates text, in each of its flavours, through
    SWEEP random workloads (the cache sized by vLLM from the row's model, a
    short model length and a 256-token budget)."""
    rows = []
    for row in SWEPT:
        for flavor in row.flavors:
            (seed,) = workloads.seeds(1, 1, part=f"sweep/{row.id}[{flavor}]")
            count = workloads.size(SWEEP, FULL_SWEEP)
            random = {"seed": seed, "count": count}
            rows.append(
                {**row._asdict(), "flags": small(row.flags), "flavor": flavor, "random": random}
            )
    return build_rows(rows, tmp_path_factory.mktemp("sweep"), timeout=900)


@pytest.mark.parametrize(
    ("row", "flavor"), [pytest.param(r, f, id=f"{r.id}-{f}") for r in SWEPT for f in r.flavors]
)
def test_every_deployment_row_agrees_on_random_workloads(
    swept: dict[str, Any], row: Any, flavor: str
) -> None:
    """Beyond the families: each deployment row's own configuration (its
    connector, drafter, windows, LoRA or parallelism) through random
    workloads, equal to vLLM's at every step."""
    entry = swept[f"{row.id}[{flavor}]"]
    assert "error" not in entry, entry.get("error")
    assert entry["engaged"], entry["warnings"]
    assert entry["parity"]["mismatch"] is None, entry["parity"]["mismatch"]
    assert entry["random"]["mismatch"] is None, entry["random"]["mismatch"]
    assert entry["random"]["exercised"]["workloads"] > 0
