"""The forward path reads like the method: from a GeoNorm decoder layer's ``forward`` to the update's arithmetic,
one forward of a tiny GeoNorm LLaMA at the defaults passes through at most 4 project files and 6 nested project
frames, and a geometry function named for the method picks the implementation on the way
(``benchmarks/forward_path.py`` measures it and writes benchmarks/results/forward_path.md). A structural check of
the code that runs, not a timing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "forward_path.py"


@pytest.fixture(scope="module")
def forward_path():
    spec = importlib.util.spec_from_file_location("bench_forward_path", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_the_layer_reaches_the_arithmetic_through_four_files_and_six_frames(forward_path):
    path = forward_path.measure("cpu")
    chain = [(frame.file, frame.name) for frame in path.to_arithmetic]
    assert chain[0] == ("modeling/decoder_layers.py", "GeoNormLlamaDecoderLayer.forward"), chain
    assert chain[-1] == ("modeling/geometry.py", "exp_map"), chain
    assert [frame.depth for frame in path.to_arithmetic] == list(range(1, len(chain) + 1))
    assert len(path.files) <= 4, path.files
    assert path.max_depth <= 6, [str(frame) for frame in path.deepest]
    assert "geodesic_step" in path.method_on_path, chain  # the one place that picks the implementation
    assert ("modeling/residual.py", "GeoNormResidual.forward") in chain
