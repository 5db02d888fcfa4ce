"""Would compiling pay for a linear-attention target? The compiled path keeps such targets eager
(engine/compiled.py ``why_not_compiled``); this lifts that check for one random Qwen3.5-shaped
target (three Gated DeltaNet layers to one full-attention layer, as the published models
interleave them) and reports the compile time and the median cost of a verify of 1 and of
8 tokens after a 128-token prompt, eager against compiled, rollback included.

    python scripts/linear_attention_compile.py --hidden 512 --layers 8 [--eager-mixers]

``--eager-mixers`` leaves the linear-attention mixers eager inside the compiled passes
(``torch.compiler.disable``), so that only the rest of the model is traced. One torch thread,
as bench. Use an empty ``TORCHINDUCTOR_CACHE_DIR`` to time a first compile. Compiling the
mixers takes many minutes on a CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers as tf

from engine import compiled as compiled_module
from engine.backends import EagerSession
from engine.compiled import CompiledPath
from engine.draft import DFlashDraftModel, new_draft_config
from engine.features import decoder_layers
from engine.target_cache import mixer_of

PROMPT = list(range(5, 133))


def qwen3_5_shape(hidden: int, layers: int) -> torch.nn.Module:
    config = tf.Qwen3_5TextConfig(
        vocab_size=8192, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=2, head_dim=64,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
        linear_num_key_heads=hidden // 128, linear_num_value_heads=hidden // 64, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4, max_position_embeddings=2048, tie_word_embeddings=True)
    torch.manual_seed(0)
    return tf.Qwen3_5ForCausalLM(config).float().eval()


def with_eager_mixers(copy_target):
    def copy(module):
        clone = copy_target(module)
        for layer in decoder_layers(clone):
            if (mixer := mixer_of(layer)) is not None:
                mixer.forward = torch.compiler.disable(mixer.forward)
        return clone

    return copy


@torch.inference_mode()
def verify_ms(open_session, width: int, repeats: int = 20) -> float:
    session = open_session()
    try:
        session.prefill(PROMPT)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            session.verify(list(range(10, 10 + width)), len(PROMPT), width)
            session.commit(len(PROMPT) + 1)
            times.append(time.perf_counter() - started)
    finally:
        session.close()
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8, help="a multiple of 4")
    parser.add_argument("--eager-mixers", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    target = qwen3_5_shape(args.hidden, args.layers)
    torch.manual_seed(1)
    draft = DFlashDraftModel(new_draft_config(target.config, 1, 8, target.config.vocab_size - 1)).eval()
    compiled_module.why_not_compiled = lambda _target: None
    if args.eager_mixers:
        compiled_module.weight_sharing_copy = with_eager_mixers(compiled_module.weight_sharing_copy)
    print(f"{sum(p.numel() for p in target.parameters()) / 1e6:.1f}M parameters; compiling …", flush=True)
    started = time.perf_counter()
    path = CompiledPath(target, draft, 8).start(max_length=512)
    try:
        if not path.wait():
            raise SystemExit(f"the compile did not finish: {path.state}: {path.error}")
        print(f"compiled {path.report.graphs} graphs in {time.perf_counter() - started:.0f} s", flush=True)
        for width in (1, 8):
            eager = verify_ms(lambda: EagerSession(target, draft), width)
            compiled = verify_ms(lambda: path.open(target, draft, 256, 8), width)
            print(f"verify of {width}: eager {eager:.2f} ms, compiled {compiled:.2f} ms ({eager / compiled:.2f}x)")
    finally:
        path.close()
        path.join(5)


if __name__ == "__main__":
    main()
