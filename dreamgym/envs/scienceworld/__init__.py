"""ScienceWorld (Wang et al., 2022), a second real environment: its adapter, its task files and how
its texts become the abstract state. Nothing generic imports this package; `envs/real.py` names it."""
