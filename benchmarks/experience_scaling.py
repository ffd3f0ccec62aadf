"""The LM's share of the experience model against training data, steps and size (issue 71's table).

Trains the experience model LM only (retrieval, no rule layer) on the validated transitions of the
project of `--params` (its buffer holds them), with KEY=VALUE overrides (steps through
`experience.epochs`, size through `experience.hidden_size`/`layers`, `experience.copy_examples=false`
to make it write every change rather than name a worked example), and measures on sets of real
transitions its fidelity and that of no model (the top example's change copied, the same
retrieval). More training games: collect, validate and ingest them into a project of their own
first (the results log's entry of 2026-12-06, night, says how).

    .venv/bin/python benchmarks/experience_scaling.py --params <project>/params.yaml --out <dir> \
        --real <fidelity.parquet> experience.copy_examples=false experience.epochs=0.5

Prints one JSON line: the settings, data, training steps and seconds, and each set's fidelity.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import machine, parse_settings, validated_rows

from dreamgym.buffer.migrations import open_migrated
from dreamgym.config import load_config
from dreamgym.envs.real import task_setting
from dreamgym.experience import ablation
from dreamgym.experience.generate import save_settings
from dreamgym.experience.report import measure_fidelity
from dreamgym.experience.variations import training_examples
from dreamgym.lm.sft import train_sft

NO_RULES = {f"experience.{key}": value for key, value in ablation.NO_RULES.items()}  # the "LM only" row's


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="of a project run to the buffer")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--real", type=Path, action="append", required=True, help="real transitions to measure on")
    parser.add_argument("settings", nargs="*", help="KEY=VALUE (JSON values), e.g. experience.epochs=0.5")
    args = parser.parse_args()
    settings = parse_settings(args.settings)
    config = load_config(args.params, {**NO_RULES, **settings})
    project = args.params.resolve().parent
    run_dir = project / config.paths.run_dir
    rows = validated_rows(config, project)
    with open_migrated(run_dir, config.buffer) as database:
        made = training_examples(database, rows, config)
    report: dict = {
        "machine": machine(),
        "settings": settings,
        "transitions": len(rows),
        "games": len({row["task_id"] for row in rows}),
    }
    started = time.perf_counter()
    result = train_sft(
        [{"prompt": e.prompt, "completion": e.completion} for e in made.examples],
        config.experience,
        args.out,
        seed=config.seed,
    )
    report |= {
        "examples": len(made.examples),
        "train_seconds": round(time.perf_counter() - started),
        "steps": result.steps,
    }
    save_settings(result.model_dir, config.experience, made.kept)
    for real in args.real:
        report[str(real)] = {}
        for name, copy in (("lm", False), ("no_model", True)):
            started = time.perf_counter()
            fidelity = measure_fidelity(result.model_dir, real, run_dir, config, copy, setting_of=task_setting)
            report[str(real)][name] = fidelity | {"seconds": round(time.perf_counter() - started)}
    print(json.dumps(report, default=str))
