"""exp and log for the portable profile: fp32 results that do not depend on which library kernel computed them.

Why: torch's CPU exp and log come from whichever vector library the build and the host select (SLEEF, or MKL's
VML, whose code path follows the CPU and, without its reproducibility mode, may follow the data's place in the
array), and ATen cuts a long elementwise call into chunks over its threads (2048-element grains for the VML
functions). Two kernels that differ in the last bits of an fp32 exp move a bf16 output now and then. A
`ws1 matrix --profile portable_cpu --op silu` run on a loaded 2-core host was red once in about 20 runs: 15 of
16384 elements one bf16 ulp off, the first at element 8192 of the packed call, which is where a two-thread
split of that call begins. That is the likely cause, not a proven one: 600 calls on an AMD host under 1 to 8
threads and 4 alignments never reproduced it (tests/ws1_kernels/test_portable_thread_counts.py).

Here the function is evaluated in fp64 and rounded once to fp32. Any two faithful fp64 kernels differ by a
few units in the 53rd bit, and that moves the fp32 result only when the exact value lies within about 2^-50
of an fp32 rounding midpoint: the same bits whatever kernel, thread count or alignment computed them, with
a probability of a difference below 2^-26 per element (and of reaching a bf16 output far below that).
"""

from __future__ import annotations

import torch


def exp(x: torch.Tensor) -> torch.Tensor:
    """``exp(x)`` in fp32 (evaluated in fp64, rounded once)."""
    return torch.exp(x.double()).float()


def log(x: torch.Tensor) -> torch.Tensor:
    """``log(x)`` in fp32 (evaluated in fp64, rounded once)."""
    return torch.log(x.double()).float()
