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


def test_the_request_drafts_chosen_ids_lose_fewer_blocks_than_the_first_ids_on_the_same_replies():
    """The shipped request draft proposes from the ids its target writes most (`train
    proposals`); on chat requests the first 2,048 ids would miss the target's English pieces."""
    script = load_script("proposal_misses")
    pair = "assets/models/tiny-coder-requests"
    engine = LocalEngine.load(EngineConfig(target=f"{pair}/target", draft=f"{pair}/draft", threads=1))
    draft = engine.models.draft
    assert draft.proposal_ids is not None and script.proposable_ids(draft) == set(draft.proposal_ids.tolist())
    prompts = [BenchPrompt("Write a function that checks whether a word is a palindrome.", name="palindrome"),
               BenchPrompt("Write a function that counts the vowels in a sentence.", name="vowels")]
    chosen = script.measure(engine, prompts, max_new_tokens=48)
    draft.proposal_ids, draft.proposal_vocab_size = None, 2048  # the head it shipped with before
    assert script.proposable_ids(draft) == set(range(2048))
    first = script.measure(engine, prompts, max_new_tokens=48)
    assert chosen["tokens"] == first["tokens"] > 0  # greedy: the same replies either way
    assert first["rejections_outside"] >= 3 and chosen["rejections_outside"] < first["rejections_outside"]
    assert chosen["tokens_outside"] < first["tokens_outside"]
