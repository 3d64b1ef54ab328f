"""The layout installs as the packages it names: ``cli/`` as ``hf_geonorm_cli`` and ``model_cards/`` as
``hf_geonorm.model_cards`` (pyproject.toml's ``package-dir``), in the editable install the tests run from and in a
wheel. The wheel works on its own: built from a copy of the source, installed into a new virtual environment and run
from a folder outside the source tree, its ``hf-geonorm`` command answers, ``hf_geonorm.modeling`` holds the method
specification, and the model card template renders a card beside a saved model.

The new environment installs the wheel alone (``--no-deps``) and sees this interpreter's site-packages through a
``.pth`` line for torch, transformers and the rest, so nothing is downloaded. An editable install of hf-geonorm
there stays inactive: its finder is started by a ``.pth`` file, and ``.pth`` files of a folder added that way
are not read. The test asserts that ``hf_geonorm`` is imported from the new environment.

The core install (``pip install hf-geonorm``, no extra) brings torch, transformers, peft, safetensors, click and
huggingface_hub and what they need, nothing else, and with them converts, loads, describes, cards and pushes a model;
``train`` and ``sweep`` say in one line which extra they need: checked in a fresh environment installed from the
package index (slow), and in a process where the extras' packages are hidden (every run).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "hf_geonorm", "cli", "model_cards")

CHECK = r"""
import importlib.resources, json, sys
from pathlib import Path

import hf_geonorm
from hf_geonorm.sharing.hub import save_shareable
from hf_geonorm.sharing.model_card import CardInfo, card_template
from transformers import AutoModelForCausalLM

venv = Path(sys.argv[1]).resolve()
assert venv in Path(hf_geonorm.__file__).resolve().parents, hf_geonorm.__file__
spec = importlib.resources.files("hf_geonorm.modeling").joinpath("method.md").read_text(encoding="utf-8")
assert "\n## Choices the paper leaves open\n" in spec
assert "{{ model_name }}" in card_template()
config = hf_geonorm.GeoNormLlamaConfig(
    vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, max_position_embeddings=32,
)
model = AutoModelForCausalLM.from_config(config)
save_shareable(model, "shared", card_info=CardInfo(license="apache-2.0"))
card = Path("shared/README.md").read_text(encoding="utf-8")
assert "library_name: transformers" in card and "geonorm" in card, card[:500]
assert Path("shared/geonorm_method.md").read_text(encoding="utf-8") == spec
print(json.dumps({"module": hf_geonorm.__file__}))
"""


def test_the_editable_install_maps_the_command_line_and_the_card_templates_to_their_folders():
    """The install the tests run from (``pip install -e .``) imports ``hf_geonorm_cli`` from ``cli/`` and
    ``hf_geonorm.model_cards`` from ``model_cards/``, the console script's entry point among them, and the card's
    template is read from there."""
    import importlib.metadata
    import importlib.resources

    import hf_geonorm.model_cards
    import hf_geonorm_cli.main
    from hf_geonorm.sharing.model_card import CARD_TEMPLATE, card_template

    assert Path(hf_geonorm_cli.main.__file__).resolve() == ROOT / "cli" / "main.py"
    assert Path(hf_geonorm.model_cards.__file__).resolve().parent == ROOT / "model_cards"
    (script,) = importlib.metadata.entry_points(group="console_scripts", name="hf-geonorm")
    assert script.load() is hf_geonorm_cli.run and script.load().__module__ == "hf_geonorm_cli"
    assert card_template() == (ROOT / "model_cards" / CARD_TEMPLATE).read_text(encoding="utf-8")
    assert importlib.resources.files("hf_geonorm.model_cards").joinpath(CARD_TEMPLATE).is_file()


def run(args: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, args))}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow  # builds a wheel and a virtual environment: minutes (run with --runslow)
def test_the_wheel_installs_and_runs_outside_the_source_tree(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(
            ROOT / name,
            source / name,
            **({"ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree else {}),
        )
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(source)],
        cwd=tmp_path, timeout=300)  # fmt: skip
    (wheel,) = dist.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"hf_geonorm/modeling/method.md", "hf_geonorm/model_cards/geonorm_model_card.md", "hf_geonorm_cli/main.py",
            "hf_geonorm/checkpoints/loading.py", "hf_geonorm/sweep/grid.py"} <= names  # fmt: skip
    # the folders under their import names only; the golden cards are the tests' (rendered for tiny test models)
    assert not [name for name in names if name.startswith(("cli/", "model_cards/", "hf_geonorm/model_cards/golden"))]

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    Path(purelib, "host-packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        cwd=tmp_path, timeout=300)  # fmt: skip

    work = tmp_path / "elsewhere"
    work.mkdir()
    help_text = run([str(venv / "bin" / "hf-geonorm"), "--help"], cwd=work, timeout=120).stdout
    assert "hf-geonorm convert" in help_text and "Commands:" in help_text
    run([str(venv / "bin" / "hf-geonorm"), "architectures"], cwd=work, timeout=120)
    run([str(python), "-c", CHECK, str(venv)], cwd=work, timeout=300)


# ---- the core install: `pip install hf-geonorm` without extras ----

CORE = {"torch", "transformers", "peft", "safetensors", "click", "huggingface-hub"}  # the card's five, and the Hub's
EXTRA_PACKAGES = ("datasets", "datasketch", "matplotlib", "scipy", "pyarrow", "gguf", "optuna", "psycopg")

# What the new environment holds, and the closure of hf-geonorm's requirements walked here from each installed
# distribution's own metadata (markers evaluated, no extra): what pip had to install, and nothing beside it
INSTALLED = r"""
import importlib.metadata, json
from packaging.requirements import Requirement

def key(name):
    return name.lower().replace("_", "-").replace(".", "-")

dists = {key(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
def needs(name):
    found = []
    for text in dists[name].requires or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            found.append(key(requirement.name))
    return found
reached, todo = set(), ["hf-geonorm"]
while todo:
    name = todo.pop()
    if name not in reached:
        reached.add(name)
        todo += needs(name)
print(json.dumps({"installed": sorted(dists), "reached": sorted(reached), "direct": sorted(needs("hf-geonorm"))}))
"""

STOCK = r"""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64)
LlamaForCausalLM(config).save_pretrained("stock")
"""

# The converted folder (geo_bridge 0) loads through the Auto classes and computes what the stock model does; the stock
# model patched in place does too
LOADED = r"""
import torch
from transformers import AutoModelForCausalLM

import hf_geonorm

stock = AutoModelForCausalLM.from_pretrained("stock").eval()
geo = AutoModelForCausalLM.from_pretrained("geo").eval()
assert type(geo).__name__ == "GeoNormLlamaForCausalLM", type(geo)
ids = torch.arange(1, 17).view(2, 8)
with torch.no_grad():
    expected = stock(ids).logits
    assert torch.equal(geo(ids).logits, expected)
    hf_geonorm.apply_geonorm(stock, norm_style="geo", geo_bridge=0.0)
    assert type(stock).__name__ == "GeoNormLlamaForCausalLM" and torch.equal(stock(ids).logits, expected)
"""


# The command line in a process where the extras' packages are hidden (an import of one fails, and find_spec finds
# none, as where they are not installed): what the core install's commands import must not reach them
WITHOUT_EXTRAS = r"""
import json, sys

for name in sys.argv[1].split(","):
    sys.modules[name] = None
from click.testing import CliRunner

from hf_geonorm_cli.main import cli

results = [CliRunner().invoke(cli, args) for args in json.loads(sys.argv[2])]
print(json.dumps([{"exit_code": result.exit_code, "output": result.output} for result in results]))
"""


def test_the_core_commands_run_without_the_extras_and_train_names_the_extra_it_needs(tmp_path, stock_llama):
    sweep_folder = ROOT / "benchmarks" / "results" / "sweeps" / "j_gpt2_300"  # a committed sweep's output
    commands = [["convert", str(stock_llama), "geo", "--bridge", "0"], ["info", "geo"], ["card", "geo", "--license",
                "mit"], ["info", str(sweep_folder)], ["train"], ["sweep"],
                ["angles", "geo", "--text", str(ROOT / "README.md"), "--plot", "angles.png"]]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS, ",".join(EXTRA_PACKAGES), json.dumps(commands)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    converted, described, carded, swept, *refused = json.loads(done.stdout.splitlines()[-1])
    for result in (converted, described, carded):
        assert result["exit_code"] == 0, result["output"]
    assert "geonorm_llama" in described["output"] and (tmp_path / "geo" / "README.md").is_file()
    jobs = [f"info of the sweep folder {sweep_folder}", "train", "sweep", "angles --plot"]
    for result, what in zip([swept, *refused], jobs, strict=True):
        assert result["exit_code"] == 1 and result["output"].count("\n") == 1, result["output"]
        assert f"hf-geonorm {what} needs the train extra" in result["output"], result["output"]
        assert result["output"].rstrip().endswith("pip install 'hf-geonorm[train]'")


def core_run(args: list[str], cwd: Path, succeed: bool = True, **env: str) -> subprocess.CompletedProcess:
    """``args`` in the core environment's world: HOME in the test's folder, offline unless ``env`` says otherwise."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environ.update({"HOME": str(cwd), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **env})
    done = subprocess.run(args, cwd=cwd, env=environ, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=900)  # fmt: skip
    assert (done.returncode == 0) == succeed, f"{args}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow  # installs torch and the rest from the package index into a new environment: minutes
def test_the_core_install_brings_the_five_packages_and_converts_loads_describes_cards_and_pushes(tmp_path):
    from importlib.metadata import version

    from support.fake_hub import FakeHub

    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, source / name,
             **({"ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree else {}))  # fmt: skip
    venv, work = tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    core_run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    python, command = str(venv / "bin" / "python"), str(venv / "bin" / "hf-geonorm")
    listing = core_run([python, "-m", "pip", "list", "--format", "json"], tmp_path).stdout
    seeded = {name.lower() for name in re.findall(r'"name": "([^"]+)"', listing)}  # what venv put there (pip, ...)
    torch_release = version("torch").split("+")[0]  # this environment's, without its local label (+cpu)
    core_run([python, "-m", "pip", "install", "-q", f"torch=={torch_release}", str(source)], tmp_path)

    packages = json.loads(core_run([python, "-c", INSTALLED], work).stdout)
    assert set(packages["direct"]) == CORE
    assert set(packages["reached"]) <= set(packages["installed"])
    assert set(packages["installed"]) - seeded == set(packages["reached"]) - seeded, "beyond the requirements"
    assert not set(packages["installed"]) & set(EXTRA_PACKAGES)

    core_run([python, "-c", STOCK], work)
    core_run([command, "convert", "stock", "geo", "--bridge", "0"], work)
    core_run([python, "-c", LOADED], work)
    assert "geonorm_llama" in core_run([command, "info", "geo"], work).stdout
    core_run([command, "card", "geo", "--license", "mit"], work)
    assert "license: mit" in (work / "geo" / "README.md").read_text(encoding="utf-8")
    with FakeHub() as hub:
        core_run([command, "push", "geo", "tester/core"], work, HF_HUB_OFFLINE="0", HF_ENDPOINT=hub.url,
                 HF_TOKEN=hub.token, HF_HUB_DISABLE_XET="1")  # fmt: skip
        pushed = hub.files("tester/core")
        assert not hub.unhandled, hub.unhandled
    assert pushed["model.safetensors"] == (work / "geo" / "model.safetensors").read_bytes()

    for job in ("train", "sweep"):  # need the train extra: one line naming it, no traceback
        refused = core_run([command, job], work, succeed=False)
        assert refused.stdout == "" and refused.stderr.count("\n") == 1, refused.stderr
        assert f"hf-geonorm {job} needs the train extra" in refused.stderr
        assert "pip install 'hf-geonorm[train]'" in refused.stderr
    listed = core_run([command, "--help"], work).stdout.split("Commands:\n")[1].splitlines()
    commands = [line.split()[0] for line in listed if line.strip()]
    assert {"convert", "info", "card", "push", "train", "sweep"} <= set(commands), commands
    for name in commands:  # every command's --help answers
        assert "Usage: hf-geonorm " + name in core_run([command, name, "--help"], work).stdout
