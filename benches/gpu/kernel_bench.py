"""The GPU check of ironbatch's Triton kernels, in one run: correctness
against the torch reference (bf16, fp16, fp32), the bandwidth ceiling, decode
attention against the roofline and torch SDPA (contiguous and gathered KV),
a mixed prefill/decode batch, and the cache write. Prints a short table last
and writes every row to a CSV.

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
from typing import Any

import torch

from ironbatch.attention.paged_reference import reference_attention
from ironbatch.kernels.reshape_and_cache import reshape_and_cache
from ironbatch.kernels.unified_attention import unified_attention

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
    bad = [r for r in ROWS if r.get("ok") is False]
    log(f"correctness: {'FAILED ' + str(bad) if bad else 'all checks passed'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
