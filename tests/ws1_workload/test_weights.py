"""Weights: HF tensor names, bf16-exact synthetic values, pinned content hash, safetensors loader + hash check."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ws1_workload import WorkloadError, content_sha256, load_checkpoint, synthetic_weights, tensor_shapes
from ws1_workload.weights import generate_tensor, verify_checkpoint


def test_names_and_shapes_match_hf_qwen3(manifest, hf_tiny):
    hf = {k: tuple(v.shape) for k, v in hf_tiny.state_dict().items()}
    assert tensor_shapes(manifest.model("tiny")) == dict(sorted(hf.items()))


def test_full_model_tensor_inventory(manifest):
    shapes = tensor_shapes(manifest.model("qwen3-8b"))
    assert len(shapes) == 3 + 36 * 11
    assert shapes["model.layers.35.self_attn.k_proj.weight"] == (8 * 128, 4096)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (4096, 12288)
    assert shapes["lm_head.weight"] == shapes["model.embed_tokens.weight"] == (151936, 4096)
    assert sum(torch.Size(s).numel() for s in shapes.values()) == 8_190_735_360  # Qwen3-8B: 8.19 B parameters
    assert list(shapes) == sorted(shapes)


def test_synthetic_values_are_bf16_never_zero(tiny_weights):
    for name, t in tiny_weights.items():
        assert t.dtype == torch.bfloat16, name
        assert not bool((t == 0).any()), name
    assert tiny_weights["model.norm.weight"].float().mean().item() == pytest.approx(1.0, abs=0.05)


def test_tiny_hash_is_pinned_and_tensors_regenerate_alone(manifest, tiny_weights):
    pin = manifest.weights("tiny")
    assert content_sha256(sorted(tiny_weights.items())) == pin.content_sha256
    name = "model.layers.1.mlp.up_proj.weight"
    alone = synthetic_weights(manifest, "tiny", names=[name])
    assert list(alone) == [name]
    assert torch.equal(alone[name].view(torch.int16), tiny_weights[name].view(torch.int16))
    assert manifest.weights("qwen3-8b").content_sha256 is not None  # the full model is pinned whole


def test_full_model_generator_is_consistent_per_tensor(manifest):
    """One small full-model tensor regenerates identically (the full hash itself is a `slow`-marked test)."""
    pin = manifest.weights("qwen3-8b")
    a = generate_tensor(pin, "model.layers.7.self_attn.q_norm.weight", (128,))
    b = synthetic_weights(manifest, "qwen3-8b", names=["model.layers.7.self_attn.q_norm.weight"])
    assert torch.equal(a.view(torch.int16), b["model.layers.7.self_attn.q_norm.weight"].view(torch.int16))


@pytest.mark.slow
@pytest.mark.heavy(seconds=65)
def test_full_model_content_hash_matches_pin(manifest):
    from ws1_workload.weights import synthetic_content_sha256

    assert synthetic_content_sha256(manifest, "qwen3-8b") == manifest.weights("qwen3-8b").content_sha256


def test_hash_requires_sorted_order(tiny_weights):
    items = sorted(tiny_weights.items(), reverse=True)
    with pytest.raises(WorkloadError, match="sorted order"):
        content_sha256(items)


def test_checkpoint_round_trip(manifest, tiny_weights, tmp_path):
    path = tmp_path / "tiny.safetensors"
    save_file(dict(tiny_weights), str(path))
    report = verify_checkpoint(path, manifest, "tiny")
    assert report.matched == "synthetic" and report.content_sha256 == manifest.weights("tiny").content_sha256
    loaded = load_checkpoint(path, manifest, "tiny")
    assert set(loaded) == set(tiny_weights)
    for name, t in loaded.items():
        assert torch.equal(t.view(torch.int16), tiny_weights[name].view(torch.int16))


def test_sharded_checkpoint_directory(manifest, tiny_weights, tmp_path):
    names = sorted(tiny_weights)
    save_file({n: tiny_weights[n] for n in names[::2]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({n: tiny_weights[n] for n in names[1::2]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    assert verify_checkpoint(tmp_path, manifest, "tiny").num_tensors == len(names)


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # flip one bit inside the last tensor's data
    path.write_bytes(bytes(data))


def test_corrupted_or_wrong_checkpoints_are_rejected(manifest, tiny_weights, tmp_path):
    path = tmp_path / "bad.safetensors"
    save_file(dict(tiny_weights), str(path))
    _corrupt(path)
    with pytest.raises(WorkloadError, match="matches no pin"):
        load_checkpoint(path, manifest, "tiny")

    truncated = tmp_path / "trunc.safetensors"
    truncated.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(WorkloadError, match="unreadable safetensors"):
        verify_checkpoint(truncated, manifest, "tiny")

    partial = dict(tiny_weights)
    partial.pop("model.norm.weight")
    save_file(partial, str(tmp_path / "partial.safetensors"))
    with pytest.raises(WorkloadError, match="missing tensor 'model.norm.weight'"):
        verify_checkpoint(tmp_path / "partial.safetensors", manifest, "tiny")

    as_fp32 = {k: v.float() for k, v in tiny_weights.items()}
    save_file(as_fp32, str(tmp_path / "fp32.safetensors"))
    with pytest.raises(WorkloadError, match="dtype"):
        verify_checkpoint(tmp_path / "fp32.safetensors", manifest, "tiny")

    with pytest.raises(WorkloadError, match="no such checkpoint"):
        verify_checkpoint(tmp_path / "absent.safetensors", manifest, "tiny")


def test_a_blocked_draw_has_the_bits_of_one_draw(manifest):
    """Blocks of whole rows (a multiple of 16 elements each) consume the generator as one draw does; the odd
    last block included. Negative control: a block that is not a multiple of 16 elements does change bits."""
    pin = manifest.weights("tiny")
    name, shape = "lm_head.weight", (5000, 256)
    whole = generate_tensor(pin, name, shape, block_elements=1 << 40)
    blocked = generate_tensor(pin, name, shape, block_elements=256 * 7)  # 715 blocks of 7 rows, the last of 2
    assert torch.equal(whole.view(torch.int16), blocked.view(torch.int16))
    gen = torch.Generator().manual_seed(1)
    one = torch.empty(4, 130).normal_(generator=gen)
    gen = torch.Generator().manual_seed(1)
    parts = torch.cat(
        [torch.empty(1, 130).normal_(generator=gen), torch.empty(3, 130).normal_(generator=gen)]
    )
    assert not torch.equal(one, parts)  # why generate_tensor only blocks rows of a multiple of 16 elements


def test_threaded_generation_gives_the_serial_tensors(manifest):
    serial = synthetic_weights(manifest, "tiny", threads=1)
    threaded = synthetic_weights(manifest, "tiny", threads=4)
    assert list(threaded) == list(serial) == sorted(serial)
    assert all(torch.equal(serial[k].view(torch.int16), threaded[k].view(torch.int16)) for k in serial)
    assert content_sha256(threaded.items()) == manifest.weights("tiny").content_sha256
