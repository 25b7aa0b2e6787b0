"""One root exception with narrow subclasses; each message is one line: what was given, what was
expected, how to fix it. Messages name the Python parameter (``n_bits=100: ...``) and carry it as
``exc.field``: the CLI writes its flag instead (``--bits 100``), the HTTP service the JSON field."""

from __future__ import annotations

from typing import Any


class DHIMRayError(Exception):
    """Root of every error dhim-ray raises on purpose."""

    #: True when retrying the same call later may succeed (network, locks).
    retriable: bool = False

    def __init__(self, *args: Any, field: str | None = None):
        super().__init__(*args)
        #: The parameter (request field) the error is about, where it is about one.
        self.field = field


class ConfigError(DHIMRayError, ValueError):
    """A setting is out of range (bit length, batch size, workers, ...)."""


class DataError(DHIMRayError, ValueError):
    """A corpus cannot be used: empty, bad rows, missing column or split."""


class UnknownDatasetError(DataError):
    """The corpus name is neither a preset, a local path nor a hub id."""


class HubUnreachableError(DataError):
    """The Hugging Face hub cannot be reached and nothing is cached."""

    retriable = True


class CheckpointError(DHIMRayError):
    """A checkpoint folder is missing, incomplete, corrupt or incompatible."""


class EncoderMismatchError(CheckpointError):
    """The encoder loaded does not match the one a checkpoint was trained on."""


class CodeFormatError(DHIMRayError, ValueError):
    """Packed codes have the wrong dtype, shape or width."""


class StoreError(DHIMRayError):
    """A vector store refused or failed an operation."""


class StoreBusyError(StoreError):
    """A milvus-lite file is open in another process."""

    retriable = True


class StoreUnreachableError(StoreError):
    """The vector store cannot be reached."""

    retriable = True


class StoreReadOnlyError(StoreError):
    """A milvus-lite file, or the folder it is to be made in, cannot be written (a read-only mount)."""

    retriable = True


class NoSpaceError(StoreError):
    """The disk holding a milvus-lite file is full."""

    retriable = True


class CollectionMismatchError(StoreError):
    """An existing collection has another code width, metric or model."""


class ClusterError(DHIMRayError):
    """The Ray cluster cannot be started or joined, or lacks what was asked (GPUs)."""

    retriable = True


class Interrupted(DHIMRayError):
    """Work stopped by Ctrl-C; the message says what was kept (the CLI exits 130)."""


class TrainingInterrupted(Interrupted):
    """Training was stopped (Ctrl-C); the message says what was kept and how to resume."""


class IngestInterrupted(Interrupted):
    """Ingest was stopped (Ctrl-C); rerunning the same ingest completes it."""


class TrainingFailed(DHIMRayError):
    """A training run failed on its workers; the message names the run folder."""


class EncoderError(DHIMRayError):
    """The encoder model cannot be found or loaded."""


class EncoderUnreachableError(EncoderError):
    """The encoder is a hub id and the Hugging Face hub cannot be reached (nothing cached)."""

    retriable = True


def first_line(exc: BaseException | None, limit: int = 200) -> str:
    """An exception's message in one line for another message: its first line (Milvus' own
    ``message`` where it has one), at most ``limit`` characters; its class name where it says nothing."""
    text = str(getattr(exc, "message", None) or exc).strip() if exc is not None else ""
    return text.splitlines()[0][:limit] if text else type(exc).__name__


def is_whole(value: Any) -> bool:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_range(name: str, value: Any, low: int, high: int, example: Any = None, low_means: str = "") -> None:
    """A ConfigError unless ``value`` is a whole number from ``low`` to ``high``, naming the field."""
    if not is_whole(value) or not low <= value <= high:
        low_text = f"{low} ({low_means})" if low_means else f"{low}"
        raise ConfigError(f"{name}={value}: must be between {low_text} and {high}"
                          + (f", e.g. {example}" if example is not None else ""), field=name)
