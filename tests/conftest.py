"""Test-wide settings: tiny models run fastest on one torch thread (see engine.loading.pick_threads)."""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

try:
    import torch
except ImportError:  # storage/UI-only environments
    torch = None

if torch is not None:
    torch.set_num_threads(1)
