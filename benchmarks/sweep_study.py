"""The study behind train's default learning rates and the README's evidence: every arm tuned the same way through
``hf-geonorm sweep``'s library function (``run_sweep``: the code users run), chosen on validation, reported on test.

Phases, each a sweep folder under ``--results`` (runs.jsonl, sweep.md, sweep.png, written by the sweep):

- ``a_gpt2``, ``a_llama``: train's default model (4 layers, width 128) and LLaMA at that size on the standard
  library's source; Pre-Norm and GeoNorm (library defaults) at six rates a factor 2 apart (1e-3 to 32e-3), the grid
  extended (twice at most) while an arm's best rate is at its edge; then seeds 0-2 at each arm's best rate.
- ``b_fortunes``: prose (Debian's ``fortunes``): each arm at half, once and twice its phase-a rate, then seeds 0-2
  at the best of these. ``b_gcide``: a dictionary (``dict-gcide``) whose validation chooses nothing here: the same three
  rates for the curve, and seeds 0-2 at the rates chosen on fortunes.
- ``c_depth``: GPT-2 at 24 layers, width 64: five rates per arm (2e-3 to 32e-3, extended at an edge), then seeds
  0-2 at each best.
- ``d_alpha``: geo_alpha 0.25, 0.5, 1 x four rates around GeoNorm's phase-a rate (half to four times).
- ``e_alpha_*``: the check phase d calls for when an alpha other than the default wins there: the default (0.5)
  and phase d's winner, each at its own phase-d rate, seeds 0-2, on the standard library (``e_alpha_stdlib``) and
  on the dictionary whose validation chooses nothing (``e_alpha_gcide``); at 24 layers x 64 (``e_alpha_depth``) each
  alpha at half, once and twice GeoNorm's phase-c rate (extended twice at most while its best is at an edge), then
  seeds 0-2 at its best.
- ``h_styles``, ``f_length_*``, ``g_*``: on the study corpus (``benchmarks/study_corpus.py``: 32M tokens of the
  Python source of torch and transformers, so that no run trains on a token twice; 1,024 evaluation blocks of 128
  tokens for validation and as many for test). ``h_styles``: the paper's table, all five norm styles tuned as phase
  a tuned two (``phase_h``). ``f_length_1200`` and ``f_length_2400``: train's default model at 4x and 8x phase h's
  300 steps, warm-up a tenth of the run (``phase_f``). ``g_*``: width and depth apart, and LLaMA (``phase_g``).
- ``i_gpt2_wNN``, ``i_llama_wNN``: the paper's table again, on both shapes, with the warm-up tuned as the rate is
  (one sweep folder per warm-up share, the same shares for every style), after the Post-Norm/DeepNorm diagnosis
  (``postnorm_diagnosis.py``) and on the split that holds out whole files. Written by an earlier version of this
  script (its loop over the share folders is in git's history); phase h stays as it was measured.
- ``j_gpt2_300``, ``j_gpt2_1200``, ``j_llama_1200`` (``--phases j``): ``hf-geonorm sweep``'s default protocol, one
  command per folder (``phase_j_sweep``): pre, geo and deepnorm, every arm's rate and warm-up tuned on one rule, three
  seeds at its chosen cell, on the whole-file split. ``j_gpt2_300`` reproduces phase i's GPT-2 table; the 1200-step
  folders answer the length question with the warm-up tuned (``--longest``: GPT-2's pre and geo at 2400 too).
- ``reproduction``: a finished run of ``a_gpt2`` trained again by the code of today (``--phases r``), so that phases
  resumed in a later session are known to run the code and data the earlier ones ran (``reproduction.json``).

Every arm of a phase gets the same grid rule and the same seeds. The runs are 300 steps x 16 x 128 tokens (the
issue asked 300-400; 300 fits the machine). Resumable: run it again and only missing runs train.

    python benchmarks/sweep_study.py [--results benchmarks/results/sweeps] [--phases a,b,c,d,e,h,f,g,j]

Phase j runs for hours; it is run in the background from a git worktree of its own on branch ``study``, one run at a
time, committing its journals every few runs, and a later session resumes it with the same command (the sweep trains
only the runs its journals lack). One thread (``OMP_NUM_THREADS=1``): on a two-core machine whose other core is busy,
a run on two threads waits for the busy one: 1.06 s a step against 0.31 on one thread (GPT-2 4 x 128, 2026-12-07):

    cd /work/wt/study && OMP_NUM_THREADS=1 PYTHONPATH=$PWD HF_HUB_OFFLINE=1 setsid nohup nice -n 5 \
        /work/venv/bin/python benchmarks/sweep_study.py --phases j --commit-every 2 >> study-j.log 2>&1 &

After merging branch ``study`` into main, write with this version what the earlier one in the worktree wrote or
lacks: ``python benchmarks/sweep_reports.py --phases j_gpt2_300`` (and each finished 1200-step folder, after
running its sweep command once more here for its unigram reference) and ``python benchmarks/length_table.py``.

(the study corpus must be built first: ``python benchmarks/study_corpus.py --layout files``, with transformers 5.24
on the path, see that script.)
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from hf_geonorm.sweep.grid import read_journal, run_sweep
from hf_geonorm.sweep.options import SweepOptions
from hf_geonorm.sweep.report import arm_name, best_rates
from hf_geonorm.training.options import LEGACY_HELD_OUT_RULE, TrainOptions

RESULTS = Path(__file__).parent / "results" / "sweeps"
STEPS, WARMUP = 300, 30
# held_out_rule: every phase was begun under the held-out rule before rule 2 (its journals record none and read as
# rule 1): the study keeps it, so that its phases, phase j's later folders too, are judged on the same held-out text
BASE = dict(preset="tiny", max_steps=STEPS, warmup_steps=WARMUP, weight_decay=0.1, batch_size=16, seq_len=128,
            eval_every=STEPS, eval_blocks=256, logging_steps=50, held_out_rule=LEGACY_HELD_OUT_RULE)  # fmt: skip
DEPTH = {"num_hidden_layers": 24, "hidden_size": 64, "num_attention_heads": 4}
SEEDS = (0, 1, 2)
ARMS = ("pre", "geo")
STYLES = ("pre", "geo", "post", "sandwich", "deepnorm")
REPOSITORY = Path(__file__).parent.parent
STUDY_CORPUS = Path(__file__).parent / "results" / "study_corpus.json"  # shards: phases h, f, g
STUDY_FILES = Path(__file__).parent / "results" / "study_corpus_files.json"  # a folder of files: phase i
LENGTHS = (1200, 2400)  # phase f beyond phase h's 300 steps: 8x in all
LENGTH_SEEDS = {1200: SEEDS, 2400: (0, 1)}  # two seeds at the longest length, for both arms alike (the budget)
# phase g: (name, architecture, layers, width)
G_CELLS = (("width_64", "gpt2", 4, 64), ("depth_2", "gpt2", 2, 128), ("llama_128", "llama", 4, 128),
           ("llama_64", "llama", 4, 64), ("depth_8", "gpt2", 8, 128), ("width_256", "gpt2", 4, 256),
           ("llama_256", "llama", 4, 256))  # fmt: skip


def log(line: str) -> None:
    print(line, flush=True)


def runs_of(folder: Path) -> list[dict]:
    return read_journal(folder / "runs.jsonl")[1]


def tuned(
    folder: Path, train: TrainOptions, style: str, rates: list[float], extend: int = 2, alpha: float | None = None
) -> float:
    """Sweep one arm (a style, or GeoNorm at one ``alpha``) over ``rates`` (seed 0), widening the grid by a factor 2
    while its best rate is at an edge (``extend`` times at most); its best rate, chosen on validation."""
    grid, alphas = sorted(rates), None if alpha is None else (alpha,)
    arm = style if alpha is None else f"{style} alpha {alpha:g}"
    for _ in range(extend + 1):
        sweep = SweepOptions(output=str(folder), styles=(style,), alphas=alphas, lrs=tuple(grid), seeds=(0,))
        run_sweep(sweep, train, log=log)
        best = best_rates([r for r in runs_of(folder) if r["seed"] == 0 and r["lr"] in grid])[arm]
        if best == grid[0]:
            grid.insert(0, grid[0] / 2)
        elif best == grid[-1]:
            grid.append(grid[-1] * 2)
        else:
            break
    return best


def seeded(folder: Path, train: TrainOptions, best: dict[str, float], seeds: tuple[int, ...] = SEEDS) -> None:
    """``seeds`` (0-2) of each arm at its best rate."""
    for style, lr in best.items():
        run_sweep(SweepOptions(output=str(folder), styles=(style,), lrs=(lr,), seeds=seeds), train, log=log)


def phase_a(results: Path, cache: str) -> dict[str, float]:
    """Train's default model and LLaMA at its size: each arm's best rate (the GPT-2 ones set train's defaults)."""
    chosen = {}
    for arch in ("gpt2", "llama"):
        folder, train = results / f"a_{arch}", TrainOptions(arch=arch, data_cache=cache, **BASE)
        best = {style: tuned(folder, train, style, [1e-3 * 2**i for i in range(6)]) for style in ARMS}
        seeded(folder, train, best)
        if arch == "gpt2":
            chosen = best_rates(runs_of(folder))
    return chosen


def corpus_files(folder: Path) -> dict[str, Path]:
    """The prose and dictionary corpora as text files with blank lines between entries (so that documents are cut
    at them): every fortune of Debian's fortunes (``%`` lines become blank lines), and dict-gcide's entries."""
    folder.mkdir(parents=True, exist_ok=True)
    fortunes, gcide = folder / "fortunes.txt", folder / "gcide.txt"
    if not fortunes.is_file():
        sources = sorted(p for p in Path("/usr/share/games/fortunes").rglob("*") if p.is_file() and not p.suffix)
        text = "\n\n".join(re.sub(r"^%$", "", p.read_text("utf-8", "replace"), flags=re.M) for p in sources)
        fortunes.write_text(re.sub(r"\n{3,}", "\n\n", text), encoding="utf-8")
    if not gcide.is_file():
        with gzip.open("/usr/share/dictd/gcide.dict.dz", "rt", encoding="utf-8", errors="replace") as f:
            gcide.write_text(f.read(), encoding="utf-8")
    return {"fortunes": fortunes, "gcide": gcide}


def phase_b(results: Path, cache: str, phase_a_best: dict[str, float]) -> None:
    """Prose (chosen on its validation) and a dictionary whose validation chooses nothing."""
    files = corpus_files(results / "corpora")
    around = {style: [lr / 2, lr, lr * 2] for style, lr in phase_a_best.items()}
    folder = results / "b_fortunes"
    train = TrainOptions(arch="gpt2", data=str(files["fortunes"]), data_cache=cache, **BASE)
    for style in ARMS:
        run_sweep(
            SweepOptions(output=str(folder), styles=(style,), lrs=tuple(around[style]), seeds=(0,)), train, log=log
        )
    chosen = best_rates([r for r in runs_of(folder) if r["seed"] == 0])
    seeded(folder, train, chosen)
    folder = results / "b_gcide"
    train = replace(train, data=str(files["gcide"]))
    for style in ARMS:
        run_sweep(
            SweepOptions(output=str(folder), styles=(style,), lrs=tuple(around[style]), seeds=(0,)), train, log=log
        )
    seeded(folder, train, chosen)  # the rates chosen on fortunes: gcide's validation chooses nothing


def phase_c(results: Path, cache: str) -> None:
    """Depth: 24 layers, width 64."""
    folder = results / "c_depth"
    train = TrainOptions(arch="gpt2", data_cache=cache, **{**BASE, "preset": DEPTH})
    best = {style: tuned(folder, train, style, [2e-3 * 2**i for i in range(5)], extend=1) for style in ARMS}
    seeded(folder, train, best)


def phase_d(results: Path, cache: str, phase_a_best: dict[str, float]) -> None:
    """geo_alpha and the rate together, at train's default model."""
    geo = phase_a_best["geo"]
    sweep = SweepOptions(output=str(results / "d_alpha"), styles=("geo",), alphas=(0.25, 0.5, 1.0),
                         lrs=(geo / 2, geo, geo * 2, geo * 4), seeds=(0,))  # fmt: skip
    run_sweep(sweep, TrainOptions(arch="gpt2", data_cache=cache, **BASE), log=log)


def phase_e(results: Path, cache: str) -> None:
    """The default alpha against phase d's best alpha, seeded and on data the choice never saw."""
    chosen = best_rates(runs_of(results / "d_alpha"))  # "geo alpha 0.5": its best rate, ...
    winner = min(chosen, key=lambda arm: _val_at(results / "d_alpha", arm, chosen[arm]))
    rates = {float(arm.split()[-1]): chosen[arm] for arm in {"geo alpha 0.5", winner}}
    files = corpus_files(results / "corpora")
    stdlib = TrainOptions(arch="gpt2", data_cache=cache, **BASE)
    for name, train in (("e_alpha_stdlib", stdlib), ("e_alpha_gcide", replace(stdlib, data=str(files["gcide"])))):
        for alpha, lr in rates.items():
            sweep = SweepOptions(output=str(results / name), styles=("geo",), alphas=(alpha,), lrs=(lr,), seeds=SEEDS)
            run_sweep(sweep, train, log=log)
    folder, depth = results / "e_alpha_depth", TrainOptions(arch="gpt2", data_cache=cache, **{**BASE, "preset": DEPTH})
    geo = best_rates(runs_of(results / "c_depth"))["geo"]
    best = {alpha: tuned(folder, depth, "geo", [geo / 2, geo, geo * 2], alpha=alpha) for alpha in sorted(rates)}
    for alpha, lr in best.items():
        sweep = SweepOptions(output=str(folder), styles=("geo",), alphas=(alpha,), lrs=(lr,), seeds=SEEDS)
        run_sweep(sweep, depth, log=log)


def _val_at(folder: Path, arm: str, lr: float) -> float:
    (loss,) = [r["val_loss"] for r in runs_of(folder) if arm_name(r) == arm and r["lr"] == lr and r["seed"] == 0]
    return loss


def reproduction(results: Path, cache: str, phase_a_best: dict[str, float]) -> None:
    """Train phase a's GeoNorm run at its best rate, seed 0, again and write both results to
    ``reproduction.json``: the later phases are comparable with the earlier ones only if it matches."""
    lr = phase_a_best["geo"]
    earlier = next(r for r in runs_of(results / "a_gpt2") if r["style"] == "geo" and r["lr"] == lr and r["seed"] == 0)
    folder = results / "reproduction"
    shutil.rmtree(folder, ignore_errors=True)
    sweep = SweepOptions(output=str(folder), styles=("geo",), lrs=(lr,), seeds=(0,))
    (again,) = run_sweep(sweep, TrainOptions(arch="gpt2", data_cache=cache, **BASE), log=log)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
    keys = ("val_loss", "test_loss")
    record = {"run": earlier["run"], "commit": commit.stdout.strip(), "journal": {k: earlier[k] for k in keys},
              "again": {k: again[k] for k in keys},
              "largest_difference": max(abs(earlier[k] - again[k]) for k in keys)}  # fmt: skip
    (results / "reproduction.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    log(f"reproduction of {earlier['run']}: {record}")


def study_options(cache: str, steps: int = STEPS, corpus: Path = STUDY_CORPUS, **changes: object) -> TrainOptions:
    """A run of the study corpus (``benchmarks/study_corpus.py``, recorded in ``corpus``; its folder must be built):
    ``steps`` steps of 16 x 128 tokens, warm-up a tenth of them, evaluated at the end on the corpus's evaluation
    blocks. Refused when the run would see more tokens than the corpus's training split holds (no token is trained
    on twice)."""
    record = json.loads(corpus.read_text(encoding="utf-8"))
    folder = (REPOSITORY / record["folder"]).resolve()
    if not folder.is_dir():
        raise SystemExit(f"{folder} does not exist: build the study corpus first (python benchmarks/study_corpus.py)")
    tokens, available = steps * 16 * 128, record["tokens"]["train_tokens"]
    if tokens > available:
        raise SystemExit(f"{steps} steps train on {tokens:,} tokens, more than the corpus's {available:,}")
    base = {**BASE, "max_steps": steps, "warmup_steps": steps * WARMUP // STEPS, "eval_every": steps,
            "eval_blocks": record["tokens"]["eval_blocks"]}  # fmt: skip
    return TrainOptions(data=str(folder), data_cache=cache, **{"arch": "gpt2", **base, **changes})


def phase_h(results: Path, cache: str) -> dict[str, float]:
    """The paper's table: the five norm styles on the study corpus at 300 steps, each tuned as phase a tuned
    Pre-Norm and GeoNorm (six rates a factor 2 apart, extended at an edge, here four times at most, chosen on seed
    0), then seeds 0-2 at each best rate. Its pre and geo arms are phase f's shortest length."""
    folder, train = results / "h_styles", study_options(cache)
    best = {style: tuned(folder, train, style, [1e-3 * 2**i for i in range(6)], extend=4) for style in STYLES}
    seeded(folder, train, best)
    return best


def phase_f(results: Path, cache: str, lengths: tuple[int, ...], seeds: dict[int, tuple[int, ...]]) -> None:
    """Length: GPT-2 4 x 128 on the study corpus at each of ``lengths`` steps (beyond phase h's 300), each arm
    tuned on a factor-2 grid around its best rate at the length before (extended while its best is at an edge,
    chosen on seed 0), then ``seeds[length]`` at its best."""
    shorter = [s for s in (300, *LENGTHS) if s < min(lengths)]
    before = results / ("h_styles" if shorter[-1] == 300 else f"f_length_{shorter[-1]}")
    previous = {style: lr for style, lr in best_rates(runs_of(before)).items() if style in ARMS}
    for steps in lengths:
        folder, train = results / f"f_length_{steps}", study_options(cache, steps)
        best = {s: tuned(folder, train, s, [lr / 2, lr, lr * 2], extend=3) for s, lr in previous.items()}
        seeded(folder, train, best, seeds.get(steps, SEEDS))
        previous = best


def phase_g(results: Path, cache: str) -> None:
    """Width and depth apart: GPT-2 at widths 64 and 256 (4 layers) and depths 2 and 8 (width 128), LLaMA at
    widths 64, 128 and 256 (4 layers), heads of 32 dimensions; each arm on a factor-2 grid around its best rate in
    phase h (extended while its best is at an edge, chosen on seed 0); seeds 0-2 at each best of the width cells,
    seed 0 alone for the others (GPT-2 4 x 128 is phase h)."""
    start = best_rates(runs_of(results / "h_styles"))
    for name, arch, layers, width in G_CELLS:
        # positions: the block length, as the runs were begun with (train then gave a model --seq-len positions)
        shape = {"num_hidden_layers": layers, "hidden_size": width, "num_attention_heads": width // 32,
                 "max_position_embeddings": BASE["seq_len"]}  # fmt: skip
        folder, train = results / f"g_{name}", study_options(cache, arch=arch, preset=shape)
        best = {style: tuned(folder, train, style, [start[style] / 2, start[style], start[style] * 2], extend=3)
                for style in ARMS}  # fmt: skip
        seeded(folder, train, best, SEEDS if name.startswith(("width", "llama")) else (0,))


# phase i: the paper's table with every style trained as its literature trains it (warm-up tuned, not fixed)
I_SHAPES = ("gpt2", "llama")
# warm-up shares of the run, the same for every style (one style with more knobs is unfair tuning): the grid starts
# at the middle two and takes one more step of the ladder while a style's best share is at an edge
I_WARMUP_LADDER = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)  # 0.7 and 0.9 added when every GPT-2 style chose 0.5, its top
I_WARMUP_START = (0.1, 0.3)
# each style's grid: four rates a factor 2 apart from half its centre, centred where phase h and the history
# ablation put it; Post-Norm and DeepNorm where postnorm_diagnosis.py's study-shape cells found them best (2e-3, its
# highest rate tried, with the position table at zero; phase h's rates were those of runs that never learned)
I_CENTRES = {"pre": 2e-3, "geo": 8e-3, "sandwich": 4e-3, "post": 2e-3, "deepnorm": 2e-3}


def phase_i_options(cache: str, arch: str, share: float) -> TrainOptions:
    return study_options(cache, corpus=STUDY_FILES, arch=arch, warmup_steps=round(STEPS * share))


# phase i's folders (i_ARCH_wNN, one per share) were written by an earlier version of this script that looped over
# them (git log -- benchmarks/sweep_study.py); `hf-geonorm sweep`'s default now walks rate x warm-up itself, in one
# folder (docs/training.md, "The sweep"), and phase j runs it.
# phase j: that default on the study corpus's whole-file split, one sweep folder per shape and length
J_STYLES = ("pre", "geo", "deepnorm")
J_CELLS = (("gpt2", 300), ("gpt2", 1200), ("llama", 1200))  # the first: the reproduction of phase i's GPT-2 table
J_LONGEST = (("gpt2", 2400, ("pre", "geo")),)  # when the budget allows (later sessions)
# where phase j starts each arm's warm-up walk at 1200 steps and longer: the default ladder, from its 30% and 50%
# steps rather than 10% and 30% (every arm alike; the walk still steps down or up while the best sits at an edge), so
# that the phase fits about three sessions of one core; the reproduction (300 steps) runs the default as it is
J_WARMUP_START = (0.3, 0.5)


def phase_j_folder(results: Path, arch: str, steps: int) -> Path:
    return results / f"j_{arch}_{steps}"


def phase_j_sweep(results: Path, cache: str, arch: str, steps: int, styles: tuple[str, ...],
                  log_line: object = None) -> list[dict]:  # fmt: skip
    """One cell of phase j: ``hf-geonorm sweep``'s default protocol (``run_sweep``: every arm's rate and warm-up
    tuned on one rule, chosen on validation, three seeds at the chosen cell), at ``steps`` steps of GPT-2 or LLaMA
    4 x 128 on the study corpus's whole-file split. The same as

        hf-geonorm sweep --output RESULTS/j_ARCH_STEPS --styles pre,geo,deepnorm --data CORPUS --arch ARCH \
            --preset tiny --max-steps STEPS --batch-size 16 --seq-len 128 --weight-decay 0.1 --eval-every STEPS \
            --eval-blocks 1024 --logging-steps 50 [--warmup-start 0.3,0.5 from 1200 steps]"""
    train = study_options(cache, steps, corpus=STUDY_FILES, arch=arch, warmup_steps=None)
    start = {} if steps <= STEPS else {"warmup_start": J_WARMUP_START}
    sweep = SweepOptions(output=str(phase_j_folder(results, arch, steps)), styles=styles, **start)
    return run_sweep(sweep, train, log=log_line or log)


def phase_j(results: Path, cache: str, longest: bool, log_line: object = None) -> None:
    """The reproduction of phase i (GPT-2, 300 steps) by one sweep command, then the length question with the
    warm-up tuned: GPT-2 and LLaMA 4 x 128 at 1200 steps; with ``longest``, GPT-2's pre and geo at 2400."""
    for arch, steps in J_CELLS:
        phase_j_sweep(results, cache, arch, steps, J_STYLES, log_line)
    if longest:
        for arch, steps, styles in J_LONGEST:
            phase_j_sweep(results, cache, arch, steps, styles, log_line)


class Committer:
    """The study's log, and a commit of every phase j folder's journal and report every ``every`` finished runs
    (``--commit-every``), so that a later session merges the branch and resumes where the journal stopped."""

    def __init__(self, results: Path, every: int) -> None:
        self.results, self.every = results, every
        self.committed = self.finished()

    def finished(self) -> int:
        return sum(len(path.read_text(encoding="utf-8").splitlines()) - 1
                   for path in self.results.glob("j_*/runs.jsonl"))  # fmt: skip

    def __call__(self, line: str) -> None:
        log(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}")
        if self.every and self.finished() - self.committed >= self.every:
            self.commit()

    def commit(self) -> None:
        paths = [str(path) for folder in self.results.glob("j_*")
                 for name in ("runs.jsonl", "sweep.md", "sweep.png", "held_out.json")
                 if (path := folder / name).is_file()]  # fmt: skip
        finished = self.finished()
        subprocess.run(["git", "add", "--", *paths], cwd=REPOSITORY, check=True)
        message = f"phase j: {finished} runs journaled"
        done = subprocess.run(["git", "commit", "-q", "-m", message, "--", *paths], cwd=REPOSITORY)
        if done.returncode == 0:
            log(f"{time.strftime('%Y-%m-%d %H:%M:%S')} committed: {message}")
        self.committed = finished


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--phases", default="a,b,c,d,e",
                        help="a comma list of a-h, j, r (the reproduction check), f1200 or f2400 (one length of f)")
    parser.add_argument("--data-cache", default=str(Path("~/.cache/hf-geonorm/study").expanduser()))
    parser.add_argument("--commit-every", type=int, default=0, metavar="N",
                        help="phase j: commit its journals and reports every N finished runs (0: never)")
    parser.add_argument("--longest", action="store_true", help="phase j: also GPT-2's pre and geo at 2400 steps")
    args = parser.parse_args()
    phases = args.phases.split(",")
    if "j" in phases:
        committer = Committer(args.results, args.commit_every)
        phase_j(args.results, args.data_cache, args.longest, committer)
        if args.commit_every:
            committer.commit()
    if "h" in phases:
        phase_h(args.results, args.data_cache)
    for phase in phases:
        if phase.startswith("f"):
            lengths = LENGTHS if phase == "f" else (int(phase[1:]),)
            phase_f(args.results, args.data_cache, lengths, LENGTH_SEEDS)
    if "g" in phases:
        phase_g(args.results, args.data_cache)
    if not {"a", "b", "c", "d", "e", "r"} & set(phases):
        return
    best = phase_a(args.results, args.data_cache) if "a" in phases else best_rates(runs_of(args.results / "a_gpt2"))
    if "r" in phases:
        reproduction(args.results, args.data_cache, best)
    if "b" in phases:
        phase_b(args.results, args.data_cache, best)
    if "c" in phases:
        phase_c(args.results, args.data_cache)
    if "d" in phases:
        phase_d(args.results, args.data_cache, best)
    if "e" in phases:
        phase_e(args.results, args.data_cache)


if __name__ == "__main__":
    main()
