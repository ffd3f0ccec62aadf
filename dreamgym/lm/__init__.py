"""Causal language models shared by the experience model and the policy: loading a local model or
making a small one from scratch (`model.py`), and supervised fine-tuning with TRL (`sft.py`)."""
