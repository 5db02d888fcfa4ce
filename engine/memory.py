"""How much memory this machine has free for a model: the GPU's free memory on CUDA, else the
host's available memory (what the kernel could hand out without swapping)."""

from __future__ import annotations

import os


def free_memory(device: str | None = None) -> tuple[float, str]:
    """(bytes free, where: "GPU memory on cuda:0" or "memory") for a model loaded on ``device``
    (None: cuda when there is one, as the engine picks)."""
    import torch

    kind = torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if kind.type == "cuda" and torch.cuda.is_available():
        index = kind.index or 0
        free, _ = torch.cuda.mem_get_info(index)
        return float(free), f"GPU memory on cuda:{index}"
    return float(available_host_memory()), "memory"


def bytes_per_parameter(device: str | None = None, dtype: str | None = None) -> float:
    """What a parameter takes once loaded with ``--device`` / ``--dtype`` as the engine picks them
    (engine.loading.pick_dtype: bfloat16 on CUDA, float32 on the CPU, unless told)."""
    import torch

    if dtype and isinstance(getattr(torch, dtype, None), torch.dtype):
        return torch.finfo(getattr(torch, dtype)).bits / 8
    kind = torch.device(device).type if device else ("cuda" if torch.cuda.is_available() else "cpu")
    return 2.0 if kind == "cuda" else 4.0


def keeps_format(method: str | None, device: str | None = None) -> bool:
    """Whether a target stored in ``method`` ("mxfp4", "fp8") stays in it once loaded on
    ``device`` (a GPU with the kernels for it), rather than dequantised to the compute dtype."""
    import torch

    from .quantization import FORMATS, device_kernels, runs_natively

    if method not in FORMATS:
        return False
    kind = torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return runs_natively(FORMATS[method], device_kernels(kind))


def available_host_memory() -> int:
    """MemAvailable from /proc/meminfo (Linux), else free physical pages."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX: no limit this code can read
        return 1 << 62
