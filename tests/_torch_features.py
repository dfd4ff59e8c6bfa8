"""What the installed torch has of the model-parallel APIs that lessons 09 and 10 use, as pytest marks.

The lessons decide the same way (their first cells), so a test of one of these APIs skips
where the lesson skips its cells, and says why.
"""

from __future__ import annotations

import os

import pytest
import torch


def torch_file_has(path: str, text: str) -> bool:
    """Whether the installed torch's source file ``path`` contains ``text`` (reading it imports nothing)."""
    file = os.path.join(os.path.dirname(torch.__file__), *path.split("/"))
    return os.path.exists(file) and text in open(file).read()


TORCH = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
needs_dtensor = pytest.mark.skipif(not torch_file_has("distributed/tensor/debug/__init__.py", "CommDebugMode"),
                                   reason="this torch has no public torch.distributed.tensor (from torch 2.5)")
needs_fsdp2 = pytest.mark.skipif(TORCH < (2, 9), reason="FSDP2 on gloo averages gradients from torch 2.9 "
                                                        "(lesson 09's FSDP2_SINCE)")
needs_pipelining = pytest.mark.skipif(not torch_file_has("distributed/pipelining/schedules.py", "scale_grads"),
                                      reason="this torch's pipelining has no scale_grads (lesson 10 skips it too)")
needs_public_functional = pytest.mark.skipif(TORCH < (2, 5), reason="torch 2.4's functional collectives cannot be "
                                             "pickled into the checks' fresh processes (a DispatchKeySet)")
