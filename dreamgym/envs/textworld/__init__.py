"""TextWorld cooking (Côté et al., 2018; tw-cooking), the first real environment: its adapter, its
games, the `games` section, and its rules for the experience model, BC, the curriculum and
collection (`cooking.py`). Nothing generic imports this package; `envs/real.py` names it."""
