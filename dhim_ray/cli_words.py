"""The command's words: the library's parameter names as this command's flags (``FLAGS``,
``SWITCHES``, ``as_flags``: ``n_bits=100: ...`` reads ``--bits 100: ...``), and an error as the
one line it prints (``print_error``); ``Help``, each command's ``--help`` in its Output panel."""

from __future__ import annotations

import re
from typing import Annotated

import typer

#: Library parameter names (in error messages) -> this CLI's flags.
FLAGS = {
    "n_bits": "--bits", "max_epochs": "--epochs", "batch_size": "--batch-size",
    "max_words": "--max-words", "max_tokens": "--max-tokens",
    "text_column": "--text-column", "label_column": "--label-column",
    "max_failures": "--max-failures", "use_gpu": "--use-gpu", "token_env": "--token-env",
    **{name: f"--{name}" for name in ("encoder", "lr", "patience", "k", "baseline", "index", "nlist", "nprobe", "collection", "uri",
                                      "resume", "out", "workers", "limit", "address", "set", "split", "select",
                                      "rerank", "epochs")},
    "replicas": "--replicas", "cache_dir": "--cache-dir", "seed": "--seed", "port": "--port", "api_token_env": "--api-token-env", "max_batch_size": "--max-batch-size",
    "host": "--host", "window_words": "--window-words", "n_windows": "--windows",
    "filter": "--filter", "max_distance": "--max-distance", "keep_columns": "--keep-columns", "alias": "--alias", "mode": "--mode",
    "fusion": "--fusion", "like": "--like", "feature_memory": "--feature-memory", "device": "--device", "bits": "--bits", "database": "--database",
    "queries": "--queries", "task": "--task", "formulation": "--formulation", "id_column": "--id-column",
    "model_dir": "--model", "allow_open": "--allow-open",
}
#: Switches: ``name=True`` (or False) is the flag itself.
SWITCHES = {("drop_empty", "True"): "--drop-empty", ("overwrite", "True"): "--overwrite",
            ("use_gpu", "True"): "--use-gpu", ("allow_open", "True"): "--allow-open",
            ("text_index", "True"): "--text-index", ("text_index", "False"): "--no-text-index"}
_SWITCH = re.compile(r"(?<![\w.-])(" + "|".join({n for n, _ in SWITCHES}) + r")=(True|False)\b")
_PARAM = re.compile(r"(?<![\w.-])(" + "|".join(sorted(FLAGS, key=len, reverse=True)) + r")=")


#: A config field (SECTION.FIELD=, the sections of dhim_ray.config.SECTIONS, written out: the
#: CLI starts without importing config and numpy; tests/test_cli.py holds the two together).
_FIELD = re.compile(r"(?<![\w.'\"-])(?<!--set )(?:set )?((?:features|model|train)\.\w+=)")


def as_flags(message: str) -> str:
    """'n_bits=100: must be ...' -> '--bits 100: must be ...'; '(set) model.init=random' ->
    '--set model.init=random'."""
    message = _SWITCH.sub(lambda m: SWITCHES.get((m.group(1), m.group(2)), m.group(0)), message)
    return _PARAM.sub(lambda m: FLAGS[m.group(1)] + " ", _FIELD.sub(r"--set \1", message))


def print_error(message: str) -> None:
    """``error: MESSAGE`` as one line on stderr, no markup interpretation (brackets and colons
    stay as given), credentials in any URL masked."""
    from dhim_ray.connectors.connection import mask_urls

    typer.echo(typer.style("error:", fg="red", bold=True) + " " + mask_urls(" ".join(message.split())), err=True)


def show_help(ctx: typer.Context, value: bool) -> None:
    """``--help`` in the Output panel (a command's only loose option otherwise got a box of its own)."""
    if value:
        typer.echo(ctx.get_help())
        raise typer.Exit()


Help = Annotated[bool, typer.Option("--help", is_eager=True, expose_value=False, callback=show_help,
                                    rich_help_panel="Output", help="Show this message and exit.")]
