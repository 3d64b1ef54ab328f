"""The layout installs as the packages it names: ``cli/`` as ``hf_geonorm_cli`` and ``model_cards/`` as
``hf_geonorm.model_cards`` (pyproject.toml's ``package-dir``), in the editable install the tests run from and in a
wheel. The wheel works on its own: built from a copy of the source, installed into a new virtual environment and run
from a folder outside the source tree, its ``hf-geonorm`` command answers, ``hf_geonorm.modeling`` holds the method
specification, and the model card template renders a card beside a saved model.

The new environment installs the wheel alone (``--no-deps``) and sees this interpreter's site-packages through a
``.pth`` line for torch, transformers and the rest, so nothing is downloaded. An editable install of hf-geonorm
there stays inactive: its finder is started by a ``.pth`` file, and ``.pth`` files of a folder added that way
are not read. The test asserts that ``hf_geonorm`` is imported from the new environment.
"""

from __future__ import annotations

import os
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
