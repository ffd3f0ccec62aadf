"""DreamGym: reinforcement learning for LLM agents inside a learned experience model."""

__version__ = "0.1.0"
