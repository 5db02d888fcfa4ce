"""The compiled path (engine/compiled.py): torch.compile of the verify and the draft pass on
static caches gives plain greedy decoding's tokens on every family twin whose layers compile (full
attention, sliding windows, sinks, latent attention, MoE), compiles each pass into one graph that
never recompiles during replies, never makes a reply wait for the compile, and keeps answering
eagerly when the compile fails. Compiling costs tens of seconds per family on a CPU;
tests/test_static_backend.py runs the same backend eagerly on every family at every block size."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from engine import compiled as compiled_module
from engine import decode as decode_module
from engine.backends import EagerSession, StaticSession
from engine.compiled import CompiledPath
from engine.config import SamplingConfig
from engine.decode import generate
from engine.events import Cycle, Finished
from tests.family_twins import family_twin
from tests.test_families import NEW_TOKENS, PROMPT, oracle_propose, plain_greedy
from tests.tiny_models import tiny_draft

BLOCK = 4
ROOT = Path(__file__).resolve().parents[1]


def run(target, draft, block, backend=None):
    events = list(generate(target, draft, PROMPT, SamplingConfig(block_size=block, max_new_tokens=NEW_TOKENS),
                           backend=backend))
    assert isinstance(events[-1], Finished), events[-1]
    return events


def drafts_of(events):
    return [cycle.draft_tokens for cycle in events if isinstance(cycle, Cycle)]


# every family twin whose layers compile (linear-attention ones stay eager: below)
COMPILED_FAMILIES = ["deepseek_v3", "gemma3", "gpt_oss", "llama", "mimo_v2_flash", "qwen3", "qwen3_moe"]


def test_every_family_is_compiled_or_says_why_not():
    from tests.family_twins import FAMILIES

    for name in sorted(set(FAMILIES) - set(COMPILED_FAMILIES)):
        path = CompiledPath(family_twin(name), None, BLOCK)
        assert path.state == "unsupported" and path.error == "linear-attention layers roll back eagerly", name


@pytest.mark.slow
@pytest.mark.parametrize("name", COMPILED_FAMILIES)
def test_the_compiled_path_equals_plain_and_eager_decoding(name, monkeypatch):
    target = family_twin(name)
    reference = plain_greedy(target, PROMPT, NEW_TOKENS)
    draft = tiny_draft(target, block_size=BLOCK)
    path = CompiledPath(target, draft, BLOCK, buckets=(64,)).start(max_length=64)
    try:
        assert path.wait(timeout=900), path.error
        passes = {(kind, 64, width) for kind, width in path.widths(BLOCK)}
        assert set(path.backend.passes) == passes
        # at most one graph per pass, none split by a graph break (a pass whose graph another
        # test's identical shapes compiled already takes it from dynamo's cache: no graph)
        assert path.report.graphs <= len(passes)
        for block in (1, BLOCK):
            eager = run(target, draft, block)
            compiled = run(target, draft, block, path)
            assert list(compiled[-1].token_ids) == reference, (name, block)
            assert drafts_of(compiled) == drafts_of(eager), (name, block)
        monkeypatch.setattr(decode_module, "propose", oracle_propose(reference, target.config.vocab_size))
        events = run(target, draft, BLOCK, path)
        assert list(events[-1].token_ids) == reference
        assert {cycle.accepted for cycle in events[1:-1]} == set(range(BLOCK))  # every rollback length
        assert path.recompiles == 0
        assert path.label == "compiled"
    finally:
        path.close()


FREEZING_CHILD = """
import torch
from engine.compiled import CompiledPath
from tests.family_twins import family_twin
from tests.test_compiled import BLOCK, drafts_of, run
from tests.tiny_models import tiny_draft

target = family_twin("qwen3", seed=3)
draft = tiny_draft(target, block_size=BLOCK)
path = CompiledPath(target, draft, BLOCK, buckets=(64,)).start(max_length=64)
assert path.wait(timeout=900), path.error
eager, compiled = run(target, draft, BLOCK), run(target, draft, BLOCK, path)
path.close()
path.join()
assert torch._inductor.config.freezing
assert list(compiled[-1].token_ids) == list(eager[-1].token_ids)
assert drafts_of(compiled) == drafts_of(eager), (drafts_of(compiled), drafts_of(eager))
"""


@pytest.mark.slow
def test_inductor_freezing_set_by_the_user_does_not_reach_the_compiled_passes():
    """CPU tuning guides recommend TORCHINDUCTOR_FREEZING=1, set as a user sets it: in the
    environment of a process that then imports torch. It would fold the draft cache's fill counters
    into constants, and the compiled draft would propose from a stale context: the output stays
    exact, drafting stops paying."""
    env = dict(os.environ, TORCHINDUCTOR_FREEZING="1")
    child = subprocess.run([sys.executable, "-c", FREEZING_CHILD], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=900)
    assert child.returncode == 0, child.stderr[-3000:]


def test_the_first_reply_answers_eagerly_while_the_passes_compile(monkeypatch):
    target = family_twin("qwen3")
    reference = plain_greedy(target, PROMPT, NEW_TOKENS)
    draft = tiny_draft(target, block_size=BLOCK)
    release = threading.Event()
    monkeypatch.setattr(CompiledPath, "_compile", lambda self, *item: release.wait(30))
    path = CompiledPath(target, draft, BLOCK, buckets=(64,)).start(max_length=64)
    sessions = []
    opened = path.open
    monkeypatch.setattr(path, "open", lambda *a: sessions.append(opened(*a)) or sessions[-1])
    try:
        assert path.label == "eager (compiling: 0 of 4 passes…)"  # verifies of 4, 3 (reduced) and 1; a draft of 4
        assert list(run(target, draft, BLOCK, path)[-1].token_ids) == reference
        assert isinstance(sessions[-1], EagerSession) and path.state == "compiling"
    finally:
        release.set()
        path.close()


def _a_python_call() -> None:
    """A new frame: what the compile thread's trace function sees."""


def test_the_compile_thread_pauses_while_an_eager_reply_runs(monkeypatch):
    """Tracing a pass beside an eager reply slowed the reply 10-60x (the GIL): the compile thread
    gives way at its next Python call until the reply ends, however the reply ends."""
    target = family_twin("qwen3")
    draft = tiny_draft(target, block_size=BLOCK)
    in_pass, stop, progress = threading.Event(), threading.Event(), []

    def compiling(self, *item):
        in_pass.set()
        while not stop.is_set():
            _a_python_call()
            progress.append(1)
            stop.wait(0.001)

    monkeypatch.setattr(CompiledPath, "_compile", compiling)
    path = CompiledPath(target, draft, BLOCK, buckets=(64,)).start(max_length=64)
    path.give_way.pause = 60.0  # no slice of compiling while the reply runs, within this test
    try:
        assert in_pass.wait(30)
        session = path.open(target, draft, 40, BLOCK)
        assert isinstance(session, EagerSession) and path.give_way.running == 1
        threading.Event().wait(0.3)  # the compile thread reaches its next call and waits there
        paused_at = len(progress)
        threading.Event().wait(0.5)
        assert len(progress) == paused_at, "the compile went on beside the reply"
        session.close()
        session.close()
        assert path.give_way.running == 0
        for _ in range(300):
            if len(progress) > paused_at:
                break
            threading.Event().wait(0.1)
        assert len(progress) > paused_at, "the compile did not go on after the reply"

        # a whole reply, and one its reader drops after the first event, both count as ended
        assert isinstance(run(target, draft, BLOCK, path)[-1], Finished)
        reply = generate(target, draft, PROMPT, SamplingConfig(block_size=BLOCK, max_new_tokens=NEW_TOKENS),
                         backend=path)
        next(reply)
        assert path.give_way.running == 1
        reply.close()
        assert path.give_way.running == 0
    finally:
        stop.set()
        path.close()


CLOSE_AND_EXIT_CHILD = """
import threading
from engine.compiled import CompiledPath
from tests.family_twins import family_twin
from tests.test_compiled import BLOCK, run
from tests.tiny_models import tiny_draft

release = threading.Event()
CompiledPath._compile = lambda self, *item: release.wait(30)
target = family_twin("qwen3")
draft = tiny_draft(target, block_size=BLOCK)
path = CompiledPath(target, draft, BLOCK, buckets=(64,)).start(max_length=64)
run(target, draft, BLOCK, path)
release.set()
path.close()
"""


def test_a_process_that_closes_the_compiled_path_then_exits_does_not_abort():
    """A compile thread still inside torch when the interpreter exits aborts the process
    ('terminate called without an active exception'): close waits for an idle one to end."""
    child = subprocess.run([sys.executable, "-c", CLOSE_AND_EXIT_CHILD], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]


EXIT_WHILE_COMPILING_CHILD = """
import sys
from engine.compiled import CompiledPath
from tests.family_twins import family_twin
from tests.test_compiled import BLOCK
from tests.tiny_models import tiny_draft

target = family_twin("qwen3")
CompiledPath(target, tiny_draft(target, block_size=BLOCK), BLOCK, buckets=(64,)).start(max_length=64)
sys.exit(3)  # at once, as a command does after printing an error, without closing anything
"""


def test_a_process_that_exits_while_its_passes_compile_ends_with_its_own_exit_code():
    """A command that stops on an error right after the load (`bench` on a prompt over the context
    window) exits while the compile thread has just entered torch, which would abort the process
    ('terminate called without an active exception', exit code 134): the exit waits for the pass
    in progress and keeps the command's own exit code."""
    child = subprocess.run([sys.executable, "-c", EXIT_WHILE_COMPILING_CHILD], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 3, child.stderr[-3000:]
    assert "terminate called" not in child.stderr


def test_a_lock_the_paused_compile_holds_reaches_the_waiting_reply():
    """The pause is sliced: a compile paused while it holds a lock a reply waits for lets it go."""
    give_way = compiled_module.GiveWay(pause=0.05, run=0.01)
    lock, held = threading.Lock(), threading.Event()

    def compiling():
        sys.settrace(give_way.at_call)
        with lock:
            held.set()
            for _ in range(200):
                _a_python_call()

    give_way.started()
    thread = threading.Thread(target=compiling, daemon=True)
    thread.start()
    try:
        assert held.wait(30)
        assert lock.acquire(timeout=60), "the reply never got the lock the paused compile held"
        lock.release()
    finally:
        give_way.ended()
        thread.join(30)
    assert not thread.is_alive()


def test_a_failed_compile_is_logged_and_replies_stay_eager(monkeypatch, caplog):
    target = family_twin("qwen3")
    reference = plain_greedy(target, PROMPT, NEW_TOKENS)
    draft = tiny_draft(target, block_size=BLOCK)

    def broken(*args, **kwargs):
        raise RuntimeError("inductor is missing a compiler")

    monkeypatch.setattr(compiled_module.torch, "compile", broken)
    with caplog.at_level(logging.ERROR, logger="engine.compiled"):
        path = CompiledPath(target, draft, BLOCK, buckets=(64,)).start(max_length=64)
        assert not path.wait(timeout=60)
    assert path.state == "failed" and "inductor is missing a compiler" in path.error
    assert any(record.exc_info for record in caplog.records), "the traceback was not logged"
    assert path.label == "eager"
    assert list(run(target, draft, BLOCK, path)[-1].token_ids) == reference
    path.close()


def assert_never_used(miscompiled, kind: str, why: str, monkeypatch, caplog) -> None:
    """With ``miscompiled`` in torch.compile's place, the check after compiling catches the
    ``kind`` pass, logs ``why`` and keeps no such pass; replies stay eager and exact."""
    target = family_twin("qwen3")
    reference = plain_greedy(target, PROMPT, NEW_TOKENS)
    draft = tiny_draft(target, block_size=BLOCK)
    monkeypatch.setattr(compiled_module.torch, "compile", miscompiled)
    with caplog.at_level(logging.WARNING, logger="engine.compiled"):
        path = CompiledPath(target, draft, BLOCK, buckets=(64,)).start(max_length=64)
        assert not path.wait(timeout=60)
    try:
        assert path.state == "unsupported" and path.error.startswith(why), path.error
        assert path.label == "eager" and not any(key[0] == kind for key in path.backend.passes)
        assert any(why in record.getMessage() for record in caplog.records)
        assert list(run(target, draft, BLOCK, path)[-1].token_ids) == reference
    finally:
        path.close()


@pytest.mark.parametrize("fault, why", [
    (lambda logits: logits + 0.5 * logits.abs().amax(), "its logits compiled differ from the eager path's by"),
    (lambda logits: logits.masked_fill(torch.ones_like(logits, dtype=torch.bool), float("nan")),
     "its logits compiled are NaN or infinite where the eager path's are finite")])
def test_a_compiled_verify_that_computes_otherwise_is_never_used(fault, why, monkeypatch, caplog):
    """Each compiled verify is checked against the eager path before a reply may run it: one
    that computes other logits (here a stand-in for a miscompiled pass) keeps replies eager."""
    def miscompiled(fn, **kwargs):
        def run(*args, **kw):
            out = fn(*args, **kw)
            return (fault(out[0]), *out[1:]) if isinstance(out, tuple) else out
        return run

    assert_never_used(miscompiled, "verify", why, monkeypatch, caplog)


def test_a_compiled_draft_pass_that_computes_otherwise_is_never_used(monkeypatch, caplog):
    """Each compiled draft pass is checked against the eager draft too. The stand-in here keeps
    the draft cache's fill counter from its first call, as a pass frozen by inductor would: its
    drafts would come from a stale context, which costs speed (never tokens), so it is not used."""
    def miscompiled(fn, **kwargs):
        if fn.__name__ == "verify":
            return fn
        traced = {}

        def stale(noise, context, positions, cache):
            filled = cache.filled.clone()
            cache.filled.copy_(traced.setdefault("filled", filled))
            try:
                return fn(noise, context, positions, cache)
            finally:
                cache.filled.copy_(filled)
        return stale

    assert_never_used(miscompiled, "draft", "its compiled draft pass differs from the eager one by", monkeypatch,
                      caplog)


def test_with_torch_compile_turned_off_the_header_says_eager():
    """TORCH_COMPILE_DISABLE=1 makes torch.compile hand back each pass uncompiled: the model
    header would say "compiled" over eager passes on static caches. The path says it is off."""
    import torch._dynamo

    target = family_twin("qwen3")
    draft = tiny_draft(target, block_size=BLOCK)
    with torch._dynamo.config.patch(disable=True):  # the config module's own patch (monkeypatch deletes it)
        path = CompiledPath(target, draft, BLOCK, buckets=(64,)).start(max_length=64)
    try:
        assert not path.wait(timeout=5)
        assert path.state == "off" and path.label == "eager" and "TORCH_COMPILE_DISABLE" in path.error
        assert list(run(target, draft, BLOCK, path)[-1].token_ids) == plain_greedy(target, PROMPT, NEW_TOKENS)
    finally:
        path.close()


def test_chunked_attention_stays_on_the_eager_path():
    """Llama 4's chunked attention, compiled on a static cache, gives NaN logits on a twin (and,
    with its temperature tuning off, other logits from the first chunk boundary on): it is kept
    from compiling by its config, before anything compiles."""
    from tests.family_twins import any_family_twin

    target = any_family_twin("llama4_text")
    path = CompiledPath(target, tiny_draft(target, block_size=BLOCK), BLOCK)
    assert path.state == "unsupported" and path.label == "eager"
    assert path.error == "its chunked-attention layers compute otherwise when compiled"


def test_a_reply_on_ready_passes_runs_on_the_static_session_and_releases_it(monkeypatch):
    """With every pass marked compiled (here: the eager functions stand in), a reply takes the
    static session and gives the lock back when it ends, also when it ends early."""
    target = family_twin("qwen3")
    draft = tiny_draft(target, block_size=BLOCK)
    reference = plain_greedy(target, PROMPT, NEW_TOKENS)
    monkeypatch.setattr(compiled_module.torch, "compile", lambda fn, **kwargs: fn)
    path = CompiledPath(target, draft, BLOCK, buckets=(64,)).start(max_length=64)
    try:
        assert path.wait(timeout=120), path.error
        sessions = []
        opened = path.open
        monkeypatch.setattr(path, "open", lambda *a: sessions.append(opened(*a)) or sessions[-1])
        assert list(run(target, draft, BLOCK, path)[-1].token_ids) == reference
        assert isinstance(sessions[-1], StaticSession)
        events = generate(target, draft, PROMPT, SamplingConfig(block_size=BLOCK, max_new_tokens=NEW_TOKENS),
                          backend=path)
        next(events), next(events)
        events.close()  # a reply abandoned mid-way (a Stop, a closed connection)
        assert list(run(target, draft, BLOCK, path)[-1].token_ids) == reference
        assert isinstance(sessions[-1], StaticSession), "the abandoned reply kept the lock"
    finally:
        path.close()


def test_a_linear_attention_target_stays_on_the_eager_path():
    target = family_twin("qwen3_5")
    path = CompiledPath(target, tiny_draft(target, block_size=BLOCK), BLOCK).start()
    assert path.state == "unsupported" and path.label == "eager"
    assert list(run(target, tiny_draft(target, block_size=BLOCK), BLOCK, path)[-1].token_ids) == \
        plain_greedy(target, PROMPT, NEW_TOKENS)


def test_the_copy_that_compiles_shares_the_weights_and_has_no_hooks():
    from engine.weights import guard_logits

    target = family_twin("llama")
    guard_logits(target)
    copy = compiled_module.weight_sharing_copy(target)
    assert all(a is b for a, b in zip(target.parameters(), copy.parameters()))
    assert not any(module._forward_hooks for module in copy.modules())
    assert target.get_output_embeddings()._forward_hooks  # the loaded target keeps its guard
    with torch.no_grad():
        torch.testing.assert_close(copy(torch.tensor([PROMPT])).logits, target(torch.tensor([PROMPT])).logits)


@pytest.mark.parametrize("argv, expected", [(["--compile"], True), (["--no-compile"], False), ([], False)])
def test_compile_flags(argv, expected, monkeypatch):
    """--compile / --no-compile; without either the default is on, unless the environment turns
    it off (the test suite does, in conftest.py)."""
    import argparse

    from app.options import add_model_options, engine_config

    parser = argparse.ArgumentParser()
    add_model_options(parser)
    assert engine_config(parser.parse_args(argv)).compile is expected
    monkeypatch.delenv("DFLASH_STUDIO_COMPILE")
    assert engine_config(parser.parse_args([])).compile is True


def test_bench_times_every_plain_path_compiled_and_eager(tmp_path, monkeypatch):
    """With the compiled path on, bench waits for the compile, runs transformers' generate() with
    and without its compiled static cache, our block-1 loop and DFlash each compiled and eager,
    checks that all of them give the same greedy tokens, and takes the speedup over the fastest
    plain path (here torch.compile hands the functions back as they are: the bench's plumbing is
    under test, not inductor)."""
    from engine.bench import BenchPrompt, bench
    from engine.config import EngineConfig
    from engine.runtime import Engine
    from tests.tiny_models import save_tiny_pair

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    target_dir, draft_dir, *_ = save_tiny_pair(tmp_path)
    engine = Engine.load(EngineConfig(target=str(target_dir), draft=str(draft_dir), compile=True))
    try:
        prompts = [BenchPrompt("def add(a, b):", raw=True), BenchPrompt("Add two numbers.")]
        result = bench(engine, prompts, SamplingConfig(max_new_tokens=12))
    finally:
        engine.close()
    assert result["identical"] == 2  # all six paths agreed on both prompts
    assert set(result["plain_paths"]) == {"transformers generate()", "transformers generate(), compiled static cache",
                                          "dflash-studio block 1", "dflash-studio block 1, compiled"}
    fastest = max(p["tokens_per_s"] for p in result["plain_paths"].values())
    assert result["ar"]["tokens_per_s"] == fastest
    assert result["speedup"] == round(result["dflash"]["tokens_per_s"] / fastest, 3)
    assert result["compiled"]["state"] == "ready" and result["compiled"]["recompiles_after_warm_up"] == 0
    assert result["dflash_eager"]["tokens"] == result["dflash"]["tokens"]
    assert all(row["dflash_eager_tokens_per_s"] > 0 for row in result["per_prompt"])


def test_measuring_costs_makes_the_compile_give_way(tmp_path, monkeypatch):
    """The app measures a cycle's cost right after loading, while the passes compile: the
    compile thread pauses meanwhile, or the GIL it holds would be timed as the cost."""
    from engine import runtime
    from engine.config import EngineConfig
    from engine.runtime import Engine
    from tests.tiny_models import save_tiny_pair

    release = threading.Event()
    monkeypatch.setattr(CompiledPath, "_compile", lambda self, *item: release.wait(30))
    target_dir, draft_dir, *_ = save_tiny_pair(tmp_path)
    engine = Engine.load(EngineConfig(target=str(target_dir), draft=str(draft_dir), compile=True))
    measure, seen = runtime.measure, []
    monkeypatch.setattr(runtime, "measure", lambda *a, **k: seen.append(engine.compiled.give_way.running) or measure(*a, **k))
    try:
        assert engine.measure_costs() is not None
        assert seen == [1] and engine.compiled.give_way.running == 0
    finally:
        release.set()
        engine.close()
