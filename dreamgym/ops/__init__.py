"""Operations of the pipeline. For now the config of evaluation, promotion and compute
(`config.py`); their code (`dreamgym/evaluation.py`, `promotion.py`, `fanout.py`) may move here."""
