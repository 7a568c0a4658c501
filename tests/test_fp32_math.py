"""fp32 reference math: inside the block every fp32 precision setting is plain fp32, after it (also after an
exception) every setting is what it was.

``ws1_kernels.reference.fp32_math`` is the one way ws1 enters fp32 reference math (the per-operator references,
the harness's reference runs, the fp32 reference chain, which is the Qwen3 drop-in on those references). The
negative control is a version that sets the flags and forgets to restore them after an exception: the same check
must catch it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest
import torch

from ws1_kernels import reference as kernels_reference

COPIES = {"kernels": kernels_reference.fp32_math}


def _read(getter: Callable[[], object]) -> object:
    try:
        return getter()
    except RuntimeError as exc:  # an unreadable legacy switch is part of the state too
        return f"unreadable: {type(exc).__name__}"


def _state() -> dict[str, object]:
    """Every per-backend fp32 precision setting and what the legacy switches read."""
    out: dict[str, object] = {
        f"site{i}": getattr(obj, attr) for i, (obj, attr) in enumerate(kernels_reference._precision_sites())
    }
    out["legacy_matmul_precision"] = _read(torch.get_float32_matmul_precision)
    out["legacy_cuda_tf32"] = _read(lambda: torch.backends.cuda.matmul.allow_tf32)
    out["legacy_cudnn_tf32"] = _read(lambda: torch.backends.cudnn.allow_tf32)
    return out


@pytest.fixture
def reduced_precision() -> Iterator[dict[str, object]]:
    """A process that asked for reduced fp32 precision (TF32 matmuls, bf16 oneDNN matmuls); put back after."""
    sites = kernels_reference._precision_sites()
    saved = [getattr(obj, attr) for obj, attr in sites]
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    if hasattr(torch.backends.mkldnn, "matmul") and hasattr(torch.backends.mkldnn.matmul, "fp32_precision"):
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    try:
        yield _state()
    finally:
        torch.set_float32_matmul_precision("highest")
        for (obj, attr), value in zip(sites, saved, strict=True):
            setattr(obj, attr, value)


def _restored_after_raise(enter: Callable[[], AbstractContextManager[None]]) -> bool:
    before = _state()
    with pytest.raises(ZeroDivisionError), enter():
        _ = 1 / 0
    return _state() == before


@pytest.mark.parametrize("copy", sorted(COPIES))
def test_inside_every_setting_is_plain_fp32(copy: str, reduced_precision: dict[str, object]) -> None:
    assert any(v in ("tf32", "bf16") for v in reduced_precision.values())  # the control: reduced before
    with COPIES[copy]():
        inside = _state()
    sites = {k: v for k, v in inside.items() if k.startswith("site")}
    assert set(sites.values()) <= {"ieee"}
    assert (inside["legacy_matmul_precision"], inside["legacy_cuda_tf32"], inside["legacy_cudnn_tf32"]) == (
        "highest",
        False,
        False,
    )


@pytest.mark.parametrize("copy", sorted(COPIES))
def test_every_setting_is_restored_after_an_exception(
    copy: str, reduced_precision: dict[str, object]
) -> None:
    assert _restored_after_raise(COPIES[copy])
    assert _state() == reduced_precision


def test_negative_control_a_version_that_does_not_restore_is_caught(
    reduced_precision: dict[str, object],
) -> None:
    @contextmanager
    def forgetful() -> Iterator[None]:
        sites = kernels_reference._precision_sites()
        saved = [getattr(obj, attr) for obj, attr in sites]
        for obj, attr in sites:
            setattr(obj, attr, "ieee")
        yield  # no try/finally: an exception skips the restore
        for (obj, attr), value in zip(sites, saved, strict=True):
            setattr(obj, attr, value)

    assert not _restored_after_raise(forgetful)
