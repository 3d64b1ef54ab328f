"""The bridge anneal of an uptraining run: ``geo_bridge`` from a converted Pre-Norm checkpoint's value to 1.0
(hf_geonorm/modeling/method.md, "The bridge"), all updates together or the last first."""

from __future__ import annotations

import torch
from transformers import TrainerCallback

from ...modeling.geometry import per_update
from ...modeling.residual import residual_modules
from ..options import BRIDGE_ORDERS

MIN_COST = 0.01  # nats: the least share weight of an update in a last-first anneal


def last_first_bridges(progress: float, weights: list[float]) -> list[float]:
    """Per-update bridge values ``progress`` (0 to 1) of the way through a last-first anneal: the updates reach 1
    one at a time, from the last to the first, update j over a share of the anneal proportional to weights[j]."""
    if progress >= 1.0:
        return [1.0] * len(weights)  # exactly: the sum of the shares may differ from the total by rounding
    largest = max(weights)
    scaled = [w / largest for w in weights]  # at most 1 each: huge finite weights (1e308) sum without overflow
    total, values, done = sum(scaled), [0.0] * len(scaled), 0.0
    for j in reversed(range(len(scaled))):
        reached = progress * total - done
        if scaled[j] > 0.0:
            values[j] = min(1.0, max(0.0, reached / scaled[j]))
        else:  # a share too small for a float (1e-320 of the largest): done as soon as its turn comes
            values[j] = 1.0 if reached > 0.0 else 0.0
        done += scaled[j]
    return values


def anneal_weights(costs: list[float]) -> list[float]:
    """The share weight of each update in a last-first anneal: the loss its conversion alone costs
    (``geo_bridge_costs``), at least ``MIN_COST`` (the updates that cost most take longest)."""
    return [max(cost, MIN_COST) for cost in costs]


class BridgeAnneal(TrainerCallback):
    """Anneal ``geo_bridge`` from its starting value to 1.0 over ``steps`` optimiser steps: the path from a
    converted Pre-Norm checkpoint (bridge 0: its exact outputs) to pure GeoNorm (hf_geonorm/modeling/method.md, "The
    bridge").

    The schedule: optimiser step s (1-based) runs at ``value_at(s)``, ``start + (1 - start) * s / steps`` for
    ``"together"``, so the last anneal step (s = ``steps``) and every step after it run at exactly 1.0, and the
    model saved after it has bridge 1.0. The value logged at step s is the one step s ran at.

    ``order="together"`` moves every update's bridge linearly at once; ``"last-first"`` converts the updates one at
    a time from the last to the first, each over a share of the steps weighted by ``anneal_weights``; it needs the
    frames and bridge costs of ``convert --calibrate`` (without frames the Pre-Norm part of a half-bridged model is
    off scale)."""

    def __init__(self, model: torch.nn.Module | None, steps: int, start: float, order: str = "together") -> None:
        if order not in BRIDGE_ORDERS:
            raise ValueError(f"the bridge order must be one of {', '.join(BRIDGE_ORDERS)}; got {order!r}")
        self.model, self.steps, self.start, self.order = model, steps, start, order
        if order == "last-first":
            found = residual_modules(model)
            modules, layers = [module for _, _, module in found], len({layer for layer, _, _ in found})
            costs = getattr(model.config, "geo_bridge_costs", None)
            if not modules or any(module.frame is None for module in modules) or costs is None:
                raise ValueError(
                    "the last-first bridge order needs the Pre-Norm frames and bridge costs (geo_frames, "
                    "geo_bridge_costs) of a calibrated conversion: convert the Pre-Norm checkpoint with --bridge 0 "
                    "--calibrate TEXT first"
                )
            self.weights = anneal_weights(per_update("geo_bridge_costs", costs, layers, len(modules) // max(layers, 1)))
            self.start = [module.bridge for module in modules]

    def value_at(self, step: int) -> float | list[float]:
        """The bridge that optimiser step ``step`` (1-based) runs at, and the model holds after it (0: the start)."""
        progress = min(1.0, step / self.steps)
        if not isinstance(self.start, list):  # together, from one value
            return self.start + (1.0 - self.start) * progress
        if self.order == "together":
            shares = [progress] * len(self.start)
        else:
            shares = last_first_bridges(progress, self.weights)
        values = [1.0 if share >= 1.0 else b + (1.0 - b) * share for b, share in zip(self.start, shares, strict=True)]
        return 1.0 if all(v == 1.0 for v in values) else values

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001 - Trainer's callback signature
        self.model.config.geo_bridge = self.value_at(state.global_step + 1)  # the model reads its config

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
        if state.log_history:  # the Trainer has already stored a copy of ``logs`` there (a list: its mean)
            value = self.value_at(state.global_step)  # what the step just taken ran at
            state.log_history[-1]["geo_bridge"] = value if isinstance(value, float) else sum(value) / len(value)
