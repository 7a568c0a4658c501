"""Full Qwen3-8B widths run (hidden 4096, 32/8 heads x 128, vocab 151936) on the primary tier's 59 tokens.

Measured by hand (portable_cpu, fwd+bwd, 2 shared cores, see docs/kernels.md): det_gemm 4096x4096 0.65 s packed,
attention 0.04 s, lm_head 4096x151936 10 s packed / 24 s as four B=1 calls.

The full-vocabulary lm_head has no test here: `nox -s cpu_contract` judges it at these widths in the gated matrix
(`lm_head` on the short and primary tiers: output and both gradients against the fp32 reference, every layout bit
for bit), which holds every assertion the test made (the shapes, a finite output, a non-zero dx). It took 19-27 s
of the pytest step for nothing the matrix did not check again.
"""

from __future__ import annotations

import pytest
import torch
from kernels_support import Batch, assert_bitwise, layout, make_case, run

from ws1_kernels import registry

FULL = dict(hidden=4096, vocab=151936, inter=12288, heads=32, kv_heads=8, head_dim=128, out=4096)
PRIMARY = Batch((11, 16, 13, 19), (4, 7, 5, 6))


@pytest.mark.slow
@pytest.mark.parametrize("op", ["det_gemm", "attention"])
def test_full_width_invariant(op: str) -> None:
    cand = registry.resolve("portable_cpu", op)
    case = make_case(op, PRIMARY, FULL)
    a = run(cand.fn, case, PRIMARY, layout(PRIMARY, "packed"), rule=cand.param_grad_rule)
    b = run(cand.fn, case, PRIMARY, layout(PRIMARY, "split_1"), rule=cand.param_grad_rule)
    assert torch.isfinite(a.out.float()).all()
    assert_bitwise(f"{op} out", b.out, a.out)
    for name in a.grads:
        assert_bitwise(f"{op} d{name}", b.grads[name], a.grads[name])
    for name in a.pgrads:
        assert_bitwise(f"{op} main_grad", b.pgrads[name], a.pgrads[name])
