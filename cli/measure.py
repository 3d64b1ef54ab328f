"""Running a model on real text: token windows, perplexity, and the rotation angle of every residual update.

The angles come from forward hooks on the GeoNorm residual modules (a stock model is first patched in place
to ``norm_style="pre"``, which is the stock computation bit for bit). A hook sees the state h entering the
update and the state h' leaving it, and records the angle between them, i.e. ``prenorm_angle(h, h' - h)``:
for Pre-Norm (stock, ``pre``, or ``geo`` with bridge 0) that is the angle between h and h + u, the rotation
Pre-Norm makes implicitly; for GeoNorm it is the rotation the geodesic step actually made. The hook also
records the per-token mass s = |h|/sqrt(d): 1/s is Pre-Norm's implied step size (GEONORM.md, "Pre-Norm is
GeoNorm with depth-dependent angles").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click


def read_text(path: str, max_tokens: int) -> str:
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise click.ClickException(f"{path} contains no text")
    return text[: max(max_tokens, 1) * 32]  # no token is shorter than 1/32 of a character's worth here


def context_length(config: Any) -> int:
    for key in ("max_position_embeddings", "n_positions", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


def encode(text: str, tokenizer: Any, vocab_size: int) -> tuple[list[int], str]:
    """Token ids of ``text`` and how they were made."""
    if tokenizer is not None:
        ids = tokenizer(text)["input_ids"]
        return list(ids), f"the model's tokenizer ({type(tokenizer).__name__})"
    ids = [b % vocab_size for b in text.encode("utf-8")]
    return ids, "raw UTF-8 bytes modulo the vocabulary size (the source has no tokenizer)"


def windows(ids: list[int], max_tokens: int, window: int) -> list[list[int]]:
    """Consecutive, non-overlapping windows over the first ``max_tokens`` ids (each at least 2 long)."""
    ids = ids[:max_tokens]
    out = [ids[i : i + window] for i in range(0, len(ids), window)]
    out = [w for w in out if len(w) >= 2]
    if not out:
        raise click.ClickException("the text gives fewer than 2 tokens; give a longer text")
    return out


def prepare(model: Any, tokenizer: Any, text_path: str, max_tokens: int, window: int | None) -> tuple[list, str]:
    text = read_text(text_path, max_tokens)
    ids, how = encode(text, tokenizer, model.config.vocab_size)
    size = min(window or context_length(model.config), context_length(model.config), max_tokens)
    return windows(ids, max_tokens, size), how


def _progress(items: list, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit="window", leave=False, disable=len(items) < 2)


def perplexity(model: Any, token_windows: list[list[int]], desc: str = "perplexity") -> float:
    """exp(mean next-token negative log-likelihood) over the windows."""
    import torch

    device = next(model.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for w in _progress(token_windows, desc):
            ids = torch.tensor([w], device=device)
            logits = model(input_ids=ids).logits[0, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum")
            total += float(nll)
            count += len(w) - 1
    return math.exp(total / count)


@dataclass
class SublayerAngles:
    """Statistics over all tokens of one residual update (one sublayer of one layer)."""

    layer: int  # 1-based
    sublayer: str  # "attn", "mlp" or "attn+mlp" (parallel blocks)
    tokens: int = 0
    angle_sum: float = 0.0
    angle_max: float = 0.0
    mass_sum: float = 0.0
    inv_mass_sum: float = 0.0
    step_size: float | None = None  # a_k of a geo model

    @property
    def angle(self) -> float:
        return self.angle_sum / max(self.tokens, 1)

    @property
    def mass(self) -> float:
        return self.mass_sum / max(self.tokens, 1)

    @property
    def inv_mass(self) -> float:
        return self.inv_mass_sum / max(self.tokens, 1)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("angle_sum", "mass_sum", "inv_mass_sum"):
            out.pop(key)
        out.update(angle=self.angle, angle_degrees=math.degrees(self.angle), mass=self.mass, inv_mass=self.inv_mass)
        return out


def residual_modules(model: Any) -> list[tuple[int, str, Any]]:
    """(layer, sublayer, GeoNormResidual) for every residual update, in order."""
    from hf_geonorm import GeoNormResidual

    found: list[tuple[int, str, Any]] = []
    for module in model.modules():
        attn = getattr(module, "geonorm_attn_residual", None)
        if isinstance(attn, GeoNormResidual):
            mlp = getattr(module, "geonorm_mlp_residual", None)
            k = attn.layer_index + 1
            if isinstance(mlp, GeoNormResidual):
                found += [(k, "attn", attn), (k, "mlp", mlp)]
            else:
                found.append((k, "attn+mlp", attn))
    return sorted(found, key=lambda item: (item[0], item[1] == "mlp"))


def regime(config: Any) -> str:
    """'pre-norm' when the model computes Pre-Norm (stock, norm_style pre, geo with bridge 0), else its style."""
    style = getattr(config, "norm_style", "pre")
    if style == "pre" or (style == "geo" and getattr(config, "geo_bridge", 1.0) == 0.0):
        return "pre-norm"
    return style


def measure_angles(model: Any, token_windows: list[list[int]]) -> list[SublayerAngles]:
    """Run the model over the windows and collect the rotation of every residual update."""
    import torch

    from hf_geonorm import prenorm_angle

    modules = residual_modules(model)
    if not modules:
        raise click.ClickException("the model has no GeoNorm residual modules to measure")
    geo = getattr(model.config, "norm_style", "pre") == "geo"
    stats = [SublayerAngles(k, name, step_size=module.step_size if geo else None) for k, name, module in modules]
    handles = []

    def make_hook(entry: SublayerAngles) -> Any:
        def hook(module: Any, args: tuple, output: Any) -> None:
            x = args[0].detach().float()
            y = (output[0] if isinstance(output, tuple) else output).detach().float()
            angle = prenorm_angle(x, y - x)
            mass = torch.linalg.vector_norm(x, dim=-1) / math.sqrt(x.shape[-1])
            entry.tokens += angle.numel()
            entry.angle_sum += float(angle.sum())
            entry.angle_max = max(entry.angle_max, float(angle.max()))
            entry.mass_sum += float(mass.sum())
            entry.inv_mass_sum += float((1.0 / mass.clamp_min(1e-30)).sum())

        return hook

    for entry, (_, _, module) in zip(stats, modules, strict=True):
        handles.append(module.register_forward_hook(make_hook(entry)))
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for w in _progress(token_windows, "angles"):
                model(input_ids=torch.tensor([w], device=device))
    finally:
        for handle in handles:
            handle.remove()
    return stats


def depth_summary(stats: list[SublayerAngles]) -> dict[str, float]:
    """Mean angle of the lowest and highest third of the layers, and their ratio."""
    layers = sorted({s.layer for s in stats})
    third = max(len(layers) // 3, 1)
    low = [s.angle for s in stats if s.layer in layers[:third]]
    high = [s.angle for s in stats if s.layer in layers[-third:]]
    low_mean, high_mean = sum(low) / len(low), sum(high) / len(high)
    return {
        "lower_third_mean_angle": low_mean,
        "upper_third_mean_angle": high_mean,
        "lower_to_upper_ratio": low_mean / high_mean if high_mean > 0 else math.inf,
    }


def format_table(stats: list[SublayerAngles], prenorm: bool) -> str:
    step_head = "1/s (implied step)" if prenorm else "a_k (step size)"
    header = (
        f"{'layer':>5}  {'sublayer':<8}  {'angle rad':>9}  {'degrees':>8}  {'max rad':>8}  {'|h|/sqrt(d)':>11}  "
        f"{step_head:>18}"
    )
    lines = [header, "-" * len(header)]
    for s in stats:
        if prenorm:
            step = f"{s.inv_mass:.4g}"
        else:
            step = "-" if s.step_size is None else f"{s.step_size:.4g}"
        lines.append(
            f"{s.layer:>5}  {s.sublayer:<8}  {s.angle:>9.4f}  {math.degrees(s.angle):>8.3f}  {s.angle_max:>8.4f}  "
            f"{s.mass:>11.4g}  {step:>18}"
        )
    return "\n".join(lines)


def check_plot_target(path: str) -> None:
    """Fail before the model runs when the plot cannot be drawn or written."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.ClickException("--plot needs matplotlib: pip install matplotlib (or hf-geonorm[plot])") from None
    parent = Path(path).absolute().parent
    if not parent.is_dir():
        raise click.ClickException(f"cannot write the plot to {path}: the folder {parent} does not exist")


def plot(stats: list[SublayerAngles], prenorm: bool, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for sublayer in sorted({s.sublayer for s in stats}):
        rows = [s for s in stats if s.sublayer == sublayer]
        layers = [s.layer for s in rows]
        (line,) = top.plot(layers, [math.degrees(s.angle) for s in rows], marker="o", label=f"{sublayer} (mean)")
        color = line.get_color()
        top.plot(layers, [math.degrees(s.angle_max) for s in rows], ":", color=color, label=f"{sublayer} (max)")
        if prenorm:
            bottom.plot(layers, [s.inv_mass for s in rows], marker="o", color=color, label=f"{sublayer}: 1/s_k")
        elif rows[0].step_size is not None:
            bottom.plot(layers, [s.step_size for s in rows], marker="o", color=color, label=f"{sublayer}: a_k")
        bottom.plot(layers, [s.mass for s in rows], "--", color=color, label=f"{sublayer}: |h|/sqrt(d)")
    top.set_ylabel("rotation per update (degrees)")
    top.set_title(title)
    top.legend(fontsize="small")
    bottom.set_yscale("log")
    bottom.set_xlabel("layer k")
    bottom.set_ylabel("implied step size 1/s_k and mass s_k" if prenorm else "step size a_k and mass")
    bottom.legend(fontsize="small")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as error:
        raise click.ClickException(f"cannot write the plot to {path}: {error.strerror or error}") from None
    finally:
        plt.close(fig)
