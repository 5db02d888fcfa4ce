"""scripts/proposal_misses.py: rejections at tokens a draft cannot propose."""

from engine.bench import BenchPrompt
from engine.config import EngineConfig
from engine.events import Cycle, FallbackDecision
from engine.runtime import LocalEngine
from tests.script_loader import load_script


def cycle(emitted, accepted, bonus, rejected):
    return Cycle(index=1, block_size=4, anchor=0, anchor_position=0, draft_tokens=(), accepted=accepted, bonus=bonus,
                 emitted=emitted, emitted_pieces=("",) * len(emitted), rejected=rejected,
                 rejected_pieces=("",) * len(rejected), slots=(), draft_ms=0.0, verify_ms=0.0,
                 fallback=FallbackDecision(4, "fixed"), context_length=0, new_context_features=0)


def test_a_rejection_counts_as_unproposable_when_the_targets_token_lies_outside_the_set():
    count = load_script("proposal_misses").count_misses
    cycles = [cycle((5, 6, 900), 2, 900, (7,)),  # the target wrote 900 where the draft said 7
              cycle((5, 6), 1, 6, (8, 9)),  # a miss the draft could have proposed
              cycle((5, 6, 7, 8), 3, 8, ())]  # all accepted: no rejection
    assert count(cycles, set(range(100))) == {"tokens": 9, "tokens_outside": 1, "rejections": 2,
                                              "rejections_outside": 1}
    assert count(cycles, None)["rejections_outside"] == 0


def test_the_embedded_draft_proposes_from_its_first_ids_and_misses_little():
    script = load_script("proposal_misses")
    engine = LocalEngine.load(EngineConfig(threads=1))
    assert script.proposable_ids(engine.models.draft) == set(range(engine.models.draft.proposal_vocab_size))
    result = script.measure(engine, [BenchPrompt("def parse(text):\n", raw=True, name="parse")], max_new_tokens=40)
    assert result["tokens"] == 39 and result["tokens_outside"] <= result["tokens"]  # 40 less the prefill's token
    assert 0 <= result["rejections_outside"] <= result["rejections"]
