"""Generation throughput of the experience model (a measurement, not a test).

    .venv/bin/python benchmarks/experience.py [--model dreamgym-experience] [--batches 1 8 32]
        [--transitions 64] [--repeats 3] [--json benchmarks/results/experience-<date>.json]

Times `ExperienceModel.predict` — one batched retrieval from the buffer, one batched `generate`
with the KV cache, parsing, and the sampled retries of completions that do not parse — on real
held-out transitions (outputs/experience/fidelity_real.parquet, made by the train-experience flow),
at each batch size, and reports transitions/s and completion tokens/s (the tokens of the final
completions; retried attempts cost time but are not counted), medians of --repeats; and, for the
same prompts, the rate of one greedy batched `generate` alone (no retrieval, parsing or retries).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from common import machine, model_setup

from dreamgym.data.schema import read_transitions
from dreamgym.experience.examples import queries_of
from dreamgym.experience.generate import open_experience_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dreamgym-experience")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--transitions", type=int, default=64, help="transitions per measurement")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    setup = model_setup(args.params, args.model)
    config, project, run_dir, model_dir = setup.config, setup.project, setup.run_dir, setup.model_dir
    rows = sorted(
        read_transitions(project / config.paths.outputs_dir / "experience" / "fidelity_real.parquet").to_pylist(),
        key=lambda row: (row["trajectory_id"], row["step"]),
    )
    report = {
        "model": setup.model_label,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "batches": {},
    }
    with open_experience_model(model_dir, run_dir, config) as experience:
        report["parameters"] = sum(p.numel() for p in experience.model.parameters())
        queries = queries_of(rows, experience.config.history)[: args.transitions]
        experience.predict(queries[:2])  # warm-up: first-call allocations, retrieval pool
        for batch in args.batches:
            rates, token_rates, parsed = [], [], []
            for _ in range(args.repeats):
                started, tokens, ok = time.perf_counter(), 0, 0
                for start in range(0, len(queries), batch):
                    for prediction in experience.predict(queries[start : start + batch]):
                        tokens += len(experience.tokenizer(prediction.text, add_special_tokens=False)["input_ids"])
                        ok += prediction.ok
                seconds = time.perf_counter() - started
                rates.append(len(queries) / seconds)
                token_rates.append(tokens / seconds)
                parsed.append(ok / len(queries))
            # The LM alone: the same prompts, one greedy batched generate, no retrieval/parse/retry.
            prompts = experience.prompts(queries)
            generate_rates = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                for start in range(0, len(prompts), batch):
                    experience.generate(prompts[start : start + batch])
                generate_rates.append(len(prompts) / (time.perf_counter() - started))
            report["batches"][str(batch)] = {
                "generate_only_transitions_per_s": statistics.median(generate_rates),
                "transitions_per_s": statistics.median(rates),
                "completion_tokens_per_s": statistics.median(token_rates),
                "parsed_fraction": statistics.median(parsed),
                "runs": rates,
            }
            print(
                f"batch {batch:3d}: {statistics.median(rates):6.2f} transitions/s (generate alone "
                f"{statistics.median(generate_rates):6.2f}), "
                f"{statistics.median(token_rates):6.0f} completion tokens/s, parsed {statistics.median(parsed):.0%}",
                flush=True,
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
