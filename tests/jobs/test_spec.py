import json

import pytest
from pydantic import ValidationError

from perfmodel.core.errors import PerfmodelError, UnknownNameError
from perfmodel.jobs.spec import DEFAULT_SEQ_LEN, JobSpec, Mode, ModuleSource, OptimizerName, Precision, ZooSource
from perfmodel.jobs.zoo import ZOO, get_entry


def test_key_is_stable_and_distinguishes_settings():
    a = JobSpec(source=ZooSource(name="resnet18"), batch_size=8)
    b = JobSpec.model_validate_json(a.model_dump_json())
    assert a == b and a.key() == b.key()
    assert a.key() != JobSpec(source=ZooSource(name="resnet18"), batch_size=16).key()
    assert a.key() != JobSpec(source=ZooSource(name="resnet18"), batch_size=8, optimizer="adam").key()


@pytest.mark.parametrize("field,value", [("batch_size", 0), ("batch_size", -3), ("precision", "fp8"),
                                         ("optimizer", "lamb"), ("mode", "eval"), ("seq_len", 0)])
def test_bad_values_are_rejected_naming_the_field(field, value):
    with pytest.raises(ValidationError) as info:
        JobSpec(source=ZooSource(name="resnet18"), **{"batch_size": 8, field: value})
    assert field in str(info.value)


def test_exactly_one_source():
    with pytest.raises(PerfmodelError):
        JobSpec.from_options(batch_size=1)
    with pytest.raises(PerfmodelError):
        JobSpec.from_options(zoo="resnet18", module="m.py:f", batch_size=1)


def test_module_path_needs_a_callable_name():
    with pytest.raises(ValidationError):
        ModuleSource(path="model.py")
    assert ModuleSource(path="dir/model.py:make").path == "dir/model.py:make"


def test_hf_config_from_path_and_dict(tmp_path):
    cfg = {"model_type": "bert", "hidden_size": 64}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    by_path = JobSpec.from_options(hf_config=tmp_path, batch_size=2)
    by_file = JobSpec.from_options(hf_config=tmp_path / "config.json", batch_size=2)
    by_dict = JobSpec.from_options(hf_config=cfg, batch_size=2)
    assert by_path.key() == by_file.key() == by_dict.key()
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PerfmodelError, match="not valid JSON"):
        JobSpec.from_options(hf_config=tmp_path / "bad.json", batch_size=2)
    with pytest.raises(PerfmodelError, match="not found"):
        JobSpec.from_options(hf_config=tmp_path / "missing.json", batch_size=2)


def test_enums_cover_the_issue():
    assert {p.value for p in Precision} == {"fp32", "fp32-strict", "tf32", "amp", "amp-bf16", "fp16", "bf16",
                                            "fp16-master", "bf16-master"}
    # the CPU models were trained before the math modes: each mode maps onto what they know
    assert {p.family for p in Precision} == {"fp32", "fp16", "bf16", "amp"}
    assert Precision.amp_bf16.autocast and not Precision.bf16.autocast and Precision.bf16.half_weights
    assert {o.value for o in OptimizerName} == {"sgd", "adam", "adamw"}


def test_a_master_weight_precision_runs_its_half_models_graph():
    # apex O2 / DeepSpeed / Megatron: the model is cast to half, the optimizer keeps fp32 master weights
    for master, half in ((Precision.fp16_master, Precision.fp16), (Precision.bf16_master, Precision.bf16)):
        assert master.half_weights and master.master_weights and not master.autocast
        assert master.half_dtype == half.half_dtype and master.graph_precision == half == half.graph_precision
        assert not half.master_weights and master.family == half.family
        spec = JobSpec.from_options(zoo="resnet18", batch_size=4, precision=master.value)
        assert spec.graph_key() == spec.model_copy(update={"precision": half}).graph_key()
        assert spec.graph_key() != spec.model_copy(update={"precision": Precision.amp}).graph_key()
    assert {p.graph_precision for p in Precision if not p.half_weights} == {Precision.fp32}


def test_each_mixed_precision_recipe_has_the_other_as_twin():
    # autocast's per-op casts and a half model with fp32 master weights run the same half kernels on the device
    for p in Precision:
        twin = p.twin
        assert twin is None or (twin.twin is p and twin.half_dtype == p.half_dtype and twin.autocast != p.autocast)
        assert p.device_math == (twin if p.master_weights else p)
    assert Precision.fp16_master.twin is Precision.amp and Precision.bf16_master.twin is Precision.amp_bf16
    assert Precision.fp16.twin is None and Precision.tf32.twin is None
    assert {p for p in Precision if p.fp32_gradients} == {Precision.bf16_master}  # Megatron-LM's bf16 main_grad


def test_zoo_has_at_least_30_architectures_from_every_library():
    assert len(ZOO) >= 30
    libraries = {e.library for e in ZOO.values()}
    assert {"torchvision", "timm", "transformers", "perfmodel"} <= libraries
    families = {e.family for e in ZOO.values()}
    for family in ("resnet", "vgg", "mobilenet", "efficientnet", "densenet", "vit", "convnext", "swin", "bert",
                   "gpt2", "t5", "llama", "opt", "rnn", "recommender"):
        assert family in families


def test_unknown_zoo_name_lists_close_matches():
    with pytest.raises(UnknownNameError) as info:
        get_entry("resnet15")
    assert "resnet152" in str(info.value) or "resnet18" in str(info.value)
    assert info.value.close_matches


def test_an_ir_job_key_is_the_hash_of_its_whole_canonical_dump():
    """An IR's graph is hashed as given (not dumped first): the key is still that of the whole spec's canonical
    JSON, so ids of IR jobs registered before stay the same."""
    import hashlib

    from perfmodel.graph import graph_for_job

    graph = json.loads(graph_for_job(JobSpec(source=ZooSource(name="resnet18"), batch_size=2)).to_json())
    spec = JobSpec.model_validate({"source": {"kind": "ir", "graph": graph},
                                   "batch_size": 2})

    def whole(s: JobSpec) -> str:
        text = json.dumps(s.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    assert spec.key() == whole(spec)
    tupled = {**graph, "nodes": [{**node, "inputs": tuple(node.get("inputs", ()))} for node in graph["nodes"]]}
    as_tuples = JobSpec.model_validate({"source": {"kind": "ir", "graph": tupled}, "batch_size": 2})
    assert as_tuples.key() == whole(as_tuples) == spec.key()  # a graph built in Python: tuples hash as lists


@pytest.mark.parametrize("name", sorted(n for n, e in ZOO.items() if e.reference_seq_len is not None))
def test_a_zoo_job_without_a_seq_len_runs_at_its_reference_implementations_own(name):
    entry = get_entry(name)
    assert JobSpec.from_options(zoo=name, batch_size=2).seq_len == entry.reference_seq_len
    as_posted = JobSpec.model_validate({"source": {"kind": "zoo", "name": name}, "batch_size": 2})
    assert as_posted.seq_len == entry.reference_seq_len
    assert as_posted.key() == JobSpec(source=ZooSource(name=name), batch_size=2,
                                      seq_len=entry.reference_seq_len).key()
    assert JobSpec.from_options(zoo=name, batch_size=2, seq_len=7).seq_len == 7  # a given one wins


def test_a_job_whose_model_has_no_reference_length_keeps_the_default():
    assert JobSpec.from_options(zoo="resnet18", batch_size=2).seq_len == DEFAULT_SEQ_LEN
    assert JobSpec.from_options(module="m.py:make", batch_size=2).seq_len == DEFAULT_SEQ_LEN
    assert len([n for n, e in ZOO.items() if e.reference_seq_len is not None]) >= 8  # the DLE and Gavel models


REFERENCE_OPTIMIZERS = {  # what the reference implementations train with (DLE defaults; Gavel's workloads)
    "ssd300": "sgd", "maskrcnn": "sgd", "gnmt": "adam", "ncf": "adam", "tacotron2": "adam", "waveglow": "adam",
    "transformer-xl-base": "adam", "transformer-xl-large": "adam", "gavel-resnet18": "sgd", "gavel-resnet50": "sgd",
    "gavel-transformer": "adam", "gavel-lm": "sgd", "gavel-recommendation": "adam", "gavel-cyclegan": "adam",
    "gavel-a3c": "adam",
    # transformers' Trainer (and its example scripts) train with AdamW
    **{name: "adamw" for name, entry in ZOO.items() if entry.library == "transformers"}}


@pytest.mark.parametrize("name,optimizer", sorted(REFERENCE_OPTIMIZERS.items()))
def test_a_zoo_job_without_an_optimizer_trains_with_its_reference_implementations(name, optimizer):
    assert get_entry(name).reference_optimizer == optimizer
    assert JobSpec.from_options(zoo=name, batch_size=2).optimizer.value == optimizer
    for body in ({}, {"optimizer": None}):  # as posted: left out, or null
        posted = JobSpec.model_validate({"source": {"kind": "zoo", "name": name}, "batch_size": 2, **body})
        assert posted.optimizer.value == optimizer
        assert posted.key() == JobSpec.from_options(zoo=name, batch_size=2, optimizer=optimizer).key()
    other = "adamw" if optimizer != "adamw" else "sgd"
    assert JobSpec.from_options(zoo=name, batch_size=2, optimizer=other).optimizer.value == other  # given wins


def test_a_job_without_a_reference_optimizer_trains_with_sgd_and_a_transformers_config_with_adamw():
    assert JobSpec.from_options(zoo="resnet50", batch_size=2).optimizer.value == "sgd"
    assert JobSpec.from_options(module="m.py:make", batch_size=2).optimizer.value == "sgd"
    assert {n for n, e in ZOO.items() if e.reference_optimizer} == set(REFERENCE_OPTIMIZERS)
    config = {"model_type": "bert", "num_hidden_layers": 2}
    assert JobSpec.from_options(hf_config=config, batch_size=2).optimizer.value == "adamw"
    posted = JobSpec.model_validate({"source": {"kind": "hf_config", "config": config}, "batch_size": 2})
    assert posted.optimizer.value == "adamw"
    assert posted.key() == JobSpec.from_options(hf_config=config, batch_size=2).key()
    assert JobSpec.from_options(hf_config=config, batch_size=2, optimizer="sgd").optimizer.value == "sgd"


def test_a_zoo_model_without_a_sequence_is_the_same_job_whatever_seq_len_comes_with_it():
    image = JobSpec.from_options(zoo="resnet50", batch_size=32, seq_len=384)
    assert image.key() == JobSpec.from_options(zoo="resnet50", batch_size=32).key()
    assert JobSpec.from_options(zoo="bert-base", batch_size=32, seq_len=384).seq_len == 384


def test_channels_last_is_its_own_job_and_leaves_every_other_key_as_it_was():
    """A channels-last job gets its own key; a job that does not say it keeps the key (and JSON) it had before the
    setting existed, so stored jobs keep their ids."""
    plain = JobSpec(source=ZooSource(name="resnet50"), batch_size=32)
    assert "channels_last" not in plain.model_dump(mode="json")
    assert plain.key() == "a16c30d7f9094ea4675908cf"  # the id README's examples show, from before the setting
    converted = plain.model_copy(update={"channels_last": True})
    assert converted.model_dump(mode="json")["channels_last"] is True
    assert JobSpec.model_validate_json(converted.model_dump_json()) == converted
    assert converted.key() != plain.key()


def test_a_fused_optimizer_is_its_own_job_on_the_same_graph_and_leaves_every_other_key_as_it_was():
    """A job stepping a fused optimizer gets its own key but its graph's (the optimizer is no node of it); a job
    that does not say it keeps the key and JSON it had before the setting existed."""
    plain = JobSpec(source=ZooSource(name="resnet50"), batch_size=32)
    assert "fused_optimizer" not in plain.model_dump(mode="json")
    assert plain.key() == "a16c30d7f9094ea4675908cf"
    fused = plain.model_copy(update={"fused_optimizer": True})
    assert JobSpec.model_validate_json(fused.model_dump_json()) == fused
    assert fused.key() != plain.key() and fused.graph_key() == plain.graph_key()
    assert JobSpec.model_validate({**plain.model_dump(mode="json"), "fused_optimizer": False}).key() == plain.key()


def test_specs_that_differ_only_in_optimizer_or_float32_math_share_a_graph_key():
    """The optimizer is priced from the parameter count and fp32, tf32 and autocast run the float32 graph: one
    graph key; a model cast to half, another batch, sequence, layout or mode is another graph."""
    base = JobSpec.from_options(zoo="bert-small", batch_size=8, seq_len=64)
    same = [base.model_copy(update={"precision": p, "optimizer": o})
            for p in (Precision.fp32, Precision.fp32_strict, Precision.tf32, Precision.amp, Precision.amp_bf16)
            for o in OptimizerName]
    assert {s.graph_key() for s in same} == {base.graph_key()}
    assert len({s.key() for s in same}) == len(same)  # each is still its own job
    plain = base.model_copy(update={"steps_vary": None, "optimizer": OptimizerName.sgd})
    assert base.graph_key() == plain.key()  # fp32 with SGD and no kind of step: its own key
    others = [base.model_copy(update=u) for u in ({"precision": Precision.fp16}, {"precision": Precision.bf16},
                                                   {"batch_size": 16}, {"seq_len": 128}, {"mode": Mode.inference})]
    others.append(JobSpec.from_options(zoo="resnet18", batch_size=8, channels_last=True))
    keys = {s.graph_key() for s in others} | {base.graph_key(), others[-1].model_copy(
        update={"channels_last": False}).graph_key()}
    assert len(keys) == len(others) + 2
    assert base.model_copy(update={"precision": Precision.fp16, "optimizer": OptimizerName.adam}).graph_key() == \
        others[0].graph_key()


def test_an_hf_config_job_with_an_unknown_task_is_refused_when_it_is_specified():
    """Before any capture: the spec itself refuses a head transformers has no class for, naming the known ones."""
    from perfmodel.jobs.hf import TASK_CLASSES

    config = {"model_type": "bert", "hidden_size": 64}
    with pytest.raises(ValidationError, match="unknown task 'qa'; one of " + ", ".join(TASK_CLASSES)):
        JobSpec.from_options(hf_config=config, task="qa", batch_size=2)
    assert JobSpec.from_options(hf_config=config, task="masked-lm", batch_size=2).source.task == "masked-lm"


def test_a_pytorch_version_is_its_own_job_and_leaves_every_other_key_as_it_was():
    """A job that names its PyTorch gets its own key and shares its graph; one that does not keeps the key (and
    JSON) it had before the setting existed; a full version is read as its major.minor."""
    plain = JobSpec(source=ZooSource(name="resnet50"), batch_size=32)
    assert "pytorch_version" not in plain.model_dump(mode="json")
    assert plain.key() == "a16c30d7f9094ea4675908cf"  # the id README's examples show, from before the setting
    older = plain.model_copy(update={"pytorch_version": "1.4"})
    assert JobSpec.model_validate_json(older.model_dump_json()) == older
    assert older.key() != plain.key() and older.graph_key() == plain.graph_key()
    for given, read in (("1.4.0", "1.4"), ("1.4.0a0+a5b4d78", "1.4"), ("2.1.2+cu121", "2.1"), (" 1.13 ", "1.13"),
                        ("1.04", "1.4")):
        assert JobSpec(source=ZooSource(name="resnet50"), batch_size=32, pytorch_version=given).pytorch_version == read


@pytest.mark.parametrize("value", ["1", "1.x", "v1.4", "latest", "", 1.4])
def test_a_pytorch_version_that_is_not_major_minor_is_refused_naming_the_field(value):
    with pytest.raises(ValidationError) as info:
        JobSpec(source=ZooSource(name="resnet50"), batch_size=32, pytorch_version=value)
    assert "pytorch_version" in str(info.value)


@pytest.mark.parametrize("name", [n for n in ZOO if n.startswith("gavel-")])
def test_gavels_jobs_default_to_the_pytorch_gavels_workloads_pin_and_a_jobs_own_version_wins(name):
    assert len([n for n in ZOO if n.startswith("gavel-")]) == 7
    assert JobSpec.from_options(zoo=name, batch_size=4).pytorch_version == "1.4"
    assert JobSpec.from_options(zoo=name, batch_size=4, pytorch_version="1.13").pytorch_version == "1.13"


def test_a_zoo_model_that_pins_no_pytorch_is_answered_for_the_newest():
    assert all(JobSpec.from_options(zoo=name, batch_size=4).pytorch_version is None
               for name in ("resnet50", "gnmt", "bert-base", "waveglow"))


def test_whether_steps_vary_is_a_zoo_models_reference_unless_the_job_says_and_leaves_other_keys_as_they_were():
    """Lambda's DeepLearningExamples models default to what their reference implementations do (SSD's DALI and
    NCF's data on the GPU: steady; GNMT's buckets, Tacotron 2's and WaveGlow's audio and Mask R-CNN's images:
    varying), and so do Gavel's (the LM's corpus on the GPU: steady) and the encoders (BERT and its kin: pre-tokenized
    features of one length), any other model to not known; the job's own
    setting wins, makes its own key and shares the graph; a job without it keeps the key and JSON it had before the
    setting existed."""
    expected = {"ssd300": False, "ncf": False, "gnmt": True, "tacotron2": True, "waveglow": True, "maskrcnn": True,
                "resnet50": None, "bert-base": False, "roberta-base": False, "distilbert-base": False, "gpt2": None,
                "t5-small": None, "gavel-resnet50": True, "gavel-lm": False}
    assert {name: JobSpec.from_options(zoo=name, batch_size=4).steps_vary for name in expected} == expected
    assert JobSpec.from_options(zoo="ssd300", batch_size=4, steps_vary=True).steps_vary is True
    plain = JobSpec(source=ZooSource(name="resnet50"), batch_size=32)
    assert "steps_vary" not in plain.model_dump(mode="json") and plain.key() == "a16c30d7f9094ea4675908cf"
    steady = JobSpec(source=ZooSource(name="resnet50"), batch_size=32, steps_vary=False)
    assert JobSpec.model_validate_json(steady.model_dump_json()) == steady
    assert steady.key() != plain.key() and steady.graph_key() == plain.graph_key()
