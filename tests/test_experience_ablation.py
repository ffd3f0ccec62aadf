"""The ablation variants and their table (the training and measurement are the flow's, tested in
test_ingest_flow.py)."""

from dreamgym.config import load_config
from dreamgym.experience.ablation import ablation_rows, markdown, plot, variant_configs


def test_each_variant_switches_off_one_part_and_keeps_the_rest(tmp_path):
    config = load_config("params.yaml")
    variants = variant_configs(config)
    assert list(variants) == ["full", "no retrieval (k=0)", "no history (h=0)", "no reasoning"]
    assert variants["full"] == config
    changed = {
        name: {key for key, value in vars(variant.experience).items() if value != getattr(config.experience, key)}
        for name, variant in variants.items()
    }
    assert changed == {
        "full": set(),
        "no retrieval (k=0)": {"neighbours"},
        "no history (h=0)": {"history"},
        "no reasoning": {"reasoning"},
    }
    assert all(variant.seed == config.seed and variant.buffer == config.buffer for variant in variants.values())


def test_table_and_plot(tmp_path):
    fidelity = {
        "next_state_exact_match": 0.5,
        "reward_accuracy": 0.9,
        "done_accuracy": 1.0,
        "parse_failure_rate": 0.05,
        "field_f1": {"location": 1.0, "visible": 0.8, "inventory": 0.9, "actions": 0.7},
        "multi_step": [{"step": 1, "exact_match": 0.5}, {"step": 2, "exact_match": 0.25}],
    }
    rows = ablation_rows({"full": fidelity, "no reasoning": {**fidelity, "multi_step": []}})
    assert rows[0]["open_loop_exact_at_last_step"] == 0.25 and rows[1]["open_loop_exact_at_last_step"] is None
    assert rows[0]["f1_actions"] == 0.7
    table = markdown(rows).splitlines()
    assert table[2] == "| full | 50.0% | 90.0% | 100.0% | 5.0% | 25.0% |"
    assert table[3].endswith("| - |")
    assert plot(rows, tmp_path / "ablation.png").stat().st_size > 1000
