"""vLLM as a second engine: a client that speaks vLLM's OpenAI-compatible HTTP API and rebuilds
the same typed events as the local engine from vLLM's per-request speculative-decoding metrics,
and a manager for a vLLM server the Studio starts itself.

    engine = VLLMEngine.connect(VLLMConfig(url="http://gpu-box:8000"))       # a running server
    engine = VLLMEngine.launch(VLLMConfig(target="...", draft="..."))         # the Studio starts one

vLLM runs in its own Python environment (``scripts/install_vllm.sh``); this package only needs
httpx and the target's tokenizer.
"""

from ..interface import VLLM_CAPABILITIES
from .client import VLLMEngine
from .config import VLLMConfig, default_vllm_python
from .server import VLLMServer

__all__ = ["VLLMConfig", "VLLMEngine", "VLLMServer", "VLLM_CAPABILITIES", "default_vllm_python"]
