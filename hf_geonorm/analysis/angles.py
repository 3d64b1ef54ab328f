"""The rotation angle of every residual update while a model reads real text.

Forward hooks on the GeoNorm residual modules (a stock model is first patched to ``norm_style="pre"``, the stock
computation bit for bit) see the state h entering an update and the state h' leaving it, and record the angle
between them, ``prenorm_angle(h, h' - h)``. For Pre-Norm (stock, ``pre``, or ``geo`` with bridge 0) that is the
rotation Pre-Norm makes implicitly; for GeoNorm it is the rotation the geodesic step made. The hook also records
the per-token mass s = |h|/sqrt(d): 1/s is Pre-Norm's implied step size (hf_geonorm/modeling/method.md, "Pre-Norm as
GeoNorm").
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoints.loading import Source
from ..errors import require_extra
from ..modeling.geometry import geonorm_angle, prenorm_angle
from ..modeling.residual import residual_modules
from ..modeling.settings import GeoNormSettings, computes_prenorm
from .defaults import ANGLE_TOKENS
from .evaluation import check_finite, prepare_model, read_with_hooks, text_windows


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
    ceiling: float | None = None  # the largest angle the clamp lets this update make (a pure geo model's)
    at_clamp: int = 0  # tokens whose update turned by the ceiling: the clamp decided their angle

    @property
    def angle(self) -> float:
        return self.angle_sum / max(self.tokens, 1)

    @property
    def mass(self) -> float:
        return self.mass_sum / max(self.tokens, 1)

    @property
    def inv_mass(self) -> float:
        return self.inv_mass_sum / max(self.tokens, 1)

    @property
    def at_clamp_share(self) -> float | None:
        return None if self.ceiling is None else self.at_clamp / max(self.tokens, 1)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("angle_sum", "mass_sum", "inv_mass_sum"):
            out.pop(key)
        out.update(angle=self.angle, angle_degrees=math.degrees(self.angle), mass=self.mass, inv_mass=self.inv_mass,
                   at_clamp_share=self.at_clamp_share)  # fmt: skip
        return out


CLAMP_TOLERANCE = 1e-3  # an angle within this share of the ceiling counts as at the clamp (float32 rounding)


def clamp_ceiling(module: nn.Module) -> float | None:
    """The largest angle the clamp lets a pure GeoNorm update make (``geonorm_angle`` of an unbounded base angle);
    None where the measured angle is not the clamped one alone (another style, a bridge below 1, learnable steps)."""
    config = module.config
    if module.norm_style != "geo" or module.bridge != 1.0 or config.geo_learnable_step:
        return None
    return float(geonorm_angle(torch.tensor(1e30), module.step_size, config.geo_max_angle, clamp=config.geo_clamp))


def clamp_reading(share: float, max_angle: float | None) -> str:
    """What the share of updates at their clamp says about --alpha, in one sentence."""
    if share >= 0.5:
        return (f"{share:.0%} of the updates turned by their clamp's ceiling, whatever the sublayer proposed: there "
                f"the angle is a_k x {max_angle:.4g} (set by --alpha and --decay alone), so --alpha scales those "
                "angles directly, and a larger --max-angle lets the updates' sizes matter again")  # fmt: skip
    if share > 0:
        return (f"{share:.0%} of the updates reached their clamp: the angles mostly follow a_k |t|/|x|, and --alpha "
                "scales them")  # fmt: skip
    return "no update reached its clamp: the angles follow a_k |t|/|x|, and --alpha scales them"


def regime(config: Any) -> str:
    """'pre-norm' when the model computes Pre-Norm (stock, norm_style pre, geo with bridge 0), else its style."""
    return "pre-norm" if computes_prenorm(config) else config.norm_style


def measure_angles(model: nn.Module, windows: list[list[int]]) -> list[SublayerAngles]:
    """Run the model over the token windows and collect the rotation of every residual update."""
    modules = residual_modules(model)
    if not modules:
        raise ValueError("the model has no GeoNorm residual modules to measure (patch it with apply_geonorm first)")
    geo = getattr(model.config, "norm_style", "pre") == "geo"
    stats = [SublayerAngles(k, name, step_size=module.step_size if geo else None, ceiling=clamp_ceiling(module))
             for k, name, module in modules]  # fmt: skip

    def make_hook(entry: SublayerAngles) -> Any:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            x = args[0].detach().float()
            y = (output[0] if isinstance(output, tuple) else output).detach().float()
            angle = prenorm_angle(x, y - x)
            mass = torch.linalg.vector_norm(x, dim=-1) / math.sqrt(x.shape[-1])
            entry.tokens += angle.numel()
            entry.angle_sum += float(angle.sum())
            entry.angle_max = max(entry.angle_max, float(angle.max()))
            entry.mass_sum += float(mass.sum())
            entry.inv_mass_sum += float((1.0 / mass.clamp_min(1e-30)).sum())
            if entry.ceiling is not None:
                entry.at_clamp += int((angle >= entry.ceiling * (1 - CLAMP_TOLERANCE)).sum())

        return hook

    read_with_hooks(model, windows, [(module, make_hook(entry)) for entry, (_, _, module) in
                                     zip(stats, modules, strict=True)])  # fmt: skip
    return stats


def depth_summary(stats: list[SublayerAngles]) -> dict[str, float]:
    """Mean angle of the lowest and highest third of the layers, and their ratio."""
    layers = sorted({s.layer for s in stats})
    third = max(len(layers) // 3, 1)
    low = [s.angle for s in stats if s.layer in layers[:third]]
    high = [s.angle for s in stats if s.layer in layers[-third:]]
    low_mean, high_mean = sum(low) / len(low), sum(high) / len(high)
    clamped = [s for s in stats if s.ceiling is not None]
    at_clamp = sum(s.at_clamp for s in clamped) / max(sum(s.tokens for s in clamped), 1) if clamped else None
    return {
        "lower_third_mean_angle": low_mean,
        "upper_third_mean_angle": high_mean,
        "lower_to_upper_ratio": low_mean / high_mean if high_mean > 0 else math.inf,
        # the share of all updates (tokens x sublayers) at their clamp; None where the clamp is not measured
        "at_clamp_share": at_clamp,
    }


def angles_table(stats: list[SublayerAngles], prenorm: bool) -> str:
    """The per-sublayer rows as a text table (the implied step 1/s for Pre-Norm, the step size a_k otherwise)."""
    step_head = "1/s (implied step)" if prenorm else "a_k (step size)"
    header = (
        f"{'layer':>5}  {'sublayer':<8}  {'angle rad':>9}  {'degrees':>8}  {'max rad':>8}  {'|h|/sqrt(d)':>11}  "
        f"{step_head:>18}"
    )
    lines = [header, "-" * len(header)]
    for s in stats:
        step = f"{s.inv_mass:.4g}" if prenorm else ("-" if s.step_size is None else f"{s.step_size:.4g}")
        lines.append(
            f"{s.layer:>5}  {s.sublayer:<8}  {s.angle:>9.4f}  {math.degrees(s.angle):>8.3f}  {s.angle_max:>8.4f}  "
            f"{s.mass:>11.4g}  {step:>18}"
        )
    return "\n".join(lines)


def check_plot_target(path: str | os.PathLike) -> None:
    """Before any model runs: ``MissingExtraError`` when the plot cannot be drawn (matplotlib is in the train
    extra), ``ValueError`` when it cannot be written to ``path``."""
    require_extra("train", "hf-geonorm angles --plot")
    parent = Path(path).absolute().parent
    if not parent.is_dir():
        raise ValueError(f"cannot write the plot to {path}: the folder {parent} does not exist")


def plot_angles(stats: list[SublayerAngles], prenorm: bool, path: str | os.PathLike, title: str) -> None:
    """Draw the mean and largest angle per layer (top) and the step sizes and mass (bottom) into a PNG."""
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
        raise ValueError(f"cannot write the plot to {path}: {error.strerror or error}") from None
    finally:
        plt.close(fig)


@dataclass
class AnglesReport:
    """What ``analyse_angles`` found: the source, the regime, the text and one row per residual update."""

    source: Source
    model_type: str
    regime: str
    settings: dict[str, Any]
    tokens: int
    tokenization: str
    text: str
    sublayers: list[SublayerAngles] = field(default_factory=list)

    @property
    def prenorm(self) -> bool:
        return self.regime == "pre-norm"

    @property
    def summary(self) -> dict[str, float]:
        return depth_summary(self.sublayers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source.spec,
            "source_model_type": self.source.model_type,
            "model_type": self.model_type,
            "regime": self.regime,
            "tokens": self.tokens,
            "tokenization": self.tokenization,
            "settings": self.settings,
            "summary": self.summary,
            "sublayers": [s.to_dict() for s in self.sublayers],
        }


def analyse_angles(
    source: Source | str,
    text_path: str | os.PathLike,
    max_tokens: int = ANGLE_TOKENS,
    window: int | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    settings: dict[str, Any] | None = None,
    plot: str | os.PathLike | None = None,
    allow_missing: bool = False,
) -> AnglesReport:
    """The rotation of every residual update of ``source`` (folder, .gguf or Hub id; converted in memory with
    ``settings``) reading the first ``max_tokens`` tokens of a text file, drawn into the PNG ``plot`` when given.

    For a Pre-Norm model these are its implicit angles and implied step sizes 1/s_k; for a GeoNorm model the
    angles its geodesic steps make. ``NonFiniteError`` (a ``ValueError``) when an angle is not finite.
    """
    if plot is not None:
        check_plot_target(plot)
    model, tokenizer, src = prepare_model(source, dtype, device, settings, allow_missing)
    windows, how = text_windows(model, tokenizer, text_path, max_tokens, window, src.spec)
    stats = measure_angles(model, windows)
    for s in stats:
        check_finite(s.angle_sum, f"the angle of the {s.sublayer} update of layer {s.layer}", model, windows)
    report = AnglesReport(
        source=src,
        model_type=model.config.model_type,
        regime=regime(model.config),
        settings=GeoNormSettings.from_object(model.config).to_dict(),
        tokens=sum(len(w) for w in windows),
        tokenization=how,
        text=Path(text_path).name,
        sublayers=stats,
    )
    if plot is not None:
        kind = "Pre-Norm implicit angles" if report.prenorm else f"{report.regime} angles"
        plot_angles(stats, report.prenorm, plot, f"{kind}: {src.label} on {report.text}")
    return report
