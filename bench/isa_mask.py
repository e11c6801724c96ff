"""torch's bf16 matmul under an instruction-set mask, as on such a CPU.

Under ONEDNN_MAX_CPU_ISA below the CPU's level (AVX2: oneDNN has no bf16
matmul), torch still sends bf16 matmuls to oneDNN (it decides from CPUID),
which throws; on a CPU that really lacks AVX-512, torch runs its own GEMM.
follow() gives the plain PyTorch baselines what they get on such a CPU
(tests/isa_mask.cpp and tests/python/conftest.py do the same for the tests).
"""
import os

import torch


def follow():
    """Turns torch's oneDNN use off where its bf16 matmul fails under the
    mask; returns a note saying so, or ""."""
    if not (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")):
        return ""
    x = torch.ones(64, 64, dtype=torch.bfloat16)  # small products skip oneDNN
    try:
        x @ x
    except RuntimeError:
        torch.backends.mkldnn.enabled = False
        return "torch's oneDNN off (no bf16 matmul under the mask)"
    return ""
