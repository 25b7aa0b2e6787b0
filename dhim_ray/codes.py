"""The one code format: ``np.uint8`` of shape (n, n_bits // 8), bits packed
most-significant first (``np.packbits(bits, axis=1)``), as Milvus BINARY_VECTOR
takes them (``codes[i].tobytes()``)."""

from __future__ import annotations

import numpy as np

from dhim_ray.errors import CodeFormatError

MIN_BITS, MAX_BITS = 8, 1024


def check_n_bits(n_bits: int, what: str = "n_bits") -> int:
    """Validate a code width; return it. Raises ConfigError naming the fix."""
    from dhim_ray.errors import ConfigError

    if isinstance(n_bits, bool) or not isinstance(n_bits, (int, np.integer)):
        raise ConfigError(f"{what}={n_bits!r}: must be an integer, e.g. 64")
    if n_bits % 8 or not MIN_BITS <= n_bits <= MAX_BITS:
        raise ConfigError(
            f"{what}={n_bits}: must be a multiple of 8 between {MIN_BITS} and {MAX_BITS}, e.g. 32, 64 or 128"
        )
    return int(n_bits)


def pack_codes(bits: np.ndarray) -> np.ndarray:
    """0/1 (or bool) array (n, n_bits) -> packed uint8 (n, n_bits // 8)."""
    bits = np.asarray(bits)
    if bits.ndim != 2 or bits.shape[1] % 8:
        raise CodeFormatError(
            f"bits of shape {bits.shape}: expected (n, n_bits) with n_bits a multiple of 8"
        )
    return np.packbits(bits.astype(bool), axis=1)


def unpack_codes(codes: np.ndarray, n_bits: int | None = None) -> np.ndarray:
    """Packed uint8 (n, n_bytes) -> uint8 0/1 array (n, n_bits)."""
    codes = check_codes(codes, n_bits)
    return np.unpackbits(codes, axis=1)


def check_codes(codes: np.ndarray, n_bits: int | None = None) -> np.ndarray:
    """Return ``codes`` if it is packed uint8 (n, n_bits // 8); raise CodeFormatError otherwise.

    Every writer calls this before anything leaves the process: milvus-lite stores
    wrong-length codes silently and shifts every later row of the batch.
    """
    if not isinstance(codes, np.ndarray):
        raise CodeFormatError(
            f"codes of type {type(codes).__name__}: expected a numpy uint8 array (n, n_bits/8) "
            "from encode() or pack_codes()"
        )
    if codes.dtype != np.uint8:
        raise CodeFormatError(
            f"codes of dtype {codes.dtype}: expected uint8 packed bits; use pack_codes(bits) on 0/1 arrays"
        )
    if codes.ndim != 2:
        raise CodeFormatError(f"codes of shape {codes.shape}: expected 2-D (n, n_bits/8)")
    if n_bits is not None and codes.shape[1] * 8 != n_bits:
        raise CodeFormatError(
            f"codes of {codes.shape[1] * 8} bits ({codes.shape[1]} bytes): expected {n_bits} bits "
            f"({n_bits // 8} bytes); encode with a model of {n_bits} bits"
        )
    return codes


def hamming(a: np.ndarray | bytes, b: np.ndarray | bytes) -> int:
    """The Hamming distance between two packed codes (arrays of uint8, or their bytes)."""
    a, b = (np.frombuffer(x, np.uint8) if isinstance(x, (bytes, bytearray)) else x for x in (a, b))
    return int(np.bitwise_count(a ^ b).sum())


def codes_to_bytes(codes: np.ndarray, n_bits: int | None = None) -> list[bytes]:
    """Packed codes -> one ``bytes`` per row, the form Milvus BINARY_VECTOR takes."""
    codes = check_codes(codes, n_bits)
    return [row.tobytes() for row in codes]


def bytes_to_codes(rows: list[bytes], n_bits: int) -> np.ndarray:
    """Inverse of :func:`codes_to_bytes`; checks every row's length."""
    n_bytes = n_bits // 8
    for i, row in enumerate(rows):
        if not isinstance(row, (bytes, bytearray)) or len(row) != n_bytes:
            size = len(row) if hasattr(row, "__len__") else "?"
            raise CodeFormatError(f"code {i} has {size} bytes: expected {n_bytes} for {n_bits} bits")
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), n_bytes).copy()


class TextHasher:
    """What every text-to-codes hasher shares (``Hasher``, ``GraphHasher``): the code width from
    its ``config`` (a DHIMConfig) and ``encode_bytes`` over its ``encode``."""

    @property
    def n_bits(self) -> int:
        return self.config.model.n_bits

    @property
    def n_bytes(self) -> int:
        return self.n_bits // 8

    def encode_bytes(self, texts: list[str] | str, batch_size: int = 64) -> list[bytes]:
        """Texts -> one ``bytes`` per text, ready for Milvus BINARY_VECTOR search or insert."""
        return codes_to_bytes(self.encode(texts, batch_size), self.n_bits)
