"""Every option, limit and constant is declared once: the constants are written in one place and imported, no
GeoNorm setting option is written by hand in the CLI, the API (``validate``) and the command line refuse the same
values with the same message whatever the field, and ``sweep --help`` offers only options that ``sweep`` takes."""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from pathlib import Path
from typing import get_type_hints

import click
import pytest
from click.testing import CliRunner

import hf_geonorm_cli
from hf_geonorm._plumbing.declarations import LIMITS as LIMIT_KEYS
from hf_geonorm._plumbing.declarations import choices_of, members, option_name
from hf_geonorm.modeling import norm_styles, settings
from hf_geonorm.sweep import engine as engine_module
from hf_geonorm.sweep import grid as sweep_module
from hf_geonorm.sweep.engine_options import EngineOptions
from hf_geonorm.sweep.options import SweepOptions
from hf_geonorm.training import presets
from hf_geonorm.training.options import TrainOptions
from hf_geonorm.training.run import trainer as trainer_module
from hf_geonorm_cli.main import cli
from hf_geonorm_cli.options import Checked

COMMANDS = {TrainOptions: "train", SweepOptions: "sweep", EngineOptions: "sweep"}
ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "hf_geonorm").rglob("*.py"), *(ROOT / "hf_geonorm_cli").glob("*.py")])


def literals(path: Path) -> list[object]:
    """The values of the tuple, list and number literals of ``path`` (those made of constants only)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Constant)):
            try:
                found.append(ast.literal_eval(node))
            except ValueError:
                continue
    return found


@pytest.mark.parametrize(
    ("constant", "home"),
    [
        (settings.RADII, "modeling/settings.py"),
        (settings.DECAYS, "modeling/settings.py"),
        (settings.CLAMPS, "modeling/settings.py"),
        (presets.DEFAULT_VOCAB, "training/presets.py"),
    ],
    ids=["radii", "decays", "clamps", "default vocabulary"],
)
def test_each_constant_is_written_once(constant, home):
    """Written out in its home only; everywhere else it is imported (the package and the CLI, which reads the
    home for ``--help`` without torch)."""
    written = [path.relative_to(ROOT).as_posix() for path in SOURCES for value in literals(path)
               if is_written(value, constant)]  # fmt: skip
    assert written == [f"hf_geonorm/{home}"], written


def is_written(value: object, constant: object) -> bool:
    """Whether a literal spells ``constant`` out: the same items (as a tuple or a list), or the same number."""
    if isinstance(constant, tuple):
        return isinstance(value, (tuple, list)) and tuple(value) == constant
    return type(value) is type(constant) and value == constant


def test_the_norm_style_names_are_the_declarations_keys_and_written_nowhere_as_a_list():
    """A style is declared once (``modeling/norm_styles.py``): no list of the styles is written out anywhere, the
    settings read theirs from the declarations."""
    names = tuple(norm_styles.NORM_STYLE_DECLARATIONS)
    assert settings.NORM_STYLES == names == ("pre", "post", "sandwich", "deepnorm", "geo")
    written = [path.relative_to(ROOT).as_posix() for path in SOURCES for value in literals(path)
               if isinstance(value, (tuple, list)) and len(value) > 2
               and all(item in names for item in value)]  # fmt: skip
    assert not written, written


def test_the_preset_names_are_the_presets_keys_and_written_nowhere_else():
    names = tuple(presets.PRESETS)
    written = [path.name for path in SOURCES for value in literals(path)
               if isinstance(value, (tuple, list)) and len(value) > 1
               and all(item in names for item in value)]  # fmt: skip
    assert not written, written


def test_no_geonorm_setting_option_is_written_by_hand_in_the_cli():
    options = [option_name(spec) for spec in dataclasses.fields(settings.GeoNormSettings)
               if "help" in spec.metadata]  # fmt: skip
    assert len(options) == 11 and "--norm-style" in options and "--post-zero-positions" in options
    for path in sorted((ROOT / "hf_geonorm_cli").glob("*.py")):
        words = {value for value in literals(path) if isinstance(value, str)}
        assert not words & set(options), (path.name, sorted(words & set(options)))


def outside_values(spec: dataclasses.Field, hint: object) -> list:
    """Values just outside each limit ``spec`` declares, worked out from the limits: one below a minimum (the
    minimum itself when it is excluded), one above a maximum, NaN for a number, a name that is not a choice."""
    limits = spec.metadata
    whole = int in members(hint)
    step = 1 if whole else 0.5
    values: list = []
    if "ge" in limits:
        values.append(limits["ge"] - step)
    if "gt" in limits:
        values.append(limits["gt"])
    if "le" in limits:
        values.append(limits["le"] + step)
    if "lt" in limits:
        values.append(limits["lt"])
    if any(key in limits for key in LIMIT_KEYS) and not whole:
        values.append(math.nan)
    if choices_of(hint) is not None:
        values.append("not-" + "-".join(choices_of(hint)))
    return values


def declared_limits() -> list[tuple[type, str, object]]:
    """(declaration, field, value outside a limit) for every declared limit of ``train``'s and ``sweep``'s own
    options that the command line can give a value for (a field set only by switches, ``--bf16``, cannot)."""
    cases = []
    for declaration in COMMANDS:
        hints = get_type_hints(declaration)
        for spec in dataclasses.fields(declaration):
            if "help" in spec.metadata and "flags" not in spec.metadata:
                cases += [(declaration, spec.name, value) for value in outside_values(spec, hints[spec.name])]
    return cases


LIMITS = declared_limits()


def test_the_walk_covers_the_limits_that_drifted_and_each_kind_of_limit():
    walked = {(declaration.__name__, name) for declaration, name, _ in LIMITS}
    assert {("TrainOptions", "seq_len"), ("TrainOptions", "vocab_size"), ("TrainOptions", "lr"),
            ("TrainOptions", "adam_beta2"), ("TrainOptions", "bridge_order"), ("SweepOptions", "extend"),
            ("EngineOptions", "workers")} <= walked


def api_refusal(declaration: type, values: dict) -> str:
    """The message ``validate`` refuses ``values`` with (a ``ValueError``: the command line's usage error)."""
    with pytest.raises(ValueError) as refused:
        declaration(**values).validate()
    return str(refused.value)


def cli_output(command: str, args: list[str], tmp_path, monkeypatch) -> click.testing.Result:
    """``hf-geonorm COMMAND ARGS`` with nothing trained: the library's entry points validate and stop."""
    monkeypatch.setattr(trainer_module, "run_training", lambda options, log: options.validate())
    monkeypatch.setattr(sweep_module, "run_sweep", lambda sweep, train, log, runner: (sweep.validate(),
                                                                                      train.validate()))  # fmt: skip
    return CliRunner().invoke(cli, [command, "--output", str(tmp_path / "out"), *args])


@pytest.mark.parametrize(("declaration", "name", "value"), LIMITS,
                         ids=[f"{d.__name__}.{n}={v}" for d, n, v in LIMITS])  # fmt: skip
def test_the_api_and_the_command_line_refuse_a_value_outside_a_declared_limit_alike(
    declaration, name, value, tmp_path, monkeypatch
):
    message = api_refusal(declaration, {name: value})
    option = "--" + name.replace("_", "-")
    assert option in message, message
    result = cli_output(COMMANDS[declaration], [f"{option}={value}"], tmp_path, monkeypatch)
    assert result.exit_code == 2 and message in result.output, (message, result.output)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("name", "value", "limit"), [("seq_len", 1, ">= 2"), ("vocab_size", 100, ">= 260")])
def test_the_limits_that_drifted_are_refused_by_the_api_as_by_the_command_line(
    name, value, limit, tmp_path, monkeypatch
):
    """``seq_len`` and ``vocab_size`` were refused below 2 and 260 on the command line but only below 1 from the
    API."""
    message = api_refusal(TrainOptions, {name: value})
    assert limit in message and f"got {value}" in message, message
    result = cli_output("train", ["--" + name.replace("_", "-"), str(value)], tmp_path, monkeypatch)
    assert result.exit_code == 2 and message in result.output, result.output


OPTION_LINE = re.compile(r"^  (?:-\w, )?(--[a-z0-9-]+)(?: / (--[a-z0-9-]+))?", re.MULTILINE)


def sample_value(param: click.Parameter, folder) -> list[str]:
    """Words that give ``param`` a value its type accepts: none for a switch, the first choice, an empty folder,
    the bottom of a declared range, else 1."""
    if isinstance(param, click.Option) and param.is_flag:
        return []
    kind = param.type
    limits = kind.field.metadata if isinstance(kind, Checked) else {}
    if isinstance(kind, Checked) and choices_of(kind.hint) is not None:
        word = str(choices_of(kind.hint)[0])
    elif isinstance(kind, click.Path):
        folder.mkdir()
        word = str(folder)
    elif "ge" in limits or "gt" in limits:
        word = str(limits["ge"] if "ge" in limits else limits["gt"] + 1)
    else:
        word = "1"
    return [word] * param.nargs


def test_every_option_sweep_offers_is_accepted(tmp_path, monkeypatch):
    """Each option of ``sweep --help``, given alone with a value its type accepts, reaches the sweep, which takes
    it: no option that the sweep would refuse (as it refuses ``--lr`` and ``--norm-style``, which the grid sets) is
    offered. The values themselves are checked elsewhere: here both declarations' ``validate`` pass, and nothing
    trains."""
    offered = [name for match in OPTION_LINE.finditer(CliRunner().invoke(cli, ["sweep", "--help"]).output)
               for name in match.groups() if name and name != "--help"]  # fmt: skip
    assert "--styles" in offered and "--alpha" in offered and "--no-learnable-step" in offered
    assert "--lr" not in offered and "--norm-style" not in offered
    params = {opt: param for param in cli.commands["sweep"].params for opt in [*param.opts, *param.secondary_opts]}
    monkeypatch.setattr(TrainOptions, "validate", lambda self: self)
    monkeypatch.setattr(SweepOptions, "validate", lambda self: self)

    class NothingTrained:
        def __init__(self, *args: object) -> None:
            pass

        def run(self) -> list:
            return []

    monkeypatch.setattr(sweep_module, "_Sweep", NothingTrained)
    monkeypatch.setattr(engine_module, "ParallelSweep", NothingTrained)
    monkeypatch.setattr(EngineOptions, "validate", lambda self: self)
    refused = {}
    for number, option in enumerate(offered):
        args = [option, *sample_value(params[option], tmp_path / f"folder-{number}")]
        if option != "--output":
            args += ["--output", str(tmp_path / f"sweep-{number}")]
        result = CliRunner().invoke(cli, ["sweep", *args])
        if result.exit_code != 0:
            refused[" ".join(args[:3])] = result.output.strip().splitlines()[-1:]
    assert not refused, refused


def test_the_api_takes_a_presets_sizes_as_well_as_its_name():
    """The study's shapes, and any caller of the library, give ``preset`` as the sizes themselves; the command line
    takes the names only, and a name not in the table is refused from both."""
    sizes = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2}
    assert TrainOptions(preset=sizes).validate().preset == sizes
    with pytest.raises(ValueError, match="--preset must be one of tiny, 125m"):
        TrainOptions(preset="huge").validate()


def test_no_click_option_is_declared_by_hand_in_the_cli():
    """Every command's options come from a declaration (``TrainOptions``, ``ConversionOptions``, the command line's
    own in ``command_options.py``): only the generator (``options.py``) calls ``click.option``."""
    calling = set()
    for path in sorted(Path(hf_geonorm_cli.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "option" and getattr(node.value, "id", None) == "click":
                calling.add(path.name)
    assert calling == {"options.py"}, sorted(calling)


def test_convert_takes_conversion_options_as_declared():
    """``convert``'s options are ``ConversionOptions``' fields (and the settings), with their defaults: the command
    builds the options object from its declaration."""
    from hf_geonorm.conversion.convert import ConversionOptions

    settings_names = {spec.name for spec in dataclasses.fields(settings.GeoNormSettings) if "help" in spec.metadata}
    params = {param.name: param for param in cli.commands["convert"].params}
    taken = set(params) - settings_names - {"source", "output_dir"}
    assert taken == {spec.name for spec in dataclasses.fields(ConversionOptions)}
    defaults = {name: value for name, value in dataclasses.asdict(ConversionOptions()).items() if value is not None}
    assert {name: params[name].default for name in defaults} == defaults  # (None: no default given to click)
