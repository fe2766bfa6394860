"""Image classifiers of torchvision and timm by name, beyond the zoo's own table.

A zoo job may name any image-classification model of the installed torchvision (`torchvision.models.list_models`
of its classification module: `vit_b_16`, `swin_t`, `efficientnet_v2_s`, ...) or timm (`timm.list_models()`:
`resnet26d`, `levit_128`, ...); it is built from its constructor, never from downloaded weights, and fed images of
its weights' (torchvision) or pretrained config's (timm) input size. The zoo's own table wins for its names, then
torchvision, then timm (both ship a `resnet50`, say: `perfmodel zoo show NAME` tells which one a name is).

The names are data, `library_models.json` beside this module, so that a name is known (and a request that names an
unknown one refused) without importing torch, torchvision or timm: the service validates job specs in a process
that never imports them. `python -m perfmodel.jobs.library_models --write` writes it from the installed
libraries and records their versions; `tests/jobs/test_library_models.py` checks it matches them where the same
versions are installed. Where others are, a name the installed library lacks fails when the job is built (its
library's own error), and a name only it has is unknown here until the file is written again.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

LIBRARY_FILE = Path(__file__).with_name("library_models.json")
LIBRARIES = ("torchvision", "timm")  # the order a name shared by both resolves in
DEFAULT_IMAGE_SIZE = 224
# torchvision modules whose constructors compute with tensors (regnet's width schedule): built on the CPU, then moved
TORCHVISION_BUILDS_OFF_META = frozenset({"regnet"})


@dataclass(frozen=True)
class LibraryModel:
    """One classifier a library builds by name: its family (the zoo table's family of the library module that
    defines it, else that module's name) and input size."""

    name: str
    library: str
    family: str
    image_size: int = DEFAULT_IMAGE_SIZE
    builds_on_meta: bool = True


@functools.cache
def library_models() -> dict[str, LibraryModel]:
    """Every name of `library_models.json`, the first library's where both have it (`LIBRARIES`)."""
    data = json.loads(LIBRARY_FILE.read_text())
    models: dict[str, LibraryModel] = {}
    for library in LIBRARIES:  # {"versions": {...}, "torchvision": {name: fields}, "timm": {...}}
        for name, fields in data.get(library, {}).items():
            models.setdefault(name, LibraryModel(name=name, library=library, **fields))
    return models


def installed_versions() -> dict[str, str]:
    """{library: its installed version} (imports both)."""
    from perfmodel.compat import ensure_torchvision

    ensure_torchvision()
    import timm
    import torchvision

    return {"torchvision": torchvision.__version__.split("+")[0], "timm": timm.__version__}


def shipped_versions() -> dict[str, str]:
    """{library: the version `library_models.json` was written from}."""
    return dict(json.loads(LIBRARY_FILE.read_text()).get("versions", {}))


def installed_library_models() -> dict[str, object]:
    """{"versions": ..., library: {name: fields}} from the installed torchvision and timm (imports both): what the
    file should hold."""
    from perfmodel.compat import ensure_torchvision

    ensure_torchvision()
    import timm
    import torchvision

    def torchvision_module(name: str) -> str:
        return str(torchvision.models.get_model_builder(name).__module__.rsplit(".", 1)[-1])

    timm_modules = {name: module for module in timm.list_modules() for name in timm.list_models(module=module)}
    # a library module that defines one of the zoo table's models is that model's family (torchvision's and timm's
    # `vision_transformer` are the table's `vit`, `mobilenetv3` its `mobilenet`): one architecture, one family
    from perfmodel.jobs.zoo import ZOO

    module_of = {"torchvision": torchvision_module, "timm": lambda name: timm_modules.get(name, name)}
    families = {module_of[e.library](e.name): e.family for e in ZOO.values() if e.library in module_of}

    def torchvision_model(name: str) -> dict[str, object]:
        module = torchvision_module(name)
        family = families.get(module, module)
        transforms = torchvision.models.get_model_weights(name).DEFAULT.transforms()
        crop = getattr(transforms, "crop_size", [DEFAULT_IMAGE_SIZE])
        return {"family": family, "image_size": int(crop[0] if isinstance(crop, (list, tuple)) else crop),
                "builds_on_meta": family not in TORCHVISION_BUILDS_OFF_META}

    def timm_model(name: str) -> dict[str, object]:
        config = timm.models.get_pretrained_cfg(name)
        size = getattr(config, "input_size", None) if config is not None else None
        module = timm_modules.get(name, name)
        return {"family": families.get(module, module), "image_size": int(size[-1]) if size else DEFAULT_IMAGE_SIZE}

    classifiers = torchvision.models.list_models(module=torchvision.models)
    return {"versions": installed_versions(),
            "torchvision": {name: torchvision_model(name) for name in sorted(classifiers)},
            "timm": {name: timm_model(name) for name in sorted(timm.list_models())}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write or check library_models.json from the installed libraries")
    parser.add_argument("--write", action="store_true", help="rewrite the file (else: check it)")
    args = parser.parse_args(argv)
    installed = installed_library_models()
    if args.write:
        LIBRARY_FILE.write_text(json.dumps(installed, indent=0, sort_keys=True) + "\n")
        print(f"wrote {LIBRARY_FILE}: " + ", ".join(f"{len(installed[k])} {k}" for k in LIBRARIES))  # type: ignore[arg-type]
        return 0
    shipped = json.loads(LIBRARY_FILE.read_text())
    if shipped != installed:
        print(f"{LIBRARY_FILE} differs from the installed libraries: run with --write", file=sys.stderr)
        return 1
    print(f"{LIBRARY_FILE} matches the installed libraries")
    return 0


if __name__ == "__main__":
    sys.exit(main())

