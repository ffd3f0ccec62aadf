"""The decoding constraint's format rule: which tokens keep a completion a prefix of the format,
every token tried against the pattern (the definition) and looked up in the format's token
automaton (`constrain._FormatIndex`, what decoding uses), per tokenizer (a measurement, not a test).

    .venv/bin/python benchmarks/format_scan.py <model or tokenizer folder> [...] [--cuts 60] [--json out.json]

At `--cuts` random cut points of a completion, both give the same tokens (checked) and their
times are compared (medians, one thread; the lookup's time includes reading the cut's tokens into
the automaton, as decoding does one token a step). The automaton's build time is reported apart.
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
from dreamgym.experience.constrain import DeltaConstraint, completion_pattern
from dreamgym.state import AbstractState

COMPLETION = (
    "<reasoning>Effects: knife goes into the inventory. The score does not change.</reasoning>\n<next_state>\n"
    "visible: -knife\ninventory: +knife\nactions: -take knife from table; +drop knife\n</next_state>\n"
    "<reward>0</reward>\n<done>false</done>"
)


def measure(folder: Path, cuts: int) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    state = AbstractState("kitchen", ("knife (on table)", "table"), ("carrot",), ("eat carrot",))
    started = time.perf_counter()
    constraint = DeltaConstraint(tokenizer, [state], prompt_length=0, greedy=False)
    build = time.perf_counter() - started
    pieces, pattern = constraint.vocabulary.pieces, completion_pattern(reasoning=True)
    rng, every, looked_up = random.Random(0), [], []
    for _ in range(cuts):
        written = COMPLETION[: rng.randint(0, len(COMPLETION) - 1)]
        started = time.perf_counter()
        expected = [
            token for token, piece in enumerate(pieces) if piece and pattern.fullmatch(written + piece, partial=True)
        ]
        every.append(time.perf_counter() - started)
        ids = tokenizer(written, add_special_tokens=False)["input_ids"]
        started = time.perf_counter()
        state_of = constraint.format.start
        for token in ids:
            state_of = constraint.format.after(state_of, token)
        found = constraint.format.allowed(state_of, len(pieces)).tolist()
        looked_up.append(time.perf_counter() - started)
        assert found == expected, written
    return {
        "vocabulary": len(tokenizer),
        "cuts": cuts,
        "automaton_build_s": build,
        "every_token_ms": 1000 * statistics.median(every),
        "automaton_ms": 1000 * statistics.median(looked_up),
        "ratio": statistics.median(every) / statistics.median(looked_up),
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
