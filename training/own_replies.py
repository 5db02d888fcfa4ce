"""The model's own first replies, for follow-ups that edit them (`train target --own-replies N`).

Training chats that only ever edit the reference solution teach an edit of code the model did
not write. Here the model being fine-tuned answers ``N`` of the training requests greedily, as a
new chat would ask them; ``followups.own_reply_chats`` then follows each answer, right or wrong,
with an edit answered by the requested function. The replies are written once to a JSON-lines
file in the run's work directory and read back when the run resumes."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

OWN_REPLY_TOKENS = 128  # longer replies are cut there (a first reply of a simple task is ~40-90 tokens)
GEN_BATCH = 64


def reply_prompts(n: int, seed: int) -> list[dict]:
    """``n`` training requests (held-out tasks left out), one wording each: rows of ``request``
    (the task's own request) and ``user`` (the words sent)."""
    from .request_data import is_held, task_requests
    from .task_data import extra_tasks, paraphrases
    from .task_families import all_tasks

    rng = random.Random(seed)
    wordings = paraphrases()
    tasks = [t for t in all_tasks() + extra_tasks() if t.code.startswith("def ") and not is_held(t.code)]
    picked = [tasks[i % len(tasks)] for i in rng.sample(range(max(n, len(tasks))), n)]
    return [{"request": t.request, "user": task_requests(t, 1, rng, 0.0, wordings)[0]} for t in picked]


@torch.no_grad()
def generate_own_replies(model, tokenizer, rows: list[dict], log=print) -> list[dict]:
    """Each row with ``reply``: the model's greedy answer to ``user``, through the chat template."""
    from .common import model_device
    from .draft import regenerate
    from .tokenizer import render_chat, stop_token_ids

    stops = stop_token_ids(tokenizer)
    was_training = model.training
    model.eval()
    out = []
    for start in range(0, len(rows), GEN_BATCH):
        chunk = rows[start : start + GEN_BATCH]
        prompts = [tokenizer(render_chat([{"role": "user", "content": r["user"]}], add_generation_prompt=True),
                             add_special_tokens=False)["input_ids"] for r in chunk]
        for row, prompt, seq in zip(chunk, prompts, regenerate(model, tokenizer, prompts, OWN_REPLY_TOKENS, stops,
                                                               model_device(model))):
            reply = [t for t in seq[len(prompt):] if t not in stops]
            out.append({**row, "reply": tokenizer.decode(reply).strip()})
        log(f"own replies: {len(out)}/{len(rows)}")
    model.train(was_training)
    return out


def own_replies(path: Path, model, tokenizer, n: int, seed: int, log=print) -> list[dict]:
    """The replies at ``path``, generated there first when it does not exist yet."""
    if path.exists():
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = generate_own_replies(model, tokenizer, reply_prompts(n, seed), log)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)
    return rows
