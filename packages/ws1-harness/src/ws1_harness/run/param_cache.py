"""A folder of generated parameters shared by the processes of one machine (`WS1_PARAM_CACHE`).

Why: a full-vocabulary weight ([151936, 4096] bf16, 1.2 GB) takes 5-10 s to draw on one host core, because the
seeded generator's stream is sequential. A GPU session runs every profile's matrix in its own processes (two
shards each, both arch sessions at once), so the same three full-vocabulary weights were drawn about thirty
times per run. With the folder, the first process to need a weight draws it and every other reads the bytes.

What makes a file trustworthy:
- the file's name is a digest of everything the values depend on: the case, the parameter's name, shape, scale,
  offset and probe flag, the generator's version below and torch's version (the CPU generator's stream is
  torch's);
- a file is written under a private draft name and renamed into place only when complete, so a reader never
  sees a half-written file; a file whose size is not the tensor's is ignored and drawn again;
- one process draws a given weight at a time (a lock file per digest); the others wait, then read it.

The folder is a cache, never evidence: unset (the default outside the GPU sessions), every process draws its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

#: bump when `adapters.make_param` draws other values for the same inputs: old files then go unread
GENERATOR_VERSION = 2  # 2: row blocks with their own seeds, drawn in threads
ENV = "WS1_PARAM_CACHE"


def cache_dir() -> Path | None:
    """The folder named by `WS1_PARAM_CACHE`, or None (no sharing)."""
    value = os.environ.get(ENV, "").strip()
    return Path(value) if value else None


def cache_key(
    case_id: str, name: str, shape: tuple[int, ...], scale: float, offset: float, probe: bool
) -> str:
    """The digest that names a parameter's file: every input of the values, the generator's and torch's versions."""
    text = "|".join(
        (f"v{GENERATOR_VERSION}", torch.__version__, case_id, name, repr(tuple(shape)), repr(scale), repr(offset),
         str(bool(probe)))
    )  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read(path: Path, shape: tuple[int, ...]) -> torch.Tensor | None:
    """The bf16 tensor in `path`, or None when the file is missing or not exactly the tensor's size."""
    numel = math.prod(shape)
    try:
        if path.stat().st_size != 2 * numel:
            return None
    except FileNotFoundError:
        return None
    data = torch.from_file(str(path), shared=False, size=numel, dtype=torch.int16)
    return data.view(torch.bfloat16).reshape(shape)


def _write(path: Path, tensor: torch.Tensor) -> None:
    draft = path.with_name(f"{path.name}.draft-{os.getpid()}")
    tensor.contiguous().view(torch.int16).numpy().tofile(draft)
    os.replace(draft, path)


def load_or_make(
    folder: Path, key: str, shape: tuple[int, ...], make: Callable[[], torch.Tensor]
) -> tuple[torch.Tensor, bool]:
    """(the parameter, whether it was read from the folder): read `<key>.bf16`, else draw it with `make` and store.

    Holds the key's lock while it looks and draws, so processes that start together draw it once."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.bf16"
    with _locked(folder / f"{key}.lock"):
        cached = _read(path, shape)
        if cached is not None:
            return cached, True
        tensor = make()
        if tensor.dtype != torch.bfloat16 or tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"a cached parameter must be bf16 of shape {tuple(shape)}, got {tensor.dtype} "
                             f"{tuple(tensor.shape)}")  # fmt: skip
        _write(path, tensor)
        return tensor, False
