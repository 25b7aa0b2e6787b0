"""The frozen encoder as an ONNX graph on ONNX Runtime's CPU (no Ray): exported once per model and
precision, fused by ONNX Runtime's transformer optimizer, optionally dynamic int8, cached under
``cache_folder()``. ``OnnxEncoder(graph)(input_ids, attention_mask)`` is ``last_hidden_state``."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from dhim_ray.errors import EncoderError
from dhim_ray.folders import cache_folder, read_sealed, seal

log = logging.getLogger(__name__)

#: ONNX operator set of the exported graphs.
OPSET = 17


def available() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def graph_key(fingerprint: str, precision: str, weights: str = "", model: torch.nn.Module | None = None) -> str:
    """The cache key of a graph: the encoder's fingerprint, its weights (``weights``: the digest of
    a local folder's weight files, else the bytes of ``model``'s tensors: a model object changed in
    memory is another graph), the precision and the exporting versions."""
    import onnxruntime

    text = f"{fingerprint}|{precision}|torch={torch.__version__}|ort={onnxruntime.__version__}|opset={OPSET}"
    digest = hashlib.sha256(text.encode())
    if weights:
        digest.update(f"|files={weights}".encode())
    else:
        for name, tensor in model.state_dict().items():
            digest.update(name.encode() + b"\0")
            digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:20]


def graph_path(key: str, folder: Path | None = None) -> Path:
    """Where the graph of ``key`` is cached."""
    return (folder or cache_folder()) / f"encoder-{key}.onnx"


def cached_graph(key: str, folder: Path | None = None) -> Path | None:
    """The cached graph of ``key`` (present; verified when read), or None."""
    path = graph_path(key, folder)
    return path if path.is_file() else None


class CachedGraph(NamedTuple):
    path: Path  # where it was read from (a temporary one is gone by now)
    data: bytes  # the graph, verified against its seal


class _LastHidden(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


@contextlib.contextmanager
def eager_attention(model: torch.nn.Module):
    """The model with its plain (eager) attention while inside: the form ONNX Runtime's
    optimizer recognises and fuses into one Attention operator per layer."""
    before = getattr(model.config, "_attn_implementation", None)
    setter = getattr(model, "set_attn_implementation", None)
    try:
        if setter is not None and before not in (None, "eager"):
            setter("eager")
        yield model
    finally:
        if setter is not None and before not in (None, "eager"):
            setter(before)


def export_graph(module: torch.nn.Module, encoder: torch.nn.Module, path: Path, output: str,
                 output_axes: dict[int, str]) -> None:
    """Write ``module`` (input_ids, attention_mask -> ``output``) as an ONNX graph, the batch and
    token axes dynamic, with ``encoder`` (the transformer inside it) in eager attention."""
    ids = torch.ones(2, 16, dtype=torch.long)
    axes = {"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"}, output: output_axes}
    with eager_attention(encoder), warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (ids, torch.ones_like(ids)), str(path), input_names=["input_ids", "attention_mask"],
                          output_names=[output], dynamic_axes=axes, opset_version=OPSET, dynamo=False)


def export_encoder(model: torch.nn.Module, path: Path) -> None:
    """Write ``model`` (input_ids, attention_mask -> last hidden layer) as an ONNX graph."""
    export_graph(_LastHidden(model), model, path, "hidden", {0: "batch", 1: "tokens"})


def optimise(path: Path, config) -> None:
    """Fuse attention, skip-layer-norms and GELUs in place (BERT-family graphs); a graph the
    optimizer does not know is left as exported."""
    heads = getattr(config, "num_attention_heads", None)
    if heads is None or getattr(config, "model_type", "") not in ("bert", "distilbert", "roberta", "xlm-roberta",
                                                                   "mpnet", "electra", "albert"):
        return
    from onnxruntime.transformers.optimizer import optimize_model

    with _quiet_logging():  # the optimizer logs each fusion at INFO on its own module loggers
        optimised = optimize_model(str(path), model_type="bert", num_heads=int(heads),
                                   hidden_size=int(config.hidden_size), opt_level=1)
        optimised.save_model_to_file(str(path))


def quantise_int8(source: Path, target: Path) -> None:
    """Dynamic int8 quantisation of every MatMul's weights (activations quantised per batch)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet_logging():  # its advice to pre-process is logged on the root logger
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})


@contextlib.contextmanager
def _quiet_logging():
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def encoder_graph(load_model: Callable[[], torch.nn.Module], key: str, precision: str = "fp32",
                  folder: Path | None = None) -> CachedGraph:
    """The ONNX graph of the model ``load_model`` gives, at ``precision`` ("fp32" or "int8"), by
    its ``graph_key``: read from the cache where its seal matches, else exported (a few seconds,
    once per model and machine) and sealed. A cache that cannot be written exports for this run only."""
    if precision not in ("fp32", "int8"):
        raise EncoderError(f"precision={precision!r}: the ONNX backend runs fp32 or int8", field="precision")
    folder = folder or cache_folder()
    path = graph_path(key, folder)
    data = read_sealed(path, key) if path.is_file() else None
    if data is not None:
        return CachedGraph(path, data)
    if path.exists():
        log.warning("%s does not match the digest it was cached with: exporting it again", path)
    model = load_model()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".export-", dir=folder))
    except OSError as exc:
        log.warning("the cache folder %s cannot be written (%s): the encoder is exported for this run only; "
                    "fix it or set DHIM_RAY_CACHE", folder, exc.strerror or exc)
        work = Path(tempfile.mkdtemp(prefix="dhim-ray-onnx-"))
        path = work / path.name
    log.info("exporting the encoder to ONNX (once per model and machine): %s", path)
    fp32 = work / "fp32.onnx"
    export_encoder(model, fp32)
    optimise(fp32, model.config)
    made = fp32
    if precision == "int8":
        made = work / "int8.onnx"
        quantise_int8(fp32, made)
    os.replace(made, path)  # atomic: a concurrent export of the same graph writes the same bytes
    seal(path, key)
    data = read_sealed(path, key)
    shutil.rmtree(work, ignore_errors=True)  # the temporary-folder case: the graph too, now read
    if data is None:
        raise EncoderError(f"{path}: the exported encoder graph does not read back as written; check the disk, or "
                           "set DHIM_RAY_CACHE to another folder")
    return CachedGraph(path, data)


class OnnxEncoder:
    """An ONNX Runtime session of an exported encoder graph on the CPU."""

    def __init__(self, graph: CachedGraph, threads: int | None = None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        self.graph = graph.path
        self.session = ort.InferenceSession(graph.data, options, providers=["CPUExecutionProvider"])

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """(B, W) int64 ids and mask -> (B, W, H) float32 last hidden layer."""
        return self.session.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})[0]
