import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.jobs.sweep import load_sweep


def test_sweep_expands_lists_as_cross_products(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text("jobs:\n  - zoo: [resnet18, vgg11]\n    batch_size: [2, 4, 8]\n"
                    "  - zoo: bert-small\n    batch_size: 2\n    seq_len: [16, 32]\n    mode: inference\n")
    specs = load_sweep(path)
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


TINY = ("import torch\n\ndef make(batch_size):\n    return torch.nn.Linear(8, 8), torch.randn(batch_size, 8)\n\n"
        "class Net:\n    pass\n")


def sweep_of(tmp_path, second: str) -> object:
    """A sweep of a valid module job, then `second` (the YAML lines of a job entry)."""
    (tmp_path / "tiny.py").write_text(TINY)
    path = tmp_path / "sweep.yaml"
    path.write_text("jobs:\n  - module: tiny.py:make\n    batch_size: 2\n" + second)
    return path


@pytest.mark.parametrize("second,fragment", [
    ("  - zoo: resnet5\n    batch_size: 2\n", "jobs[1]: unknown zoo model 'resnet5'; did you mean: resnet50"),
    ("  - zoo: [resnet18, resnet5]\n    batch_size: 2\n", "jobs[1]: unknown zoo model 'resnet5'"),
    ("  - module: gone.py:make\n    batch_size: 2\n", "jobs[1]: module file not found: {tmp}/gone.py"),
    ("  - module: tiny.py:nope\n    batch_size: 2\n",
     "jobs[1]: {tmp}/tiny.py defines no 'nope'; the functions and classes it defines: make, Net"),
    ("  - module: broken.py:make\n    batch_size: 2\n", "jobs[1]: could not load {tmp}/broken.py:make: SyntaxError"),
    ("  - onnx: gone.onnx\n    batch_size: 2\n", "jobs[1]: ONNX file not found: {tmp}/gone.onnx"),
    ("  - onnx: bad.onnx\n    batch_size: 2\n", "jobs[1]: {tmp}/bad.onnx is not a readable ONNX model"),
    ("  - hf_config: gone.json\n    batch_size: 2\n", "jobs[1]: HF config not found: {tmp}/gone.json"),
])
def test_every_jobs_model_source_is_resolved_when_the_sweep_loads(tmp_path, second, fragment):
    (tmp_path / "broken.py").write_text("def make(batch_size)\n    return None\n")
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07\x12\x04junk-not-a-model")
    path = sweep_of(tmp_path, second)
    with pytest.raises(PerfmodelError) as info:
        load_sweep(path)
    message = str(info.value)
    assert message.startswith(f"sweep file {path}: ") and "\n" not in message
    assert fragment.format(tmp=tmp_path) in message


def test_valid_sources_resolve_without_running_anything(tmp_path, exported_mlp_onnx):
    (tmp_path / "blocks.py").write_text(
        "raise SystemExit('importing this file is not part of the check')\n"
        "try:\n    from torch.nn import Linear as make_linear\nexcept ImportError:\n    make_linear = None\n"
        "if True:\n    def make_if(batch_size):\n        pass\n")
    (tmp_path / "star.py").write_text("from os.path import *\n")
    (tmp_path / "lazy.py").write_text("def __getattr__(name):\n    raise AttributeError(name)\n")
    (tmp_path / "made.py").write_text("exec('def make(batch_size):\\n    return None')\n")
    path = sweep_of(tmp_path, f"  - module: [blocks.py:make_linear, blocks.py:make_if, star.py:anything, "
                              f"lazy.py:anything, made.py:make]\n    batch_size: 2\n  - onnx: {exported_mlp_onnx}\n"
                              f"    batch_size: 4\n  - zoo: resnet18\n    batch_size: [2, 4]\n")
    specs = load_sweep(path)
    assert [s.name for s in specs] == ["module:tiny.make", "module:blocks.make_linear", "module:blocks.make_if",
                                       "module:star.anything", "module:lazy.anything", "module:made.make",
                                       "onnx:mlp", "resnet18", "resnet18"]


def test_a_name_the_module_never_spells_is_a_typo(tmp_path):
    (tmp_path / "inner.py").write_text("class Net:\n    pass\n\ndef make(batch_size):\n    return Net()\n")
    path = sweep_of(tmp_path, "  - module: inner.py:build\n    batch_size: 2\n")
    with pytest.raises(PerfmodelError, match=r"jobs\[1\]: .*inner.py defines no 'build'; the functions and "
                                             r"classes it defines: Net, make$"):
        load_sweep(path)


@pytest.mark.parametrize("text,fragment", [
    ("jobs: []\n", "sweep file {path} holds no job: its 'jobs' list is empty"),
    ("jobs:\n  - zoo: resnet18\n    batch_size: []\n",
     "sweep file {path}: jobs[0]: batch_size is an empty list, so the entry holds no job"),
    ("jobs:\n  - zoo: resnet18\n    hf_config: gpt2.json\n    batch_size: 1\n",
     "sweep file {path}: jobs[0]: give exactly one model source, one of the keys zoo, hf_config, module or onnx; "
     "it gives zoo and hf_config"),
    ("jobs:\n  - zoo: resnet18\n    batch_size: 1\n  - batch_size: 1\n",
     "sweep file {path}: jobs[1]: give exactly one model source, one of the keys zoo, hf_config, module or onnx; "
     "it gives none"),
    ("jobs:\n  - hf_config: 5\n    batch_size: 1\n", "sweep file {path}: jobs[0]: hf_config must be a path"),
    ("jobs:\n  - zoo: resnet18\n    batch_size: [1, 2\n",
     "sweep file {path} is not valid YAML at line 4, column 1: expected ',' or ']'"),
    ("jobs:\n  - zoo: resnet18\n   batch_size: 1\n", "sweep file {path} is not valid YAML at line 3, column 4: "),
    ("device: cuda\njobs:\n  - zoo: resnet18\n    batch_size: 1\n",
     "sweep file {path} has top-level fields ['device'] that nothing reads"),
])
def test_sweeps_with_nothing_to_run_or_misplaced_keys_say_where(tmp_path, text, fragment):
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    with pytest.raises(PerfmodelError) as info:
        load_sweep(path)
    assert fragment.format(path=path) in str(info.value) and "\n" not in str(info.value)


def test_a_sweep_file_that_is_not_text_is_a_user_error(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(PerfmodelError, match="is not text"):
        load_sweep(path)
