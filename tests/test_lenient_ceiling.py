"""scripts/lenient_ceiling.py: accepting what the target finds plausible, as an upper bound."""

import statistics

import torch

from engine.bench import BenchPrompt, run_dflash
from engine.config import EngineConfig, SamplingConfig
from engine.prompts import heal_code_prompt
from engine.runtime import LocalEngine
from tests.script_loader import load_script


def test_a_draft_is_accepted_while_the_target_finds_it_plausible_enough():
    accept = load_script("lenient_ceiling").lenient_accept
    # target probabilities per verified position (3 drafts + the bonus position)
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.5, 0.1, 0.4], [0.1, 0.1, 0.8]])
    logits = probs.log()
    drafts = [0, 2, 1]  # the top choice, then 0.6 of the top, then 0.2 of the top
    assert accept(drafts, logits, 1.0) == (1, [0, 1, 0, 2])  # greedy: only the argmax
    assert accept(drafts, logits, 0.5) == (2, [0, 2, 0, 2])
    assert accept(drafts, logits, 0.1) == (3, [0, 2, 1, 2])


def test_alpha_one_is_greedy_dflash_and_the_engine_is_left_as_it_was():
    from engine import decode

    script = load_script("lenient_ceiling")
    greedy = decode.TokenChooser.verify
    engine = LocalEngine.load(EngineConfig(threads=1))
    prompts = [BenchPrompt("def parse(text):\n", raw=True, name="parse"), BenchPrompt("Write a stack class.", name="stack")]
    result = script.measure(engine, prompts, alpha=1.0, max_new_tokens=40)
    taus = []
    for p in prompts:
        text = heal_code_prompt(p.prompt) if p.raw else p.prompt  # as the script (and the Complete tab) sends it
        finished, _ = run_dflash(engine, engine.encode(text, raw=p.raw), SamplingConfig(max_new_tokens=40), None)
        taus.extend(finished.acceptance_lengths)
    assert result["tau"] == round(statistics.mean(taus), 2) > 2
    assert result["chat_requests"] == 1 and result["code_prefixes"] == 1
    lenient = script.measure(engine, prompts, alpha=0.01, max_new_tokens=40)
    assert lenient["tau"] >= result["tau"]
    assert decode.TokenChooser.verify is greedy
