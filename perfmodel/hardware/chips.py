"""The die (chip) of catalog parts: SKUs of one die share their compute and memory design, so what is observed on
one (a whole training step, a calibration) says something about the others, and a chip hold-out holds out all of
them. Parts not in the table are their own die."""

from __future__ import annotations

# the die of every catalog part the public whole-run data covers, and of their siblings in the catalog
DIE_OF = {
    **dict.fromkeys(("a100-pcie-40gb", "a100-pcie-80gb", "a100-sxm4-40gb", "a100-sxm4-80gb", "a800-pcie-40gb",
                     "a800-pcie-80gb", "a800-sxm4-80gb", "a30"), "GA100"),
    **dict.fromkeys(("rtx-3090", "rtx-3090-ti", "rtx-3080", "rtx-3080-ti", "rtx-a6000", "rtx-a5000", "rtx-a5500",
                     "rtx-a4500", "a40", "a10", "a10g"), "GA102"),
    **dict.fromkeys(("rtx-3070", "rtx-3070-ti", "rtx-3060-ti", "rtx-a4000", "rtx-3080-max-q", "rtx-3080-laptop"),
                    "GA104"),
    **dict.fromkeys(("rtx-3060", "rtx-3050"), "GA106"),
    **dict.fromkeys(("rtx-4090", "rtx-6000-ada", "rtx-5000-ada", "l40", "l40s"), "AD102"),
    **dict.fromkeys(("rtx-4080", "rtx-4080-super", "rtx-4070-ti-super"), "AD103"),
    **dict.fromkeys(("rtx-4070-ti", "rtx-4070", "rtx-4070-super", "rtx-4500-ada", "rtx-4000-ada", "rtx-4000-sff-ada"),
                    "AD104"),
    **dict.fromkeys(("rtx-4060-ti-8gb", "rtx-4060-ti-16gb"), "AD106"),
    **dict.fromkeys(("rtx-4060", "rtx-2000-ada"), "AD107"),
    **dict.fromkeys(("v100-sxm2-16gb", "v100-sxm2-32gb", "v100-pcie-16gb", "v100-pcie-32gb", "v100s-pcie-32gb",
                     "titan-v", "quadro-gv100"), "GV100"),
    **dict.fromkeys(("rtx-2080-ti", "titan-rtx", "quadro-rtx-6000", "quadro-rtx-8000"), "TU102"),
    **dict.fromkeys(("quadro-rtx-5000", "rtx-2080-max-q", "rtx-2080-super-max-q", "t4", "quadro-rtx-4000", "rtx-2080",
                     "rtx-2080-super", "rtx-2070-super"), "TU104"),
    **dict.fromkeys(("rtx-2070-max-q", "rtx-2070", "rtx-2060", "rtx-2060-super"), "TU106"),
    **dict.fromkeys(("gtx-1080-ti", "titan-xp", "titan-x-pascal", "p40"), "GP102"),
    **dict.fromkeys(("p4", "gtx-1080", "gtx-1070"), "GP104"),
    **dict.fromkeys(("p100-pcie-12gb", "p100-pcie-16gb", "p100-sxm2-16gb"), "GP100"),
    **dict.fromkeys(("h100-pcie", "h100-sxm5", "h100-nvl", "h800-pcie", "h800-sxm", "h200", "h200-nvl", "h20",
                     "gh200-96gb", "gh200-144gb"), "GH100"),
    **dict.fromkeys(("b200", "gb200"), "GB100"),
    **dict.fromkeys(("rtx-5080", "rtx-5070-ti"), "GB203"),
    **dict.fromkeys(("rtx-5070",), "GB205"),
    **dict.fromkeys(("k80",), "GK210"),
    **dict.fromkeys(("mi250", "mi250x"), "aldebaran"),
    **dict.fromkeys(("mi300x", "mi300a", "mi325x"), "aqua-vanjaram"),
}


def die_of(accelerator: str) -> str:
    """The die of a catalog part (its own name where the table has none)."""
    return DIE_OF.get(accelerator, accelerator)
