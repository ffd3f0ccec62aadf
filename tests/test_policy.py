"""The policy model on a tiny from-scratch Llama (random weights, no training, no fixtures from
conftest): batched action scoring against naive full-sequence scoring, the choice distribution,
acting, the value head, save/load, and the behaviour-cloning examples."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from dreamgym.errors import DreamgymError
from dreamgym.lm.model import init_model, train_tokenizer
from dreamgym.policy.bc import bc_examples, initial_policy
from dreamgym.policy.config import PolicyConfig
from dreamgym.policy.model import (
    KEPT_NAMES_FILE,
    SETTINGS_FILE,
    VALUE_HEAD_FILE,
    Observation,
    Policy,
    PolicyError,
    action_completion,
    load_policy,
)
from dreamgym.policy.view import object_placeholders, policy_input, policy_prompt
from dreamgym.state import parse_state

KITCHEN = "location: kitchen\nvisible: apple\ninventory:\nactions: eat apple; go north; take apple"
HALL = (
    "location: hall\nvisible: wooden door (closed)\ninventory: brass key\n"
    "actions: drop brass key; go south; open wooden door with brass key"
)
ACTIONS = ("eat apple", "go north", "take apple", "drop brass key", "go south", "open wooden door with brass key")
CONFIG = PolicyConfig(
    vocab_size=400, hidden_size=32, layers=1, heads=2, max_length=256, action_score="sum", placeholders=False
)

# Two prompts of different lengths (padding) and candidates of different token lengths
# ("examine the rusty old cabinet" has words the tokenizer never saw: many byte-level tokens).
PROMPTS = [
    policy_prompt("eat the apple", [], KITCHEN),
    policy_prompt("open the wooden door in the hall", ["go north", "take brass key"], HALL),
]
CANDIDATES = [
    ("eat apple", "go north", "take apple", "examine the rusty old cabinet"),
    ("go south", "open wooden door with brass key"),
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """A 32-wide model gains nothing from intra-op threads, and on a busy machine their spin-waits
    make each forward pass ~100× slower; restored after this module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer():
    texts = PROMPTS + [policy_prompt("go north", ["eat apple"], KITCHEN)] + [action_completion(a) for a in ACTIONS]
    return train_tokenizer(texts * 2, CONFIG.vocab_size)


@pytest.fixture(scope="module")
def model(tokenizer):
    return init_model(tokenizer, CONFIG, 0).eval()


def make_policy(model, tokenizer, **changes) -> Policy:
    return Policy(model, tokenizer, dataclasses.replace(CONFIG, **changes))


@pytest.fixture(scope="module")
def policy(model, tokenizer) -> Policy:
    return make_policy(model, tokenizer)


def naive_score(policy: Policy, prompt: str, action: str) -> tuple[float, int]:
    """Sum of the action's token log-probs (EOS included) from one unpadded forward pass over
    prompt + action, and the number of action tokens."""
    tokenizer = policy.tokenizer
    prompt_ids = tokenizer(prompt)["input_ids"]
    action_ids = tokenizer(action_completion(action), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([prompt_ids + action_ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    # token k of the action sits at position len(prompt)+k and is predicted by position len(prompt)+k-1
    total = sum(float(logprobs[len(prompt_ids) - 1 + k, token]) for k, token in enumerate(action_ids))
    return total, len(action_ids)


def test_the_test_inputs_exercise_padding(policy):
    prompt_lengths = {len(policy.tokenizer(prompt)["input_ids"]) for prompt in PROMPTS}
    action_lengths = {
        len(policy.tokenizer(action_completion(a), add_special_tokens=False)["input_ids"])
        for options in CANDIDATES
        for a in options
    }
    assert len(prompt_lengths) == 2 and len(action_lengths) >= 2
    for state in (KITCHEN, HALL):
        parse_state(state)  # valid abstract states


def test_score_actions_sum_equals_naive_scoring(policy):
    with torch.no_grad():
        scores, values = policy.score_actions(PROMPTS, CANDIDATES)
    assert values is None
    expected = [
        naive_score(policy, prompt, action)[0] for prompt, options in zip(PROMPTS, CANDIDATES) for action in options
    ]
    assert scores.shape == (6,)  # 4 + 2 candidates, flattened in order
    assert scores.tolist() == pytest.approx(expected, abs=1e-4)


def test_score_actions_mean_divides_by_the_action_tokens_eos_included(model, tokenizer):
    mean_policy = make_policy(model, tokenizer, action_score="mean")
    with torch.no_grad():
        scores, _ = mean_policy.score_actions(PROMPTS, CANDIDATES)
    expected = []
    for prompt, options in zip(PROMPTS, CANDIDATES):
        for action in options:
            total, count = naive_score(mean_policy, prompt, action)
            expected.append(total / count)
    assert scores.tolist() == pytest.approx(expected, abs=1e-4)


def test_score_actions_does_not_depend_on_the_batch(policy):
    with torch.no_grad():
        together, _ = policy.score_actions(PROMPTS, CANDIDATES)
        second_alone, _ = policy.score_actions(PROMPTS[1:], CANDIDATES[1:])
    assert second_alone.tolist() == pytest.approx(together[4:].tolist(), abs=1e-4)


def test_rows_of_like_length_go_together_and_come_back_in_the_callers_order(model, tokenizer, monkeypatch):
    """More rows than one pass takes, longest first: they are scored in passes of the shortest
    rows together, and every score and value comes back where the caller put its prompt."""
    import dreamgym.policy.model as policy_model

    policy = make_policy(model, tokenizer)
    policy.add_value_head()
    with torch.no_grad():
        policy.value_head.weight.normal_(generator=torch.Generator().manual_seed(2))
    prompts = [PROMPTS[1], PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[0]]
    candidates = [CANDIDATES[1], CANDIDATES[0], CANDIDATES[1][:1], CANDIDATES[0][2:], CANDIDATES[0][:1]]
    monkeypatch.setattr(policy_model, "ROWS_PER_PASS", 2)
    scores, values = policy.score_actions(prompts, candidates, with_values=True)
    expected = [
        naive_score(policy, prompt, action)[0] for prompt, options in zip(prompts, candidates) for action in options
    ]
    assert scores.tolist() == pytest.approx(expected, abs=1e-4)
    with torch.no_grad():
        for prompt, value in zip(prompts, values):
            ids = torch.tensor([tokenizer(prompt)["input_ids"]])
            hidden = policy.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, -1]
            assert float(value) == pytest.approx(float(policy.value_head(hidden)), abs=1e-4)
    # differentiable, as BC and the RL losses need
    (scores.sum() + values.sum()).backward()
    assert policy.model.get_input_embeddings().weight.grad.abs().sum() > 0


def test_token_ids_come_from_the_cache_and_a_full_cache_starts_again(model, tokenizer, monkeypatch):
    """Token ids are kept by text (BC reads the same texts every epoch); scores with a cache that
    fills up within one call are those of fresh tokenization."""
    import dreamgym.policy.model as policy_model

    policy = make_policy(model, tokenizer)
    monkeypatch.setattr(policy_model, "TOKEN_CACHE_SIZE", 3)
    expected = [
        naive_score(policy, prompt, action)[0] for prompt, options in zip(PROMPTS, CANDIDATES) for action in options
    ]
    for _ in range(2):
        with torch.no_grad():
            scores, _ = policy.score_actions(PROMPTS, CANDIDATES)
        assert scores.tolist() == pytest.approx(expected, abs=1e-4)
    assert len(policy._token_cache) <= len(PROMPTS) + sum(map(len, CANDIDATES))
    monkeypatch.setattr(policy_model, "TOKEN_CACHE_SIZE", 1000)
    calls = []
    monkeypatch.setattr(policy, "tokenizer", _Counting(tokenizer, calls))
    with torch.no_grad():
        policy.score_actions(PROMPTS, CANDIDATES)
        assert 1 <= len(calls) <= 2  # what the small cache lost: prompts and actions, one call each
        calls.clear()
        policy.score_actions(PROMPTS, CANDIDATES)
    assert calls == []


class _Counting:
    """A tokenizer that records its calls."""

    def __init__(self, tokenizer, calls: list):
        self._tokenizer, self._calls = tokenizer, calls

    def __call__(self, *args, **kwargs):
        self._calls.append(args)
        return self._tokenizer(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def test_score_actions_needs_a_candidate_per_prompt(policy):
    with pytest.raises(PolicyError):
        policy.score_actions(PROMPTS, [CANDIDATES[0], ()])
    with pytest.raises(PolicyError):
        policy.score_actions(PROMPTS, CANDIDATES[:1])


def test_log_probs_are_a_log_softmax_per_prompt(policy):
    with torch.no_grad():
        scores, _ = policy.score_actions(PROMPTS, CANDIDATES)
        distributions, _ = policy.log_probs(PROMPTS, CANDIDATES)
        cooled, _ = policy.log_probs(PROMPTS, CANDIDATES, temperature=0.5)
    assert [len(d) for d in distributions] == [4, 2]
    for distribution in distributions + cooled:
        assert float(distribution.exp().sum()) == pytest.approx(1.0, abs=1e-5)
    # temperature 0.5: softmax(scores / 0.5) within each prompt's candidates
    for distribution, part in zip(cooled, torch.split(scores, [4, 2])):
        expected = torch.softmax(part / 0.5, dim=0)
        assert distribution.exp().tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    # temperature 1: softmax(scores); e.g. two candidates: log π(a0) = -log(1 + exp(s1 - s0))
    s0, s1 = scores[4:].tolist()
    assert float(distributions[1][0]) == pytest.approx(-torch.log1p(torch.tensor(s1 - s0).exp()).item(), abs=1e-5)


def observations() -> list[Observation]:
    return [
        Observation("eat the apple", (), KITCHEN),
        Observation("open the wooden door in the hall", ("look", "go north", "take brass key"), HALL),
    ]


def test_act_greedy_picks_the_argmax(policy):
    decisions = policy.act(observations(), greedy=True)
    assert [d.candidates for d in decisions] == [
        ("eat apple", "go north", "take apple"),
        ("drop brass key", "go south", "open wooden door with brass key"),
    ]
    # history 2 (the default): only the last two recent actions are in the prompt
    assert decisions[1].prompt == policy_prompt(
        "open the wooden door in the hall", ["go north", "take brass key"], HALL, list_actions=False
    )
    with torch.no_grad():
        distributions, _ = policy.log_probs([d.prompt for d in decisions], [d.candidates for d in decisions])
    for decision, distribution in zip(decisions, distributions):
        assert decision.chosen == int(torch.argmax(distribution))
        assert decision.logprob == pytest.approx(float(distribution[decision.chosen]), abs=1e-5)
        assert decision.value is None


def test_act_sampling_is_reproducible_and_valid(policy):
    def draw(seed: int):
        return policy.act(observations() * 3, generator=torch.Generator().manual_seed(seed))

    first = draw(7)
    assert [d.chosen for d in first] == [d.chosen for d in draw(7)]
    chosen = set()
    for seed in range(3):
        decisions = draw(seed)
        for observation, decision in zip(observations() * 3, decisions):
            assert decision.action in parse_state(observation.state).actions
            chosen.add(decision.action)
        with torch.no_grad():
            distributions, _ = policy.log_probs([d.prompt for d in decisions], [d.candidates for d in decisions])
        for decision, distribution in zip(decisions, distributions):
            assert decision.logprob == pytest.approx(float(distribution[decision.chosen]), abs=1e-5)
    assert len(chosen) > 2  # near-uniform random policy: sampling does not always take the same action


def test_act_temperature_is_used_in_the_recorded_logprob(policy):
    decisions = policy.act(observations(), greedy=True, temperature=0.5)
    with torch.no_grad():
        distributions, _ = policy.log_probs([d.prompt for d in decisions], [d.candidates for d in decisions], 0.5)
    for decision, distribution in zip(decisions, distributions):
        assert decision.logprob == pytest.approx(float(distribution[decision.chosen]), abs=1e-5)


def test_act_without_available_actions_looks(policy):
    assert policy.act([]) == []
    [decision] = policy.act([Observation("eat the apple", (), "location: kitchen\nvisible:\ninventory:\nactions:")])
    assert decision.candidates == ("look",) and decision.action == "look"
    assert decision.logprob == pytest.approx(0.0, abs=1e-6)  # the only candidate: probability 1


def test_value_head(model, tokenizer):
    policy = make_policy(model, tokenizer)
    with pytest.raises(PolicyError, match="value head"):
        policy.score_actions(PROMPTS, CANDIDATES, with_values=True)
    policy.add_value_head()
    with torch.no_grad():
        scores, values = policy.score_actions(PROMPTS, CANDIDATES, with_values=True)
    assert values.tolist() == [0.0, 0.0]  # zero-initialised: one value per prompt
    assert scores.shape == (6,)
    decisions = policy.act(observations(), greedy=True, with_values=True)
    assert [d.value for d in decisions] == [0.0, 0.0]


def test_a_value_reads_the_last_prompt_token_whatever_candidates_follow_it(model, tokenizer):
    """The prompt shares its row with its candidates: its value is still the value head on the
    prompt's own last hidden state, as in a forward pass over the prompt alone."""
    policy = make_policy(model, tokenizer)
    policy.add_value_head()
    with torch.no_grad():
        policy.value_head.weight.normal_(generator=torch.Generator().manual_seed(1))
        _, values = policy.score_actions(PROMPTS, CANDIDATES, with_values=True)
        for prompt, value in zip(PROMPTS, values):
            ids = torch.tensor([tokenizer(prompt)["input_ids"]])
            hidden = policy.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, -1]
            assert float(value) == pytest.approx(float(policy.value_head(hidden)), abs=1e-4)


def test_save_and_load_round_trip(model, tokenizer, tmp_path):
    policy = make_policy(model, tokenizer, history=1, action_score="sum")
    policy.add_value_head()
    with torch.no_grad():
        policy.value_head.weight.normal_(generator=torch.Generator().manual_seed(0))
        policy.value_head.bias.fill_(0.25)
        scores, values = policy.score_actions(PROMPTS, CANDIDATES, with_values=True)
    path = policy.save(tmp_path / "policy")
    assert (path / VALUE_HEAD_FILE).is_file()
    settings = json.loads((path / SETTINGS_FILE).read_text())
    assert settings["history"] == 1 and settings["action_score"] == "sum" and settings["mode"] == "choice"

    # the saved prompt settings override the config given; the rest of the config is kept
    other = dataclasses.replace(CONFIG, history=5, action_score="mean", batch_size=3)
    loaded = load_policy(path, other)
    assert loaded.config.history == 1 and loaded.config.action_score == "sum"
    assert loaded.config.batch_size == 3
    assert not loaded.training and loaded.value_head is not None
    with torch.no_grad():
        loaded_scores, loaded_values = loaded.score_actions(PROMPTS, CANDIDATES, with_values=True)
    assert loaded_scores.tolist() == pytest.approx(scores.tolist(), abs=1e-4)
    assert loaded_values.tolist() == pytest.approx(values.tolist(), abs=1e-5)
    assert values.tolist() != pytest.approx([0.25, 0.25])  # the head really reads the hidden state
    assert loaded.act(observations(), greedy=True)[1].prompt == policy_prompt(
        "open the wooden door in the hall", ["take brass key"], HALL, list_actions=False
    )  # history 1 after loading


def test_a_policy_saved_before_the_domain_named_its_task_objects_keeps_its_prompt(model, tokenizer, tmp_path):
    path = make_policy(model, tokenizer, domain="textworld-cooking").save(tmp_path / "policy")
    assert load_policy(path).config.domain == "textworld-cooking"
    settings = json.loads((path / SETTINGS_FILE).read_text())
    del settings["domain"]  # as policies trained before 2026-11-27 were saved
    (path / SETTINGS_FILE).write_text(json.dumps(settings))
    assert load_policy(path, dataclasses.replace(CONFIG, domain="textworld-cooking")).config.domain == "none"


def test_a_policy_saved_before_the_task_came_last_keeps_its_prompt(model, tokenizer, tmp_path):
    observation = Observation("open the wooden door in the hall", ("take brass key",), HALL)
    path = make_policy(model, tokenizer).save(tmp_path / "policy")
    assert load_policy(path).view(observation).prompt.endswith("\ntask: open the wooden door in the hall\nnext action:")
    settings = json.loads((path / SETTINGS_FILE).read_text())
    del settings["task_last"]  # as policies trained before 2026-12-05 (late) were saved
    (path / SETTINGS_FILE).write_text(json.dumps(settings))
    old = load_policy(path, CONFIG)
    assert not old.config.task_last
    assert old.view(observation).prompt == policy_prompt(
        "open the wooden door in the hall", ["take brass key"], HALL, list_actions=False, task_last=False
    )
    assert old.view(observation).prompt.startswith("task: open the wooden door in the hall\nrecent actions:")


def test_save_without_value_head_loads_without_one(model, tokenizer, tmp_path):
    path = make_policy(model, tokenizer).save(tmp_path / "plain")
    assert not (path / VALUE_HEAD_FILE).exists()
    loaded = load_policy(path)
    assert loaded.value_head is None
    with pytest.raises(PolicyError):
        loaded.score_actions(PROMPTS, CANDIDATES, with_values=True)


def test_load_policy_of_an_empty_folder_fails(tmp_path):
    with pytest.raises(DreamgymError, match="no saved policy"):
        load_policy(tmp_path)


# --- the policy's view: placeholders -------------------------------------------------------------

PANTRY = (
    "location: pantry\nvisible: carrot (on shelf); purple potato (on shelf); shelf\n"
    "inventory: knife; red apple (sliced)\n"
    "actions: eat red apple; go north; slice red apple with knife; take carrot from shelf; "
    "take purple potato from shelf"
)
RECIPE = "Recipe: ingredients: purple potato, red apple. directions: roast the purple potato; prepare meal."
KEPT = frozenset({"knife", "shelf"})


def test_objects_the_task_names_come_first_in_its_order_and_the_others_after():
    assert object_placeholders(KEPT, RECIPE, PANTRY) == {
        "purple potato": "obj1",
        "red apple": "obj2",
        "carrot": "other1",
    }
    view = policy_input(RECIPE, ["take red apple from shelf", "slice red apple with knife"], PANTRY, 1, KEPT)
    assert view.prompt == policy_prompt(
        "Recipe: ingredients: obj1, obj2. directions: roast the obj1; prepare meal.",
        ["slice obj2 with knife"],
        "location: pantry\nvisible: obj1 (on shelf); other1 (on shelf); shelf\n"
        "inventory: knife; obj2 (sliced)\n"
        "actions: eat obj2; go north; slice obj2 with knife; take obj1 from shelf; take other1 from shelf",
    )
    # the candidates are the available actions in the state's order, renamed; the real ones beside
    assert view.actions == parse_state(PANTRY).actions
    assert view.candidates == (
        "eat obj2",
        "go north",
        "slice obj2 with knife",
        "take other1 from shelf",
        "take obj1 from shelf",
    )
    assert view.rename("take purple potato from shelf") == "take obj1 from shelf"
    assert view.restore("take obj1 from shelf") == "take purple potato from shelf"
    # a food the training data never showed is renamed the same way: names are not learnt, roles are
    unseen = PANTRY.replace("purple potato", "green zucchini")
    assert (
        policy_input(RECIPE.replace("purple potato", "green zucchini"), [], unseen, 2, KEPT).prompt
        == policy_input(RECIPE, [], PANTRY, 2, KEPT).prompt
    )


def test_the_objects_the_task_asks_for_keep_their_numbers_before_the_state_shows_them():
    # only the recipe's second ingredient is in sight: still obj2, and the first, unseen, is obj1
    shelf = (
        "location: pantry\nvisible: red apple (on shelf); shelf\ninventory: knife\nactions: take red apple from shelf"
    )
    asked = ("purple potato", "red apple")
    view = policy_input(RECIPE, [], shelf, 2, KEPT, task_objects=asked)
    assert "\ntask: Recipe: ingredients: obj1, obj2. directions: roast the obj1; prepare meal.\n" in view.prompt
    assert view.candidates == ("take obj2 from shelf",)
    # the same numbers once both are in sight, so a food's number never changes within an episode
    assert object_placeholders(KEPT, RECIPE, PANTRY, asked) == object_placeholders(KEPT, RECIPE, PANTRY)
    # numbered by what the state shows alone (a domain that names no task objects), the one in
    # sight would be obj1 and the recipe would keep the other's real name
    assert object_placeholders(KEPT, RECIPE, shelf) == {"red apple": "obj1"}


def test_without_placeholders_the_view_is_the_real_text():
    view = policy_input(RECIPE, ["look"], PANTRY, 2, None)
    assert view.prompt == policy_prompt(RECIPE, ["look"], PANTRY)
    assert view.candidates == view.actions == parse_state(PANTRY).actions


def test_a_policy_with_placeholders_acts_on_real_actions_and_saves_its_kept_names(model, tokenizer, tmp_path):
    with pytest.raises(PolicyError, match="kept_names"):
        make_policy(model, tokenizer, placeholders=True)
    policy = Policy(model, tokenizer, dataclasses.replace(CONFIG, placeholders=True), kept_names=KEPT)
    observation = Observation(RECIPE, (), PANTRY)
    decisions = policy.act([observation] * 6, generator=torch.Generator().manual_seed(0))
    for decision in decisions:
        assert decision.prompt == policy.view(observation).prompt and "purple potato" not in decision.prompt
        assert decision.action == parse_state(PANTRY).actions[decision.chosen]  # the real text is played
        assert decision.candidates[decision.chosen] == policy.view(observation).rename(decision.action)
    path = policy.save(tmp_path / "named")
    assert json.loads((path / KEPT_NAMES_FILE).read_text()) == sorted(KEPT)
    loaded = load_policy(path)
    assert loaded.kept_names == KEPT and loaded.view(observation) == policy.view(observation)
    (path / KEPT_NAMES_FILE).unlink()
    with pytest.raises(PolicyError, match=KEPT_NAMES_FILE):
        load_policy(path)


def test_an_action_already_taken_from_the_same_state_is_no_candidate_again(model, tokenizer):
    """Two rooms and a greedy policy: back in the kitchen it must not go north again (it would loop)."""
    past_states, past_actions = [KITCHEN, HALL], ["go north", "go south"]
    view = policy_input("eat the apple", past_actions, KITCHEN, 2, None, past_states=past_states)
    assert view.candidates == ("eat apple", "take apple")
    # only from the very same state: in the hall, "go south" was taken from the hall and is left out,
    # "go north" (taken from the kitchen) would not be
    assert "go south" not in policy_input("x", past_actions, HALL, 2, None, past_states=past_states).candidates
    # when every action was tried, those tried least often are left; without past states, all
    everything = ["eat apple", "go north", "take apple"]
    assert policy_input("x", everything, KITCHEN, 2, None, past_states=[KITCHEN] * 3).candidates == tuple(everything)
    again = [*everything, "go north", "eat apple"]
    assert policy_input("x", again, KITCHEN, 2, None, past_states=[KITCHEN] * 5).candidates == ("take apple",)
    assert policy_input("x", past_actions, KITCHEN, 2, None).candidates == tuple(everything)
    for avoid in (True, False):
        policy = make_policy(model, tokenizer, avoid_repeats=avoid)
        [decision] = policy.act(
            [Observation("eat the apple", tuple(past_actions), KITCHEN, tuple(past_states))], greedy=True
        )
        assert ("go north" in decision.candidates) is not avoid


def test_a_denied_action_is_no_candidate_while_another_is_available(model, tokenizer):
    """RL's rollouts deny the moves another rollout of the group lost by from the same state."""
    assert policy_input("x", [], KITCHEN, 2, None, denied={"eat apple"}).candidates == ("go north", "take apple")
    # all denied: nothing would be left to play, so every action stays
    everything = ("eat apple", "go north", "take apple")
    assert policy_input("x", [], KITCHEN, 2, None, denied=set(everything)).candidates == everything
    # with placeholders the denied real action leaves out its renamed candidate
    view = policy_input(RECIPE, [], PANTRY, 2, KEPT, denied={"take purple potato from shelf"})
    assert "take purple potato from shelf" not in view.actions and len(view.candidates) == len(view.actions)
    [decision] = make_policy(model, tokenizer).act(
        [Observation("eat the apple", (), KITCHEN, (), denied=frozenset({"eat apple", "take apple"}))], greedy=True
    )
    assert decision.candidates == ("go north",) and decision.action == "go north"


# --- behaviour cloning examples -----------------------------------------------------------------


def _state(trajectory: str, step: int) -> str:
    """A distinct, parseable state per trajectory and step."""
    return (
        f"location: room {trajectory} {step}\nvisible:\ninventory:\nactions: eat apple; go north; go south; "
        "open door; take apple"
    )


def _row(
    trajectory: str,
    step: int,
    action: str,
    won: bool,
    source: str = "real",
    instruction: str = "eat the apple",
    expert_action: str | None = None,
) -> dict:
    return {
        "trajectory_id": trajectory,
        "step": step,
        "instruction": instruction,
        "state": _state(trajectory, step),
        "action": action,
        "won": won,
        "source": source,
        "expert_action": expert_action,
    }


def _prompt(instruction: str, recent: list[str], trajectory: str, step: int) -> str:
    """The prompt a choice policy reads (the available actions are candidates, not listed)."""
    return policy_prompt(instruction, recent, _state(trajectory, step), list_actions=False)


def test_bc_examples_from_won_real_trajectories_in_step_order():
    rows = [
        # t2: won, given out of order
        _row("t2", 2, "eat apple", True),
        _row("t2", 0, "go north", False),
        _row("t2", 1, "take apple", False),
        # t1: lost
        _row("t1", 0, "go south", False),
        _row("t1", 1, "eat apple", False),
        # t3: won but synthetic
        _row("t3", 0, "eat apple", True, source="synthetic"),
        # t0: won in one step, another task
        _row("t0", 0, "open door", True, instruction="open the door"),
    ]
    examples = bc_examples(rows, dataclasses.replace(CONFIG, history=1))
    # trajectories sorted by id: t0, then t2; history 1: only the last action, not "go north | take apple"
    assert [(e["prompt"], e["completion"]) for e in examples] == [
        (_prompt("open the door", [], "t0", 0), " open door"),
        (_prompt("eat the apple", [], "t2", 0), " go north"),
        (_prompt("eat the apple", ["go north"], "t2", 1), " take apple"),
        (_prompt("eat the apple", ["take apple"], "t2", 2), " eat apple"),
    ]
    actions = list(parse_state(_state("t2", 0)).actions)
    assert all(e["candidates"] == actions and actions[e["label"]] == e["completion"].strip() for e in examples)
    assert "\nactions:" not in examples[0]["prompt"]
    with_two = bc_examples(rows, dataclasses.replace(CONFIG, history=2))
    assert with_two[3]["prompt"] == _prompt("eat the apple", ["go north", "take apple"], "t2", 2)
    without = bc_examples(rows, dataclasses.replace(CONFIG, history=0))
    assert all("recent actions: none" in e["prompt"] for e in without)
    # mode generate writes the action, so its prompt lists the available ones
    generating = bc_examples(rows, dataclasses.replace(CONFIG, mode="generate"))
    assert generating[0]["prompt"] == policy_prompt("open the door", [], _state("t0", 0))


def test_bc_examples_imitate_the_expert_at_every_step_of_every_labelled_episode():
    rows = [
        # lost, and its first action was a random one: still every step, labelled with the expert's choice
        _row("t1", 0, "go south", False, expert_action="take apple"),
        _row("t1", 1, "eat apple", False, expert_action="take apple"),
        # won: the same, recent actions are what was done
        _row("t2", 0, "go north", False, expert_action="take apple"),
        _row("t2", 1, "take apple", True, expert_action="take apple"),
    ]
    examples = bc_examples(rows, CONFIG)
    assert [e["completion"] for e in examples] == [" take apple"] * 4
    assert examples[1]["prompt"] == _prompt("eat the apple", ["go south"], "t1", 1)
    # one unlabelled step: the episode falls back to the old rule (its actions, only if won)
    rows[1] = _row("t1", 1, "eat apple", False)
    assert [e["completion"] for e in bc_examples(rows, CONFIG)] == [" take apple", " take apple"]


def test_bc_examples_leave_out_what_the_episode_already_tried_from_the_state():
    """The noisy expert went north from room A, came back to A and went north again: the second
    visit's candidates lack "go north", and a step whose label was already tried there is no example
    (acting could never choose it)."""
    rows = [
        {**_row("t", 0, "go north", False, expert_action="take apple"), "state": _state("a", 0)},
        {**_row("t", 1, "go south", False, expert_action="go south"), "state": _state("b", 0)},
        {**_row("t", 2, "take apple", False, expert_action="take apple"), "state": _state("a", 0)},
        {**_row("t", 3, "go south", False, expert_action="go south"), "state": _state("b", 0)},
    ]
    examples = bc_examples(rows, CONFIG)
    assert [e["completion"] for e in examples] == [" take apple", " go south", " take apple"]
    assert "go north" in examples[0]["candidates"] and "go north" not in examples[2]["candidates"]
    assert [e["candidates"][e["label"]] for e in examples] == ["take apple", "go south", "take apple"]
    assert len(bc_examples(rows, dataclasses.replace(CONFIG, avoid_repeats=False))) == 4


def test_bc_examples_of_no_won_real_episode_are_empty():
    assert bc_examples([_row("t1", 0, "go south", False)], CONFIG) == []
    assert bc_examples([], CONFIG) == []


def test_initial_policy_without_examples_fails():
    with pytest.raises(DreamgymError, match="no real episodes"):
        initial_policy([], CONFIG, seed=0)


def test_initial_policy_from_examples_is_seeded(tokenizer):
    examples = [
        {"prompt": prompt, "completion": action_completion(options[0])} for prompt, options in zip(PROMPTS, CANDIDATES)
    ]
    first, second = initial_policy(examples, CONFIG, seed=3), initial_policy(examples, CONFIG, seed=3)
    assert not first.training
    with torch.no_grad():
        a, _ = first.score_actions(PROMPTS, CANDIDATES)
        b, _ = second.score_actions(PROMPTS, CANDIDATES)
    assert a.tolist() == pytest.approx(b.tolist(), abs=1e-6)
