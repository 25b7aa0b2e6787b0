"""Classic unsupervised hashing on the same frozen sentence vectors (numpy; whitening through
dhim_ray.encoding.transforms), and the float references (``FLOAT_BASELINES``, cosine kNN).
Each is fitted on the database's vectors; whitening-sign gives pca-sign's bits, kept under
the literature's name."""

from __future__ import annotations

import numpy as np

from dhim_ray.codes import check_n_bits, pack_codes
from dhim_ray.errors import ConfigError

BASELINES = ("lsh", "pca-sign", "pca-median", "itq", "whitening-sign", "ubinary")
FLOAT_BASELINES = {"cosine": None, "whitening-cosine": "whitening"}
"""The unhashed references: exact cosine kNN on the float sentence vectors, as they are or
after a transform (dhim_ray.encoding.transforms) fitted on the database; name -> transform."""


def check_baseline(name: str) -> None:
    """A hashing or a float baseline's name, or a ConfigError listing them all."""
    if name not in BASELINES and name not in FLOAT_BASELINES:
        raise ConfigError(f"baseline={name!r}: choose one of {', '.join((*BASELINES, *FLOAT_BASELINES))}", field="baseline")


class Baseline:
    name = ""

    def __init__(self, n_bits: int, seed: int = 0):
        self.n_bits = check_n_bits(n_bits)
        self.seed = seed
        self.mean: np.ndarray | None = None

    def fit(self, vectors: np.ndarray) -> Baseline:
        raise NotImplementedError

    def project(self, vectors: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def hash(self, vectors: np.ndarray) -> np.ndarray:
        """Vectors (n, d) -> packed codes (n, n_bits // 8)."""
        if self.mean is None:
            raise ConfigError(f"{self.name}: call fit(database_vectors) before hash()")
        return pack_codes(self.bits(vectors))

    def bits(self, vectors: np.ndarray) -> np.ndarray:
        return self.project(vectors) > 0

    def _pca(self, vectors: np.ndarray) -> np.ndarray:
        x = np.asarray(vectors, dtype=np.float64)
        if self.n_bits > min(x.shape):
            raise ConfigError(
                f"n_bits={self.n_bits}: {self.name} needs at most min(documents, dims) = {min(x.shape)} bits "
                f"for these features; give more documents"
                + (f" or use n_bits={8 * (min(x.shape) // 8)} or less" if min(x.shape) >= 8 else "")
                + ("" if self.name == "lsh" else ", or baseline=lsh"), field="n_bits"
            )
        self.mean = x.mean(axis=0)
        # Principal axes by the covariance's eigenvectors, largest variance first.
        cov = np.cov(x - self.mean, rowvar=False)
        values, vectors_ = np.linalg.eigh(cov)
        order = np.argsort(values)[::-1][: self.n_bits]
        return vectors_[:, order]  # (d, n_bits)


class LSH(Baseline):
    """Random Gaussian projection of centred vectors, then sign (Charikar 2002)."""

    name = "lsh"

    def fit(self, vectors):
        x = np.asarray(vectors, dtype=np.float64)
        self.mean = x.mean(axis=0)
        self.w = np.random.default_rng(self.seed).standard_normal((x.shape[1], self.n_bits))
        return self

    def project(self, vectors):
        return (np.asarray(vectors, dtype=np.float64) - self.mean) @ self.w


class PCASign(Baseline):
    """Top principal components, sign; identical bits to BERT-whitening + sign."""

    name = "pca-sign"

    def fit(self, vectors):
        self.w = self._pca(vectors)
        return self

    def project(self, vectors):
        return (np.asarray(vectors, dtype=np.float64) - self.mean) @ self.w


class PCAMedian(PCASign):
    """Top principal components thresholded at the database median (balanced bits)."""

    name = "pca-median"

    def fit(self, vectors):
        super().fit(vectors)
        self.median = np.median(super().project(vectors), axis=0)
        return self

    def project(self, vectors):
        return super().project(vectors) - self.median


class ITQ(PCASign):
    """Iterative quantisation (Gong & Lazebnik 2011): PCA, then the rotation that
    minimises the quantisation error to the hypercube vertices."""

    name = "itq"

    def __init__(self, n_bits: int, seed: int = 0, n_iter: int = 50):
        super().__init__(n_bits, seed)
        self.n_iter = n_iter

    def fit(self, vectors):
        super().fit(vectors)
        v = super().project(vectors)  # (n, bits)
        rng = np.random.default_rng(self.seed)
        r, _ = np.linalg.qr(rng.standard_normal((self.n_bits, self.n_bits)))
        for _ in range(self.n_iter):
            b = np.where(v @ r >= 0, 1.0, -1.0)
            u, _, wt = np.linalg.svd(b.T @ v)
            r = (u @ wt).T
        self.rotation = r
        return self

    def project(self, vectors):
        return super().project(vectors) @ self.rotation


class WhiteningSign(Baseline):
    """Whitening fitted on the database (dhim_ray.encoding.transforms), then the sign of its
    first n_bits output dims (principal-axis order)."""

    name = "whitening-sign"

    def fit(self, vectors):
        from dhim_ray.encoding.transforms import Whitening

        x = np.asarray(vectors, dtype=np.float64)
        if self.n_bits > x.shape[1]:
            raise ConfigError(f"n_bits={self.n_bits}: {self.name} keeps at most the vectors' {x.shape[1]} dims; "
                              f"use n_bits={8 * (x.shape[1] // 8)} or less", field="n_bits")
        self.transform = Whitening(x.shape[1], k=self.n_bits).fit(x)
        self.mean = x.mean(axis=0)
        return self

    def project(self, vectors):
        from dhim_ray.encoding.transforms import transform

        return transform(self.transform, np.asarray(vectors, dtype=np.float32))[:, : self.n_bits]


class UBinary(Baseline):
    """The sign of every dimension of the raw sentence vector, one bit each: what
    sentence-transformers' ``quantize_embeddings(emb, "ubinary")`` gives
    (``np.packbits(emb > 0)``), so 384 bits for MiniLM. Nothing is fitted; its width is the
    vectors' (``n_bits`` None takes it; another value is refused)."""

    name = "ubinary"

    def __init__(self, n_bits: int | None = None, seed: int = 0):
        if n_bits is not None:
            check_n_bits(n_bits)
        self.n_bits, self.seed, self.mean = n_bits, seed, None

    def fit(self, vectors):
        dims = np.asarray(vectors).shape[1]
        if dims % 8:
            raise ConfigError(f"baseline=ubinary: the vectors have {dims} dims, not a multiple of 8; "
                              "use another baseline", field="baseline")
        if self.n_bits is not None and self.n_bits != dims:
            raise ConfigError(f"n_bits={self.n_bits}: ubinary takes one bit per dimension of the encoder's "
                              f"vector ({dims}); leave n_bits out", field="n_bits")
        self.n_bits, self.mean = dims, np.zeros(dims)
        return self

    def project(self, vectors):
        return np.asarray(vectors, dtype=np.float64)


def make_baseline(name: str, n_bits: int | None, seed: int = 0) -> Baseline:
    """Build a baseline by name: lsh, pca-sign, pca-median, itq, whitening-sign or ubinary (whose width is the vectors': ``n_bits`` None)."""
    if name == "ubinary":
        return UBinary(n_bits, seed)
    classes = {"lsh": LSH, "pca-sign": PCASign, "pca-median": PCAMedian, "itq": ITQ,
               "whitening-sign": WhiteningSign}
    if name not in classes:
        raise ConfigError(f"baseline={name!r}: choose one of {', '.join(BASELINES)}", field="baseline")
    return classes[name](n_bits, seed)
