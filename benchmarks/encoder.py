"""The sentence encoder on an offline dataset's transitions: what the buffer's upsert pays to embed
them (a measurement, not a test).

    .venv/bin/python benchmarks/encoder.py --data <project>/data/trajectories/offline.parquet \
        [--rows 1024] [--repeats 3] [--json out.json]

Encodes the first --rows transitions' texts (`transition_text`, as the upsert does), --repeats
times each way, alternating:
- `float32` and `bf16`: every text, in that precision, the cache bypassed;
- `encoder`: `Encoder.encode` as the pipeline runs it, in the precision `inference_dtype` picks
  for this machine, from an empty cache (each distinct text once).
Reports texts/s (medians), the distinct share of the texts, and whether the CPU has native bf16.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from common import machine

from dreamgym.buffer.embeddings import Encoder, inference_dtype, transition_text
from dreamgym.data.schema import read_transitions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a transitions Parquet file (offline.parquet)")
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    rows = read_transitions(args.data).to_pylist()[: args.rows]
    texts = [transition_text(row["instruction"], row["state"], row["action"]) for row in rows]
    encoder = Encoder()
    chosen = inference_dtype(encoder.model.device)
    seconds: dict[str, list[float]] = {"float32": [], "bf16": [], "encoder": []}
    for repeat in range(args.repeats):
        for way, dtype in (("float32", torch.float32), ("bf16", torch.bfloat16), ("encoder", chosen)):
            encoder.model.to(dtype)
            encoder.forget()
            started = time.perf_counter()
            if way == "encoder":
                encoder.encode(texts)
            else:
                encoder._encode(texts)
            seconds[way].append(time.perf_counter() - started)
            print(f"repeat {repeat + 1}: {way} {len(texts) / seconds[way][-1]:.1f} texts/s", flush=True)

    report = {
        "machine": machine(),
        "cpu_native_bf16": inference_dtype(torch.device("cpu")) == torch.bfloat16,
        "encoder_dtype": str(chosen),
        "data": str(args.data),
        "texts": len(texts),
        "distinct_texts": len(set(texts)),
        "texts_per_second": {way: len(texts) / statistics.median(runs) for way, runs in seconds.items()},
        "seconds": seconds,
    }
    print(json.dumps({key: report[key] for key in report if key not in ("machine", "seconds")}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
