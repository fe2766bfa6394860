"""Build a job's PyTorch module, example inputs and loss on a device (a real one, or `meta` for graph capture)."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from perfmodel.compat import ensure_torchvision
from perfmodel.core.errors import JobLoadError, PerfmodelError
from perfmodel.jobs import custom
from perfmodel.jobs.hf import build_hf_model
from perfmodel.jobs.spec import (
    DEFAULT_SEQ_LEN,
    GraphSource,
    HFConfigSource,
    JobSpec,
    ModuleSource,
    OnnxSource,
    Precision,
    ZooSource,
)
from perfmodel.jobs.zoo import InputKind, build_model, get_entry
from perfmodel.torch_device import resolve_device

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}  # a half model's dtype, by `Precision.half_dtype`


@dataclass(frozen=True)
class BuiltJob:
    """A job ready to run: `loss_fn(module(*args, **kwargs))` is one training step's loss. `own_loss`: the loss
    is the job's own (a user module's `loss_fn`), part of the step's graph; otherwise it is `mean_loss`, a
    stand-in the graph leaves out."""

    spec: JobSpec
    module: nn.Module
    args: tuple
    kwargs: Mapping[str, Any]
    loss_fn: Callable[[Any], torch.Tensor] = field(repr=False)
    family: str
    device: torch.device
    own_loss: bool = False

    def forward(self) -> Any:
        return self.module(*self.args, **self.kwargs)

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast_context(self.spec.precision, self.device)


# TF32 switches per precision: (matmul, cuDNN); None keeps PyTorch's defaults (matmul off, cuDNN on)
_TF32 = {Precision.fp32_strict: (False, False), Precision.tf32: (True, True)}


@contextlib.contextmanager
def _tf32(matmul: bool, cudnn: bool) -> Any:
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def autocast_context(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager:
    """The math a precision names, while a step runs: autocast for `amp` (fp16 on CUDA/ROCm, bf16 on CPU) and
    `amp-bf16`; the TF32 switches for `tf32` (on) and `fp32-strict` (off); nothing for the others."""
    if device.type == "meta":
        return contextlib.nullcontext()
    if precision in _TF32:
        return _tf32(*_TF32[precision])
    if not precision.autocast:
        return contextlib.nullcontext()
    half = precision == Precision.amp and device.type == "cuda"
    return torch.autocast(device_type=device.type, dtype=torch.float16 if half else torch.bfloat16)


def first_tensor(output: Any) -> torch.Tensor:
    """The tensor a default loss reduces: the output itself, HF `logits`, or the first tensor inside."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    values = output.values() if isinstance(output, Mapping) else output if isinstance(output, Sequence) else ()
    for value in values:
        try:
            return first_tensor(value)
        except TypeError:
            continue
    raise TypeError(f"model output of type {type(output).__name__} holds no tensor")


def mean_loss(output: Any) -> torch.Tensor:
    return first_tensor(output).float().mean()


def build_job(spec: JobSpec, device: str | torch.device = "cpu", seed: int = 0) -> BuiltJob:
    """Build the module (in train or eval mode as the spec says), inputs and loss on `device`."""
    device = resolve_device(device)
    source = spec.source
    if isinstance(source, OnnxSource):
        raise PerfmodelError("an ONNX job has no PyTorch module: its graph and timings come from ONNX Runtime")
    if isinstance(source, GraphSource):
        raise PerfmodelError("an IR job has no module to build: it holds only its graph (predict it, not profile it)")
    torch.manual_seed(seed)
    loss_fn: Callable[[Any], torch.Tensor] = mean_loss
    user_loss: Callable[[Any], torch.Tensor] | None = None
    build_device = device
    if isinstance(source, ZooSource) and device.type == "meta" and not get_entry(source.name).builds_on_meta:
        build_device = torch.device("cpu")
    with torch.device(build_device):
        if isinstance(source, ZooSource):
            entry = get_entry(source.name)
            module = build_model(entry, source.task)
            if entry.make_inputs is not None:
                args, kwargs = entry.make_inputs(module, spec.batch_size, spec.seq_len)
            else:
                args, kwargs = _zoo_inputs(entry.inputs, module, spec, entry.image_size)
            family = entry.family
        elif isinstance(source, HFConfigSource):
            module = build_hf_model(source.config, source.task)
            kind = InputKind.seq2seq if module.config.is_encoder_decoder else InputKind.tokens
            args, kwargs = _zoo_inputs(kind, module, spec, 224)
            family = f"hf:{source.config.get('model_type')}"
        else:
            assert isinstance(source, ModuleSource)
            module, args, kwargs, user_loss = load_user_module(source.path, spec.batch_size, spec.seq_len)
            loss_fn = user_loss or mean_loss
            family = f"module:{source.path}"
    module = module.to(device)
    args = tuple(_to(a, device) for a in args)
    kwargs = {k: _to(v, device) for k, v in kwargs.items()}
    dtype = _DTYPES.get(spec.precision.half_dtype or "") if spec.precision.half_weights else None
    if dtype is not None:
        module = module.to(dtype)
        args = tuple(_cast_float(a, dtype) for a in args)
        kwargs = {k: _cast_float(v, dtype) for k, v in kwargs.items()}
    if spec.channels_last:  # as a channels-last training script converts them; other tensors keep their layout
        module = module.to(memory_format=torch.channels_last)
        args = tuple(_channels_last(a) for a in args)
        kwargs = {k: _channels_last(v) for k, v in kwargs.items()}
    module.train(spec.mode.value == "train")
    return BuiltJob(spec, module, args, kwargs, loss_fn, family, device, own_loss=user_loss is not None)


def _zoo_inputs(kind: InputKind, module: nn.Module, spec: JobSpec, image_size: int) -> tuple[tuple, dict]:
    b, s = spec.batch_size, spec.seq_len
    if kind == InputKind.image:
        return (torch.randn(b, 3, image_size, image_size),), {}
    if kind == InputKind.recsys:
        dense = torch.randn(b, custom.RECSYS_DENSE_FEATURES)
        sparse = torch.randint(0, custom.RECSYS_ROWS_PER_TABLE, (b, custom.RECSYS_SPARSE_FEATURES))
        return (dense, sparse), {}
    if kind == InputKind.rnn_tokens:
        return (torch.randint(0, custom.RNN_VOCAB_SIZE, (b, s)),), {}
    config: Any = module.config  # a transformers config: its fields are read by name
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if limit is not None and s > limit:
        raise PerfmodelError(f"seq_len {s} exceeds the model's max_position_embeddings {limit}")
    vocab = int(config.vocab_size)
    ids = torch.randint(0, vocab, (b, s))
    if kind == InputKind.seq2seq:
        return (), {"input_ids": ids, "decoder_input_ids": torch.randint(0, vocab, (b, s))}
    return (), {"input_ids": ids}


def _to(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _channels_last(value: Any) -> Any:
    """A 4-D floating tensor (an image batch) in channels-last memory format; anything else as it is."""
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() == 4:
        return value.contiguous(memory_format=torch.channels_last)
    return value


def _cast_float(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    return value


def load_user_module(path: str, batch_size: int,
                     seq_len: int | None = None) -> tuple[nn.Module, tuple, dict, Callable | None]:
    """Import `file.py:NAME` and call NAME(batch_size) -> (module, inputs[, loss_fn]); a builder that takes a
    sequence length (a parameter named `seq_len`, or a second positional parameter without a default) is called
    NAME(batch_size, seq_len) with `seq_len` (DEFAULT_SEQ_LEN when None). A `seq_len` other than the default for a
    builder that cannot take one is refused (it would be silently ignored). Inputs: a tensor, a tuple of positional
    inputs, or a dict of keyword inputs. torchvision (and timm, transformers: what imports it) is made importable
    first, as for zoo models (`perfmodel.compat`). Any failure is a JobLoadError naming the file."""
    file, _, name = path.rpartition(":")
    file_path = Path(file)
    if not file_path.is_file():
        raise JobLoadError(f"module file not found: {file_path}")
    ensure_torchvision()  # a CUDA torchvision wheel next to the CPU torch: importable only after this
    module_name = f"perfmodel_user_{uuid.uuid4().hex[:8]}"
    try:
        import_spec = importlib.util.spec_from_file_location(module_name, file_path)
        if import_spec is None or import_spec.loader is None:
            raise ImportError("not a Python file")
        user = importlib.util.module_from_spec(import_spec)
        sys.modules[module_name] = user
        import_spec.loader.exec_module(user)
        factory = getattr(user, name, None)
    except Exception as exc:  # user code: anything it raises is bad input, reported in one line
        sys.modules.pop(module_name, None)
        raise JobLoadError(f"could not load {path}: {type(exc).__name__}: {exc}") from None
    if factory is None or not callable(factory):
        sys.modules.pop(module_name, None)
        defined = [key for key, value in vars(user).items()
                   if callable(value) and getattr(value, "__module__", None) == module_name]
        kind = type(factory).__name__
        what = (f"defines no {name!r}" if factory is None else
                f"defines {name!r} as {'an' if kind[0] in 'aeiou' else 'a'} {kind}, not a function")
        raise JobLoadError(f"{file_path} {what}; the functions and classes it defines: {', '.join(defined) or 'none'}")
    try:
        how = _seq_len_call(factory)
        length = DEFAULT_SEQ_LEN if seq_len is None else seq_len
        if how is None and length != DEFAULT_SEQ_LEN:
            raise JobLoadError(f"{path}: seq_len {length} was given, but {name}(batch_size) takes no seq_len; "
                               f"define {name}(batch_size, seq_len) to build the model at a sequence length")
        try:
            if how == "keyword":
                result = factory(batch_size, seq_len=length)
            elif how == "positional":
                result = factory(batch_size, length)
            else:
                result = factory(batch_size)
        except Exception as exc:  # user code: anything it raises is bad input, reported in one line
            raise JobLoadError(f"could not load {path}: {type(exc).__name__}: {exc}") from None
    finally:
        sys.modules.pop(module_name, None)
    if not isinstance(result, tuple) or len(result) not in (2, 3) or not isinstance(result[0], nn.Module):
        raise JobLoadError(f"{path} must return (module, example_inputs) or (module, example_inputs, loss_fn)")
    module, inputs = result[0], result[1]
    loss_fn = result[2] if len(result) == 3 else None
    if loss_fn is not None and not callable(loss_fn):
        raise JobLoadError(f"{path}: loss_fn is not callable")
    if isinstance(inputs, torch.Tensor):
        return module, (inputs,), {}, loss_fn
    if isinstance(inputs, Mapping):
        return module, (), dict(inputs), loss_fn
    if isinstance(inputs, (tuple, list)):
        return module, tuple(inputs), {}, loss_fn
    raise JobLoadError(f"{path}: example_inputs must be a tensor, a tuple of tensors or a dict")


def _seq_len_call(factory: Any) -> str | None:
    """How a builder takes the sequence length: "keyword" (a `seq_len` parameter, or **kwargs), "positional" (a
    second positional parameter without a default, or *args) or None (it takes only the batch size). A second
    parameter with a default and another name (`make(batch_size, hidden=256)`) is not taken for a length."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # no signature to read (a builtin): called with the batch size only
        return None
    params = list(signature.parameters.values())
    named = signature.parameters.get("seq_len")
    if named is not None and named.kind not in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL,
                                                inspect.Parameter.VAR_KEYWORD):
        return "keyword"
    positional = [p for p in params
                  if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 2 and (positional[1].default is inspect.Parameter.empty or positional[1].name == "seq_len"):
        return "positional"
    if len(positional) <= 1 and any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params):
        return "positional"
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
        return "keyword"
    return None
