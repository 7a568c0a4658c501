"""The stock model a user would otherwise run, for the whole-model step rows: transformers' own Qwen3 on the
candidate's weight tensors, with the attention a user would pick for the call.

- Decode (`decode_graph`): `attn_implementation="sdpa"`, torch's default SDPA backend selection.
- A packed training call (`train_step`): several samples in one row, attention over each sample alone through
  torch's varlen flash attention (`torch.nn.attention.varlen.varlen_attn`, the flash-attention kernels torch
  ships), registered with transformers as the attention implementation `VARLEN` and fed the call's
  `cu_seq_lens` the way transformers feeds flash-attention's varlen path. A padded batch or one SDPA over a
  block-diagonal mask would be a weakened stock.

`PER_SAMPLE` is the CPU tests' stand-in for the varlen kernel (one SDPA per sample; no CUDA, no flash): the
bench refuses it as a peer on a GPU.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

#: transformers attention implementations registered here
VARLEN = "ws1_stock_varlen"
PER_SAMPLE = "ws1_stock_per_sample_sdpa"


def causal_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int, scale: float
) -> torch.Tensor:
    """Causal attention of each sample of a packed call, ``[T, Hq, D]``, by torch's varlen flash attention.

    Its keyword arguments changed across torch releases (``is_causal`` then ``window_size``; ``enable_gqa`` and
    ``scale`` later): the ones this torch has are used, and kv heads are repeated where it has no GQA."""
    from torch.nn.attention import varlen

    return varlen_call(varlen.varlen_attn, q, k, v, cu, max_len, scale)  # type: ignore[no-any-return]


def varlen_call(fn: Callable[..., Any], q, k, v, cu, max_len: int, scale: float) -> Any:  # type: ignore[no-untyped-def]
    """Call ``fn`` (a ``varlen_attn`` of some torch release) for a causal GQA packed call."""
    params = inspect.signature(fn).parameters
    kw: dict[str, Any] = {}
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        else:
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if "is_causal" in params:
        kw["is_causal"] = True
    elif "window_size" in params:
        kw["window_size"] = (-1, 0)
    else:
        raise RuntimeError("torch.nn.attention.varlen.varlen_attn takes neither is_causal nor window_size")
    if "scale" in params:
        kw["scale"] = scale
    elif abs(scale - q.shape[-1] ** -0.5) > 1e-12:
        raise RuntimeError(f"this torch's varlen_attn has no scale argument and the model's is {scale}")
    cu32 = cu.to(torch.int32)
    return fn(q, k, v, cu32, cu32, max_len, max_len, **kw)


def per_sample_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int, scale: float
) -> torch.Tensor:
    """The CPU stand-in: causal SDPA over each sample alone (the same function as ``causal_varlen``)."""
    out = torch.empty_like(q)
    bounds = cu.tolist()
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        o = torch.nn.functional.scaled_dot_product_attention(
            q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1),
            is_causal=True, scale=scale, enable_gqa=True,
        )  # fmt: skip
        out[a:b] = o.transpose(0, 1)
    return out


def _interface(kernel: Callable[..., torch.Tensor]) -> Callable[..., tuple[torch.Tensor, None]]:
    """transformers' attention-function convention around a packed ``[T, H, D]`` kernel (one row, B = 1)."""

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):  # type: ignore[no-untyped-def]
        cu = kwargs.get("cu_seq_lens_q")
        if cu is None or query.shape[0] != 1:
            raise RuntimeError(f"{VARLEN}: a packed call of one row with cu_seq_lens_q is needed")
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [1, H, T, D] -> [T, H, D]
        out = kernel(q, k, v, cu, int(kwargs["max_length_q"]), float(scaling))
        return out[None], None  # [1, T, Hq, D]

    return attention


def register() -> None:
    """Make ``VARLEN`` and ``PER_SAMPLE`` transformers attention implementations (masks: none, as for
    flash-attention's varlen path: the sample bounds are the mask)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    flash_mask = ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"]
    for name, kernel in ((VARLEN, causal_varlen), (PER_SAMPLE, per_sample_sdpa)):
        AttentionInterface.register(name, _interface(kernel))
        AttentionMaskInterface.register(name, flash_mask)


def stock_model(
    hf_config: Any, weights: dict[str, torch.Tensor], device: str, attn: str = "sdpa"
) -> torch.nn.Module:
    """transformers' own Qwen3 on ``weights`` (the candidate's tensors: no copy), attention ``attn``."""
    import transformers

    if attn in (VARLEN, PER_SAMPLE):
        register()
    cfg = hf_config.__class__.from_dict(hf_config.to_dict())
    cfg._attn_implementation = attn
    with torch.device("meta"):  # no second copy of the weights: they are assigned below
        model = transformers.Qwen3ForCausalLM(cfg)
    model.load_state_dict({k: v.to(device) for k, v in weights.items()}, strict=True, assign=True)
    # the rotary table is a buffer, not a weight: built again on the device (it stayed on meta)
    with torch.device(device):
        model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg)
    return model


def packed_kwargs(lengths: tuple[int, ...] | list[int], device: Any) -> dict[str, Any]:
    """What transformers' varlen path takes for one packed row: positions restarting per sample and the bounds."""
    n = torch.tensor(list(lengths), dtype=torch.int64)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(n, 0)
    starts = torch.repeat_interleave(cu[:-1], n)
    positions = torch.arange(int(cu[-1])) - starts
    cu_d = cu.to(device)
    return {
        "position_ids": positions[None].to(device),
        "cu_seq_lens_q": cu_d,
        "cu_seq_lens_k": cu_d,
        "max_length_q": int(n.max()),
        "max_length_k": int(n.max()),
    }


def profile_call(fn: Callable[[], Any], *, grad: bool = False) -> Any:
    """One eager call of ``fn`` under the CUDA profiler, synchronised: the profiler, for `attention_kernels` and
    `rank_kernels` to read (one call serves both).

    ``grad``: the call runs a backward (the train step), so autograd stays on; a decode call runs without it.
    The train peer's observation once ran under ``no_grad`` and its backward failed ("element 0 of tensors does
    not require grad"), which left the train_step row without a peer."""
    from torch.profiler import ProfilerActivity, profile

    mode = torch.enable_grad() if grad else torch.no_grad()
    with mode, profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return prof


def attention_kernels(prof: Any) -> list[str]:
    """The distinct attention kernels a profiled call launched (their names say which SDPA backend ran)."""
    names = {e.name for e in prof.events() if e.device_type.name == "CUDA"}
    keys = ("flash", "fmha", "attention", "attn", "sdpa", "cudnn", "efficient")
    return sorted(n for n in names if any(k in n.lower() for k in keys))[:16]


def observed_cuda_kernels(fn: Callable[[], Any], *, grad: bool = False) -> list[str]:
    """The distinct attention kernels the CUDA profiler sees in one eager call (which backend ran)."""
    return attention_kernels(profile_call(fn, grad=grad))


def rank_kernels(averages: Any, top: int = 8) -> list[dict[str, Any]]:
    """The ``top`` device kernels by total device time from a profiler's ``key_averages()``: name (cut to 120
    characters), total microseconds, calls. Host-side entries (no device time) are left out."""
    rows = []
    for a in averages:
        us = float(getattr(a, "device_time_total", 0.0) or getattr(a, "cuda_time_total", 0.0) or 0.0)
        if us > 0 and getattr(a, "device_type", None) is not None and a.device_type.name == "CUDA":
            rows.append({"name": str(a.key)[:120], "us": round(us, 1), "calls": int(a.count)})
    return sorted(rows, key=lambda r: (-r["us"], r["name"]))[:top]


def step_kernels(fn: Callable[[], Any], top: int = 8) -> tuple[list[str], list[dict[str, Any]] | str]:
    """One profiled eager decode step: (its attention kernels, its ``top`` kernels by device time).

    Why the ranking: the stock decode at batch 64 and 256 grew far faster than its bytes (104.8 ms at batch 64
    against 10.8 ms at batch 1 on the H200) and the cause was never measured; the bench records it beside the
    times. A profiler that cannot rank costs the figure (a one-line reason instead), not the row."""
    prof = profile_call(fn)
    try:
        ranked: list[dict[str, Any]] | str = rank_kernels(prof.key_averages(), top)
    except Exception as exc:  # noqa: BLE001 - recorded, never judged
        ranked = f"not profiled: {type(exc).__name__}: {exc}".splitlines()[0]
    return attention_kernels(prof), ranked
