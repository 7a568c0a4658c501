"""Where the stock attention baseline spends its time on a GPU: SDPA per backend, mask form and key length.

The native attention sweep once spent most of its minute in about a thousand decode-step SDPA calls of ~55 ms
each. This probe times one decode-shaped call (one query, Qwen3-8B heads, bf16) for a run of new key lengths,
per backend and per way of stating causality (explicit boolean mask, no mask, causal flag), with and without
the harness's dispatch watch, and prints which fused kernel SDPA chose. Diagnostic only: it judges nothing.

    python ci/sdpa_probe.py [--lengths 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, KV_HEADS, DIM = 32, 8, 128


def _time(fn: Callable[[], torch.Tensor], repeats: int) -> float:
    """Median wall time in ms of `fn` after a device sync (the first call of a shape included separately)."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _inputs(n: int, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(length)
    q = torch.randn(1, HEADS, n, DIM, device="cuda", generator=g).bfloat16()
    k = torch.randn(1, HEADS, length, DIM, device="cuda", generator=g).bfloat16()
    v = torch.randn(1, HEADS, length, DIM, device="cuda", generator=g).bfloat16()
    return q, k, v


def _variants(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    n, length = q.shape[2], k.shape[2]
    qpos = torch.arange(length - n, length, device="cuda")
    mask = torch.arange(length, device="cuda")[None, :] <= qpos[:, None]
    return {
        "bool_mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        "no_mask": lambda: F.scaled_dot_product_attention(q, k, v),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, default=200, help="how many distinct key lengths (decode steps)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(
        "torch",
        torch.__version__,
        "device",
        torch.cuda.get_device_name(),
        "cudnn",
        torch.backends.cudnn.version(),
    )
    backends: dict[str, list[SDPBackend] | None] = {
        "default": None,
        "flash": [SDPBackend.FLASH_ATTENTION],
        "efficient": [SDPBackend.EFFICIENT_ATTENTION],
        "cudnn": [SDPBackend.CUDNN_ATTENTION],
        "math": [SDPBackend.MATH],
    }
    from ws1_harness.run.observe import observe  # the harness's own dispatch watch, as the sweep runs it

    base = (
        64  # every configuration gets key lengths no earlier one used: a plan cached by shape is not reused
    )
    for watch in (False, True):
        for bname, allowed in backends.items():
            for form in ("bool_mask", "no_mask"):
                first, steady, err = [], [], ""
                base += args.lengths
                for length in range(base, base + args.lengths):
                    q, k, v = _inputs(1, length)
                    fn = _variants(q, k, v)[form]
                    try:
                        ctxs = [sdpa_kernel(allowed)] if allowed else []
                        if watch:
                            ctxs.append(observe())
                        for c in ctxs:
                            c.__enter__()
                        try:
                            first.append(_time(fn, 1))
                            steady.append(_time(fn, args.repeats))
                        finally:
                            for c in reversed(ctxs):
                                c.__exit__(None, None, None)
                    except RuntimeError as exc:
                        err = str(exc).splitlines()[0][:80]
                        break
                if err:
                    print(f"watch={watch!s:5} {bname:9} {form:9}  unsupported: {err}")
                    continue
                print(
                    f"watch={watch!s:5} {bname:9} {form:9}  first call median {statistics.median(first):8.3f} ms"
                    f"  max {max(first):8.3f}  steady {statistics.median(steady):7.3f} ms  over {len(first)} lengths"
                )
    q, k, v = _inputs(1, 300)
    qpos = torch.arange(299, 300, device="cuda")
    mask = torch.arange(300, device="cuda")[None, :] <= qpos[:, None]
    for name, m in (("bool_mask", mask), ("no_mask", None)):
        print("chosen backend", name, torch._fused_sdp_choice(q, k, v, m, 0.0, False))


if __name__ == "__main__":
    main()
