"""Generation and fidelity measurement with a real (tiny, from-scratch) experience model trained on
real TextWorld transitions; no retrieval here (k = 0), so no buffer is needed."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import TINY_EXPERIENCE as TINY

from dreamgym.envs.dynamics import Query, Step
from dreamgym.experience.examples import queries_of
from dreamgym.experience.fidelity import evaluate, field_f1, foreseeable, set_f1, single_step
from dreamgym.experience.format import FORMAT_VERSION
from dreamgym.experience.generate import SETTINGS_FILE, ExperienceFormatError, ExperienceModel, trained_settings
from dreamgym.lm.model import load_model
from dreamgym.state import AbstractState, item_name, parse_state


def test_a_model_trained_on_another_prompt_format_is_refused(tmp_path):
    saved = dataclasses.asdict(TINY) | {"kept_names": None}  # as settings were saved before format 3
    (tmp_path / SETTINGS_FILE).write_text(json.dumps(saved))
    with pytest.raises(
        ExperienceFormatError,
        match=f"trained on prompt format 2, and this dreamgym writes format {FORMAT_VERSION}.*dreamgym run",
    ):
        trained_settings(tmp_path, TINY)
    (tmp_path / SETTINGS_FILE).write_text(json.dumps(saved | {"format": FORMAT_VERSION}))
    assert trained_settings(tmp_path, TINY) == TINY
    # A model trained on an endpoint's traces is used as one (no reward/done rule), its endpoint along.
    openai = {"annotator": "openai", "annotator_url": "http://h:8000/v1", "annotator_model": "m"}
    (tmp_path / SETTINGS_FILE).write_text(json.dumps(saved | {"format": FORMAT_VERSION} | openai))
    assert trained_settings(tmp_path, TINY) == dataclasses.replace(TINY, **openai)


def test_scores_by_setting_in_natural_order():
    from dreamgym.experience.fidelity import by_setting, setting_table

    def record(task_id: str, exact: bool) -> dict:
        return {"task_id": task_id, "exact_match": exact, "reward_correct": True, "done_correct": True, "parsed": True}

    records = [record("a-12", True), record("b-12", False), record("a-6", True), record("a-6", False)]
    rooms = lambda task_id: f"rooms {task_id.split('-')[1]}"  # noqa: E731
    scores = by_setting(records, rooms)
    assert list(scores) == ["rooms 6", "rooms 12"]
    assert scores["rooms 12"]["games"] == 2 and scores["rooms 6"]["games"] == 1
    assert scores["rooms 6"]["next_state_exact_match"] == 0.5 == scores["rooms 12"]["next_state_exact_match"]
    assert setting_table(scores).splitlines()[2] == "| rooms 6 | 1 | 2 | 50.0% | 100.0% | 100.0% | 0.0% |"


def test_set_and_field_f1():
    assert set_f1([], []) == 1.0
    assert set_f1(["a", "b"], ["b", "c"]) == pytest.approx(0.5)
    real = AbstractState("kitchen", ("knife (on table)", "table"), (), ("look", "take knife from table"))
    predicted = AbstractState("kitchen", ("table",), ("knife",), ("look",))
    assert field_f1(real, real) == {"location": 1.0, "visible": 1.0, "inventory": 1.0, "actions": 1.0}
    scores = field_f1(predicted, real)
    assert scores["location"] == 1.0 and scores["inventory"] == 0.0
    assert scores["visible"] == pytest.approx(2 / 3) and scores["actions"] == pytest.approx(2 / 3)


def test_a_transition_is_foreseeable_when_the_prompt_names_everything_in_its_next_state():
    kitchen = AbstractState(
        "kitchen",
        ("fridge (closed)", "knife (on table)", "table"),
        (),
        ("go east", "open fridge", "take knife from table"),
    )
    query = lambda action, history=(): Query("Cook the red apple.", kitchen, action, history)  # noqa: E731
    taken = AbstractState("kitchen", ("fridge (closed)", "table"), ("knife",), ("drop knife", "go east"))
    assert foreseeable(query("take knife from table"), taken)
    # Opening the fridge shows an apple: named in the instruction, so it could be known.
    assert foreseeable(
        query("open fridge"),
        AbstractState("kitchen", ("fridge (open)", "red apple (in fridge)", "knife (on table)", "table"), (), ()),
    )
    # ... but not a carrot, nor a room never seen before ...
    assert not foreseeable(
        query("open fridge"), AbstractState("kitchen", ("fridge (open)", "carrot (in fridge)"), (), ())
    )
    pantry = AbstractState("pantry", ("shelf",), (), ("go west",))
    assert not foreseeable(query("go east"), pantry)
    # ... unless the history went there: its name is in the prompt (its contents still are not).
    assert not foreseeable(query("go east", (Step("go west", 0, "pantry"),)), pantry)
    assert foreseeable(query("go east", (Step("go west", 0, "pantry"),)), AbstractState("pantry", (), (), ()))


def test_a_batch_comes_back_parsed_or_as_explicit_failures(tiny_experience, first_episode):
    model, tokenizer = load_model(tiny_experience.model_dir)
    experience = ExperienceModel(model, tokenizer, TINY)
    batch = first_episode[:8]
    predictions = experience.predict(queries_of(batch, TINY.history))
    assert len(predictions) == len(batch)
    for prediction in predictions:
        if prediction.ok:
            assert isinstance(prediction.completion.next_state, AbstractState)
            assert prediction.error is None and 1 <= prediction.attempts <= TINY.retries + 1
        else:  # tried every time it may, and says why the last attempt failed
            assert prediction.attempts == TINY.retries + 1 and prediction.error
            assert prediction.completion is None
    # Trained on exactly these transitions, the model writes completions that parse.
    assert sum(p.ok for p in predictions) >= len(batch) // 2, [p.error for p in predictions]


def test_rows_that_finished_leave_the_batch_and_the_others_write_the_same_tokens(
    tiny_experience, first_episode, monkeypatch
):
    import dreamgym.experience.generate as generate

    model, tokenizer = load_model(tiny_experience.model_dir)
    experience = ExperienceModel(model, tokenizer, TINY)
    queries = queries_of(first_episode[:8], TINY.history)
    prompts = experience.prompts(queries)
    states = [query.state for query in queries]
    monkeypatch.setattr(generate, "COMPACT_AFTER", 10_000)  # one call for the whole batch
    whole = experience.generate(prompts, states=states)
    batches = []
    original = model.generate
    monkeypatch.setattr(model, "generate", lambda **kw: batches.append(len(kw["input_ids"])) or original(**kw))
    monkeypatch.setattr(generate, "COMPACT_AFTER", 8)
    compacted = experience.generate(prompts, states=states)
    assert compacted == whole
    # It went on in smaller batches: the rows that had ended were left out.
    assert batches[0] == len(prompts) and len(batches) > 2 and batches[-1] < len(prompts), batches


def test_retries_sampled_together_draw_what_each_would_draw_alone(tiny_experience, first_episode, monkeypatch):
    import dreamgym.experience.generate as generate
    from dreamgym.lm.model import init_model

    _, tokenizer = load_model(tiny_experience.model_dir)
    # An untrained model spreads its scores: another seed draws another completion.
    untrained = init_model(tokenizer, TINY, seed=1)
    experience = ExperienceModel(untrained, tokenizer, dataclasses.replace(TINY, max_new_tokens=12))
    prompts = experience.prompts(queries_of(first_episode[:6], TINY.history))
    monkeypatch.setattr(generate, "COMPACT_AFTER", 4)  # the rows go on in new batches, prefilled again
    together = experience.generate(prompts, sample=True, attempt=1)
    assert together == [experience.generate([prompt], sample=True, attempt=1)[0] for prompt in prompts]
    assert len(set(together)) == len(prompts)  # sampled: no two rows drew alike
    assert experience.generate(prompts, sample=True, attempt=2) != together  # each attempt draws again


def test_an_untrained_model_fails_explicitly(tiny_experience, first_episode):
    from dreamgym.lm.model import init_model

    _, tokenizer = load_model(tiny_experience.model_dir)
    untrained = init_model(tokenizer, TINY, seed=1)
    experience = ExperienceModel(untrained, tokenizer, dataclasses.replace(TINY, max_new_tokens=16))
    predictions = experience.predict(queries_of(first_episode[:4], TINY.history))
    assert not any(p.ok for p in predictions)
    assert all(p.error and p.attempts == TINY.retries + 1 for p in predictions)


def test_fidelity_report_on_real_transitions(tiny_experience, first_episode):
    model, tokenizer = load_model(tiny_experience.model_dir)
    settings = trained_settings(tiny_experience.model_dir, dataclasses.replace(TINY, history=3))
    assert settings.history == TINY.history  # the prompt shape it was tiny_experience with wins
    setting_of = lambda task_id: "this game" if task_id == first_episode[0]["task_id"] else "other"  # noqa: E731
    report = evaluate(ExperienceModel(model, tokenizer, settings), first_episode, horizon=3, setting_of=setting_of)
    summary = report.summary
    # Per setting: here all of one game, so one setting whose scores are the whole report's.
    assert list(summary["by_setting"]) == ["this game"]
    assert summary["by_setting"]["this game"] == {"games": 1} | {
        key: summary[key]
        for key in ("transitions", "next_state_exact_match", "reward_accuracy", "done_accuracy", "parse_failure_rate")
    }
    assert summary["transitions"] == len(first_episode) == len(report.records)
    failures = sum(not r["parsed"] for r in report.records)
    assert summary["parse_failure_rate"] == pytest.approx(failures / len(first_episode))
    # Exact matches are matches on every field.
    for record in report.records:
        if record["exact_match"]:
            assert all(record[f"f1_{name}"] == 1.0 for name in ("location", "visible", "inventory", "actions"))
    foreseen = [r for r in report.records if r["foreseeable"]]
    assert summary["foreseeable"]["transitions"] == len(foreseen)
    assert summary["foreseeable_fraction"] == pytest.approx(len(foreseen) / len(first_episode))
    if foreseen:
        assert summary["foreseeable"]["next_state_exact_match"] == pytest.approx(
            sum(r["exact_match"] for r in foreseen) / len(foreseen)
        )
    assert [entry["step"] for entry in summary["multi_step"]] == [1, 2, 3]
    assert summary["multi_step"][0]["episodes"] == 1
    # Memorised transitions are mostly predicted exactly: the measurement sees a working model.
    assert summary["next_state_exact_match"] >= 0.5


def test_fidelity_asks_the_queries_the_examples_were_built_from_cut_at_a_quarantined_step(
    tiny_experience, first_episode
):
    """Single-step fidelity asks the model what its examples were built from (`queries_of`): a step
    right after one that validation quarantined carries no history from before the gap."""
    model, tokenizer = load_model(tiny_experience.model_dir)
    experience = ExperienceModel(model, tokenizer, trained_settings(tiny_experience.model_dir, TINY))
    rows = first_episode[:2] + first_episode[3:6]  # step 2 quarantined
    asked = []

    class Recorded:  # the real model, the queries it is asked kept
        history = experience.history

        def predict(self, queries):
            asked.extend(queries)
            return experience.predict(queries)

    records = single_step(Recorded(), list(reversed(rows)))  # in any order
    assert asked == queries_of(rows, TINY.history)
    assert asked[1].history and not asked[2].history and not asked[2].earlier
    assert [record["step"] for record in records] == [row["step"] for row in rows]


def test_measure_fidelity_is_the_report_the_pipeline_and_the_cli_log(
    tiny_experience, first_episode, mlflow_tracking, tmp_path
):
    """The pipeline's fidelity task and `dreamgym experience eval` both measure through
    `measure_fidelity`: `evaluate` on the model `open_experience_model` opens, logged to the run."""
    import mlflow

    from dreamgym.config import PipelineConfig
    from dreamgym.data.schema import to_table, write_transitions
    from dreamgym.experience.generate import open_experience_model
    from dreamgym.experience.report import measure_fidelity

    real = write_transitions(to_table(first_episode), tmp_path / "real.parquet")
    config = PipelineConfig(experience=TINY)
    setting_of = lambda task_id: "this game"  # noqa: E731
    experiment = mlflow.create_experiment("fidelity", artifact_location=(tmp_path / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment) as run:  # artifacts under tmp_path, not ./mlruns
        summary = measure_fidelity(tiny_experience.model_dir, real, tmp_path, config, setting_of=setting_of)
    with open_experience_model(tiny_experience.model_dir, tmp_path, config) as experience:
        expected = evaluate(experience, first_episode, TINY.multi_step, setting_of=setting_of).summary
    assert summary == expected and list(summary["by_setting"]) == ["this game"]
    logged = mlflow.get_run(run.info.run_id).data.metrics
    assert logged["fidelity_next_state_exact_match"] == summary["next_state_exact_match"]


def test_additions_and_replacements_cannot_repeat_an_item(tiny_experience):
    from dreamgym.experience.constrain import DeltaConstraint, repeated_entries

    state = AbstractState("kitchen", ("knife (on table)", "table"), ("carrot",), ("eat carrot",))
    assert repeated_entries(state, "<next_state>\ninventory: +knife; +car") == ("car", {"knife", "carrot"})
    assert repeated_entries(state, "<next_state>\nvisible = table; kni") == ("kni", {"table"})
    assert repeated_entries(state, "<next_state>\ninventory: -carrot") is None  # a removal: the other rule
    assert repeated_entries(state, "<reasoning>inventory: +carrot") is None
    _, tokenizer = load_model(tiny_experience.model_dir)
    constraint = DeltaConstraint(tokenizer, [state, state], prompt_length=0)
    constraint.generated = ["<next_state>\ninventory: +carrot", "<next_state>\ninventory: +onion"]
    scores = torch.zeros(2, len(tokenizer))
    for row in range(2):  # this rule alone (the format's would pick one token of these scores)
        constraint._constrain_entries(row, state, scores)
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"][-1]
    # 'carrot' is in the inventory already: ending the entry there is masked; 'onion' may end.
    assert scores[0, newline] == float("-inf") and scores[1, newline] == 0
    assert torch.isfinite(scores[0]).sum() > 0, "the entry may still go on"


def test_the_tokens_toward_an_ending_are_those_the_definition_gives(tiny_experience):
    """The looked-up tokens are exactly those of the rule's definition: every token whose piece
    keeps the text on the way to an ending, or completes one and goes on past it."""
    import random

    from dreamgym.experience.constrain import DeltaConstraint, _fits

    _, tokenizer = load_model(tiny_experience.model_dir)
    state = AbstractState("kitchen", ("knife (on table)", "table"), ("carrot",), ("eat carrot",))
    constraint = DeltaConstraint(tokenizer, [state], prompt_length=0)
    width = len(tokenizer) - 3  # the scores may be narrower than the vocabulary
    endings = [
        "carrot",  # complete where "carrot\n" and "carrot; " go on
        "ca",  # complete where "carrot" goes on: then any token that heads for "rrot" fits, "re" too
        "knife; ",
        "knife (on table)\n",
        "carrot\n",
        "carrot; ",
        "no change\n",
        "same as example 1\n",
        "same as example 12\n",
        "yellow bell pepper (in fridge)\n",
    ]
    rng, cases = random.Random(0), 0
    for _ in range(300):
        chosen = rng.sample(endings, rng.randint(1, 4))
        base = rng.choice(chosen)
        written = base[: rng.randint(0, len(base) + 2)] + ("x" if rng.random() < 0.1 else "")
        expected = {
            token
            for char in {e[len(written)] for e in chosen if len(e) > len(written) and e.startswith(written)}
            for token, piece in constraint.vocabulary.by_first.get(char, ())
            if token < width and _fits(written + piece, chosen)
        }
        assert constraint._tokens_toward(written, chosen, width) == expected, (written, chosen)
        cases += bool(expected)
    assert cases > 150  # most cases leave some tokens, so the comparison means something


# A state and a completion in the format, cut at random points by the format rule's tests.
FORMAT_STATE = AbstractState("kitchen", ("knife (on table)", "table"), ("carrot",), ("eat carrot",))
FORMAT_COMPLETION = (
    "<reasoning>The player takes the knife.</reasoning>\n<next_state>\nvisible: -knife (on table)\n"
    "inventory: +knife\n</next_state>\n<reward>0</reward>\n<done>false</done>"
)


def _read_text(constraint, tokenizer, text: str) -> None:
    """`text` (one row) into `constraint` as decoding gives it: token by token."""
    constraint.read(tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"])
    assert constraint.generated[0] == text  # the pieces are exact on this ASCII text


def test_greedy_decoding_keeps_the_best_scored_token_that_fits_the_format(tiny_experience):
    """Greedy decoding keeps the one token the definition names: the best-scored whose piece keeps
    the completion a prefix of the format, every token tried against the pattern, on 200 random
    cuts of a completion (decoding looks them up in the format's token automaton)."""
    import random

    from dreamgym.experience import constrain

    _, tokenizer = load_model(tiny_experience.model_dir)
    pattern = constrain.completion_pattern(reasoning=True)
    assert pattern.fullmatch(FORMAT_COMPLETION)
    pieces = constrain._vocabulary(tokenizer, len(tokenizer)).pieces
    rng = random.Random(0)
    for _ in range(200):
        written = FORMAT_COMPLETION[: rng.randint(0, len(FORMAT_COMPLETION) - 1)]
        scores = torch.randn(1, len(tokenizer))
        fitting = [t for t in range(len(pieces)) if pieces[t] and pattern.fullmatch(written + pieces[t], partial=True)]
        best = max(fitting, key=lambda token: scores[0, token].item())
        constraint = constrain.DeltaConstraint(tokenizer, [FORMAT_STATE], prompt_length=0)
        _read_text(constraint, tokenizer, written)
        constraint._constrain_format(scores)
        assert (scores[0] > float("-inf")).nonzero().flatten().tolist() == [best], written


def test_the_greedy_format_rule_on_a_batch_gives_each_row_what_it_gives_the_row_alone(tiny_experience):
    """The greedy format rule works on every row of a batch at once; each row comes out as it does
    decoded alone: rows at other places of the format, one that has left it (ended), and one whose
    completion is whole (left as it is, waiting for the batch)."""
    import random

    from dreamgym.experience import constrain

    _, tokenizer = load_model(tiny_experience.model_dir)
    rng = random.Random(2)
    texts = [FORMAT_COMPLETION[: rng.randint(0, len(FORMAT_COMPLETION) - 1)] for _ in range(6)]
    off_format = "<reasoning>The player looks.</reasoning>\n<next_state>\nvisible = knife (on table) to the"
    texts += [off_format, FORMAT_COMPLETION]
    alone, rows = [], []
    for text in texts:
        constraint = constrain.DeltaConstraint(tokenizer, [FORMAT_STATE], prompt_length=0)
        _read_text(constraint, tokenizer, text)
        alone.append(constraint)
    scores = torch.randn(len(texts), len(tokenizer))
    scores[0, rng.sample(range(len(tokenizer)), 200)] = float("-inf")  # masked by another rule
    for row, constraint in enumerate(alone):
        row_scores = scores[row : row + 1].clone()
        constraint._constrain_format(row_scores)
        rows.append(row_scores[0])
    batch = constrain.DeltaConstraint(tokenizer, [FORMAT_STATE] * len(texts), prompt_length=0)
    batch.format_states = [constraint.format_states[0] for constraint in alone]  # each row's place
    assert batch.format_states[-2] is None and batch.format.complete(batch.format_states[-1])
    together = scores.clone()
    batch._constrain_format(together)
    for row, expected in enumerate(rows):
        assert torch.equal(together[row], expected), texts[row]
    assert torch.equal(together[-1], scores[-1])  # the whole completion: untouched
    assert (together[-2] > float("-inf")).nonzero().flatten().tolist() == [tokenizer.eos_token_id]


def test_a_completion_with_no_way_on_in_the_format_ends_at_once(tiny_experience):
    """Where the other rules mask every token that would keep the completion in the format (an
    item named twice in a replacement line: after its `)` only `;` or the line's end may come, and
    both are masked), or where it has left the format, the end is the row's one token, greedy or
    sampled: nothing it could write on would parse. A completion with a way on is not ended."""
    from dreamgym.experience.constrain import DeltaConstraint, completion_pattern

    _, tokenizer = load_model(tiny_experience.model_dir)
    head = "<reasoning>The player looks.</reasoning>\n<next_state>\nvisible = knife (on table); "
    dead_end, off_format, going_on = head + "knife (on table)", head + "knife (on table) to the", head + "ta"
    assert completion_pattern(reasoning=True).fullmatch(dead_end, partial=True)
    assert not completion_pattern(reasoning=True).fullmatch(off_format, partial=True)
    for greedy in (True, False):
        for written, ends in ((dead_end, True), (off_format, True), (going_on, False)):
            constraint = DeltaConstraint(tokenizer, [FORMAT_STATE], prompt_length=0, greedy=greedy)
            ids = tokenizer(written, add_special_tokens=False, return_tensors="pt")["input_ids"]
            scores = constraint(ids, torch.randn(1, len(tokenizer)))
            alive = (scores[0] > float("-inf")).nonzero().flatten().tolist()
            assert (alive == [tokenizer.eos_token_id]) == ends, (written, greedy, alive[:5])


def test_sampling_keeps_the_top_tokens_that_fit_the_format_else_every_token_that_does(tiny_experience, monkeypatch):
    """Sampling draws among the best-scored tokens that keep the completion a prefix of the format,
    and when none of them does, among every token that does: the definition, every token tried
    against the pattern, on 200 random cases."""
    import random

    from dreamgym.experience import constrain

    monkeypatch.setattr(constrain, "FORMAT_CANDIDATES", 2)
    _, tokenizer = load_model(tiny_experience.model_dir)
    pattern = constrain.completion_pattern(reasoning=True)
    pieces = constrain._vocabulary(tokenizer, len(tokenizer)).pieces
    rng, looks = random.Random(1), {"first": 0, "every": 0}
    for _ in range(200):
        written = FORMAT_COMPLETION[: rng.randint(0, len(FORMAT_COMPLETION) - 1)]
        scores = torch.randn(1, len(tokenizer))
        scores[0, rng.sample(range(len(tokenizer)), 50)] = float("-inf")  # masked by another rule
        fitting = {
            t
            for t in range(len(pieces))
            if pieces[t] and scores[0, t] > float("-inf") and pattern.fullmatch(written + pieces[t], partial=True)
        }
        top = set(torch.topk(scores[0], 2).indices.tolist())
        expected = (top & fitting) or fitting or {tokenizer.eos_token_id}  # none fits: the row ends
        looks["first" if top & fitting else "every"] += 1
        constraint = constrain.DeltaConstraint(tokenizer, [FORMAT_STATE], prompt_length=0, greedy=False)
        _read_text(constraint, tokenizer, written)
        constraint._constrain_format(scores)
        assert set((scores[0] > float("-inf")).nonzero().flatten().tolist()) == expected, written
    assert min(looks.values()) > 10, looks  # both looks were taken


def test_removals_are_constrained_to_items_the_state_has(tiny_experience):
    from dreamgym.experience.constrain import DeltaConstraint, allowed_removals

    state = AbstractState(
        "kitchen", ("fridge (closed)", "knife (on table)", "table"), ("carrot",), ("eat carrot", "open fridge")
    )
    # Only what the field holds and the line has not removed yet, by name as removals are written.
    assert allowed_removals(state, "<next_state>\nvisible: -fridge; -kn") == (
        "kn",
        ["knife; ", "table; ", "knife\n", "table\n"],
    )
    assert allowed_removals(state, "<next_state>\nvisible: +kn") is None  # additions are free
    assert allowed_removals(state, "<next_state>\nvisible: -a\n</next_state>\n<reward>") is None
    _, tokenizer = load_model(tiny_experience.model_dir)
    torch.manual_seed(0)
    for written in ("<next_state>\ninventory: -", "<next_state>\nvisible: -fridge; -k"):
        text = written
        # Whatever the scores, greedy decoding under the constraint spells an item of the field.
        for _ in range(12):
            ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
            scores = torch.randn(1, len(tokenizer))
            # A completion without reasoning: the format's own rule allows what follows `<next_state>`.
            constrained = DeltaConstraint(tokenizer, [state], prompt_length=0, reasoning=False)(ids, scores)
            text += tokenizer.decode([int(constrained.argmax())])
            if "; " in text[len(written) :] or "\n" in text[len(written) :]:
                break  # the entry is complete (a token may run on past its end)
        entry = text[len(written) :].split("; ")[0].split("\n")[0]
        removed = entry if written.endswith("-") else "k" + entry
        field = state.inventory if "inventory" in written else state.visible
        assert removed in {item_name(item) for item in field}, text


def _first_line(tokenizer, state: AbstractState, examples: list[str], wanted: str) -> str:
    """The next state's first line, decoded greedily (constrained) for a model that wants to write
    `wanted` there: each token that continues it scores higher the more of it it spells."""
    from dreamgym.experience.constrain import DeltaConstraint

    pieces = [tokenizer.decode([token]) for token in range(len(tokenizer))]
    text = "<next_state>\n"
    for _ in range(len(wanted)):
        written = text[len("<next_state>\n") :]
        scores = torch.randn(1, len(tokenizer)) * 0.1
        scores[0, tokenizer.all_special_ids] = float("-inf")  # it does not stop mid-line
        for token, piece in enumerate(pieces):
            if piece and wanted.startswith(written + piece):
                scores[0, token] += 10 + len(piece)
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        constraint = DeltaConstraint(tokenizer, [state], 0, [examples], reasoning=False)
        text += tokenizer.decode([int(constraint(ids, scores).argmax())])
        if "\n" in text[len("<next_state>\n") :]:
            break
    return text[len("<next_state>\n") :].split("\n")[0]


KNIFE_STATE = AbstractState("kitchen", ("knife (on table)", "table"), ("carrot",), ("eat carrot",))
TAKES_KNIFE = "visible: -knife\ninventory: +knife"
DROPS_APPLE = "inventory: -apple\nvisible: +apple"  # the state has no apple: it cannot fit


def test_a_reference_can_only_name_a_worked_example_whose_change_fits(tiny_experience):
    from dreamgym.experience.constrain import fitting_references

    assert fitting_references(KNIFE_STATE, [DROPS_APPLE, TAKES_KNIFE]) == ["same as example 2"]
    _, tokenizer = load_model(tiny_experience.model_dir)
    torch.manual_seed(0)
    # Unconstrained the model would name example 1, which does not fit: it names example 2.
    assert _first_line(tokenizer, KNIFE_STATE, [DROPS_APPLE, TAKES_KNIFE], "same as example 1\n") == "same as example 2"
    # A reference that fits is left alone.
    assert _first_line(tokenizer, KNIFE_STATE, [DROPS_APPLE, TAKES_KNIFE], "same as example 2\n") == "same as example 2"
    # No example fits: the first line cannot head for a reference at all.
    first_line = _first_line(tokenizer, KNIFE_STATE, [DROPS_APPLE], "same as example 1\n")
    assert first_line and not "same as example ".startswith(first_line[: len("same as example ")]), first_line


def test_each_row_of_a_batch_names_only_a_worked_example_that_fits_its_own_examples(tiny_experience):
    from dreamgym.experience.constrain import DeltaConstraint

    _, tokenizer = load_model(tiny_experience.model_dir)
    pieces = [tokenizer.decode([token]) for token in range(len(tokenizer))]
    torch.manual_seed(0)
    wanted = "same as example 1\n"  # what both rows "want"; only the second row's example 1 fits
    examples = [[DROPS_APPLE, TAKES_KNIFE], [TAKES_KNIFE, DROPS_APPLE]]
    constraint = DeltaConstraint(tokenizer, [KNIFE_STATE] * 2, 0, examples, reasoning=False)
    ids = tokenizer(["<next_state>\n"] * 2, return_tensors="pt", add_special_tokens=False)["input_ids"]
    written = ["", ""]
    while not all("\n" in text for text in written) and len(written[0]) < 2 * len(wanted):
        scores = torch.randn(2, len(tokenizer)) * 0.1
        scores[:, tokenizer.all_special_ids] = float("-inf")
        for row, text in enumerate(written):
            for token, piece in enumerate(pieces):
                if piece and wanted.startswith(text + piece):
                    scores[row, token] += 10 + len(piece)
        chosen = constraint(ids, scores).argmax(dim=-1)
        ids = torch.cat([ids, chosen[:, None]], dim=1)
        written = [text + pieces[int(token)] for text, token in zip(written, chosen)]
    # The rows write the same prefix with the same tokens; each is held to its own examples.
    assert [text.split("\n")[0] for text in written] == ["same as example 2", "same as example 1"]


def test_a_change_may_be_written_out_where_an_example_fits(tiny_experience):
    _, tokenizer = load_model(tiny_experience.model_dir)
    torch.manual_seed(0)
    writes_out = "inventory: +apple\n"
    # An example fits or none does: the model that wants to write its own change writes it.
    assert _first_line(tokenizer, KNIFE_STATE, [DROPS_APPLE, TAKES_KNIFE], writes_out) == writes_out.strip()
    assert _first_line(tokenizer, KNIFE_STATE, [DROPS_APPLE], writes_out) == writes_out.strip()


def test_the_reward_and_done_are_held_to_what_the_reasoning_stated(tiny_experience):
    from dreamgym.experience.constrain import DeltaConstraint

    state = AbstractState("kitchen", ("table",), ("carrot",), ("eat carrot",))
    _, tokenizer = load_model(tiny_experience.model_dir)
    pieces = [tokenizer.decode([token]) for token in range(len(tokenizer))]
    tail = "\n<reward>1</reward>\n<done>false</done>"  # what the model "wants" to write

    def decoded(reasoning: str, stated: bool = True, traces: tuple[str, ...] = ()) -> str:
        """Greedy decoding after the next state of a model that wants to write `tail`."""
        text = f"<reasoning>{reasoning}</reasoning>\n<next_state>\ninventory: -carrot\n</next_state>"
        prefix = len(text)
        while "</done>" not in text and len(text) < prefix + 2 * len(tail):
            written = text[prefix:]
            scores = torch.randn(1, len(tokenizer)) * 0.1
            scores[0, tokenizer.all_special_ids] = float("-inf")
            for token, piece in enumerate(pieces):
                if piece and tail.startswith(written + piece):
                    scores[0, token] += 10 + len(piece)
            ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
            constrained = DeltaConstraint(tokenizer, [state], 0, None, stated, [traces])(ids, scores)
            text += tokenizer.decode([int(constrained.argmax())])
        return text[prefix:]

    torch.manual_seed(0)
    lost = "Effects: carrot leaves the inventory. The score does not change. The task is lost and the episode ends."
    assert decoded(lost) == "\n<reward>0</reward>\n<done>true</done>"
    assert decoded(lost, stated=False) == tail  # the rule is off: the model's own tags
    scored = "Effects: carrot leaves the inventory. The score rises by 1: the action advances the task."
    assert decoded(scored) == tail  # the tags it wanted agree with its reasoning
    # A reasoning in other words states nothing: the model writes its tags.
    assert decoded("The carrot is eaten; it was not in the recipe.") == tail
    # A reasoning that names a worked example states what that example's trace states.
    assert decoded("same as example 1", traces=(lost,)) == "\n<reward>0</reward>\n<done>true</done>"
    assert decoded("same as example 2", traces=(lost,)) == tail  # no such example: the parser says so


def test_the_next_state_is_no_change_exactly_where_the_reasoning_said_nothing_changed(tiny_experience):
    from dreamgym.experience.annotate import describe_change
    from dreamgym.experience.constrain import DeltaConstraint
    from dreamgym.experience.format import apply_delta, fits

    state = AbstractState("kitchen", ("fridge (closed)", "table"), (), ("open fridge",))
    opened = "visible: -fridge; +fridge (open)\nactions: -open fridge; +close fridge"
    assert fits(state, opened)
    opens = describe_change(state, "open fridge", apply_delta(state, opened), 0, False)
    nothing = describe_change(state, "open fridge", state, 0, False)
    _, tokenizer = load_model(tiny_experience.model_dir)
    pieces = [tokenizer.decode([token]) for token in range(len(tokenizer))]

    def first_line(reasoning: str, wants: dict[str, float], stated: bool = True, traces=(opens,)) -> str:
        """The next state's first line, greedy, of a model that scores the lines `wants` so."""
        text = f"<reasoning>{reasoning}</reasoning>\n<next_state>\n"
        prefix = len(text)
        while not text.endswith("\n") or len(text) == prefix:
            written = text[prefix:]
            scores = torch.randn(1, len(tokenizer)) * 0.1
            scores[0, tokenizer.all_special_ids] = float("-inf")
            for token, piece in enumerate(pieces):
                for line, weight in wants.items():
                    if piece and line.startswith(written + piece):
                        scores[0, token] += weight + len(piece)
            ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
            constrained = DeltaConstraint(tokenizer, [state], 0, [[opened]], stated, [traces])(ids, scores)
            text += tokenizer.decode([int(constrained.argmax())])
        return text[prefix:]

    torch.manual_seed(0)
    out_of_its_data = {"no change\n": 20, "same as example 1\n": 10}  # what the model did on new games
    # Its reasoning copied the example that opens the fridge: the fridge opens.
    assert first_line("same as example 1", out_of_its_data) == "same as example 1\n"
    assert first_line(opens, out_of_its_data) == "same as example 1\n"  # written out, the same
    assert first_line("same as example 1", out_of_its_data, stated=False) == "no change\n"  # the rule off
    assert first_line("The fridge opens.", out_of_its_data) == "no change\n"  # other words state nothing
    # Its reasoning said nothing changed: so does the next state.
    copies = {"same as example 1\n": 20, "no change\n": 10}
    assert first_line("same as example 1", copies, traces=(nothing,)) == "no change\n"
    assert first_line("same as example 1", copies) == "same as example 1\n"


def test_a_draft_holds_exactly_where_greedy_decoding_writes_it(tiny_experience, first_episode, monkeypatch):
    import dreamgym.experience.decoding as decoding
    import dreamgym.experience.generate as generate

    model, tokenizer = load_model(tiny_experience.model_dir)
    experience = ExperienceModel(model, tokenizer, TINY)
    queries = queries_of(first_episode, TINY.history)
    written = experience.generate(experience.prompts(queries), states=[query.state for query in queries])
    # Written token by token (this model shows no examples); the completions that end as they should.
    ended = [index for index, text in enumerate(written) if text.endswith("<done>false</done>")][:8]
    assert len(ended) == 8, written
    queries, written = [queries[i] for i in ended], [written[i] for i in ended]
    prompts, states = experience.prompts(queries), [query.state for query in queries]
    # Every other draft is what the model wrote, the rest differ from it at the very end.
    drafts = {
        prompt: text if index % 2 == 0 else text.replace("<done>false</done>", "<done>true</done>")
        for index, (prompt, text) in enumerate(zip(prompts, written))
    }
    monkeypatch.setattr(decoding, "copied_completion", lambda prompt, reasoning: drafts[prompt])
    monkeypatch.setattr(decoding, "VERIFY_CHUNK", 3)  # rows of several lengths in each forward pass
    checked = experience.checked_drafts(prompts, states=states)
    assert checked[0::2] == written[0::2]
    # Where a draft fails, what decoding writes first: the draft up to "true", and "false" there.
    for known, text in zip(checked[1::2], written[1::2]):
        assert tokenizer.decode(known) == text[: text.index("<done>") + len("<done>false")]
    # Through generate: the drafts that hold are taken, the others written on from there, the same text.
    monkeypatch.setattr(experience, "_drafts_checkable", lambda: True)
    decoded, speculated = [], []
    original, speculate = experience._decode, experience.speculated
    monkeypatch.setattr(
        experience, "_decode", lambda prompts, *a: decoded.append(len(prompts)) or original(prompts, *a)
    )
    monkeypatch.setattr(
        experience,
        "speculated",
        lambda prompt, known, *a, **k: speculated.append(known) or speculate(prompt, known, *a, **k),
    )
    assert experience.generate(prompts, states=states) == written
    assert decoded == [] and speculated == checked[1::2]
    # More rows than generate speculates, one by one: they are decoded as a batch, the same text.
    monkeypatch.setattr(generate, "SPECULATED_ROWS", 3)
    speculated.clear()
    assert experience.generate(prompts, states=states) == written
    assert decoded == [4] and speculated == []


def test_lookup_guesses_what_followed_the_last_earlier_place_of_the_last_tokens():
    from dreamgym.experience.decoding import looked_up

    tokens = [5, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2]
    assert looked_up(tokens, 2, ngram=2) == [4, 7]  # the last earlier (1, 2), not the first
    assert looked_up(tokens, 9, ngram=2) == [4, 7, 1, 2]  # as many as there are
    assert looked_up([*tokens, 3], 2, ngram=3) == [9, 1]  # (1, 2, 3) once before
    assert looked_up([*tokens, 8, 4], 3, ngram=3) == [7, 1, 2]  # (8, 4) never before: (4) alone
    assert looked_up([*tokens, 6], 3) == []  # 6 never before
    assert looked_up(tokens, 0) == [] and looked_up([1], 3) == []


def test_speculative_decoding_writes_what_decoding_token_by_token_writes_in_fewer_passes(
    tiny_experience, first_episode, monkeypatch
):
    model, tokenizer = load_model(tiny_experience.model_dir)
    experience = ExperienceModel(model, tokenizer, TINY)
    queries = queries_of(first_episode, TINY.history)[:6]
    prompts, states = experience.prompts(queries), [query.state for query in queries]
    batched = experience._decode(prompts, False, 0, states, None, None)  # every change written out
    passes = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: passes.append(1) or forward(*a, **k))
    speculated = [experience.speculated(prompt, (), [state]) for prompt, state in zip(prompts, states)]
    assert speculated == batched
    # A change copies runs of the prompt's state: a pass took several tokens where its guess held.
    tokens = sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in speculated)
    assert len(passes) < tokens / 1.25, (len(passes), tokens)
    # A retry's sample: each position's token drawn from the prompt's generator, in order, as in
    # decoding token by token (the draws of a sampled batch, each row's its own).
    sampled = experience._decode(prompts, True, 1, states, None, None)
    assert sampled != batched
    assert [
        experience.speculated(prompt, (), [state], sample=True, attempt=1) for prompt, state in zip(prompts, states)
    ] == sampled
    # A model whose generation config changes its scores (transformers applies it) is not speculated.
    model.generation_config.repetition_penalty = 1.3
    monkeypatch.setattr(experience, "speculated", lambda *a, **k: pytest.fail("speculated past the penalty"))
    assert experience.generate(prompts[:2], states=states[:2]) == experience._decode(
        prompts[:2], False, 0, states[:2], None, None
    )


def test_a_change_written_out_for_a_situation_no_example_covers_parses_and_applies(tiny_experience, first_episode):
    model, tokenizer = load_model(tiny_experience.model_dir)
    experience = ExperienceModel(model, tokenizer, dataclasses.replace(TINY, retries=0))
    # Each step of the episode the model learned, beside a thing it never saw.
    unseen = []
    for row in first_episode:
        state = parse_state(row["state"])
        lantern = AbstractState(
            state.location,
            (*state.visible, "brass lantern (on floor)"),
            state.inventory,
            (*state.actions, "examine brass lantern"),
        )
        unseen.append(Query(row["instruction"], lantern, row["action"], ()))
    predictions = experience.predict(unseen)
    # This model writes every change out (it was trained without examples), and knows one episode:
    # off it, what it writes is seldom what the game would do, but the decoding rules keep it a
    # change of this state that parses (9 of 11 steps on one machine, 7 on another, whose float
    # sums trained other weights: the rest ran out of tokens; 3 before the format rule).
    parsed = [prediction.ok for prediction in predictions]
    assert sum(parsed) > len(unseen) / 2, [prediction.error for prediction in predictions]
    # An edit of this very state: the thing it never saw stays where it was.
    assert all(
        "brass lantern (on floor)" in prediction.completion.next_state.visible
        for prediction in predictions
        if prediction.ok
    )
    loose = ExperienceModel(model, tokenizer, dataclasses.replace(TINY, retries=0, constrained_decoding=False))
    assert sum(prediction.ok for prediction in loose.predict(unseen)) < sum(parsed)
