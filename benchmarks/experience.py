"""Generation throughput of the experience model (a measurement, not a test).

    .venv/bin/python benchmarks/experience.py [--model dreamgym-experience] [--batches 1 8 32]
        [--transitions 64] [--repeats 3] [--json benchmarks/results/experience-<date>.json]

Times `ExperienceModel.predict` — one batched retrieval from the buffer, one batched `generate`
with the KV cache, parsing, and the sampled retries of completions that do not parse — on real
held-out transitions (outputs/experience/fidelity_real.parquet, made by the train-experience flow),
at each batch size, and reports transitions/s and completion tokens/s (the tokens of the final
completions; retried attempts cost time but are not counted), medians of --repeats; and, for the
same prompts, the rate of one greedy batched `generate` alone (no retrieval, parsing or retries).

Where the time goes, per batch size: the prompt pass (prefill) per prompt, one decoding step per
batch row (a generate forced to 66 new tokens minus one of 2), and how long the batch's longest
completion is against the mean one (a batch decodes until its last row stops).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
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
    config, project, run_dir, model_dir, label = (
        setup.config,
        setup.project,
        setup.run_dir,
        setup.model_dir,
        setup.model_label,
    )
    rows = sorted(
        read_transitions(project / config.paths.outputs_dir / "experience" / "fidelity_real.parquet").to_pylist(),
        key=lambda row: (row["trajectory_id"], row["step"]),
    )
    report = {
        "model": label,
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
            split = cost_split(experience, prompts, batch, args.repeats)
            report["batches"][str(batch)] = {
                **split,
                "generate_only_transitions_per_s": statistics.median(generate_rates),
                "transitions_per_s": statistics.median(rates),
                "completion_tokens_per_s": statistics.median(token_rates),
                "parsed_fraction": statistics.median(parsed),
                "runs": rates,
            }
            print(
                f"batch {batch:3d}: {statistics.median(rates):6.2f} transitions/s (generate alone "
                f"{statistics.median(generate_rates):6.2f}), "
                f"{statistics.median(token_rates):6.0f} completion tokens/s, parsed {statistics.median(parsed):.0%}; "
                f"prefill {split['prefill_ms_per_prompt']:.0f} ms/prompt, decode "
                f"{split['decode_ms_per_row_step']:.2f} ms/row-step, longest/mean completion "
                f"{split['longest_over_mean_completion']:.2f}",
                flush=True,
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


@torch.inference_mode()
def cost_split(experience, prompts: list[str], batch: int, repeats: int) -> dict:
    """Prefill ms per prompt, decode ms per row and step (medians over batches and repeats), and
    the mean over batches of longest / mean greedy completion length."""
    tokenizer, model = experience.tokenizer, experience.model

    def forced(inputs, new_tokens: int) -> float:
        started = time.perf_counter()
        model.generate(
            **inputs,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            use_cache=True,
            cache_implementation="static",
            pad_token_id=tokenizer.pad_token_id,
        )
        return time.perf_counter() - started

    prefill, decode, stretch = [], [], []
    for start in range(0, len(prompts) - batch + 1, batch):
        inputs = experience.encode(prompts[start : start + batch])
        for _ in range(repeats):
            started = time.perf_counter()
            model(**inputs)
            prefill.append((time.perf_counter() - started) * 1000 / batch)
            decode.append((forced(inputs, 66) - forced(inputs, 2)) * 1000 / 64 / batch)
        lengths = [
            len(tokenizer(text, add_special_tokens=False)["input_ids"])
            for text in experience.generate(prompts[start : start + batch])
        ]
        stretch.append(max(lengths) / statistics.mean(lengths))
    return {
        "prefill_ms_per_prompt": statistics.median(prefill),
        "decode_ms_per_row_step": statistics.median(decode),
        "longest_over_mean_completion": statistics.mean(stretch),
    }


if __name__ == "__main__":
    main()
