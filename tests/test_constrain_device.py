"""The decoding rules on a GPU's scores: the same tokens allowed as on the CPU, greedy and sampled.

Needs no game, buffer or trained model (a tokenizer learned here from format texts), so that it also
runs on a GPU machine that has none of them: `pytest --noconftest tests/test_constrain_device.py`.
On a machine without CUDA it is skipped.
"""

from __future__ import annotations

import random

import pytest
import torch

from dreamgym.experience.constrain import DeltaConstraint
from dreamgym.lm.model import train_tokenizer
from dreamgym.state import AbstractState

STATE = AbstractState("kitchen", ("knife (on table)", "table"), ("carrot",), ("eat carrot",))
COMPLETIONS = (
    "<reasoning>The player takes the knife.</reasoning>\n<next_state>\nvisible: -knife (on table)\n"
    "inventory: +knife\n</next_state>\n<reward>0</reward>\n<done>false</done>",
    "<reasoning>The player looks.</reasoning>\n<next_state>\nvisible = knife (on table); table\n"
    "</next_state>\n<reward>1</reward>\n<done>true</done>",
)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run it where one is lent")
@pytest.mark.parametrize("greedy", [True, False])
def test_the_rules_allow_the_same_tokens_on_a_gpu_as_on_the_cpu(greedy):
    tokenizer = train_tokenizer(list(COMPLETIONS) * 20, vocab_size=400)
    rng = random.Random(0)
    restricted = 0
    for _ in range(100):
        text = rng.choice(COMPLETIONS)
        written = text[: rng.randint(0, len(text) - 1)]
        ids = tokenizer([written], add_special_tokens=False, return_tensors="pt")["input_ids"]
        scores = torch.randn(1, len(tokenizer), generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
        allowed = {}
        for device in ("cpu", "cuda"):
            constraint = DeltaConstraint(tokenizer, [STATE], prompt_length=0, greedy=greedy)
            out = constraint(ids.to(device), scores.clone().to(device))
            allowed[device] = (out[0] > float("-inf")).nonzero().flatten().tolist()
        assert allowed["cuda"] == allowed["cpu"], written
        restricted += len(allowed["cpu"]) < len(tokenizer)
    assert restricted > 50  # the rules did restrict the tokens
