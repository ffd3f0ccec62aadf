from pathlib import Path

import pytest

from dreamgym.config import PipelineConfig, config_to_dict, flatten, load_config
from dreamgym.errors import ConfigError

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


def test_params_yaml_is_valid_and_matches_the_defaults():
    assert load_config(PARAMS) == PipelineConfig()


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"collect.epsilon": 1.5}, "params.yaml: collect.epsilon = 1.5: Input should be less than or equal to 1"),
        ({"collect.epsillon": 0.1}, "unknown key 'collect.epsillon'; remove it or check its spelling"),
        ({"env.max_steps": "many"}, "env.max_steps = 'many': Input should be a valid integer"),
        ({"validation.reward_min": 20}, "reward_min (20.0) is above reward_max (10.0): swap them"),
        ({"experience.ranking_off": ["kinds"]}, "ranking_off names no ranking key: kinds; use some of action,"),
        # An older params.yaml: what to rename or delete, not "check its spelling".
        (
            {"experience.constrain_removals": False},
            "'experience.constrain_removals' is now called 'experience.constrained_decoding'; rename it",
        ),
        ({"buffer.top_k": 4}, "'buffer.top_k' was removed (`dreamgym buffer query -k` sets it;"),
        ({"experience.examples_first": False}, "'experience.examples_first' was removed (decided: always off"),
        ({"rl.step_weight": 0.0}, "'rl.step_weight' was removed (GiGPO's step-level advantage: no gain"),
    ],
)
def test_bad_values_name_the_key_and_the_fix(tmp_path, overrides, message):
    params = tmp_path / "params.yaml"
    params.write_text(PARAMS.read_text())
    with pytest.raises(ConfigError) as error:
        config_from_file_with(params, overrides)
    assert message in str(error.value)


def config_from_file_with(params, overrides):
    # Overrides written into the file, so the message refers to params.yaml, not the command line.
    import yaml

    values = yaml.safe_load(params.read_text())
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        section = values
        for parent in parents:
            section = section[parent]
        section[leaf] = value
    params.write_text(yaml.safe_dump(values))
    return load_config(params)


def test_unsupported_room_count_is_explained():
    with pytest.raises(ConfigError, match="go value 2 is not supported by tw-cooking: use one of 1, 6, 9, 12"):
        load_config(PARAMS, {"games.go": [2]})


def test_command_line_overrides_are_named_as_options():
    with pytest.raises(ConfigError, match=r"^--policy 'greedy': Input should be"):
        load_config(PARAMS, {"collect.policy": "greedy"})
    assert load_config(PARAMS, {"collect.epsilon": 0.5}).collect.epsilon == 0.5


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("games: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)


def test_flatten_gives_dotted_params():
    flat = flatten(config_to_dict(PipelineConfig()))
    assert flat["collect.epsilon"] == 0.3
    assert flat["games.go"] == [1, 6]


def test_every_model_setting_belongs_to_a_part_and_the_cache_keys_follow_the_parts():
    """Which settings make a different model, example set or saved prompt is read from each
    field's part, so a new field without one would silently miss a cache key."""
    import dataclasses

    from dreamgym.experience.config import ExperienceConfig
    from dreamgym.lm.sft import training_settings
    from dreamgym.policy.config import PolicyConfig
    from dreamgym.sections import config_part

    for config in (ExperienceConfig(), PolicyConfig()):
        parts = [(field.json_schema_extra or {}).get("part") for field in type(config).__pydantic_fields__.values()]
        assert None not in parts, type(config).__name__
    experience = ExperienceConfig()
    assert set(config_part(experience, "prompt")) >= {"history", "neighbours", "reasoning", "placeholders"}
    assert training_settings(experience) != training_settings(dataclasses.replace(experience, epochs=5.0))
    assert training_settings(experience) == training_settings(dataclasses.replace(experience, save_steps=7))
    assert training_settings(experience) == training_settings(dataclasses.replace(experience, max_new_tokens=9))
    with pytest.raises(ValueError, match="no field in part"):
        config_part(experience, "no-such-part")


def test_each_section_is_declared_beside_its_code_with_the_shared_helpers_only():
    """A package's config.py imports `dreamgym.sections` (and, lazily, its own package), never
    `dreamgym.config`, which composes them: no import cycle, and each section travels with its code."""
    import ast

    library = PARAMS.parent / "dreamgym"
    modules = sorted(path for path in library.rglob("config.py") if path.parent != library)
    packages = {"data", "buffer", "experience", "policy", "rl", "ops", "textworld", "scienceworld"}
    assert {path.parent.name for path in modules} >= packages
    for path in modules:
        imported = {
            node.module
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dreamgym")
        }
        own = f"dreamgym.{path.parent.name}."
        assert {name for name in imported if not name.startswith(own)} == {"dreamgym.sections"}, path


def test_the_scienceworld_preset_is_params_yaml_with_its_marked_lines_changed():
    """params-scienceworld.yaml is valid, selects ScienceWorld and the generic path, and differs from
    params.yaml only in lines that say why (# ScienceWorld), so the two cannot drift apart unseen."""
    preset = PARAMS.with_name("params-scienceworld.yaml")
    config = load_config(preset)
    assert config.env.name == "scienceworld"
    assert (config.experience.domain, config.policy.domain, config.collect.domain) == ("none", "none", "none")
    base, section, unmarked = set(PARAMS.read_text().splitlines()), None, []
    for line in preset.read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            section = line.split(":", 1)[0]
        if line not in base and not line.startswith("#") and section != "scienceworld" and "ScienceWorld" not in line:
            unmarked.append(line)
    assert not unmarked, unmarked


def test_scienceworld_refuses_textworld_rules_with_the_fix():
    with pytest.raises(
        ConfigError, match=r"env.name is 'scienceworld', but experience.domain is 'textworld-cooking', use 'none'"
    ):
        load_config(PARAMS, {"env.name": "scienceworld"})
