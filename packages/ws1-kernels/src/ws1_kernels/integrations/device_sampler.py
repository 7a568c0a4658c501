"""Gumbel-max sampling on the logits' own device, with noise keyed by (seed, request id, position, vocab id).

Why: ``rollout.GumbelSampler`` draws each row's noise on the host from a generator seeded per (request, position):
one host loop per row and the logits copied to the host every step. Here the noise is a counter-based hash of the
key, computed with integer tensor ops for all rows at once wherever the logits are, so a step samples with a few
kernels and one small copy of the chosen ids back.

Batch invariance by construction: the noise of element ``(row, v)`` is a pure function of ``(seed, request id,
position, v)``; ``logits / temperature + noise`` is elementwise and ``argmax`` returns the first maximal index
whatever the batch, so a token never depends on the other rows or their order.

The hash is MurmurHash3's 32-bit finaliser (a bijection with good avalanche), chained over the key's 32-bit words;
two finalised words give a 53-bit uniform in (0, 1). Multiplications are done modulo 2^32 in 16-bit halves, so no
intermediate leaves int64's range (torch leaves signed overflow undefined). It is not a cryptographic generator:
sampling needs independent-looking, reproducible draws, not secrecy. Integer ops are exact on every device; the
float64 ``log`` may differ by an ulp between a CPU and a GPU, so the same key can pick another token across
devices only where two candidates are within that ulp.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import KernelInputError

_M32 = 0xFFFFFFFF
_C1 = 0x85EBCA6B
_C2 = 0xC2B2AE35
_ROW = 0x9E3779B9  # mixed into the seed word, so seed 0 does not start from 0
_SECOND = 0x68E31DA4  # mixed into the first word to draw the second


def mulmod32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2^32`` for int64 ``x`` in ``[0, 2^32)``: in 16-bit halves, so every product stays below 2^48."""
    lo = (x & 0xFFFF) * c
    hi = ((x >> 16) * c) & 0xFFFF
    return (lo + (hi << 16)) & _M32


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's finaliser on int64 tensors holding 32-bit values (a bijection of ``[0, 2^32)``)."""
    h = h ^ (h >> 16)
    h = mulmod32(h, _C1)
    h = h ^ (h >> 13)
    h = mulmod32(h, _C2)
    return h ^ (h >> 16)


def _words(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The low and high 32-bit words of non-negative int64 values."""
    return values & _M32, (values >> 32) & _M32


def row_keys(seed: int, request_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per row: the finaliser chained over the words of (seed, request id, position)."""
    h = fmix32(torch.full_like(request_ids, (seed & _M32) ^ _ROW))
    h = fmix32(h ^ ((seed >> 32) & _M32))
    for words in (_words(request_ids), _words(positions)):
        for w in words:
            h = fmix32(h ^ w)
    return h


def uniforms(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """float64 ``[R, vocab]`` uniforms in (0, 1): element (r, v) from two finalised words of (key r, v)."""
    v = torch.arange(vocab, dtype=torch.int64, device=keys.device)
    a = fmix32(keys[:, None] ^ v[None, :])
    b = fmix32(a ^ _SECOND)
    bits53 = (a >> 5) * (1 << 26) + (b >> 6)  # 27 + 26 bits
    return (bits53.to(torch.float64) + 0.5) * 2.0**-53


class DeviceGumbelSampler:
    """``argmax(logits / temperature + g)`` on the logits' device; ``g`` Gumbel noise keyed by (seed, request id,
    position of the sampled token, vocab id). ``temperature == 0`` is greedy. Equivalent in distribution to softmax
    sampling at the temperature."""

    def __init__(self, seed: int, temperature: float = 1.0) -> None:
        if not temperature >= 0:
            raise KernelInputError(f"DeviceGumbelSampler: temperature must be >= 0, got {temperature!r}")
        if seed < 0:
            raise KernelInputError(f"DeviceGumbelSampler: seed must be >= 0, got {seed}")
        self.seed = int(seed)
        self.temperature = float(temperature)

    def keys(self, rows: int, request_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The rows' keys (a test overrides it with the batch index to show the damage that keying prevents)."""
        return row_keys(self.seed, request_ids, positions)

    def noise(self, request_ids: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
        """float64 Gumbel noise ``[R, vocab]`` of the rows' keys."""
        u = uniforms(self.keys(request_ids.shape[0], request_ids, positions), vocab)
        return -torch.log(-torch.log(u))

    def sample(
        self, logits: torch.Tensor, request_ids: Sequence[int], positions: Sequence[int]
    ) -> torch.Tensor:
        """One token per row of ``logits [R, V]`` (int64, on the logits' device)."""
        if logits.dim() != 2 or len(request_ids) != logits.shape[0] or len(positions) != logits.shape[0]:
            raise KernelInputError(
                f"DeviceGumbelSampler: logits {tuple(logits.shape)} need one request id and one position per row "
                f"(got {len(request_ids)} and {len(positions)})"
            )
        if any(r < 0 for r in request_ids) or any(p < 0 for p in positions):
            raise KernelInputError("DeviceGumbelSampler: request ids and positions must be >= 0")
        x = logits.detach().to(torch.float64)
        if self.temperature == 0:
            return torch.argmax(x, dim=-1)
        dev = logits.device
        rid = torch.tensor(list(request_ids), dtype=torch.int64).to(dev, non_blocking=True)
        pos = torch.tensor(list(positions), dtype=torch.int64).to(dev, non_blocking=True)
        return torch.argmax(x / self.temperature + self.noise(rid, pos, x.shape[1]), dim=-1)
