"""The Hopper logp's two load paths under compute-sanitizer: one forward and one backward each of the 16-byte path
(aligned rows, V % 8 == 0) and of the scalar path (rows 2 bytes off a 16-byte boundary, and V % 8 != 0, whose last
vector is partial), at the full vocabulary and at odd widths; then linear_logp's fused forward (the GEMM with the
log-sum-exp epilogue, and the fold of its partials) in each M bucket's tile (1 and 7 rows: 64 x 128; 70 and 130:
128 x 128, both sides of its 128 rows; 1100: 128 x 256), with vocabularies whose last 128-wide block is partial, or
(V = 120 in the 256-wide tile) whose tile's second block lies wholly past V; then the weight gradient
(`ws1_sm90.wgrad`: its gather and its wgmma kernel) over tables with empty slots, with and without the hi + lo
split; then every GEMM tile (`ws1_sm90.gemm_tile`, the mid bucket's wide 128 x 192 among them), forward and dx, at
sizes that end in partial tiles.

`ci/sanitize_cuda.py` drives the candidates on the bench's inputs, which are fresh (aligned) allocations of the
tiny widths: the scalar path and the partial last vector would never run under the sanitizer. This driver makes
them run. It needs the Hopper module (`ws1_cuda_sm90_ext`) on the path and an sm_90 device; exit 0 when every
call returned and the paths were the ones asked for, else one line and exit 1.

    compute-sanitizer --tool memcheck --error-exitcode 1 python ci/sanitize_logp_sm90.py

(no kernel filter: the CUTLASS kernel's name is CUTLASS's; every kernel this script launches is checked)
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch


def _call(ext: object, rows: int, vocab: int, skew: bool) -> str:
    n = rows * vocab
    buf = torch.randn(n + 8, device="cuda").to(torch.bfloat16)
    logits = (buf[1 : 1 + n] if skew else buf[:n]).view(rows, vocab)
    targets = torch.arange(rows, device="cuda", dtype=torch.int64) * 7 % vocab
    g = torch.ones(rows, device="cuda")
    vector = bool(ext.logp_vector_path(logits))  # type: ignore[attr-defined]
    want = not skew and vocab % 8 == 0
    if vector != want:
        raise RuntimeError(f"rows {rows} V {vocab} skew {skew}: vector path {vector}, expected {want}")
    _, lse = torch.ops.ws1_sm90.logp_fwd(logits, targets)
    torch.ops.ws1_sm90.logp_bwd(logits, targets, lse, g)
    torch.cuda.synchronize()
    return "16-byte" if vector else "scalar"


def _fused(rows: int, vocab: int, hidden: int) -> str:
    x = torch.randn(rows, hidden, device="cuda").to(torch.bfloat16)
    w = torch.randn(vocab, hidden, device="cuda").to(torch.bfloat16)
    targets = torch.arange(rows, device="cuda", dtype=torch.int64) * 7 % vocab
    out, _ = torch.ops.ws1_sm90.linear_logp_fwd(x, w, targets)
    torch.cuda.synchronize()
    if not bool(torch.isfinite(out).all()):
        raise RuntimeError("a non-finite logprob")
    return "fused forward ok"


def _wgrad(n: int, k: int, lengths: tuple[int, ...], split: bool) -> str:
    """The Hopper weight gradient (wip: ws1_sm90.wgrad) over the blocks of samples of `lengths` (empty slots, a
    partial last stage), with dy split as hi + lo or not."""
    from ws1_kernels import LayoutContext
    from ws1_kernels.row_tables import block_table

    ids = torch.cat([torch.full((m,), s, dtype=torch.int64) for s, m in enumerate(lengths)])
    pos = torch.cat([torch.arange(m, dtype=torch.int64) for m in lengths])
    rows = int(ids.shape[0])
    dy = torch.randn(rows, n, device="cuda").to(torch.bfloat16)
    x = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
    lo = (dy.float() * 2.0**-9).to(torch.bfloat16) if split else None
    table = block_table(LayoutContext(ids, pos), rows, dy.device)
    mg = torch.zeros(n, k, device="cuda")
    torch.ops.ws1_sm90.wgrad(dy, x, table.rows, table.n_blocks, mg, lo)
    torch.cuda.synchronize()
    if not bool(torch.isfinite(mg).all()):
        raise RuntimeError("a non-finite weight gradient")
    return "weight gradient ok"


def _gemm_tile(tile: int, m: int, n: int, k: int) -> str:
    """One forward (b [n, k]) and one dx (b [k, n]) on `tile`, checked finite."""
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    fwd = torch.ops.ws1_sm90.gemm_tile(a, w, True, tile)
    dx = torch.ops.ws1_sm90.gemm_tile(torch.randn(m, n, device="cuda").to(torch.bfloat16), w, False, tile)
    torch.cuda.synchronize()
    if not (bool(torch.isfinite(fwd).all()) and bool(torch.isfinite(dx).all())):
        raise RuntimeError("a non-finite output")
    return "forward and dx ok"


def main() -> int:
    from ws1_kernels import cuda_sm90

    ext = cuda_sm90.extension()
    if ext is None or not torch.cuda.is_available():
        print(f"sanitize_logp_sm90: {cuda_sm90.missing_reason() or 'no CUDA device'}", file=sys.stderr)
        return 1
    # (label, the call, the ops it calls: logp's forward and backward, or the fused forward): one line each, the
    # first failure ends the run
    cases: list[tuple[str, Callable[[], str], int]] = [
        (f"rows={r} V={v} skew={k}", lambda r=r, v=v, k=k: f"{_call(ext, r, v, k)} path ok", 2)
        for r, v, k in ((3, 151936, False), (3, 151936, True), (5, 1001, False), (1, 8, False), (2, 9, True))
    ]
    cases += [
        (f"linear_logp rows={r} V={v} H={h}", lambda r=r, v=v, h=h: _fused(r, v, h), 1)
        for r, v, h in (
            (1, 136, 64),
            (7, 1000, 64),
            (70, 120, 64),
            (130, 1000, 128),
            (1100, 1000, 64),
            (1100, 120, 64),
            (3, 151936, 64),
        )
    ]
    cases += [
        (f"wgrad N={n} K={k} samples={ls} split={sp}", lambda n=n, k=k, ls=ls, sp=sp: _wgrad(n, k, ls, sp), 1)
        for n, k, ls, sp in (
            (128, 128, (5,), False),
            (256, 384, (5, 17, 33), True),
            (128, 256, (70, 1), False),
        )
    ]
    # every GEMM tile (ws1_sm90.gemm_tile: small, mid, large, the mid bucket's wide 128 x 192) forward and dx, at
    # rows and widths that end in partial tiles of each
    cases += [
        (f"gemm_tile tile={t} M={m} N={n} K={k}", lambda t=t, m=m, n=n, k=k: _gemm_tile(t, m, n, k), 2)
        for t in (0, 1, 2, 3)
        for m, n, k in ((7, 200, 136), (130, 392, 256))
    ]
    calls = 0
    for label, run, ops in cases:
        try:
            what = run()
        except Exception as exc:  # noqa: BLE001 - one line, then the exit status
            print(f"sanitize_logp_sm90 {label}: {str(exc).splitlines()[0]}", flush=True)
            return 1
        calls += ops
        print(f"sanitize_logp_sm90 {label}: {what}", flush=True)
    print(f"sanitize_logp_sm90: {calls} calls, every path ran", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
