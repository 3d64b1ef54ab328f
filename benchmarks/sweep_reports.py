"""Each finished study phase's ``sweep.md`` and ``sweep.png`` written again from its journal (``runs.jsonl``) by the
sweep's own report writer (``hf_geonorm.sweep.report.write_report``, what ``hf-geonorm sweep`` calls when
every run is in), so that a report written by an earlier hf-geonorm says what the current one says of the same runs.
Trains nothing, and reads nothing but the journals and each folder's ``held_out.json`` (the unigram reference row; a
finished sweep run again measures it where an earlier hf-geonorm wrote none); a phase still running (phase j's
j_llama_1200) is not among the defaults, since its own sweep writes its report after every run. Phase j runs
from a worktree at an earlier hf-geonorm (``sweep_study.py``): after merging its branch, write j_gpt2_300's report
again here:

    python benchmarks/sweep_reports.py [--results benchmarks/results/sweeps] [--phases a_gpt2,h_styles,...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hf_geonorm.sweep.grid import read_journal
from hf_geonorm.sweep.report import write_report

RESULTS = Path(__file__).parent / "results" / "sweeps"
FINISHED = ("a_gpt2", "a_llama", "b_fortunes", "b_gcide", "c_depth", "d_alpha", "e_alpha_stdlib", "e_alpha_gcide",
            "e_alpha_depth", "f_length_1200", "f_length_2400", "g_width_64", "g_width_256", "g_depth_2", "g_depth_8",
            "g_llama_64", "g_llama_128", "g_llama_256", "h_styles", "reproduction", "j_gpt2_300",
            "j_gpt2_1200")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--phases", default=",".join(FINISHED), help="comma-separated phase folders under --results")
    args = parser.parse_args()
    for phase in args.phases.split(","):
        journal = args.results / phase / "runs.jsonl"
        if not journal.is_file():
            raise SystemExit(f"{journal} does not exist: give phases that have a journal (--phases)")
        header, runs = read_journal(journal)
        write_report(journal.parent, runs, log=lambda line, phase=phase: print(f"{phase}: {line}"), header=header)


if __name__ == "__main__":
    main()
