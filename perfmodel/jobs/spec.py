"""The job spec: one model source plus how it is run. Shared by the CLI and the HTTP API."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationInfo, field_validator, model_validator

from perfmodel.core.canonical import canonical_sha256, opt_in_flag
from perfmodel.core.errors import PerfmodelError


class Precision(str, Enum):
    """What math a job runs, named for what really runs (`perfmodel.predictor.math_modes` prices each op class):

    - `fp32`: a plain PyTorch fp32 script. Matmuls in fp32 (`torch.backends.cuda.matmul.allow_tf32` defaults to
      False), cuDNN convolutions in TF32 on GPUs that have it (`torch.backends.cudnn.allow_tf32` defaults to True).
    - `fp32-strict`: TF32 off everywhere.
    - `tf32`: matmuls and convolutions in TF32 (`torch.set_float32_matmul_precision("high")`, NGC containers).
    - `amp`: autocast to fp16 (bf16 on CPU), weights and optimizer in fp32, GradScaler.
    - `amp-bf16`: autocast to bf16.
    - `fp16`, `bf16`: the model cast to half precision (`model.half()`): weights, activations and optimizer.
    - `fp16-master`, `bf16-master`: the model cast to half precision, the optimizer stepping an fp32 master copy of
      the weights (apex AMP O2, DeepSpeed's and Megatron-LM's fp16/bf16 training): every activation in half
      precision (softmax and norms included), as `fp16`/`bf16`, with `amp`'s optimizer. `fp16-master` keeps half
      gradients and copies them to fp32 at the step (apex O2, Megatron-LM's fp16); `bf16-master` accumulates the
      gradients in fp32 through backward and all-reduces them in fp32 (`fp32_gradients`: Megatron-LM, which
      requires it for bf16, and FSDP's and torchtitan's reduce in fp32).
    """

    fp32 = "fp32"
    fp32_strict = "fp32-strict"
    tf32 = "tf32"
    amp = "amp"
    amp_bf16 = "amp-bf16"
    fp16 = "fp16"
    bf16 = "bf16"
    fp16_master = "fp16-master"
    bf16_master = "bf16-master"

    @property
    def autocast(self) -> bool:
        return self in (Precision.amp, Precision.amp_bf16)

    @property
    def half_weights(self) -> bool:
        """The module itself is cast to fp16/bf16."""
        return self in (Precision.fp16, Precision.bf16, Precision.fp16_master, Precision.bf16_master)

    @property
    def master_weights(self) -> bool:
        """A half model whose optimizer steps an fp32 master copy of its weights."""
        return self in (Precision.fp16_master, Precision.bf16_master)

    @property
    def fp32_gradients(self) -> bool:
        """A half model whose gradients are accumulated, all-reduced and stepped in fp32 (`bf16-master`): each
        parameter's half gradient is added into a persistent fp32 one as backward produces it."""
        return self is Precision.bf16_master

    @property
    def half_state(self) -> bool:
        """The optimizer steps the half weights themselves, its states in their dtype (`fp16`, `bf16`: no master
        copy)."""
        return self.half_weights and not self.master_weights

    @property
    def half_dtype(self) -> str | None:
        """The half type the job computes in (fp16 or bf16), None for the float32 maths."""
        return _HALF_DTYPES.get(self)

    @property
    def graph_precision(self) -> Precision:
        """The precision of the graph the job runs: float32 unless the model is cast to half (`fp16-master` runs
        the `fp16` graph)."""
        if not self.half_weights:
            return Precision.fp32
        return Precision.fp16 if self.half_dtype == "fp16" else Precision.bf16

    @property
    def twin(self) -> Precision | None:
        """The same half-precision kernels under the other mixed-precision recipe: autocast's per-op casts (`amp`,
        `amp-bf16`) and a half model with fp32 master weights (`fp16-master`, `bf16-master`), each the other's;
        None for the other maths."""
        return _TWINS.get(self)

    @property
    def device_math(self) -> Precision:
        """The precision whose device effects (fleet calibration) a job of this one shares: a master-weight
        precision its autocast twin's (the device runs the same half kernels), every other its own."""
        return _TWINS[self] if self.master_weights else self

    @property
    def family(self) -> str:
        """fp32, fp16, bf16 or amp: what the CPU iteration models (trained before the math modes) know."""
        return {Precision.fp32_strict: "fp32", Precision.tf32: "fp32", Precision.amp_bf16: "amp",
                Precision.fp16_master: "fp16", Precision.bf16_master: "bf16"}.get(self, self.value)


_TWINS = {Precision.fp16_master: Precision.amp, Precision.amp: Precision.fp16_master,
          Precision.bf16_master: Precision.amp_bf16, Precision.amp_bf16: Precision.bf16_master}
_HALF_DTYPES = {Precision.amp: "fp16", Precision.fp16: "fp16", Precision.fp16_master: "fp16",
                Precision.amp_bf16: "bf16", Precision.bf16: "bf16", Precision.bf16_master: "bf16"}


class OptimizerName(str, Enum):
    sgd = "sgd"  # momentum 0.9
    adam = "adam"
    adamw = "adamw"


class Mode(str, Enum):
    train = "train"
    inference = "inference"


class _Source(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# the longest a zoo name may be (the longest known, a timm model's, has 39 characters): a longer one is refused
# before it is looked up, since an unknown name's suggestions compare it with every known name
ZOO_NAME_MAX_CHARS = 200


class ZooSource(_Source):
    kind: Literal["zoo"] = "zoo"
    name: str = Field(max_length=ZOO_NAME_MAX_CHARS,
                      description="a name from `perfmodel zoo list`, or any torchvision or timm image classifier's "
                                  "(`perfmodel zoo list --all`)")
    # left out of the serialised spec when None, so that the keys of specs without a task never change
    task: str | None = Field(
        default=None, exclude_if=lambda task: task is None,
        description="head of a transformers zoo model (the values of hf_config's `task`); default: the model's "
                    "own (`perfmodel zoo show NAME`)",
    )

    @field_validator("task")
    @classmethod
    def _task_fits(cls, task: str | None, info: ValidationInfo) -> str | None:
        if task is None:
            return task
        from perfmodel.jobs.hf import TASK_CLASSES
        from perfmodel.jobs.zoo import find_entry

        if task not in TASK_CLASSES:
            raise ValueError(f"unknown task {task!r}; one of {', '.join(TASK_CLASSES)}")
        entry = find_entry(info.data.get("name", ""))
        if entry is not None and entry.library != "transformers":
            raise ValueError(f"zoo model {entry.name!r} is a {entry.library} model with one head; a task applies "
                             "to transformers zoo models and hf_config")
        return task


class HFConfigSource(_Source):
    kind: Literal["hf_config"] = "hf_config"
    config: dict[str, Any] = Field(description="a Hugging Face config (the content of config.json)")
    task: str | None = Field(
        default=None,
        description="head to build: base, causal-lm, masked-lm, seq2seq-lm, sequence-classification, "
                    "question-answering; "
        "default: the config's `architectures`, else base",
    )

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str | None) -> str | None:
        from perfmodel.jobs.hf import TASK_CLASSES

        if task is not None and task not in TASK_CLASSES:
            raise ValueError(f"unknown task {task!r}; one of {', '.join(TASK_CLASSES)}")
        return task


class ModuleSource(_Source):
    kind: Literal["module"] = "module"
    path: str = Field(description="path/to/file.py:NAME; NAME(batch_size), or NAME(batch_size, seq_len) when it "
                                  "takes a seq_len, returns (module, inputs[, loss_fn]); a training step's loss is "
                                  "loss_fn(module(*inputs)), captured in the job's graph")

    @model_validator(mode="after")
    def _has_callable(self) -> ModuleSource:
        file, sep, name = self.path.rpartition(":")
        if not sep or not file or not name.isidentifier():
            raise ValueError(f"module path must look like path/to/file.py:NAME, got {self.path!r}")
        return self


class OnnxSource(_Source):
    kind: Literal["onnx"] = "onnx"
    path: str = Field(description="path to an .onnx file")


class GraphSource(_Source):
    """A graph IR captured elsewhere (`perfmodel graph --json` on the client's machine): used as is, never
    re-captured. Its shapes are those of the batch it was captured at."""

    kind: Literal["ir"] = "ir"
    graph: dict[str, Any] = Field(description="the graph IR, as `perfmodel graph --json` prints it "
                                              "(`schema_version`, `name`, `source`, `mode`, `nodes`, `totals`, ...)")

    @model_validator(mode="after")
    def _is_graph_ir(self) -> GraphSource:
        self.parsed()  # a graph that does not load is refused here, naming what is wrong
        return self

    def parsed(self) -> Any:
        """The `perfmodel.core.ir.Graph` this IR holds (validated); a ValueError naming the bad field otherwise."""
        from pydantic import ValidationError

        from perfmodel.core.ir import SCHEMA_VERSION, Graph, Node

        version = self.graph.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"graph.schema_version: {version!r} is not supported (expected {SCHEMA_VERSION})")
        data = self.graph
        prefix: tuple[str | int, ...] = ()  # where in the IR a validation error is
        try:
            nodes = data.get("nodes")
            if isinstance(nodes, list) and len(nodes) > _NODE_CHUNK:
                # node by node: no single call holds the GIL for a whole IR (a 30 MB one takes seconds), so other
                # threads (a server's event loop) keep running while it is validated
                validated = []
                for i, node in enumerate(nodes):
                    prefix = ("nodes", i)
                    validated.append(Node.model_validate(node))
                data, prefix = {**data, "nodes": validated}, ()
            return Graph.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in ("graph", *prefix, *first["loc"]))
            more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
            raise ValueError(f"{where}: {first['msg']}{more}") from None


_NODE_CHUNK = 1000  # an IR with more nodes is validated node by node (see `GraphSource.parsed`)

ModelSource = Annotated[
    Union[ZooSource, HFConfigSource, ModuleSource, OnnxSource, GraphSource], Field(discriminator="kind")
]

DEFAULT_SEQ_LEN = 128
# what a transformers model trains with when the job names no optimizer: transformers' Trainer default (adamw_torch)
TRANSFORMERS_OPTIMIZER = "adamw"
_KEY_ATTR = "key_cache__"  # where `JobSpec.key()` keeps its value (not a field)
_GRAPH_KEY_ATTR = "graph_key_cache__"  # and `JobSpec.graph_key()` its own


class JobSpec(BaseModel):
    """What to run: a model source, batch size, sequence length (token models), precision, optimizer, mode."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: ModelSource
    batch_size: PositiveInt = Field(description="samples in one forward/backward pass of one model replica: the "
                                                "batch its graph is captured at (README, \"Batch size\")")
    seq_len: PositiveInt = Field(
        default=DEFAULT_SEQ_LEN,
        description=f"sequence length of token models; default: a zoo model's own (its reference implementation's: "
                    f"audio samples per segment, mel frames, bptt; `perfmodel zoo show NAME`), else {DEFAULT_SEQ_LEN}")
    precision: Precision = Precision.fp32
    optimizer: OptimizerName = Field(
        default=OptimizerName.sgd,
        description="sgd (momentum 0.9), adam or adamw; default: a zoo model's reference optimizer (the one its "
                    "reference implementation trains with; `perfmodel zoo show NAME`), adamw for a transformers "
                    "model (the zoo's and any hf_config, as transformers' Trainer trains), else sgd")
    fused_optimizer: bool = opt_in_flag(
        "the optimizer steps every parameter in one fused kernel (torch.optim's `fused=True`, "
        "transformers' `adamw_torch_fused`, apex's FusedAdam and FusedSGD, DeepSpeed's and Megatron-LM's "
        "fused Adam): it reads the weights, gradients and states once and writes the weights and states "
        "once (Adam: 7 passes over the parameters against torch's default multi-tensor step's 18), and "
        "allocates no temporaries; default: false, torch's default (foreach) implementation")
    mode: Mode = Mode.train
    channels_last: bool = opt_in_flag(
        "the model and its image inputs are in channels-last memory format "
        "(`model.to(memory_format=torch.channels_last)`): cuDNN runs its half-precision convolutions "
        "without the NCHW <-> NHWC transposes a channels-first model pays")
    pytorch_version: str | None = Field(
        default=None, pattern=r"^[0-9]+\.[0-9]+$", exclude_if=lambda version: version is None,
        description="the PyTorch (major.minor) the job trains with, e.g. \"1.4\": an answer is for the newest "
                    "software the whole-step stage learned unless the job names an older one, which it answers "
                    "as much slower as that version ran on the public runs (README, \"Software\"); default: a "
                    "zoo model's reference implementation's (Gavel's jobs: 1.4), else the newest")

    steps_vary: bool | None = Field(
        default=None, exclude_if=lambda vary: vary is None,
        description="whether the job's steps vary in time from one to the next, so that data-parallel replicas "
                    "wait for the slowest every step: true for variable-length batches (bucketed sentences, "
                    "utterances, images of several sizes) or inputs decoded and augmented on the CPU each step "
                    "(DataLoader workers reading audio or images); false for fixed shapes with the input ready on "
                    "the device (decoded there by DALI, or held in GPU memory); default: a zoo model's reference "
                    "implementation's where known (`perfmodel zoo show NAME`), else not known (the average of "
                    "the public multi-GPU runs)")

    @field_validator("pytorch_version", mode="before")
    @classmethod
    def _major_minor(cls, value: Any) -> Any:
        """A full version ("1.4.0", "2.1.2+cu121", "1.4.0a0+a5b4d78") is its major.minor."""
        if isinstance(value, str):
            found = re.fullmatch(r"([0-9]+)\.([0-9]+)(\.[0-9]+)?([.+a-z].*)?", value.strip())
            if not found:
                raise ValueError("expected a PyTorch version, major.minor like 1.4 (or a full one like 1.4.0 or "
                                 "2.1.2+cu121)")
            return f"{int(found[1])}.{int(found[2])}"
        return value

    @model_validator(mode="before")
    @classmethod
    def _zoo_defaults(cls, data: Any) -> Any:
        """A zoo model that trains at its own sequence length gets it when the job names none: WaveGlow's
        8,000-sample segments or Tacotron 2's 850 mel frames asked without `seq_len` are not 128 of them. A zoo
        model with no sequence (an image classifier, a recommender's fixed features) ignores one: the same job
        whatever `seq_len` a scheduler sends with every job. A zoo model with a reference implementation gets its
        optimizer when the job names none (GNMT and Gavel's Transformer train with Adam), its PyTorch version
        where it pins one (Gavel's workloads: 1.4), and whether its steps vary where its reference implementation
        says (`steps_vary`). A transformers model (the zoo's, or any `hf_config`) trains with AdamW when the job
        names no optimizer, as transformers' Trainer and its example scripts do."""
        if not isinstance(data, dict):
            return data
        source = data.get("source")
        if (isinstance(source, HFConfigSource) or (isinstance(source, dict) and source.get("kind") == "hf_config")) \
                and data.get("optimizer") is None:
            return {**data, "optimizer": TRANSFORMERS_OPTIMIZER}
        if isinstance(source, ZooSource):
            name = source.name
        elif isinstance(source, dict) and source.get("kind") == "zoo" and isinstance(source.get("name"), str):
            name = source["name"]
        else:
            return data
        from perfmodel.jobs.zoo import InputKind, find_entry

        entry = find_entry(name)
        if entry is not None and entry.reference_optimizer is not None and data.get("optimizer") is None:
            data = {**data, "optimizer": entry.reference_optimizer}
        if entry is not None and entry.reference_pytorch is not None and data.get("pytorch_version") is None:
            data = {**data, "pytorch_version": entry.reference_pytorch}
        if entry is not None and entry.reference_steps_vary is not None and data.get("steps_vary") is None:
            data = {**data, "steps_vary": entry.reference_steps_vary}
        given = data.get("seq_len")
        valid = given is None or (isinstance(given, int) and not isinstance(given, bool) and given > 0)
        if entry is not None and entry.inputs in (InputKind.image, InputKind.recsys) and valid:
            return {**data, "seq_len": DEFAULT_SEQ_LEN}
        if data.get("seq_len") is not None or entry is None or entry.reference_seq_len is None:
            return data
        return {**data, "seq_len": entry.reference_seq_len}

    @model_validator(mode="after")
    def _ir_mode_matches(self) -> JobSpec:
        if isinstance(self.source, GraphSource):
            captured = self.source.graph.get("mode", "train")
            if captured != self.mode.value:
                raise ValueError(f"mode: the graph IR was captured for {captured!r}, the job says "
                                 f"{self.mode.value!r}")
        return self

    @property
    def name(self) -> str:
        """A short human name: the zoo name, the HF model type, the module callable, the ONNX file name or the
        IR's graph name."""
        src = self.source
        if isinstance(src, ZooSource):
            return src.name
        if isinstance(src, HFConfigSource):
            return f"hf:{src.config.get('model_type', 'model')}"
        if isinstance(src, ModuleSource):
            file, _, function = src.path.rpartition(":")
            return f"module:{Path(file).stem}.{function}"
        if isinstance(src, GraphSource):
            return f"ir:{src.graph.get('name', 'graph')}"
        return f"onnx:{Path(src.path).stem}"

    def key(self) -> str:
        """Stable content hash: equal specs get equal keys (the store uses it to resume sweeps). Computed once
        per spec (an IR source makes it a hash of megabytes); kept outside the fields, so equality ignores it."""
        cached = self.__dict__.get(_KEY_ATTR)
        if cached is None:
            cached = self.__dict__[_KEY_ATTR] = self._content_hash()[:24]
        return cached

    def graph_key(self) -> str:
        """The key of the spec's graph: specs that differ only in what no graph depends on share it. The optimizer
        (fused or not) is priced from the parameter count, the PyTorch version by the whole-step stage, whether
        steps vary by the placement model, and the math of a model whose weights stay float32 (fp32, fp32-strict,
        tf32, amp, amp-bf16) from its float32 graph: only a model cast to half (fp16, bf16, fp16-master,
        bf16-master) has another graph, one per half type."""
        cached = self.__dict__.get(_GRAPH_KEY_ATTR)
        if cached is None:
            update: dict[str, Any] = {"optimizer": OptimizerName.sgd, "fused_optimizer": False,
                                      "pytorch_version": None, "steps_vary": None,
                                      "precision": Precision(self.precision).graph_precision}
            same = all(getattr(self, name) == value for name, value in update.items())
            cached = self.__dict__[_GRAPH_KEY_ATTR] = self.key() if same else self.model_copy(update=update).key()
        return cached

    def _content_hash(self) -> str:
        """sha256 of the canonical JSON of `model_dump(mode="json")`, written in pieces (`core.canonical`). An IR's
        graph is hashed as given: it came from JSON, and dumping it would copy megabytes unchanged in one C call
        that holds the GIL. A graph holding what JSON cannot (TypeError) is dumped first, as any other field."""
        if isinstance(self.source, GraphSource):
            fields = self.model_dump(mode="json", exclude={"source": {"graph"}})
            fields["source"]["graph"] = self.source.graph
            try:
                return canonical_sha256(fields)
            except TypeError:
                pass
        return canonical_sha256(self.model_dump(mode="json"))

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> JobSpec:
        copied = super().model_copy(update=update, deep=deep)
        if update:
            copied.__dict__.pop(_KEY_ATTR, None)  # another spec: its keys are computed afresh
            copied.__dict__.pop(_GRAPH_KEY_ATTR, None)
        return copied

    @classmethod
    def from_options(
        cls,
        *,
        zoo: str | None = None,
        hf_config: str | Path | dict | None = None,
        task: str | None = None,
        module: str | None = None,
        onnx: str | Path | None = None,
        **run: Any,
    ) -> JobSpec:
        """Build a spec from CLI-style options: exactly one model source plus run settings."""
        given = [s for s in (zoo, hf_config, module, onnx) if s is not None]
        if len(given) != 1:
            raise PerfmodelError("give exactly one model source: a zoo name, --hf-config, --module or --onnx")
        if zoo is not None:
            source: Any = ZooSource(name=zoo, task=task)
        elif hf_config is not None:
            source = HFConfigSource(config=load_hf_config(hf_config), task=task)
        elif module is not None:
            source = ModuleSource(path=str(module))
        else:
            source = OnnxSource(path=str(onnx))
        run = {k: v for k, v in run.items() if v is not None}
        return cls(source=source, **run)


def load_hf_config(config: str | Path | dict) -> dict:
    """A config dict, or the path of a config.json (or of a folder holding one)."""
    if isinstance(config, dict):
        return config
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PerfmodelError(f"HF config not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PerfmodelError(f"HF config {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise PerfmodelError(f"HF config {path} has no 'model_type'")
    return data
