"""The experience model on a pretrained backbone, trained and measured where a GPU is lent (a
measurement, not a test).

A lent GPU machine has no Postgres, sentence encoder or TextWorld, so the work is cut in two:

    # 1. here (CPU), in a project after `make run`: a bundle of the SFT examples and, for each
    #    evaluation set, its real transitions with the neighbours the buffer retrieves for each
    #    (recorded), and the fidelity of the project's model and of no model on them
    .venv/bin/python benchmarks/pretrained_experience.py export --out .gpu/bundle \
        --set held-out=outputs/experience/fidelity_real.parquet --set shifted=data/games/shifted
    # 2. on the GPU machine: fine-tune the named model (TRL SFT, bf16), then its fidelity on every
    #    set and its speed at batch 1 and 32; `--trained DIR` measures a trained model as it is
    python benchmarks/pretrained_experience.py run --bundle .gpu/bundle --model smollm2-135m \
        --sets shifted held-out --json out.json

On the GPU machine retrieval is replayed from the recording (`ReplayedRetrieval`; the export checks
it gives the live records), so speed figures are the model's part of a step; the export measures
retrieval's CPU cost. A bundle's sets are pickled: read only bundles you made.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import lzma
import pickle
import shutil
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from transformers import TrainerCallback

from dreamgym.config import load_config
from dreamgym.envs.dynamics import Query
from dreamgym.envs.real import task_setting
from dreamgym.experience.affordances import AFFORDANCES_FILE, Affordances, saved_beside
from dreamgym.experience.examples import load_examples, load_kept_names, queries_of
from dreamgym.experience.fidelity import evaluate
from dreamgym.experience.generate import (
    ExperienceModel,
    NeighbourCopy,
    save_settings,
    trained_kept_names,
    trained_settings,
)
from dreamgym.ops.benchmark import machine

EXAMPLES = "examples.parquet"
SETS = "sets"
BASELINE = "baseline.json"


def retrieval_key(query: Query) -> tuple:
    """What retrieval reads of a query (not its history)."""
    return (query.instruction, query.state, query.action, query.trajectory_id)


def _portable(row: dict) -> dict:
    """A retrieved row without its embedding (the prompt never shows it)."""
    return {key: value for key, value in row.items() if key != "embedding"}


class ReplayedRetrieval(ExperienceModel):
    """An experience model whose retrieval replays neighbours recorded from the real buffer, for a
    machine without one. A query that was not recorded is an error, never an empty retrieval."""

    def __init__(self, model, tokenizer, config, recorded: dict, kept_names, affordances=None, seed: int = 0):
        # `recorded` stands in the database's and the encoder's places: it answers retrieval.
        super().__init__(
            model, tokenizer, config, recorded, recorded, seed=seed, kept_names=kept_names, affordances=affordances
        )
        self.recorded = recorded

    def retrieved(self, queries):
        missing = [query for query in queries if retrieval_key(query) not in self.recorded]
        if missing:
            raise KeyError(f"{len(missing)} queries were not recorded, e.g. {missing[0].action!r}")
        return [self.recorded[retrieval_key(query)] for query in queries]


class ReplayedCopy(ReplayedRetrieval, NeighbourCopy):
    """No model, its retrieval replayed: the top neighbour's change (NeighbourCopy)."""

    def __init__(self, config, recorded: dict, kept_names, affordances=None):
        NeighbourCopy.__init__(self, config, recorded, recorded, kept_names=kept_names, affordances=affordances)
        self.recorded = recorded


def sorted_queries(rows: list[dict], history: int) -> list[Query]:
    """Single-step queries of real transitions, in the order `fidelity.single_step` reads them."""
    return queries_of(sorted(rows, key=lambda row: (row["trajectory_id"], row["step"])), history)


def _summary(report) -> dict:
    keys = ("transitions", "next_state_exact_match", "reward_accuracy", "done_accuracy", "parse_failure_rate")
    return {
        **{key: report.summary[key] for key in keys},
        "foreseeable": report.summary["foreseeable"],
        "by_setting": report.summary["by_setting"],
    }


# --- export (CPU, in the project) --------------------------------------------------------------


def export(args: argparse.Namespace) -> None:
    from common import model_setup

    from dreamgym.data.collect import collect_held_out
    from dreamgym.data.schema import read_transitions
    from dreamgym.experience.generate import open_experience_model

    setup = model_setup(args.params, args.model)
    config, out = setup.config, args.out
    (out / SETS).mkdir(parents=True, exist_ok=True)
    examples = args.examples or _only_examples(setup.project / config.paths.outputs_dir / "experience")
    shutil.copyfile(examples, out / EXAMPLES)
    if config.experience.adapts_examples:  # the learnt actions the examples' changes were adapted with
        shutil.copyfile(saved_beside(examples), out / AFFORDANCES_FILE)
    # A bundle grows set by set: sets exported before are kept.
    earlier = json.loads((out / BASELINE).read_text())["sets"] if (out / BASELINE).is_file() else {}
    baseline = {"model": setup.model_label, "examples": str(examples), "machine": machine(), "sets": earlier}
    # One model, buffer and encoder for every set: its retrieval is recorded set by set.
    with open_experience_model(setup.model_dir, setup.run_dir, config) as experience:
        live = experience.retrieved
        for spec in args.set:
            name, source = spec.split("=", 1)
            source = Path(source)
            if source.is_dir():  # a folder of games: their real transitions, as `dreamgym experience eval` collects
                parquet = (
                    setup.project / config.paths.outputs_dir / "experience" / f"eval-{source.resolve().name}.parquet"
                )
                source = Path(collect_held_out(source, parquet, config))
            rows = read_transitions(source).to_pylist()
            recorded: dict = {}
            experience.retrieved = functools.partial(_recording, live, recorded)
            baseline["sets"][name] = {"source": str(source)} | _measured(experience, live, recorded, rows, name, args)
            with lzma.open(out / SETS / f"{name}.pkl.xz", "wb") as file:
                pickle.dump({"rows": rows, "recorded": recorded}, file)
    (out / BASELINE).write_text(json.dumps(baseline, indent=1))


def _recording(live, recorded: dict, queries: list[Query]) -> list[list[dict]]:
    """`live` retrieval, each query's neighbours kept in `recorded`."""
    found = live(queries)
    for query, rows_found in zip(queries, found):
        recorded[retrieval_key(query)] = [_portable(row) for row in rows_found]
    return found


def _measured(experience: ExperienceModel, live, recorded: dict, rows: list[dict], name: str, args) -> dict:
    """The fidelity of the project's model (its retrieval recorded meanwhile) and of no model on
    `rows`, the retrieval's own time, and the check that replaying the recording changes nothing."""
    started = time.perf_counter()
    report = evaluate(experience.dynamics(), rows, horizon=0, batch_size=32, progress=True, setting_of=task_setting)
    seconds = time.perf_counter() - started
    retrieval = _retrieval_seconds(live, sorted_queries(rows, experience.config.history))
    # Replaying must give the live records: the same prompts, so the same predictions.
    replayed = ReplayedRetrieval(
        experience.model,
        experience.tokenizer,
        experience.config,
        recorded,
        experience.kept_names,
        experience.affordances,
    )
    check = args.check_transitions
    same = (
        evaluate(replayed.dynamics(), rows[:check], horizon=0, batch_size=32).records
        == evaluate(experience.dynamics(), rows[:check], horizon=0, batch_size=32).records
    )
    if not same:
        raise SystemExit(f"{name}: replayed retrieval gives other records than the live one")
    copy = evaluate(
        ReplayedCopy(experience.config, recorded, experience.kept_names, experience.affordances).dynamics(),
        rows,
        horizon=0,
        batch_size=32,
        setting_of=task_setting,
    )
    print(
        f"{name}: {len(rows)} transitions; model exact {report.summary['next_state_exact_match']:.1%}, "
        f"no model {copy.summary['next_state_exact_match']:.1%}; replay checked on {check}",
        flush=True,
    )
    return {
        "model": _summary(report),
        "no_model": _summary(copy),
        "model_seconds": seconds,
        "retrieval_seconds_per_batch": retrieval,
    }


def _only_examples(folder: Path) -> Path:
    found = sorted(folder.glob("examples-*.parquet"))
    if len(found) != 1:
        raise SystemExit(f"{len(found)} example files in {folder}: name the one the model trained on with --examples")
    return found[0]


def _retrieval_seconds(retrieve, queries: list[Query], batches=(1, 32)) -> dict:
    """Median seconds of one retrieval of a batch (buffer search, re-ranking, encoder)."""
    timings = {}
    for batch in batches:
        times = []
        for start in range(0, min(len(queries), 64), batch):
            started = time.perf_counter()
            retrieve(queries[start : start + batch])
            times.append(time.perf_counter() - started)
        timings[str(batch)] = statistics.median(times)
    return timings


# --- run (the GPU machine) ----------------------------------------------------------------------


class WallClock(TrainerCallback):
    """Ends training after `seconds` of it (a lease is short); the run records the epochs done."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if time.perf_counter() - self.started > self.seconds:
            control.should_training_stop = True


def run(args: argparse.Namespace) -> None:
    from dreamgym.experience import decoding, generate
    from dreamgym.lm.model import load_model
    from dreamgym.lm.sft import train_sft

    started = time.perf_counter()
    deadline = started + args.deadline_seconds
    # Settings measured against each other on a GPU (chosen on 2 CPU cores)
    generate.CACHE = args.cache or generate.CACHE
    decoding.VERIFY_CHUNK = args.verify_chunk or decoding.VERIFY_CHUNK
    config = load_config(args.params)
    report = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(), "args": _plain(args)}
    bundle = args.bundle
    kept = load_kept_names(bundle / EXAMPLES)
    saved = bundle / AFFORDANCES_FILE  # the examples' learnt actions, when they were adapted with them
    affordances = Affordances.load(saved) if saved.is_file() else None

    def save() -> None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))

    if args.trained:
        model_dir = args.trained
        settings = trained_settings(model_dir, config.experience)
        kept = trained_kept_names(model_dir)
        if (model_dir / AFFORDANCES_FILE).is_file():
            affordances = Affordances.load(model_dir / AFFORDANCES_FILE)
    else:
        settings = dataclasses.replace(
            config.experience,
            model=args.model,
            epochs=args.epochs,
            batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            max_length=args.max_length,
        )
        examples = [{"prompt": e.prompt, "completion": e.completion} for e in load_examples(bundle / EXAMPLES)]
        result = train_sft(
            examples,
            settings,
            args.work / "model",
            seed=config.seed,
            resume=False,
            progress=False,
            callbacks=[WallClock(args.train_seconds)],
        )
        model_dir = result.model_dir
        save_settings(model_dir, settings, kept)
        if affordances is not None:  # loadable as a project's model is
            affordances.save(model_dir / AFFORDANCES_FILE)
        report["training"] = {
            key: value
            for key, value in dataclasses.asdict(result).items()
            if key not in ("model_dir", "train_losses", "eval_losses")
        } | {"examples": len(examples), "final_train_loss": result.train_losses[-1][1] if result.train_losses else None}
        report["train_losses"] = result.train_losses
        print(f"trained {result.steps} steps, {result.epochs:.2f} epochs in {result.seconds:.0f} s", flush=True)
        save()
    model, tokenizer = load_model(model_dir)
    report["model"] = {"name": args.model if not args.trained else str(args.trained), "settings": _plain(settings)}
    report["parameters"] = sum(p.numel() for p in model.parameters())
    report["sets"] = {}
    first = None  # the first set's model and queries, for the speed figures
    for name in args.sets:
        with lzma.open(bundle / SETS / f"{name}.pkl.xz", "rb") as file:
            data = pickle.load(file)
        if args.limit:  # whole episodes, in the order fidelity reads them
            episodes = sorted({row["trajectory_id"] for row in data["rows"]})[: args.limit]
            data["rows"] = [row for row in data["rows"] if row["trajectory_id"] in set(episodes)]
        experience = ReplayedRetrieval(
            model, tokenizer, settings, data["recorded"], kept, affordances, seed=config.seed
        )
        first = first or (experience, sorted_queries(data["rows"], settings.history))
        if time.perf_counter() > deadline:
            print(f"{name}: skipped, past the deadline", flush=True)
            continue
        began = time.perf_counter()
        rows = data["rows"]
        fidelity = evaluate(
            experience.dynamics(), rows, horizon=0, batch_size=args.eval_batch, progress=False, setting_of=task_setting
        )
        report["sets"][name] = _summary(fidelity) | {"seconds": time.perf_counter() - began}
        print(
            f"{name}: {len(data['rows'])} transitions, exact {fidelity.summary['next_state_exact_match']:.1%}, "
            f"reward {fidelity.summary['reward_accuracy']:.1%}, done {fidelity.summary['done_accuracy']:.1%}, "
            f"parse failures {fidelity.summary['parse_failure_rate']:.1%} ({time.perf_counter() - began:.0f} s)",
            flush=True,
        )
        save()
    if args.throughput_batches and time.perf_counter() < deadline:  # fidelity first: a lease is short
        report["throughput"] = throughput(*first, args.throughput_batches, args.throughput, args.repeats)
    report["seconds"] = time.perf_counter() - started
    save()


def throughput(
    experience: ExperienceModel, queries: list[Query], batches: list[int], transitions: int, repeats: int = 1
) -> dict:
    """Transitions per second of `predict` at each batch size (retrieval replayed), after a warm-up:
    `repeats` rounds, each one pass over the same `transitions` queries per batch size (the batch
    sizes interleaved, so that a slow spell of the machine does not fall on one of them alone)."""
    import torch

    experience.predict(queries[:2])
    chosen = queries[:transitions]
    runs: dict[str, list[float]] = {str(batch): [] for batch in batches}
    for _ in range(repeats):
        for batch in batches:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            began = time.perf_counter()
            _predict_all(experience, chosen, batch)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            runs[str(batch)].append(len(chosen) / (time.perf_counter() - began))
            print(f"batch {batch}: {runs[str(batch)][-1]:.1f} transitions/s", flush=True)
    return {
        "transitions": len(chosen),
        "transitions_per_s": {batch: statistics.median(rates) for batch, rates in runs.items()},
        "runs": runs,
    }


def _predict_all(experience: ExperienceModel, queries: list[Query], batch: int) -> None:
    for start in range(0, len(queries), batch):
        experience.predict(queries[start : start + batch])


def _plain(values) -> dict:
    items = vars(values) if isinstance(values, argparse.Namespace) else dataclasses.asdict(values)
    return {key: str(value) if isinstance(value, Path) else value for key, value in items.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    commands = parser.add_subparsers(dest="command", required=True)
    out = commands.add_parser("export", help="the bundle, here (CPU), in a project after make run")
    out.add_argument("--out", type=Path, required=True)
    out.add_argument("--model", default="dreamgym-experience", help="the project's model (recorded and measured)")
    out.add_argument("--examples", type=Path, help="its SFT examples [default: the one examples-*.parquet]")
    out.add_argument("--set", action="append", required=True, help="NAME=PARQUET or NAME=GAMES_FOLDER, in order")
    out.add_argument("--check-transitions", type=int, default=64, help="replayed vs live retrieval on these")
    on = commands.add_parser("run", help="train and measure (the GPU machine)")
    on.add_argument("--bundle", type=Path, required=True)
    on.add_argument("--json", type=Path, required=True)
    on.add_argument("--work", type=Path, default=Path("/tmp/pretrained-experience"))
    on.add_argument("--model", default="smollm2-135m", help="the backbone to fine-tune")
    on.add_argument("--trained", type=Path, help="measure this trained experience model instead of training one")
    on.add_argument("--sets", nargs="+", required=True, help="bundle sets to measure, in order")
    on.add_argument("--epochs", type=float, default=3.0)
    on.add_argument("--batch-size", type=int, default=16)
    on.add_argument("--learning-rate", type=float, default=2e-4)
    on.add_argument("--max-length", type=int, default=2048)
    on.add_argument("--train-seconds", type=float, default=180.0)
    on.add_argument("--eval-batch", type=int, default=64)
    on.add_argument("--throughput-batches", type=int, nargs="*", default=[1, 32])
    on.add_argument("--throughput", type=int, default=64, help="transitions per throughput measurement")
    on.add_argument("--repeats", type=int, default=1, help="throughput rounds (medians reported)")
    on.add_argument("--limit", type=int, help="the first episodes of each set only (a dry run)")
    on.add_argument(
        "--cache", choices=["static", "dynamic"], help="the KV cache generation uses [default: generate.CACHE]"
    )
    on.add_argument(
        "--verify-chunk",
        type=int,
        help="prompts per forward pass of the drafts' check [default: decoding.VERIFY_CHUNK]",
    )
    on.add_argument(
        "--deadline-seconds", type=float, default=480.0, help="no set or speed measurement is started after this"
    )
    args = parser.parse_args()
    export(args) if args.command == "export" else run(args)


if __name__ == "__main__":
    main()
