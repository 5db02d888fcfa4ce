"""`train eval`: does the target answer coding requests? Greedy replies to a prompt file (the
held-out requests by default), scored with ``training.code_metrics``: chat requests -> parses and
defines a function/class, on topic; raw code prefixes -> parses when closed, uses the
function's parameters; both -> loops."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from training import code_metrics
from engine.prompts import heal_code_prompt


@dataclass(frozen=True)
class ReplyScore:
    name: str
    kind: str  # "chat" or "complete"
    prompt: str
    reply: str
    new_tokens: int
    ended: bool  # stopped at a stop token (not the token limit)
    loop: bool
    parses: bool  # chat: parses and defines a function/class; complete: parses when closed
    on_topic: bool  # chat: key word in name/code; complete: uses the function's parameters
    names_it: bool = False  # chat: a key word names the function/class


def score_reply(name: str, kind: str, prompt: str, reply: str, new_tokens: int, ended: bool,
                loop: bool) -> ReplyScore:
    if kind == "chat":
        match = code_metrics.topic_match(prompt, reply)
        return ReplyScore(name, kind, prompt, reply, new_tokens, ended, loop,
                          code_metrics.defines_code(reply), match["code"], match["name"])
    return ReplyScore(name, kind, prompt, reply, new_tokens, ended, loop,
                      code_metrics.parses_when_closed(prompt, reply, truncated=not ended),
                      code_metrics.uses_parameters(prompt, reply))


def percent(flags: list[bool]) -> float | None:
    return round(100.0 * sum(flags) / len(flags), 1) if flags else None


def summarize(scores: list[ReplyScore]) -> dict:
    chat = [s for s in scores if s.kind == "chat"]
    comp = [s for s in scores if s.kind == "complete"]
    return {
        "chat_requests": len(chat),
        "chat_parse_define_pct": percent([s.parses for s in chat]),
        "chat_on_topic_pct": percent([s.on_topic for s in chat]),
        "chat_names_it_pct": percent([s.names_it for s in chat]),
        "code_prefixes": len(comp),
        "prefix_parses_closed_pct": percent([s.parses for s in comp]),
        "prefix_uses_params_pct": percent([s.on_topic for s in comp]),
        "ended_pct": percent([s.ended for s in scores]),
        "loops": sum(s.loop for s in scores),
    }


@torch.no_grad()
def greedy_reply(model, tokenizer, prompt, max_new_tokens: int, stops: list[int]) -> tuple[list[int], bool]:
    """(new token ids without the stop token, whether a stop token ended the reply)."""
    if prompt.raw:
        text = heal_code_prompt(prompt.prompt)  # as the app's Complete tab sends it
    else:
        messages = [{"role": "user", "content": prompt.prompt}] if isinstance(prompt.prompt, str) else list(prompt.prompt)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=stops, pad_token_id=tokenizer.pad_token_id)
    new = out[0, ids.shape[1]:].tolist()
    ended = bool(new) and new[-1] in stops
    return (new[:-1] if ended else new), ended


def evaluate_target(target_dir: Path, prompts_path: Path, max_new_tokens: int = 160,
                    threads: int | None = None, log=print) -> dict:
    from engine.bench import is_loop, read_prompts
    from engine.loading import load_target, resolve

    from .tokenizer import stop_token_ids

    if threads:
        torch.set_num_threads(threads)
    prompts = read_prompts(prompts_path)
    model, tokenizer = load_target(resolve(str(target_dir), "target"), torch.device("cpu"), torch.float32)
    stops = stop_token_ids(tokenizer)
    t0 = time.time()
    scores = []
    for p in prompts:
        new, ended = greedy_reply(model, tokenizer, p, max_new_tokens, stops)
        reply = tokenizer.decode(new)
        kind = "complete" if p.raw else "chat"
        shown = heal_code_prompt(p.prompt) if p.raw else p.label  # the text the reply continues
        scores.append(score_reply(p.name, kind, shown, reply, len(new), ended, is_loop(new)))
        s = scores[-1]
        log(f"{'ok ' if s.parses and s.on_topic else 'no '} {kind:8} {p.name:18} parses={s.parses!s:5} "
            f"on_topic={s.on_topic!s:5} tokens={len(new)}")
    return {"target": str(target_dir), "prompts": str(prompts_path), "max_new_tokens": max_new_tokens,
            "seconds": round(time.time() - t0, 1), **summarize(scores),
            "replies": [asdict(s) for s in scores]}
