"""Fast detection of an unreachable Hugging Face hub.

Without this, datasets and transformers retry for ~20 s before failing. When the
hub cannot be reached we switch both libraries to offline mode, so copies already
in the local cache still load, and anything else fails at once.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from functools import lru_cache
from urllib.parse import urlparse


def _endpoint() -> tuple[str, int]:
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    return url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)


@lru_cache(maxsize=1)
def hub_reachable(timeout: float = 3.0) -> bool:
    """True when the hub endpoint accepts a TCP connection within ``timeout`` s."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    try:
        with socket.create_connection(_endpoint(), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def offline_unless_reachable():
    """Within the block, datasets (where imported before it) and transformers run offline if
    the hub is unreachable."""
    if hub_reachable():
        yield True
        return
    import huggingface_hub.constants as hub_constants

    saved = [(hub_constants, "HF_HUB_OFFLINE", hub_constants.HF_HUB_OFFLINE)]
    hub_constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:  # its own copy of the flag; importing datasets for it costs seconds
        import datasets.config as ds_config

        saved.append((ds_config, "HF_HUB_OFFLINE", ds_config.HF_HUB_OFFLINE))
        ds_config.HF_HUB_OFFLINE = True
    try:
        yield False
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
