"""The GPU check of ironbatch's Triton kernels, in one run: correctness
against the torch reference (bf16, fp16, fp32; the fused norm and RoPE
kernels against the model's torch path in bf16), the bandwidth ceiling,
decode attention against the roofline and torch SDPA (contiguous and
gathered KV), a sweep of decode launch choices (tile, warps, stages, block
size), a mixed prefill/decode batch, and the cache write. Prints a short
table last and writes every row to a CSV.

    python benches/gpu/kernel_bench.py --out kernels.csv     # on the GPU
    TRITON_INTERPRET=1 python benches/gpu/kernel_bench.py --dry-run   # CPU, toy sizes
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ironbatch.attention.paged_reference import reference_attention, reference_reshape_and_cache
from ironbatch.kernels import unified_attention as attention_module
from ironbatch.kernels.reshape_and_cache import reshape_and_cache
from ironbatch.kernels.rms_norm import rms_norm
from ironbatch.kernels.rope_and_cache import rope_and_cache
from ironbatch.kernels.unified_attention import LaunchConfig, unified_attention
from ironbatch.model.config import RopeConfig
from ironbatch.model.llama import RMSNorm
from ironbatch.model.rope import RotaryEmbedding, rotate

ROWS: list[dict[str, Any]] = []


def log(msg: str) -> None:
    print(msg, flush=True)


def record(**row: Any) -> None:
    ROWS.append(row)
    log("  " + ", ".join(f"{k}={v}" for k, v in row.items()))


class Bench:
    def __init__(self, device: str, dry: bool) -> None:
        self.device, self.dry = device, dry

    def time(self, fn: Callable[[], Any], graph: bool = False) -> float:
        """Median seconds per call (CUDA events and an L2 flush on the GPU)."""
        if self.dry:
            fn()
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        import triton.testing

        if graph:
            return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e-3
        return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e-3


def paged_batch(
    b: Bench,
    q_lens: list[int],
    seq_lens: list[int],
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype,
    block_size: int = 16,
    seed: int = 0,
) -> dict[str, Any]:
    """Random caches with permuted block tables; q for the last q_len positions."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    blocks = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks) + 1
    perm = torch.randperm(num_blocks - 1, generator=g) + 1
    table = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    at = 0
    for s, nb in enumerate(blocks):
        table[s, :nb] = perm[at : at + nb].to(torch.int32)
        at += nb
    dev = b.device
    k_cache = torch.randn(num_blocks, block_size, hkv, d, device=dev, dtype=dtype)
    v_cache = torch.randn(num_blocks, block_size, hkv, d, device=dev, dtype=dtype)
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    q = torch.randn(int(cu[-1]), hq, d, device=dev, dtype=dtype)
    return dict(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        cu=cu.to(dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        table=table.to(dev),
        scale=1 / math.sqrt(d),
        max_q=max(q_lens),
    )


def attend(x: dict[str, Any], out: torch.Tensor, **kw: Any) -> None:
    unified_attention(
        x["q"],
        x["k_cache"],
        x["v_cache"],
        out,
        x["cu"],
        x["seq_lens"],
        x["table"],
        x["scale"],
        x["max_q"],
        **kw,
    )


def correctness(b: Bench) -> None:
    log("== correctness against the torch reference (mixed batch, GQA 32:8 / toy)")
    hq, hkv, d = (8, 2, 64) if b.dry else (32, 8, 128)
    tol = {torch.float32: 2e-3 if not b.dry else 1e-5, torch.float16: 5e-3, torch.bfloat16: 1.5e-2}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = paged_batch(b, [1, 1, 7, 40], [300, 17, 64, 99], hq, hkv, d, dtype, seed=1)
        out = torch.full_like(x["q"], float("nan"))
        attend(x, out)
        want = reference_attention(
            x["q"].cpu(),
            x["k_cache"].cpu(),
            x["v_cache"].cpu(),
            x["cu"].cpu(),
            x["seq_lens"].cpu(),
            x["table"].cpu(),
            x["scale"],
        )
        err = (out.float().cpu() - want).abs().max().item()
        ok = err <= tol[dtype] * (1 + want.abs().max().item())
        record(check="attention", dtype=str(dtype).split(".")[-1], max_abs_err=f"{err:.2e}", ok=ok)
    tokens = 64
    kc = torch.zeros(16, 16, hkv, d, device=b.device, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    key = torch.randn(tokens, hkv, d, device=b.device, dtype=torch.bfloat16)
    val = torch.randn_like(key)
    slots = (torch.randperm(15 * 16)[:tokens] + 16).to(b.device)
    reshape_and_cache(key, val, kc, vc, slots)
    ok = torch.equal(kc.view(-1, hkv, d)[slots], key) and torch.equal(
        vc.view(-1, hkv, d)[slots], val
    )
    record(
        check="reshape_and_cache", dtype="bfloat16", max_abs_err="exact" if ok else "WRONG", ok=ok
    )
    fused_kernels(b)


def close(got: torch.Tensor, want: torch.Tensor, tol: float) -> tuple[str, bool]:
    err = (got.float().cpu() - want.float().cpu()).abs().max().item()
    return f"{err:.2e}", err <= tol * (1 + want.float().abs().max().item())


def fused_kernels(b: Bench) -> None:
    """The fused kernels against the model's torch path, in real bf16 (the
    interpreter computes it in fp32): Qwen3-0.6B's and Llama-3.2-1B's shapes."""
    dtype = torch.float32 if b.dry else torch.bfloat16
    tol = 1e-5 if b.dry else 1.6e-2
    g = torch.Generator(device="cpu").manual_seed(3)
    for hidden in (64,) if b.dry else (1024, 2048):
        x = torch.randn(64, hidden, generator=g).to(b.device, dtype)
        residual = torch.randn(64, hidden, generator=g).to(b.device, dtype)
        norm = RMSNorm(hidden, 1e-6).to(b.device, dtype)
        want, want_residual = norm(x, residual)
        got, got_residual = rms_norm(x.clone(), norm.weight.detach(), 1e-6, residual.clone())
        err, ok = close(got, want, tol)
        ok = ok and close(got_residual, want_residual, tol)[1]
        record(check=f"rms_norm+residual {hidden}", dtype=str(dtype)[6:], max_abs_err=err, ok=ok)
    shapes = [(4, 2, 16, True)] if b.dry else [(16, 8, 128, True), (32, 8, 64, False)]
    for hq, hkv, d, qk_norm in shapes:
        tokens = 64
        rope = RotaryEmbedding(d, RopeConfig(theta=1e6)).to(b.device)
        qkv = torch.randn(tokens, hq + 2 * hkv, d, generator=g).to(b.device, dtype)
        positions = torch.randperm(4096, generator=g)[:tokens].to(b.device)
        weights = [torch.rand(d, generator=g).to(b.device, dtype) + 0.5 for _ in range(2)]
        q_norm, k_norm = weights if qk_norm else (None, None)
        slots = (torch.randperm(63 * 16, generator=g)[:tokens] + 16).to(b.device)
        kc = torch.zeros(64, 16, hkv, d, device=b.device, dtype=dtype)
        vc, want_k, want_v = torch.zeros_like(kc), torch.zeros_like(kc), torch.zeros_like(kc)
        qk = qkv[:, : hq + hkv]
        if qk_norm:
            normed = torch.nn.functional.rms_norm(qk.float(), (d,), eps=1e-6).to(dtype)
            qk = torch.cat([q_norm.expand(hq, -1), k_norm.expand(hkv, -1)]) * normed
        cos, sin = rope(positions)
        qk = rotate(qk, cos.to(dtype), sin.to(dtype))
        reference_reshape_and_cache(qk[:, hq:], qkv[:, hq + hkv :], want_k, want_v, slots)
        table = rope.cos_sin_table(4096)
        got = qkv.clone()
        q = rope_and_cache(got, positions, table, kc, vc, slots, hq, q_norm, k_norm, 1e-6)
        err, ok = close(q, qk[:, :hq], 2 * tol)
        ok = ok and close(kc, want_k, 2 * tol)[1] and torch.equal(vc, want_v)
        record(check=f"rope_and_cache {hq}:{hkv}x{d}", dtype=str(dtype)[6:], max_abs_err=err, ok=ok)


def ceiling(b: Bench) -> float:
    log("== bandwidth ceiling")
    n = (1 << 16) if b.dry else (2 << 30)  # 4 GiB of bf16 on the GPU
    src = torch.randn(n, device=b.device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t_copy = b.time(lambda: dst.copy_(src))
    t_sum = b.time(lambda: src.sum())
    copy_bw = 2 * src.numel() * 2 / t_copy
    record(
        bench="ceiling",
        copy_TBps=f"{copy_bw / 1e12:.2f}",
        read_TBps=f"{src.numel() * 2 / t_sum / 1e12:.2f}",
    )
    return copy_bw


def decode(b: Bench, bw: float) -> list[dict[str, Any]]:
    log("== decode attention (bf16, block 16, permuted tables)")
    hq, hkv, d = (8, 2, 64) if b.dry else (32, 8, 128)
    shapes = (
        [(2, 64)]
        if b.dry
        else [(bs, L) for bs in (1, 8, 64, 128, 256) for L in (1024, 2048, 4096, 8192)]
    )
    dtype = torch.float32 if b.dry else torch.bfloat16
    table = []
    for bsz, L in shapes:
        x = paged_batch(b, [1] * bsz, [L] * bsz, hq, hkv, d, dtype, seed=bsz + L)
        out = torch.empty_like(x["q"])
        t = b.time(lambda x=x, out=out: attend(x, out))
        t_graph = t if b.dry else b.time(lambda x=x, out=out: attend(x, out), graph=True)
        esz = x["q"].element_size()
        nbytes = bsz * L * hkv * d * 2 * esz + bsz * hq * d * 2 * esz + bsz * -(-L // 16) * 4
        row = dict(
            bench="decode",
            B=bsz,
            L=L,
            us=f"{t * 1e6:.1f}",
            us_graph=f"{t_graph * 1e6:.1f}",
            roofline_pct=f"{100 * nbytes / t_graph / bw:.0f}",
        )
        if bsz * hkv < 128:  # auto picked split-KV: time the 2D grid too
            t2d = b.time(lambda x=x, out=out: attend(x, out, split_kv=False), graph=not b.dry)
            row["us_graph_2d"] = f"{t2d * 1e6:.1f}"
        if not b.dry and bsz in (64, 128) and L in (1024, 4096):
            row.update(sdpa_baselines(b, x, bsz, L, hq, hkv, d))
        record(**row)
        table.append(row)
        del x, out
    return table


def sdpa_baselines(
    b: Bench, x: dict[str, Any], bsz: int, L: int, hq: int, hkv: int, d: int
) -> dict[str, str]:
    """torch SDPA on contiguous KV (gather untimed), and gather + SDPA."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ids = x["table"].long()

    def gather() -> tuple[torch.Tensor, torch.Tensor]:
        k = x["k_cache"][ids].reshape(bsz, -1, hkv, d)[:, :L].transpose(1, 2)
        v = x["v_cache"][ids].reshape(bsz, -1, hkv, d)[:, :L].transpose(1, 2)
        return k, v

    k, v = gather()
    k, v = k.contiguous(), v.contiguous()
    q = x["q"].view(bsz, hq, 1, d)
    res = {}
    for name, backend in (
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ):
        try:
            with sdpa_kernel(backend):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                t = b.time(
                    lambda: torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, enable_gqa=True
                    )
                )
            res["sdpa_backend"] = name
            res["sdpa_us"] = f"{t * 1e6:.1f}"

            def gathered() -> torch.Tensor:
                kk, vv = gather()
                return torch.nn.functional.scaled_dot_product_attention(q, kk, vv, enable_gqa=True)

            with sdpa_kernel(backend):
                res["gather_sdpa_us"] = f"{b.time(gathered) * 1e6:.1f}"
            break
        except RuntimeError as e:
            res[f"{name}_error"] = str(e).splitlines()[0][:60]
    return res


@dataclass(frozen=True)
class SweepPoint:
    batch: int
    length: int
    block_size: int
    launch: LaunchConfig


def _points(batch: int, block_size: int, *choices: tuple[int, int, int]) -> list[SweepPoint]:
    return [
        SweepPoint(batch, 4096, block_size, LaunchConfig(tile=t, num_warps=w, num_stages=st))
        for t, w, st in choices
    ]


#: Launch choices (tile, warps, stages) tried at 128 x 4k (the 2D grid) and
#: 8 x 4k (split-KV); the first of each is the default.
SWEEP = [
    *_points(128, 16, (32, 4, 3), (64, 4, 3), (64, 8, 3), (32, 8, 3), (32, 4, 4), (16, 4, 3)),
    *_points(128, 32, (32, 4, 3)),
    *_points(8, 16, (32, 4, 3), (64, 4, 3)),
]


def sweep(b: Bench, bw: float) -> list[dict[str, Any]]:
    """Decode time for each launch choice (graph timing): what to set in
    ``unified_attention.LAUNCH_2D`` / ``LAUNCH_SPLIT_KV`` after a GPU run."""
    log("== decode launch sweep (bf16)")
    hq, hkv, d = (8, 2, 64) if b.dry else (32, 8, 128)
    dtype = torch.float32 if b.dry else torch.bfloat16
    points = SWEEP
    if b.dry:
        points = [
            SweepPoint(2, 64, 16, LaunchConfig(tile=16, num_warps=4, num_stages=3)),
            SweepPoint(2, 64, 32, LaunchConfig(tile=64, num_warps=4, num_stages=3)),
        ]
    rows = []
    for pt in points:
        x = paged_batch(b, [1] * pt.batch, [pt.length] * pt.batch, hq, hkv, d, dtype, pt.block_size)
        out = torch.empty_like(x["q"])
        launch = pt.launch
        kw = dict(tile=launch.tile, num_warps=launch.num_warps, num_stages=launch.num_stages)
        t = b.time(lambda x=x, out=out, kw=kw: attend(x, out, **kw), graph=not b.dry)
        esz = x["q"].element_size()
        nbytes = pt.batch * pt.length * hkv * d * 2 * esz + pt.batch * hq * d * 2 * esz
        split = pt.batch * hkv < attention_module.SPLIT_KV_BELOW_PROGRAMS
        row = dict(
            bench="decode_sweep",
            B=pt.batch,
            L=pt.length,
            path="split" if split else "2d",
            block=pt.block_size,
            tile=launch.tile,
            warps=launch.num_warps,
            stages=launch.num_stages,
            us_graph=f"{t * 1e6:.1f}",
            roofline_pct=f"{100 * nbytes / t / bw:.0f}",
        )
        record(**row)
        rows.append(row)
        del x, out
    return rows


def mixed(b: Bench) -> None:
    log("== mixed batch: 64 decodes at 2k + one 512-token chunk at context 2k")
    if b.dry:
        return
    hq, hkv, d = 32, 8, 128
    both = paged_batch(b, [1] * 64 + [512], [2048] * 64 + [2560], hq, hkv, d, torch.bfloat16)
    dec = paged_batch(b, [1] * 64, [2048] * 64, hq, hkv, d, torch.bfloat16)
    pre = paged_batch(b, [512], [2560], hq, hkv, d, torch.bfloat16)
    times = {}
    for name, x in (("mixed", both), ("decode_only", dec), ("prefill_only", pre)):
        out = torch.empty_like(x["q"])
        times[name] = b.time(lambda x=x, out=out: attend(x, out))
    record(bench="mixed", **{f"{k}_us": f"{v * 1e6:.1f}" for k, v in times.items()})


def cache_write(b: Bench, bw: float) -> None:
    log("== reshape_and_cache")
    hkv, d = (2, 64) if b.dry else (8, 128)
    for tokens in (16,) if b.dry else (64, 8192):
        nb = tokens // 16 + 64
        kc = torch.zeros(nb, 16, hkv, d, device=b.device, dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        key = torch.randn(tokens, hkv, d, device=b.device, dtype=torch.bfloat16)
        val = torch.randn_like(key)
        slots = (torch.randperm((nb - 1) * 16)[:tokens] + 16).to(b.device)
        t = b.time(
            lambda key=key, val=val, kc=kc, vc=vc, slots=slots: reshape_and_cache(
                key, val, kc, vc, slots
            )
        )
        nbytes = 2 * 2 * tokens * hkv * d * 2
        record(
            bench="cache_write",
            T=tokens,
            us=f"{t * 1e6:.1f}",
            roofline_pct=f"{100 * nbytes / t / bw:.0f}",
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU interpreter, toy sizes")
    ap.add_argument("--out", default="kernels.csv")
    a = ap.parse_args()
    if not a.dry_run and not torch.cuda.is_available():
        print("no CUDA device; use --dry-run", file=sys.stderr)
        return 2
    import triton

    b = Bench("cpu" if a.dry_run else "cuda", a.dry_run)
    name = "cpu (interpreter)" if a.dry_run else torch.cuda.get_device_name()
    log(f"device {name}, torch {torch.__version__}, triton {triton.__version__}")
    correctness(b)
    bw = ceiling(b)
    table = decode(b, bw)
    swept = sweep(b, bw)
    mixed(b)
    cache_write(b, bw)
    keys = sorted({k for r in ROWS for k in r})
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(ROWS)
    log(
        "\n| B | L | µs (launch) | µs (graph) | % of copy roofline | 2D grid µs (graph) "
        "| SDPA contiguous µs | gather+SDPA µs |"
    )
    log("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in table:
        log(
            f"| {r['B']} | {r['L']} | {r['us']} | {r['us_graph']} | {r['roofline_pct']} | "
            f"{r.get('us_graph_2d', '')} | {r.get('sdpa_us', '')} | {r.get('gather_sdpa_us', '')} |"
        )
    log("\n| sweep: B | L | path | block | tile | warps | stages | µs (graph) | % roofline |")
    log("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in swept:
        log(
            f"| {r['B']} | {r['L']} | {r['path']} | {r['block']} | {r['tile']} | {r['warps']} | "
            f"{r['stages']} | {r['us_graph']} | {r['roofline_pct']} |"
        )
    bad = [r for r in ROWS if r.get("ok") is False]
    log(f"correctness: {'FAILED ' + str(bad) if bad else 'all checks passed'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
