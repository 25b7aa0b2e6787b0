"""The docs' pictures, drawn by the code the tests run: the curves by ``dhim-ray train`` and
``dhim-ray eval --plot`` (dhim_ray.plots), the search page by the headless-browser driver of
tests/test_serve.py (tests/browser.py) on a real service. Packaged encoder and BBC corpus; about
ten minutes on 2 CPU cores.

    python -m bench figures                      # -> docs/images/*.png
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUERY = "oil prices push the stock market down"
TOKEN_ENV = "DHIM_RAY_FIGURES_TOKEN"

logger = logging.getLogger("bench.figures")


def dhim_ray(*args: object) -> None:
    subprocess.run([sys.executable, "-m", "dhim_ray.cli", *map(str, args)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench figures", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / ".cache" / "figures")
    parser.add_argument("--bits", type=int, default=64)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out, work = args.out_dir, args.work
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    model = work / f"bbc-{args.bits}"
    if not (model / "training.png").exists():
        shutil.rmtree(model, ignore_errors=True)
        dhim_ray("train", "bbc", "--bits", args.bits, "--out", model, "--cache-dir", work / "features")
    shutil.copyfile(model / "training.png", out / "training.png")
    common = ("--baseline", "itq", "--baseline", "lsh", "--baseline", "cosine", "--database", "bbc:train",
              "--cache-dir", work / "features")
    dhim_ray("eval", model, *common, "--queries", "bbc:test", "--plot", out / "precision-at-k.png")
    dhim_ray("eval", model, *common, "--task", "known-item", "--queries", "bbc:test", "--plot",
             out / "known-item-recall.png")
    db = work / "figures.db"
    dhim_ray("ingest", "bbc", "--model", model, "--uri", db, "--collection", "bbc_64", "--overwrite")
    search_page(model, db, out / "search-page.png")
    logger.info("wrote %s", ", ".join(p.name for p in sorted(out.glob("*.png"))))


def search_page(model: Path, db: Path, path: Path) -> None:
    """The page of a service with a token, as a person sees it after one query."""
    sys.path.insert(0, str(ROOT / "tests"))
    from browser import SearchPage, browser

    from dhim_ray.jobs.serve import ServeOptions, token_digest
    from dhim_ray.jobs.service_life import start_service, stop_service

    os.environ[TOKEN_ENV] = "figures-token"
    url = start_service(ServeOptions(str(model.resolve()), str(db), "bbc_64",
                                     api_token_sha256=token_digest(TOKEN_ENV)), port=8765)
    driver = browser(1280, 900)
    try:
        page = SearchPage(driver, url)
        page.auth_message()
        page.give_token(os.environ[TOKEN_ENV])
        page.about()
        page.search(QUERY, k=10)
        page.screenshot(path)
    finally:
        driver.quit()
        stop_service(and_ray=True)


if __name__ == "__main__":
    main()
