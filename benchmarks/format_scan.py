"""The decoding constraint's last look, when none of the best-scored tokens keeps the completion in
the format: every token tried (the definition) against the tokens of the first characters that fit
(`DeltaConstraint._every_fitting`), per tokenizer (a measurement, not a test).

    .venv/bin/python benchmarks/format_scan.py <model or tokenizer folder> [...] [--cuts 60] [--json out.json]

At `--cuts` random cut points of a completion, both give the same tokens (checked) and their
times are compared (medians, one thread). A pretrained tokenizer (SmolLM2's ~49k tokens) is where
it matters: the look runs once per row and step wherever none of the top tokens fits.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from dreamgym.benchmark import machine
from dreamgym.experience.constrain import DeltaConstraint
from dreamgym.state import AbstractState

COMPLETION = (
    "<reasoning>Effects: knife goes into the inventory. The score does not change.</reasoning>\n<next_state>\n"
    "visible: -knife\ninventory: +knife\nactions: -take knife from table; +drop knife\n</next_state>\n"
    "<reward>0</reward>\n<done>false</done>"
)


def measure(folder: Path, cuts: int) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    state = AbstractState("kitchen", ("knife (on table)", "table"), ("carrot",), ("eat carrot",))
    constraint = DeltaConstraint(tokenizer, [state], prompt_length=0, greedy=False)
    pieces, pattern = constraint.vocabulary.pieces, constraint.pattern
    rng, every, first = random.Random(0), [], []
    for _ in range(cuts):
        written = COMPLETION[: rng.randint(0, len(COMPLETION) - 1)]
        scores = torch.randn(len(tokenizer))
        started = time.perf_counter()
        expected = [
            token
            for token in (scores > float("-inf")).nonzero().flatten().tolist()
            if token < len(pieces) and pieces[token] and pattern.fullmatch(written + pieces[token], partial=True)
        ]
        every.append(time.perf_counter() - started)
        started = time.perf_counter()
        found = constraint._every_fitting(written, scores.tolist())
        first.append(time.perf_counter() - started)
        assert found == expected, written
    return {
        "vocabulary": len(tokenizer),
        "cuts": cuts,
        "every_token_ms": 1000 * statistics.median(every),
        "first_characters_first_ms": 1000 * statistics.median(first),
        "ratio": statistics.median(every) / statistics.median(first),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+")
    parser.add_argument("--cuts", type=int, default=60)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    report = {"machine": machine(), "tokenizers": {str(folder): measure(folder, args.cuts) for folder in args.folders}}
    print(json.dumps(report["tokenizers"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
