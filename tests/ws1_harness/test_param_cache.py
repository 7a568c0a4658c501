"""The shared parameter folder (`WS1_PARAM_CACHE`): the same bits as a fresh draw, one draw per weight between the
processes of a run, and no file trusted that is not the tensor's size. Each property with its control."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import pytest
import torch

from ws1_harness.run import adapters, param_cache
from ws1_harness.run.adapters import ParamInput, make_param, shared_param

SHAPE = (8, 16)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    target = tmp_path / "params"
    monkeypatch.setenv(param_cache.ENV, str(target))
    monkeypatch.setattr(adapters, "SHARED_MIN_NUMEL", 1)  # small weights through the folder too
    shared_param.cache_clear()
    yield target
    shared_param.cache_clear()


@pytest.mark.parametrize(
    ("case", "param", "digest"),
    [
        # three row blocks, the last one short, with the order-probe columns and rows (generator version 2: each
        # block its own seed)
        ("case|lm_head", ParamInput("weight", (4099, 2048), scale=0.015625, order_probe=True),
         "7977565596824efce8342a82a9e17e8f67d9f911e49fbb06b53467bc9b8c0472"),
        ("case|rms_norm", ParamInput("weight", (4096,), scale=0.0625, offset=1.0),
         "71f50714748b420c6aef2fb2bcfa188fb16a1467d91bc567526463db9601943c"),
        # values so small that some round to bf16 zero and are replaced by the scale
        ("case|tiny", ParamInput("w", (64, 64), scale=2.0**-130),
         "337f771f3f2ca1ea4f5ddf02896e31ac3186e16ff5f624441cc106f038bfd484"),
    ],
)  # fmt: skip
def test_a_draw_keeps_its_pinned_bits(case: str, param: ParamInput, digest: str) -> None:
    """Every judged input descends from these bits: a faster draw must give the same ones (the one-block weights
    pinned before the in-place rewrite of make_param, the three-block one at generator version 2). Control: another
    case gives another digest."""

    def sha(t: torch.Tensor) -> str:
        return hashlib.sha256(_bits(t).numpy().tobytes()).hexdigest()

    drawn = make_param(case, param)
    assert sha(drawn) == digest
    assert not bool((drawn == 0).any())
    assert sha(make_param(case + "2", param)) != digest


#: five row blocks of 64 rows, the last one short (`small_blocks`)
BLOCKED = ParamInput("weight", (4 * 64 + 5, 512), scale=0.5)


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapters, "PARAM_BLOCK_NUMEL", 64 * 512)


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_the_bits_do_not_depend_on_the_thread_count(threads: int, small_blocks: None) -> None:
    """Each row block has its own generator, so any number of threads draws the same weight."""
    param = BLOCKED
    want = make_param("case|threads", param, threads=1)
    assert torch.equal(_bits(make_param("case|threads", param, threads=threads)), _bits(want))
    assert not torch.equal(want[:64], want[64:128])  # blocks are not copies of one another


def test_the_control_blocks_seeded_in_another_order_differ(
    monkeypatch: pytest.MonkeyPatch, small_blocks: None
) -> None:
    """The thread test could not fail if every block drew the same values: with the block seeds reversed, the same
    weight's bits change."""
    param = BLOCKED
    want = make_param("case|threads", param, threads=3)
    blocks = 5
    seed = adapters.param_block_seed
    monkeypatch.setattr(adapters, "param_block_seed", lambda base, block: seed(base, blocks - 1 - block))
    assert not torch.equal(_bits(make_param("case|threads", param, threads=3)), _bits(want))


def test_a_weight_read_back_has_the_bits_of_a_fresh_draw(folder: Path) -> None:
    param = ParamInput("w", (256, 256), scale=0.25, order_probe=True)
    first = shared_param("case|op", param)
    shared_param.cache_clear()  # another process: nothing in memory, the file is read
    key = param_cache.cache_key("case|op", "w", param.shape, 0.25, 0.0, True)
    again, was_read = param_cache.load_or_make(folder, key, param.shape, lambda: pytest.fail("drawn again"))
    assert was_read
    assert torch.equal(_bits(again), _bits(make_param("case|op", param)))
    assert torch.equal(_bits(first), _bits(again))
    # control: another case draws other values, so equality above is not the folder returning anything at all
    assert not torch.equal(_bits(make_param("case2|op", param)), _bits(again))


def test_without_the_variable_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(param_cache.ENV, raising=False)
    monkeypatch.setattr(adapters, "SHARED_MIN_NUMEL", 1)
    monkeypatch.chdir(tmp_path)
    shared_param.cache_clear()
    shared_param("case|op", ParamInput("w", SHAPE))
    assert param_cache.cache_dir() is None
    assert list(tmp_path.iterdir()) == []
    # control: with the variable set, the same call leaves one file
    monkeypatch.setenv(param_cache.ENV, str(tmp_path / "p"))
    shared_param.cache_clear()
    shared_param("case|op", ParamInput("w", SHAPE))
    assert len(list((tmp_path / "p").glob("*.bf16"))) == 1
    shared_param.cache_clear()


def test_a_small_weight_is_drawn_in_the_process(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapters, "SHARED_MIN_NUMEL", 1 << 22)
    shared_param("case|op", ParamInput("norm", (4096,)))
    assert not folder.exists() or not list(folder.glob("*.bf16"))
    # control: at the threshold it goes through the folder
    monkeypatch.setattr(adapters, "SHARED_MIN_NUMEL", 4096)
    shared_param("case|op", ParamInput("norm2", (4096,)))
    assert len(list(folder.glob("*.bf16"))) == 1


def test_a_file_of_the_wrong_size_is_drawn_again(folder: Path) -> None:
    key = param_cache.cache_key("c", "w", SHAPE, 1.0, 0.0, False)
    folder.mkdir(parents=True)
    (folder / f"{key}.bf16").write_bytes(b"\0" * 10)  # a truncated file
    fresh = torch.full(SHAPE, 3.0, dtype=torch.bfloat16)
    got, was_read = param_cache.load_or_make(folder, key, SHAPE, lambda: fresh)
    assert not was_read and torch.equal(got, fresh)
    assert (folder / f"{key}.bf16").stat().st_size == 2 * fresh.numel()
    # control: a file of the right size is read as it is (the name, not the content, is what the folder checks)
    planted = torch.full(SHAPE, 5.0, dtype=torch.bfloat16)
    planted.view(torch.int16).numpy().tofile(folder / f"{key}.bf16")
    got, was_read = param_cache.load_or_make(folder, key, SHAPE, lambda: fresh)
    assert was_read and torch.equal(got, planted)


@pytest.mark.parametrize(
    "change",
    [
        {"case_id": "other"},
        {"name": "other"},
        {"shape": (16, 8)},
        {"scale": 0.5},
        {"offset": 1.0},
        {"probe": True},
    ],
)
def test_every_input_of_the_values_names_another_file(change: dict) -> None:
    base = {"case_id": "c", "name": "w", "shape": SHAPE, "scale": 1.0, "offset": 0.0, "probe": False}
    assert param_cache.cache_key(**base) == param_cache.cache_key(
        **dict(base)
    )  # control: same inputs, same file
    assert param_cache.cache_key(**{**base, **change}) != param_cache.cache_key(**base)


def test_the_generator_version_names_another_file(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ("c", "w", SHAPE, 1.0, 0.0, False)
    before = param_cache.cache_key(*args)
    monkeypatch.setattr(param_cache, "GENERATOR_VERSION", param_cache.GENERATOR_VERSION + 1)
    assert param_cache.cache_key(*args) != before


def _draw_together(folder: Path, keys: list[str]) -> list[str]:
    drawn: list[str] = []

    def make_for(key: str):
        def make() -> torch.Tensor:
            drawn.append(key)
            time.sleep(0.2)  # long enough for the other thread to reach the lock
            return torch.ones(SHAPE, dtype=torch.bfloat16)

        return make

    threads = [
        threading.Thread(target=param_cache.load_or_make, args=(folder, k, SHAPE, make_for(k))) for k in keys
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return drawn


def test_processes_that_start_together_draw_a_weight_once(tmp_path: Path) -> None:
    assert _draw_together(tmp_path / "a", ["k", "k", "k"]) == ["k"]
    # control: different weights are each drawn
    assert sorted(_draw_together(tmp_path / "b", ["k1", "k2"])) == ["k1", "k2"]


def test_a_wrong_tensor_from_the_maker_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bf16 of shape"):
        param_cache.load_or_make(tmp_path, "k", SHAPE, lambda: torch.ones(SHAPE, dtype=torch.float32))
    assert not list(tmp_path.glob("*.bf16"))
    # control: the right tensor is stored
    param_cache.load_or_make(tmp_path, "k", SHAPE, lambda: torch.ones(SHAPE, dtype=torch.bfloat16))
    assert len(list(tmp_path.glob("*.bf16"))) == 1
