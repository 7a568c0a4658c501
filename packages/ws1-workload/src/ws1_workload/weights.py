"""Model weights: Hugging Face Qwen3 tensor names, synthetic generation, content hash, checkpoint loading.

Synthetic tensors are generated one at a time from a generator seeded by `(seed, tensor name)`, drawn in
fp32 and rounded to bf16, so any subset can be regenerated alone. A large tensor is drawn in blocks of whole rows
into one reused fp32 buffer (the same bits as one draw: see `generate_tensor`), and `synthetic_weights` draws
independent tensors on several threads, so the full-width embedding and lm_head (151936 x 4096 each) no longer
cost a 2.5 GB fp32 temporary each and a serial pass over the whole model. The content hash streams tensor by tensor
in sorted name order over (name, dtype, shape, raw bytes), so the 16 GB full model is never in memory at once.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import WorkloadError
from .inputs import ZERO_REPLACEMENT, derive_seed, round_to_bf16
from .manifest import Manifest, ModelConfig, WeightPin

_DTYPES = {"bfloat16": torch.bfloat16}


def tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight of the model (HF Qwen3ForCausalLM names), in sorted name order."""
    q_out, kv_out = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg.vocab, cfg.hidden),
        "model.norm.weight": (cfg.hidden,),
    }
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab, cfg.hidden)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (cfg.hidden,),
                p + "self_attn.q_proj.weight": (q_out, cfg.hidden),
                p + "self_attn.k_proj.weight": (kv_out, cfg.hidden),
                p + "self_attn.v_proj.weight": (kv_out, cfg.hidden),
                p + "self_attn.o_proj.weight": (cfg.hidden, q_out),
                p + "post_attention_layernorm.weight": (cfg.hidden,),
                p + "mlp.gate_proj.weight": (cfg.intermediate, cfg.hidden),
                p + "mlp.up_proj.weight": (cfg.intermediate, cfg.hidden),
                p + "mlp.down_proj.weight": (cfg.hidden, cfg.intermediate),
            }
        )
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (cfg.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (cfg.head_dim,)
    return dict(sorted(shapes.items()))


#: elements per block of a blocked draw (64 MB of fp32); a tensor at most this large is drawn at once
BLOCK_ELEMENTS = 1 << 24
#: torch's CPU ``normal_`` fills a float tensor of n >= 16 elements by drawing n uniforms in order, then
#: transforming them 16 at a time (Box-Muller within each group of 16); only a tail of n % 16 elements is redrawn.
#: So consecutive draws whose sizes are multiples of 16 consume the stream exactly as one draw does and give the
#: same bits (tests/ws1_workload/test_weights.py checks it against the one-draw path and the pinned hash).
_NORMAL_GROUP = 16


def _scale(pin: WeightPin, name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """(multiplier, offset) of a standard normal draw for this tensor."""
    init = pin.init
    if name == "model.embed_tokens.weight":
        return init.embed_std, 0.0
    if len(shape) == 1:  # every 1-D weight of Qwen3 dense is an RMSNorm scale
        return init.norm_std, init.norm_mean
    return init.linear_gain / math.sqrt(shape[1]), 0.0


def generate_tensor(
    pin: WeightPin, name: str, shape: tuple[int, ...], *, block_elements: int | None = None
) -> torch.Tensor:
    """One synthetic tensor: fp32 draw from a generator seeded by (seed, name), rounded to bf16, no zeros.

    A 2-D tensor larger than ``block_elements`` whose rows hold a multiple of 16 elements is drawn block of rows
    by block into a reused fp32 buffer, each block scaled and rounded into the bf16 result: the same stream, the
    same elementwise ops, the same bits as one draw (see ``_NORMAL_GROUP``), without the fp32 temporary of the
    whole tensor.
    """
    gen = torch.Generator(device="cpu").manual_seed(derive_seed("weights", str(pin.seed), name))
    mul, add = _scale(pin, name, shape)
    limit = BLOCK_ELEMENTS if block_elements is None else block_elements
    dtype = _DTYPES[pin.dtype]
    numel = math.prod(shape)
    if len(shape) != 2 or numel <= limit or shape[1] % _NORMAL_GROUP or dtype != torch.bfloat16:
        x = torch.empty(shape, dtype=torch.float32).normal_(generator=gen)
        x.mul_(mul)
        if add:
            x.add_(add)
        return round_to_bf16(x).to(dtype)
    rows, cols = shape
    step = max(1, limit // cols)
    out = torch.empty(shape, dtype=dtype)
    buf = torch.empty((step, cols), dtype=torch.float32)
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        x = buf[:n].normal_(generator=gen)
        x.mul_(mul)
        if add:
            x.add_(add)
        dst = out[r0 : r0 + n]
        dst.copy_(x)  # round to nearest even, as round_to_bf16's .to(bfloat16)
        dst.masked_fill_(dst == 0, ZERO_REPLACEMENT)
    return out


def iter_synthetic_weights(
    manifest: Manifest, model: str, names: Iterable[str] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) in sorted name order, generated one at a time."""
    shapes, pin, wanted = _wanted(manifest, model, names)
    for name in wanted:
        yield name, generate_tensor(pin, name, shapes[name])


def _wanted(
    manifest: Manifest, model: str, names: Iterable[str] | None
) -> tuple[dict[str, tuple[int, ...]], WeightPin, list[str]]:
    """The model's tensor shapes, its weight pin and the sorted names asked for (all by default); an unknown name
    is bad input before any tensor is drawn."""
    shapes = tensor_shapes(manifest.model(model))
    wanted = sorted(shapes) if names is None else sorted(set(names))
    for name in wanted:
        if name not in shapes:
            raise WorkloadError(f"model {model!r}: no tensor named {name!r}")
    return shapes, manifest.weights(model), wanted


def synthetic_weights(
    manifest: Manifest, model: str = "tiny", names: Iterable[str] | None = None, *, threads: int | None = None
) -> dict[str, torch.Tensor]:
    """All (or the named) synthetic tensors of `model` as bf16, keyed by HF name (sorted).

    Each tensor has its own generator, so tensors are drawn on ``threads`` threads at once (default: half the
    host's cores, at most 8; 1: one after another) with the bits of a serial draw: a full-width run no longer
    waits for one core to draw 1.7 G normals one tensor after another.
    """
    shapes, pin, wanted = _wanted(manifest, model, names)
    workers = threads if threads is not None else max(1, min(8, (os.cpu_count() or 2) // 2))
    if workers <= 1 or len(wanted) <= 1:
        return {name: generate_tensor(pin, name, shapes[name]) for name in wanted}
    # largest first, so the two vocab-sized tensors start at once and the layers fill the other threads
    order = sorted(wanted, key=lambda n: -math.prod(shapes[n]))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {name: pool.submit(generate_tensor, pin, name, shapes[name]) for name in order}
        return {name: futures[name].result() for name in wanted}


def _record_header(name: str, tensor: torch.Tensor) -> bytes:
    dtype = str(tensor.dtype).removeprefix("torch.")
    head = json.dumps(
        {"dtype": dtype, "name": name, "shape": list(tensor.shape)}, sort_keys=True, separators=(",", ":")
    )
    return head.encode("utf-8") + b"\n"


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    t = tensor.detach().to("cpu").contiguous()
    return t.view(torch.uint8).numpy().data if t.numel() else memoryview(b"")


class ContentHasher:
    """Streaming SHA-256 over (header, byte count, raw little-endian bytes) of tensors in sorted name order."""

    def __init__(self) -> None:
        self._h = hashlib.sha256(b"ws1.weights.v1\n")
        self._last: str | None = None

    def update(self, name: str, tensor: torch.Tensor) -> None:
        if self._last is not None and name <= self._last:
            raise WorkloadError(f"content hash: tensor {name!r} out of sorted order (after {self._last!r})")
        self._last = name
        raw = _raw_bytes(tensor)
        self._h.update(_record_header(name, tensor))
        self._h.update(len(raw).to_bytes(8, "little"))
        self._h.update(raw)

    def hexdigest(self) -> str:
        return "sha256:" + self._h.hexdigest()


def tensor_sha256(name: str, tensor: torch.Tensor) -> str:
    """Hash of one tensor record (the same bytes it contributes to the content hash)."""
    h = ContentHasher()
    h.update(name, tensor)
    return h.hexdigest()


def content_sha256(items: Iterable[tuple[str, torch.Tensor]]) -> str:
    """Content hash of (name, tensor) pairs given in sorted name order."""
    h = ContentHasher()
    for name, tensor in items:
        h.update(name, tensor)
    return h.hexdigest()


def synthetic_content_sha256(manifest: Manifest, model: str) -> str:
    return content_sha256(iter_synthetic_weights(manifest, model))


# ---- checkpoints -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointReport:
    path: str
    model: str
    content_sha256: str
    matched: str  # "checkpoint" | "synthetic" | "synthetic_subset"
    num_tensors: int


def _checkpoint_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise WorkloadError("no *.safetensors file in directory", str(path))
        return files
    if not path.is_file():
        raise WorkloadError("no such checkpoint file", str(path))
    return [path]


def _index(path: Path) -> dict[str, Path]:
    from safetensors import safe_open

    where: dict[str, Path] = {}
    for f in _checkpoint_files(path):
        try:
            with safe_open(str(f), framework="pt") as handle:
                names = list(handle.keys())
        except Exception as exc:  # safetensors raises its own error types for bad headers
            raise WorkloadError(
                f"unreadable safetensors file: {exc.__class__.__name__}: {exc}", str(f)
            ) from None
        for name in names:
            if name in where:
                raise WorkloadError(
                    f"tensor {name!r} appears in two shards ({where[name].name}, {f.name})", str(path)
                )
            where[name] = f
    return where


def _iter_checkpoint(path: Path, cfg: ModelConfig, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    shapes = tensor_shapes(cfg)
    where = _index(path)
    missing, extra = sorted(set(shapes) - set(where)), sorted(set(where) - set(shapes))
    if missing:
        raise WorkloadError(
            f"missing tensor {missing[0]!r} ({len(missing)} missing) for model {cfg.name!r}", str(path)
        )
    if extra:
        raise WorkloadError(
            f"unexpected tensor {extra[0]!r} ({len(extra)} extra) for model {cfg.name!r}", str(path)
        )
    for name in shapes:
        try:
            with safe_open(str(where[name]), framework="pt") as handle:
                tensor = handle.get_tensor(name)
        except Exception as exc:
            raise WorkloadError(
                f"cannot read tensor {name!r}: {exc.__class__.__name__}: {exc}", str(where[name])
            ) from None
        if tuple(tensor.shape) != shapes[name]:
            raise WorkloadError(
                f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {shapes[name]}", str(path)
            )
        if tensor.dtype != dtype:
            raise WorkloadError(f"tensor {name!r} has dtype {tensor.dtype}, expected {dtype}", str(path))
        yield name, tensor


def _judge(
    path: Path, model: str, pin: WeightPin, digest: str, subset_ok: bool | None, count: int
) -> CheckpointReport:
    if pin.checkpoint_sha256 is not None and digest == pin.checkpoint_sha256:
        matched = "checkpoint"
    elif pin.content_sha256 is not None and digest == pin.content_sha256:
        matched = "synthetic"
    elif pin.content_sha256 is None and subset_ok:
        matched = "synthetic_subset"
    else:
        raise WorkloadError(f"content hash {digest} matches no pin of model {model!r}", str(path))
    return CheckpointReport(
        path=str(path), model=model, content_sha256=digest, matched=matched, num_tensors=count
    )


def _read(
    path: str | Path, manifest: Manifest, model: str, keep: bool
) -> tuple[CheckpointReport, dict[str, torch.Tensor]]:
    p = Path(path)
    cfg, pin = manifest.model(model), manifest.weights(model)
    hasher = ContentHasher()
    subset = dict(pin.subset_sha256 or {})
    subset_ok: bool | None = True if subset else None
    kept: dict[str, torch.Tensor] = {}
    count = 0
    for name, tensor in _iter_checkpoint(p, cfg, _DTYPES[pin.dtype]):
        hasher.update(name, tensor)
        if name in subset and tensor_sha256(name, tensor) != subset[name]:
            subset_ok = False
        if keep:
            kept[name] = tensor
        count += 1
    return _judge(p, model, pin, hasher.hexdigest(), subset_ok, count), kept


def verify_checkpoint(path: str | Path, manifest: Manifest, model: str) -> CheckpointReport:
    """Stream a safetensors checkpoint (file or directory of shards) and check it against the model's pins."""
    return _read(path, manifest, model, keep=False)[0]


def load_checkpoint(path: str | Path, manifest: Manifest, model: str) -> dict[str, torch.Tensor]:
    """Load a checkpoint after checking names, shapes, dtype and content hash; WorkloadError otherwise."""
    return _read(path, manifest, model, keep=True)[1]


def check_weights(cfg: ModelConfig, weights: Mapping[str, torch.Tensor]) -> None:
    """Names and shapes of an in-memory weight dict match the model."""
    shapes = tensor_shapes(cfg)
    missing = sorted(set(shapes) - set(weights))
    if missing:
        raise WorkloadError(f"weights: missing tensor {missing[0]!r} for model {cfg.name!r}")
    for name, shape in shapes.items():
        if tuple(weights[name].shape) != shape:
            raise WorkloadError(f"weights: {name!r} has shape {tuple(weights[name].shape)}, expected {shape}")
