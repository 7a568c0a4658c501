"""Rotary-embedding math in fp32 with fp64 angles: the tables and the rotation, shared by the portable and
native candidates and by the fp32 reference (one copy of the arithmetic every side must agree on)."""

from __future__ import annotations

import torch


def rope_tables(positions: torch.Tensor, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``cos, sin`` of shape ``[T, 1, dim]`` (HF layout: the half-table repeated), angles in fp64.

    Pads (position -1) use position 0; their rows are never compared.  Shared with the fp32 reference.
    """
    half = dim // 2
    inv = 1.0 / (theta ** (torch.arange(0, half, dtype=torch.float64, device=positions.device) * 2.0 / dim))
    ang = positions.clamp(min=0).to(torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return torch.cos(ang).float()[:, None, :], torch.sin(ang).float()[:, None, :]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x*cos + rotate_half(x)*sin`` (fp32), ``rotate_half(x) = cat(-x2, x1)``."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


def rotate_transposed(g: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The transpose of ``rotate``: ``g*cos + rotate_half^T(g*sin)``, ``rotate_half^T(u) = cat(u2, -u1)``."""
    half = g.shape[-1] // 2
    u = g * sin
    return g * cos + torch.cat([u[..., half:], -u[..., :half]], dim=-1)
