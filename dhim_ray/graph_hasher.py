"""A model's codes from its ONNX graph with no torch: what a one-shot search loads. The graph is
made once per model and machine in the cache folder; where it cannot stand in for the model
(another precision than fp32, no tokenizer.json) ``load_query_hasher`` gives the torch Hasher.

    >>> load_query_hasher("runs/bbc-64").encode(["oil prices rise"])   # uint8 (1, 8)"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dhim_ray.codes import TextHasher
from dhim_ray.corpus.text import check_texts
from dhim_ray.errors import DHIMRayError, first_line
from dhim_ray.folders import cache_folder, read_sealed, seal
from dhim_ray.model.checkpoint import WEIGHTS_FILE, CheckpointInfo, file_sha256, read_checkpoint, verify_weights

if TYPE_CHECKING:
    from dhim_ray.hasher import Encoded, Hasher

log = logging.getLogger(__name__)

#: Bumped when what a cached query graph holds changes: older graphs are then made again.
GRAPH_FORMAT = 2  # 2: each file sealed with its digest
GRAPH, SPEC, TOKENIZER = "model.onnx", "model.json", "tokenizer.json"


def graph_folder(info: CheckpointInfo, ort_version: str, folder: Path | None = None) -> Path:
    """Where the query graph of the checkpoint ``info`` is cached: keyed by its weights, the
    encoder it was trained on, ONNX Runtime's version and the graph format."""
    weights = info.weights_sha256 or file_sha256(info.path / WEIGHTS_FILE)
    text = f"{weights}|{info.encoder_fingerprint}|ort={ort_version}|format={GRAPH_FORMAT}"
    return (folder or cache_folder()) / f"query-{hashlib.sha256(text.encode()).hexdigest()[:20]}"


def _verified(folder: Path) -> dict[str, bytes] | None:
    """The query graph's files where each matches its seal (under the folder's key); else None."""
    files = {name: read_sealed(folder / name, folder.name) for name in (GRAPH, SPEC, TOKENIZER)}
    return None if None in files.values() else files


def query_graph(info: CheckpointInfo, ort_version: str) -> dict[str, bytes]:
    """The query graph of ``info``'s files, verified: exported (with torch) and sealed where it is
    not cached yet, or not as it was written (said once, and made again); written under a
    temporary name and renamed when whole."""
    target = graph_folder(info, ort_version)
    files = _verified(target) if target.is_dir() else None
    if files is not None:
        return files
    from dhim_ray.export import export_codes_graph

    if target.exists():
        log.warning("%s does not match the digests it was cached with: making it again", target)
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    log.debug("preparing %s for searches without torch (once per model and machine)", info.path)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".query-", dir=target.parent))
    try:
        export_codes_graph(info.path, work / GRAPH)
        if not (work / TOKENIZER).is_file():
            raise ValueError("its tokenizer has no tokenizer.json")
        for name in (GRAPH, SPEC, TOKENIZER):
            seal(work / name, target.name)
        with contextlib.suppress(OSError):  # another process cached the same graph first: theirs is verified
            os.rename(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    files = _verified(target)
    if files is None:
        raise DHIMRayError(f"{target}: the query graph does not read back as written; check the disk, or set "
                           "DHIM_RAY_CACHE to another folder")
    return files


class GraphHasher(TextHasher):
    """Text -> packed codes through a model's query graph (ONNX Runtime and ``tokenizers``):
    ``Hasher.encode``'s codes. Pre-threshold scores and sentence vectors, which only the torch
    model gives, load the ``Hasher`` on first use."""

    def __init__(self, files: dict[str, bytes], info: CheckpointInfo):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        spec = json.loads(files[SPEC])
        self.info, self.config = info, info.config
        options = ort.SessionOptions()
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(files[GRAPH], options, providers=["CPUExecutionProvider"])
        self.tokenizer = Tokenizer.from_str(files[TOKENIZER].decode())
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(int(spec["max_tokens"]))
        self.pad_id = int(spec["pad_id"])
        self._hasher: Hasher | None = None

    @property
    def model_id(self) -> str:
        return self.info.model_id

    @property
    def hasher(self) -> Hasher:
        """The torch ``Hasher`` of the same model, loaded on first use."""
        if self._hasher is None:
            from dhim_ray.hasher import Hasher

            self._hasher = Hasher.load(self.info.path)
        return self._hasher

    def encode(self, texts: list[str] | str, batch_size: int = 64, progress: bool = False, scores: bool = False,
               vectors: bool = False, prepared: bool = False) -> np.ndarray | Encoded:
        """Texts -> packed codes, uint8 (n, n_bits // 8), as ``Hasher.encode``; with ``scores``
        or ``vectors``, the ``Hasher``'s ``Encoded``."""
        if scores or vectors:
            return self.hasher.encode(texts, batch_size, progress, scores, vectors, prepared)
        texts = [texts] if isinstance(texts, str) else texts
        if not prepared:
            texts = check_texts(texts, self.config.features)
        codes = np.empty((len(texts), self.n_bytes), dtype=np.uint8)
        for start in range(0, len(texts), batch_size):
            ids = [e.ids for e in self.tokenizer.encode_batch(texts[start : start + batch_size])]
            input_ids = np.full((len(ids), max(map(len, ids))), self.pad_id, dtype=np.int64)
            mask = np.zeros_like(input_ids)
            for row, doc in enumerate(ids):
                input_ids[row, : len(doc)], mask[row, : len(doc)] = doc, 1
            feeds = {"input_ids": input_ids, "attention_mask": mask}
            codes[start : start + len(ids)] = self.session.run(None, feeds)[0]
        return codes


def load_query_hasher(model_dir: str | Path) -> GraphHasher | Hasher:
    """The model at ``model_dir`` as a ``GraphHasher`` where its graph can stand in for it, else
    its ``Hasher``. The checkpoint is checked as ``Hasher.load`` checks it, and refused alike."""
    info = read_checkpoint(model_dir)
    verify_weights(info)
    if info.config.features.precision == "fp32":
        try:
            import onnxruntime

            return GraphHasher(query_graph(info, onnxruntime.__version__), info)
        except DHIMRayError:
            raise
        except Exception as exc:  # an encoder the exporter cannot trace, a slow tokenizer: torch runs it
            log.warning("%s: hashing with torch (no query graph: %s)", model_dir, first_line(exc))
    from dhim_ray.hasher import Hasher

    return Hasher.load(model_dir)
