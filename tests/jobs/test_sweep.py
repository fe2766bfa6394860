import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.jobs.sweep import load_sweep


def test_sweep_expands_lists_as_cross_products(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text("device: cpu\njobs:\n  - zoo: [resnet18, vgg11]\n    batch_size: [2, 4, 8]\n"
                    "  - zoo: bert-small\n    batch_size: 2\n    seq_len: [16, 32]\n    mode: inference\n")
    specs, settings = load_sweep(path)
    assert settings == {"device": "cpu"}
    assert len(specs) == 2 * 3 + 2
    assert len({s.key() for s in specs}) == len(specs)
    assert specs[-1].mode.value == "inference" and specs[-1].seq_len == 32


@pytest.mark.parametrize("text,match", [("jobs: 3", "jobs"), ("jobs:\n  - zoo: x\n    colour: red", "unknown"),
                                        ("jobs:\n  - zoo: resnet18\n    batch_size: 0", "batch_size"),
                                        ("jobs: [", "YAML")])
def test_bad_sweeps_are_user_errors(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(PerfmodelError, match=match):
        load_sweep(path)
