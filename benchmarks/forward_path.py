"""How far a reader walks from a GeoNorm decoder layer's ``forward`` to the update's arithmetic: one forward of a
tiny GeoNorm LLaMA at the default settings, profiled with ``sys.setprofile``, counting the frames of the project's
own code (files under ``hf_geonorm/``) that run inside each decoder layer's ``forward``: the distinct files, the
deepest nesting (the layer's ``forward`` is depth 1; frames of torch and transformers in between are not
counted), the chain of frames to the deepest one, and the chain to ``geometry.exp_map``, where the state turns.

Writes ``forward_path.json`` and ``.md`` to ``--out`` (default benchmarks/results; ``--device cuda`` writes
``forward_path_cuda.*``, after a first forward that runs the kernel's first-use check). Seconds.

    python benchmarks/forward_path.py
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import torch
import transformers

import hf_geonorm
from hf_geonorm.modeling.decoder_layers import GeoNormDecoderLayer

RESULTS = Path(__file__).resolve().parent / "results"
PACKAGE = Path(hf_geonorm.__file__).resolve().parent
# the function that turns the state, and the names a geometry function named for the method may have
ARITHMETIC = ("geometry.py", "exp_map")
METHOD_NAMES = ("geodesic_step", "exp_map")


@dataclass(frozen=True)
class Frame:
    """One project frame: its file (relative to ``hf_geonorm/``), qualified name and depth under the layer."""

    file: str
    name: str
    depth: int

    def __str__(self) -> str:
        return f"{self.file}:{self.name}"


@dataclass
class ForwardPath:
    """What one profiled forward found inside the decoder layers' ``forward``."""

    device: str
    layer: str
    files: list[str]
    max_depth: int
    deepest: list[Frame]  # the chain from the layer's forward to the deepest frame
    to_arithmetic: list[Frame]  # the chain from the layer's forward to geometry.exp_map ([] if it did not run)
    calls: list[Frame]  # every distinct (file, name, depth) in the order first seen

    @property
    def method_on_path(self) -> list[str]:
        """The geometry functions named for the method on the chain to the arithmetic."""
        return [f.name for f in self.to_arithmetic if f.file == "modeling/geometry.py" and f.name in METHOD_NAMES]


def tiny_geonorm_llama(device: str) -> torch.nn.Module:
    """A 2-layer GeoNorm LLaMA built from a config at the default GeoNorm settings."""
    config = hf_geonorm.config_class_for("llama")(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).to(device)


def _project_file(code: CodeType) -> str | None:
    path = Path(code.co_filename)
    if not path.is_absolute():
        return None
    try:
        return path.resolve().relative_to(PACKAGE).as_posix()
    except ValueError:
        return None


def profile_forward(model: torch.nn.Module, ids: torch.Tensor) -> ForwardPath:
    """Run ``model(ids)`` under ``sys.setprofile`` and collect the project frames inside each decoder layer's
    ``forward``."""
    layer_file = Path(inspect.getfile(GeoNormDecoderLayer)).resolve().relative_to(PACKAGE).as_posix()
    stack: list[Frame | None] = []  # one entry per open Python frame: its project Frame, or None for others
    chain: list[Frame] = []  # the open project frames under a layer's forward
    seen: dict[tuple[str, str, int], Frame] = {}
    deepest: list[Frame] = []
    to_arithmetic: list[Frame] = []
    layer_name = ""

    def profiler(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal deepest, to_arithmetic, layer_name
        if event == "call":
            file = _project_file(frame.f_code)
            inside = bool(chain) or (file == layer_file and frame.f_code.co_name == "forward")
            if file is None or not inside:
                stack.append(None)
                return
            entry = Frame(file, frame.f_code.co_qualname, len(chain) + 1)
            if not chain:
                layer_name = entry.name
            stack.append(entry)
            chain.append(entry)
            seen.setdefault((entry.file, entry.name, entry.depth), entry)
            if len(chain) > len(deepest):
                deepest = list(chain)
            if (Path(entry.file).name, frame.f_code.co_name) == ARITHMETIC and not to_arithmetic:
                to_arithmetic = list(chain)
        elif event == "return" and stack:
            if stack.pop() is not None:
                chain.pop()

    sys.setprofile(profiler)
    try:
        model(ids)
    finally:
        sys.setprofile(None)
    files = sorted({f.file for f in seen.values()})
    return ForwardPath(str(ids.device), layer_name, files, len(deepest), deepest, to_arithmetic, list(seen.values()))


def measure(device: str = "cpu") -> ForwardPath:
    """One forward of a tiny GeoNorm LLaMA at the defaults (after a first one where the device runs a first-use
    check of its own: the kernel's on CUDA), profiled."""
    model = tiny_geonorm_llama(device)
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1)).to(device)
    if device != "cpu":
        model(ids)
    return profile_forward(model, ids)


def chain_text(chain: list[Frame]) -> str:
    return " -> ".join(f"{Path(f.file).stem}.{f.name}" for f in chain)


def markdown(path: ForwardPath) -> str:
    lines = [
        "# From a decoder layer's forward to the update's arithmetic (benchmarks/forward_path.py)",
        "",
        f"One forward of a tiny GeoNorm LLaMA (2 layers, width 32) at the default settings on {path.device}, "
        "profiled with `sys.setprofile`: the frames of `hf_geonorm/` that run inside each decoder layer's "
        f"`forward` (`{path.layer}` is depth 1; torch and transformers frames in between are not counted).",
        "",
        f"- Project files: **{len(path.files)}** ({', '.join(f'`{f}`' for f in path.files)})",
        f"- Deepest nesting: **{path.max_depth}** frames: {chain_text(path.deepest)}",
        f"- To the arithmetic (`geometry.exp_map`, {len(path.to_arithmetic)} frames): "
        f"{chain_text(path.to_arithmetic) or 'not reached'}",
        f"- Geometry functions named for the method on that chain: {', '.join(path.method_on_path) or 'none'}",
        "",
        "Every project frame, in the order first seen (depth, file, function):",
        "",
        "| depth | file | function |",
        "|---|---|---|",
        *(f"| {f.depth} | `{f.file}` | `{f.name}` |" for f in path.calls),
        "",
        f"torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for forward_path.json and .md")
    args = parser.parse_args(argv)
    path = measure(args.device)
    stem = "forward_path" if args.device == "cpu" else f"forward_path_{args.device}"
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {**asdict(path), "method_on_path": path.method_on_path}
    (args.out / f"{stem}.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    (args.out / f"{stem}.md").write_text(markdown(path), encoding="utf-8")
    print(markdown(path))


if __name__ == "__main__":
    main()
