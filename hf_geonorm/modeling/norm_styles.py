"""The norm styles of the GeoNorm family (method.md, "The family"), each declared once, here: the modules and
init it adds, its model card's words and where its default learning rate comes from. The code that builds,
patches, describes or trains a model reads these declarations. The residual rules of the five styles are one
``match`` over ``norm_style`` in ``GeoNormResidual.forward`` (``residual.py``); a style declared with a ``rule``
of its own runs that instead, so adding a style is adding its declaration (``tests/test_norm_styles.py`` adds a
sixth in a copy of the package and runs a model with it).

Standard library only, like ``settings.py``, which reads the style names from here: the command line reads both
without torch. A rule therefore uses only the operators of the tensors and modules it is handed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Where a style's default peak learning rate comes from beyond its own measured cells (``training/rate_rule.py``):
# the Pre-Norm recipe itself (the measured Pre-Norm cells, then GPT-3's published rates by size), or Pre-Norm's rate
# times this style's measured ratio to it at the largest shape both were measured at (an extrapolation; Pre-Norm's
# rate, as a fallback, for a style no cell measured beside Pre-Norm).
PRE_NORM_RECIPE = "the Pre-Norm recipe"
RATIO_TO_PRE_NORM = "ratio to Pre-Norm"
RATE_SOURCES = (PRE_NORM_RECIPE, RATIO_TO_PRE_NORM)

# (residual, x, u, norm, first_tokens) -> the new state, for a style that is not one of the five: the residual
# module (``residual.GeoNormResidual``) of the update, the state, the sublayer's update, the block's norm before
# that sublayer, the first-token mask or None.
ResidualRule = Callable[[Any, Any, Any, Any, Any], Any]


@dataclass(frozen=True)
class NormStyle:
    """One member of the family, as ``norm_style`` names it.

    ``card_text`` how the model card names it (its name, then after a comma or colon its rule);
    ``normalises_after``: the sublayer reads the state itself and the rule normalises afterwards with the block's
    own norms (so the first block's input follows ``post_embedding_norm``, and a model built from a config starts a
    learned position table at zero under ``post_zero_positions``); ``output_norms``: each sublayer's update passes
    a fresh norm of the block's kind (``residual.output_norm``, starting as the identity); ``deepnet_init``: a
    model built from a config draws DeepNet's init (``fresh_init.deepnet_init_``); ``geodesic``: the GeoNorm update
    with its entry (``geo_radius``), learnable step, padding row and first-token rule; ``rate_source`` one of
    ``RATE_SOURCES`` (every style but Pre-Norm: its ratio to Pre-Norm); ``is_stock``: the style is the stock model
    itself (``pre``); ``rule`` the residual update of a style that is not one of the five (``ResidualRule``; the
    five are written out in ``GeoNormResidual.forward``)."""

    name: str
    card_text: str
    is_stock: bool = False
    normalises_after: bool = False
    output_norms: bool = False
    deepnet_init: bool = False
    geodesic: bool = False
    rate_source: str = RATIO_TO_PRE_NORM
    rule: ResidualRule | None = None

    @property
    def title(self) -> str:
        """The style's name as a card's title names the model: ``card_text`` up to its first comma or colon
        ("Pre-Norm", "GeoNorm")."""
        return re.split(r"[,:]", self.card_text, maxsplit=1)[0]

    @property
    def only_input_norms(self) -> bool:
        """Whether the style uses the block's norms only before the sublayers and adds none: then it also applies
        to blocks that already normalise each sublayer's output, or have no norm before a sublayer."""
        return not (self.normalises_after or self.output_norms)


def named_styles(which: Callable[[NormStyle], bool], last: str) -> str:
    """The declared styles for which ``which`` holds, named for a message: "'pre' (the stock model) and 'geo'"
    (``last`` "and"), or with "or"."""
    names = [repr(s.name) + (" (the stock model)" if s.is_stock and last == "and" else "")
             for s in NORM_STYLE_DECLARATIONS.values() if which(s)]  # fmt: skip
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


NORM_STYLE_DECLARATIONS: dict[str, NormStyle] = {
    style.name: style
    for style in (
        NormStyle("pre", "Pre-Norm, x + F(N(x)): the stock model", is_stock=True, rate_source=PRE_NORM_RECIPE),
        NormStyle("post", "Post-Norm, N(x + F(x))", normalises_after=True),
        NormStyle("sandwich", "Sandwich-Norm, x + N'(F(N(x)))", output_norms=True),
        NormStyle("deepnorm", "DeepNorm, N(alpha x + F(x))", normalises_after=True, deepnet_init=True),
        NormStyle("geo", "GeoNorm: geodesic steps on the sphere", geodesic=True),
    )
}
NORM_STYLES = tuple(NORM_STYLE_DECLARATIONS)
