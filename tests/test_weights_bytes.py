"""model.safetensors is byte-for-byte reproducible for identical weights (checkpoint and export)."""

from __future__ import annotations

import dataclasses
import json
import struct
import subprocess
import sys

import pytest
import torch

from bertrain.config import ModelConfig
from bertrain.model import build_model, load_weights, save_weights
from bertrain.model.hf import export_hf

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def tiny(kind: str) -> ModelConfig:
    extra = dict(embedding_size=16, num_hidden_groups=1, inner_group_num=1) if kind == "albert" else {}
    return ModelConfig(type=kind, vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=32, **extra)


def header(path) -> dict:
    """The safetensors JSON header, read by hand (8-byte little-endian length, then JSON)."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + length])


@pytest.mark.parametrize("kind", ["bert", "albert"])
def test_saving_identical_weights_gives_identical_bytes(tmp_path, kind):
    torch.manual_seed(0)
    model = build_model(tiny(kind))
    # safetensors writes metadata in hash-map order, which changes from call to call: save many times.
    for i in range(12):
        save_weights(model, tmp_path / f"{i}.safetensors")
    first = (tmp_path / "0.safetensors").read_bytes()
    assert all((tmp_path / f"{i}.safetensors").read_bytes() == first for i in range(12))
    assert header(tmp_path / "0.safetensors")["__metadata__"] == {"format": "pt"}
    # load → save round trip into a differently initialized model.
    torch.manual_seed(1)
    other = build_model(tiny(kind))
    load_weights(other, tmp_path / "0.safetensors")
    save_weights(other, tmp_path / "again.safetensors")
    assert (tmp_path / "again.safetensors").read_bytes() == first


def test_another_process_writes_the_same_bytes(tmp_path):
    torch.manual_seed(0)
    model = build_model(tiny("bert"))
    save_weights(model, tmp_path / "here.safetensors")
    script = ("import sys, torch; from bertrain.config import ModelConfig; "
              "from bertrain.model import build_model, load_weights, save_weights; "
              f"m = build_model(ModelConfig(**{dataclasses.asdict(tiny('bert'))!r})); "
              "load_weights(m, sys.argv[1]); save_weights(m, sys.argv[2])")
    for i in range(3):  # each process seeds its hash maps afresh
        subprocess.run([sys.executable, "-c", script, str(tmp_path / "here.safetensors"),
                        str(tmp_path / f"there{i}.safetensors")], check=True, cwd=ROOT)
        assert (tmp_path / f"there{i}.safetensors").read_bytes() == (tmp_path / "here.safetensors").read_bytes()


def test_exporting_twice_gives_identical_files(tmp_path):
    torch.manual_seed(0)
    model = build_model(tiny("albert"))
    for i in range(4):
        export_hf(model, tmp_path / str(i))
    for name in ("model.safetensors", "config.json"):
        assert len({(tmp_path / str(i) / name).read_bytes() for i in range(4)}) == 1, name
