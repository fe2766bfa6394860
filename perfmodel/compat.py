"""Make torchvision importable next to a torch build it was not compiled for.

PyPI's torchvision wheel is a CUDA build. Next to the CPU wheel of torch its C++ library (`torchvision._C`) does not
load, and `import torchvision` then fails while registering fake kernels for `torchvision::nms` / `qnms`, which
do not exist. timm and transformers import torchvision, so they fail too. When the library does not load we define
the schemas of those two operators (no kernels): torchvision, timm and transformers import, every classification
model runs, and only the detection ops (nms, roi_align, ...) stay unavailable, with torchvision's own error.

Call `ensure_torchvision()` before importing torchvision, timm or transformers. It is idempotent and cheap.
"""

from __future__ import annotations

import importlib.util
import os

_fallback_library = None  # keeps the fallback definitions registered for the life of the process
_state: str | None = None  # "native", "fallback" or "absent"

_FALLBACK_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)


def ensure_torchvision() -> str:
    """Return how torchvision's operators are provided: 'native', 'fallback' (schemas only) or 'absent'."""
    global _fallback_library, _state
    if _state is not None:
        return _state
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        _state = "absent"
        return _state
    package_dir = os.path.dirname(spec.origin)
    libs = [f for f in os.listdir(package_dir) if f.startswith("_C.") and f.endswith((".so", ".pyd"))]
    try:
        if not libs:
            raise OSError("torchvision has no compiled _C library")
        torch.ops.load_library(os.path.join(package_dir, libs[0]))
        _state = "native"
    except OSError:
        library = torch.library.Library("torchvision", "DEF")
        for schema in _FALLBACK_SCHEMAS:
            library.define(schema)
        _fallback_library = library
        _state = "fallback"
    return _state
