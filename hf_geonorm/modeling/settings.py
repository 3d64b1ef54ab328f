"""The settings that select a member of the GeoNorm family, their validation, and their command-line options.

The field names are the config fields of every GeoNorm model (``config.norm_style`` and so on). The config is
their one home: a model's residual modules read them from it at every forward (``residual.py``). A field that the
commands take as an option has its help in its metadata (``help``, and ``name``, ``metavar`` and the limits ``ge``
and ``le`` where it needs them) and its choices in its type; the command line generates the options from them. The
module imports the standard library only, so that ``hf-geonorm --help`` reads it without torch (and it ships as
remote code beside the modelling files).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, NewType

from .norm_styles import NORM_STYLE_DECLARATIONS, NORM_STYLES

RADII = ("embedding", "sqrt_d")
CLAMPS = ("both", "final")
# what the first block of a post-normalising style reads: the embeddings as the stock model sums them, times
# sqrt(hidden_size) (the original Transformer), or normalised per token without a gain or bias (BERT's embedding
# LayerNorm at its init)
POST_EMBEDDING_NORMS = ("none", "sqrt_d", "layer_norm")
DECAYS = ("harmonic", "sqrt", "linear", "constant")
# The largest step size a model accepts. Beyond it the step is numerically meaningless: with a clamp every token
# turns by max_angle whatever its update; without one the angle alpha |t|/|x| winds around the circle so many
# times that float32 keeps none of its digits; and the gradients, of the order of alpha per step, overflow
# float32 and bfloat16 within a few layers.
MAX_ALPHA = 1e6
# How far ``geo_frames`` may rise in all: the product of c_next / c over every update where the frame grows,
# counted from 1 before the first update. Between bridge 0 and 1 the state's radius interpolates between the
# framed Pre-Norm update's and the GeoNorm update's, so a rising frame scales the state up and the next falling
# frame does not scale it back: rises compound with depth, and at 1e7 between two neighbours a 3-layer model's
# state already overflows float32 at bridge 0.5. Calibrated frames (|h_0| / |h| before each update) fall with
# depth and rise only by noise.
MAX_FRAME_RISE = 1e4
# The smallest frame: below it the framed state is lost against the norms' epsilon and its gradients underflow.
MIN_FRAME = 1e-9

# No step turns a state further than this, also with no clamp (``max_angle=None``): pi takes a state to its
# antipode, the end of every geodesic that is the shortest path (the exponential map is one-to-one only up to
# there). Turning further winds back around the circle; its angle, linear in alpha, has gradients of order alpha
# per step, which compound over the layers past float16's range from alpha ~ 1e2 and past float32's from ~1e4.
MAX_TURN = math.pi
# States shorter than this have no usable direction (torch.nn.functional.normalize uses the same eps): the
# GeoNorm step leaves them where they are, and every division by |x| is by at least this.
NORM_FLOOR = 1e-12

# An angle in radians, in (0, pi]: the command line also reads it as pi/N, and "none" for no clamp
Radians = NewType("Radians", float)


def computes_prenorm(settings: Any) -> bool:
    """Whether a model with these settings (a mapping or a config; none at all: a stock model) computes the stock
    Pre-Norm update: ``norm_style="pre"``, or ``geo`` with ``geo_bridge=0``."""
    get = settings.get if isinstance(settings, dict) else lambda name, default: getattr(settings, name, default)
    style = get("norm_style", "pre")
    bridges = get("geo_bridge", 1.0)
    bridges = bridges if isinstance(bridges, list) else [bridges]
    return style == "pre" or (style == "geo" and all(b == 0.0 for b in bridges))


def frame_rise(frames: list[float]) -> float:
    """The product of c_next / c over the updates where ``frames`` grow, counted from 1 before the first."""
    rise, previous = 1.0, 1.0
    for c in frames:
        rise *= max(c / previous, 1.0)
        previous = c
    return rise


def check_frames(frames: list[float]) -> None:
    """``ValueError`` for positive frames that would make the bridge overflow (``MAX_FRAME_RISE``) or underflow
    (``MIN_FRAME``); every other list gives finite outputs and gradients on a finite model."""
    smallest = min(frames)
    if smallest < MIN_FRAME:
        raise ValueError(
            f"geo_frames must each be at least {MIN_FRAME:g}: a smaller frame shrinks the state below the norms' "
            f"epsilon and its gradients underflow; got {smallest:g}"
        )
    rise = frame_rise(frames)
    if rise > MAX_FRAME_RISE * (1.0 + 1e-9):
        raise ValueError(
            f"geo_frames may rise by at most a factor of {MAX_FRAME_RISE:g} in all (the product of c_next / c over "
            "the updates where the frame grows, from 1 before the first): between bridge 0 and 1 a rising frame "
            "scales the state up and a falling one does not scale it back, so larger rises overflow float32; got "
            f"a rise of {rise:.4g} (calibrated frames, `convert --calibrate`, fall with depth)"
        )


@dataclass
class GeoNormSettings:
    """Which residual update every block uses; ``geo`` with the defaults is the paper's GeoNorm.

    ``geo_alpha`` defaults to 0.5, not the spec's 1.0: the scaling study, now history
    (``benchmarks/results/history/scaling.md``), trained GPT-2 and LLaMA shapes over token budgets 0.13M-1M, depths
    4-32 and alpha 0.125-2 on two corpora, and 0.5 (harmonic decay) had the lowest mean regret against each cell's best
    alpha; the best alpha grows with the budget and shrinks with depth, so 0.5 is a middle, not an optimum
    everywhere. The tuned-rate study (``benchmarks/results/sweeps/study.md``, phase e) agrees: with each alpha at its
    own best rate, alpha 1 is 0.043 ± 0.015 lower on test at 4 layers (Welch's p = 0.064) and 0.351 ± 0.015 higher
    at 24 layers (p < 0.001).
    Set ``geo_alpha`` for your budget where you can tune it."""

    norm_style: Literal[NORM_STYLES] = field(default="geo", metadata={"help": (
        "Residual update of every block, one of the family the choices name: geo is GeoNorm, pre the stock "
        "Pre-Norm.")})  # fmt: skip
    post_zero_positions: bool = field(default=True, metadata={"help": (
        "post and deepnorm built from a config: a learned position table (GPT-2's) starts at zero, not at random "
        "(other styles, and trained weights, are left alone).")})  # fmt: skip
    post_embedding_norm: Literal[POST_EMBEDDING_NORMS] = field(default="none", metadata={"help": (
        "post and deepnorm: what the first block reads: the embeddings as the stock model sums them (none), times "
        "sqrt(hidden_size) (sqrt_d, the original Transformer), or normalised per token (layer_norm, BERT's "
        "embedding LayerNorm without its gain and bias).")})  # fmt: skip
    geo_alpha: float | list[float] = field(default=0.5, metadata={"name": "--alpha", "help": (
        "Base step size a, or a comma-separated list of T per-layer (or 2T per-update) step sizes (used as "
        "given)."), "ge": 0, "metavar": "FLOAT|LIST"})  # fmt: skip
    geo_decay: Literal[DECAYS] = field(default="harmonic", metadata={"name": "--decay", "help": (
        "Layer-wise step-size schedule a_k: harmonic a/k, sqrt a/sqrt(k), linear a(T+1-k)/T, constant a.")})
    geo_max_angle: Radians | None = field(default=math.pi / 4, metadata={"name": "--max-angle", "help": (
        "Clamp on each rotation, in radians (a number, pi/4, ...) or 'none'."), "metavar": "RAD|none"})
    geo_clamp: Literal[CLAMPS] = field(default="both", metadata={"name": "--clamp", "help": (
        "What --max-angle clamps: both the base angle |t|/|x| and the final angle (the paper's rule), or the final "
        "angle only (for small calibrated steps).")})  # fmt: skip
    geo_learnable_step: bool = field(default=False, metadata={"name": "--learnable-step", "help": (
        "Give every sublayer a learnable scale and bias on its angle.")})
    geo_radius: Literal[RADII] = field(default="embedding", metadata={"name": "--radius", "help": (
        "Sphere radius: each token's embedding norm, or sqrt(hidden_size).")})
    geo_bridge: float | list[float] = field(default=1.0, metadata={"name": "--bridge", "help": (
        "0 = exact Pre-Norm (the source model's outputs), 1 = pure GeoNorm; in between interpolates (a list: one "
        "value per layer, or per update)."), "ge": 0, "le": 1})  # fmt: skip
    geo_frames: list[float] | None = None
    geo_bridge_costs: list[float] | None = None
    geo_first_token_prenorm: bool = field(default=False, metadata={"name": "--first-token-prenorm", "help": (
        "The first token of each sequence (position id 0) takes the Pre-Norm update x + u, for models converted "
        "from Pre-Norm.")})  # fmt: skip

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, num_layers: int | None = None) -> GeoNormSettings:
        """Raise ``ValueError`` naming the valid values for any setting out of range; return self."""
        if self.norm_style not in NORM_STYLES:
            raise ValueError(f"norm_style must be one of {', '.join(NORM_STYLES)}; got {self.norm_style!r}")
        if self.geo_decay not in DECAYS:
            raise ValueError(f"geo_decay must be one of {', '.join(DECAYS)}; got {self.geo_decay!r}")
        if self.geo_radius not in RADII:
            raise ValueError(f"geo_radius must be one of {', '.join(RADII)}; got {self.geo_radius!r}")
        if self.post_embedding_norm not in POST_EMBEDDING_NORMS:
            raise ValueError(
                f"post_embedding_norm must be one of {', '.join(POST_EMBEDDING_NORMS)}; "
                f"got {self.post_embedding_norm!r}"
            )
        if self.post_embedding_norm != "none" and not NORM_STYLE_DECLARATIONS[self.norm_style].normalises_after:
            post_styles = [style.name for style in NORM_STYLE_DECLARATIONS.values() if style.normalises_after]
            raise ValueError(
                f"post_embedding_norm={self.post_embedding_norm!r} is part of the {' and '.join(post_styles)} styles; "
                f"with norm_style={self.norm_style!r} leave it at 'none'"
            )
        if self.geo_clamp not in CLAMPS:
            raise ValueError(f"geo_clamp must be one of {', '.join(CLAMPS)}; got {self.geo_clamp!r}")
        alpha = self.geo_alpha
        values = list(alpha) if isinstance(alpha, (list, tuple)) else [alpha]
        for a in values:
            if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or a < 0:
                raise ValueError(
                    f"geo_alpha must be a finite number >= 0 or a list of them, one per layer; got {alpha!r}"
                )
            if a > MAX_ALPHA:
                raise ValueError(
                    f"geo_alpha must be at most {MAX_ALPHA:g}: a larger step size only turns every token by "
                    "max_angle (or, with no clamp, winds it around the circle) and its gradients overflow float32 "
                    f"and bfloat16; got {alpha!r}"
                )
        if isinstance(alpha, (list, tuple)):
            self.geo_alpha = [float(a) for a in alpha]
        else:
            self.geo_alpha = float(alpha)
        m = self.geo_max_angle
        if m is not None:
            if isinstance(m, bool) or not isinstance(m, (int, float)) or not (0 < m <= math.pi):
                raise ValueError(f"geo_max_angle must be None or a number of radians in (0, pi]; got {m!r}")
            self.geo_max_angle = float(m)
        for flag in ("post_zero_positions", "geo_learnable_step", "geo_first_token_prenorm"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be True or False; got {getattr(self, flag)!r}")
        b = self.geo_bridge
        bridges = list(b) if isinstance(b, (list, tuple)) else [b]
        if not bridges or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0
                              for v in bridges):  # fmt: skip
            raise ValueError(
                "geo_bridge must be a number in [0, 1] (1 = GeoNorm, 0 = Pre-Norm) or a list of them, one per layer "
                f"or per update; got {b!r}"
            )
        self.geo_bridge = [float(v) for v in bridges] if isinstance(b, (list, tuple)) else float(b)
        frames = self.geo_frames
        if frames is not None:
            if not isinstance(frames, (list, tuple)) or not frames or any(
                isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0
                for c in frames
            ):
                raise ValueError(
                    "geo_frames must be None or a list of positive numbers, one per update (the scale of the "
                    f"Pre-Norm state before each update; `convert --calibrate` measures it); got {frames!r}"
                )
            self.geo_frames = [float(c) for c in frames]
            check_frames(self.geo_frames)
        costs = self.geo_bridge_costs
        if costs is not None:
            if not isinstance(costs, (list, tuple)) or not costs or any(
                isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) for c in costs
            ):
                raise ValueError(
                    "geo_bridge_costs must be None or a list of finite numbers, one per update (the loss in nats "
                    "that moving that update alone to bridge 1 adds; `convert --calibrate` measures it); got "
                    f"{costs!r}"
                )
            self.geo_bridge_costs = [float(c) for c in costs]
        if num_layers is not None:
            for name in ("geo_alpha", "geo_bridge", "geo_frames", "geo_bridge_costs"):
                values = getattr(self, name)
                if isinstance(values, list) and len(values) not in (num_layers, 2 * num_layers):
                    raise ValueError(
                        f"{name} given as a list must have one value per layer ({num_layers}) or one per update "
                        f"({2 * num_layers}: attention, then feed-forward, of each layer); got {len(values)}"
                    )
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_object(cls, obj: Any, **overrides: Any) -> GeoNormSettings:
        """Read the settings from a config (or any object with the fields), defaults where missing."""
        values = {n: getattr(obj, n) for n in cls.names() if hasattr(obj, n)}
        unknown = set(overrides) - set(cls.names())
        if unknown:
            raise ValueError(
                f"unknown GeoNorm setting(s) {', '.join(sorted(unknown))}; valid: {', '.join(cls.names())}"
            )
        values.update(overrides)
        return cls(**values)
