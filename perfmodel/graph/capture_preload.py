"""Imported only by the graph-capture fork server (`perfmodel.graph.capture`), never by the package: it imports
what every capture needs (torch, torchvision behind `ensure_torchvision`, transformers' model machinery) once, so
that each capture's child, forked from that server, starts in milliseconds instead of re-importing them."""

import gc

from perfmodel.compat import ensure_torchvision

ensure_torchvision()

import torchvision.models  # noqa: E402,F401
import transformers.modeling_utils  # noqa: E402
import transformers.models.auto.modeling_auto  # noqa: E402,F401

import perfmodel.graph.from_torch  # noqa: E402
import perfmodel.jobs.build  # noqa: E402
import perfmodel.jobs.zoo  # noqa: E402,F401


def _warm_up() -> None:
    """One tiny capture: torch.export's lazily imported machinery is then in the server, not paid per child."""
    from perfmodel.graph.from_torch import capture_graph
    from perfmodel.jobs.spec import JobSpec, ZooSource

    for name in WARM_UP:
        capture_graph(JobSpec(source=ZooSource(name=name), batch_size=2, seq_len=8))


WARM_UP = ("resnet18",)
_warm_up()
gc.freeze()  # what the server holds is shared copy-on-write with every child: never touched by their GC
