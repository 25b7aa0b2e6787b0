"""A table generated over every option of every command: each numeric option given a word,
an empty value, and (float options) NaN and infinity, each flag-taking option given nothing.
Every case must exit 2 with exactly one line on stderr naming the option, no traceback.
Cases the hand-written table (test_bad_input.py) holds, with their files and models, are not
repeated here; these need none of them: the mistake is caught before any file is read."""

from __future__ import annotations

import pytest
import typer

from dhim_ray.cli import app, main

#: Arguments that make each command reach its option checks (paths need not exist: a bad
#: option value is refused before any is opened).
PREFIX = {
    "train": ["corpus-dir"],
    "eval": ["model-dir", "--queries", "c:val", "--database", "c:train"],
    "ingest": ["corpus-dir", "--model", "model-dir"],
    "search": ["query", "--model", "model-dir"],
    "serve": ["model-dir", "--collection", "c"],
    "demo": [],
    "export": ["model-dir"],
    "curve": ["model-dir"],
}


def options():
    root = typer.main.get_command(app)
    for name, command in sorted(root.commands.items()):
        for param in command.params:
            if param.param_type_name != "option" or param.is_flag or param.name == "help":
                continue
            yield name, param


def cases():
    out = []
    for command, param in options():
        flag = max(param.opts, key=len)
        kind = getattr(param.bare_type(), "__name__", str(param.bare_type()))
        if kind in ("int", "float"):
            bad = ["abc", ""]
            if kind == "float":
                bad += ["nan", "inf"]
            out += [(command, flag, value) for value in bad]
        elif kind == "Path":  # an empty folder would mean the current one
            out.append((command, flag, ""))
        out.append((command, flag, None))  # the option with no value
    return out


CASES = cases()


def test_the_table_covers_every_numeric_option_of_every_command():
    covered = {(c, f) for c, f, v in CASES if v == "abc"}
    assert {c for c, _ in covered} >= {"train", "eval", "ingest", "search", "serve", "demo"}
    assert ("train", "--epochs") in covered and ("serve", "--port") in covered and len(CASES) > 80
    assert {("train", "--out"), ("train", "--cache-dir"), ("search", "--model")} <= {(c, f) for c, f, v in CASES
                                                                                     if v == ""}


def refused_in_one_line(args: list[str], capsys, tmp_path) -> str:
    """Run the CLI on ``args`` in ``tmp_path``: exit 2, one line on stderr, no traceback, no file
    written. Returns that line."""
    with pytest.raises(SystemExit) as exit_:
        main(args)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_.value.code == 2, (args, out, err)
    assert "Traceback" not in out + err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert list(tmp_path.iterdir()) == [], "a refused command wrote files"
    return lines[0]


@pytest.mark.parametrize("command, flag, value", CASES, ids=[f"{c} {f} {v!r}" for c, f, v in CASES])
def test_every_option_refuses_a_bad_value_in_one_line(command, flag, value, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # nothing the command might write lands in the checkout
    args = [command, *PREFIX[command]] + ([flag, value] if value is not None else [flag])
    line = refused_in_one_line(args, capsys, tmp_path)
    assert flag in line, (flag, line)


# ---- every config field through --set -------------------------------------------------------
def set_cases():
    """Each config field given, through --set, a value of the wrong type and values past its
    range on both sides: every one must be refused naming the field, none silently kept."""
    import dataclasses

    from dhim_ray.config import FeatureConfig, ModelConfig, TrainConfig

    out = []
    for section, kind in (("features", FeatureConfig), ("model", ModelConfig), ("train", TrainConfig)):
        for f in dataclasses.fields(kind):
            default = f.default if f.default is not dataclasses.MISSING else None
            if isinstance(default, bool):
                bad = ["maybe", "2"]
            elif isinstance(default, int):
                bad = ["-1", "1000000000000", "1.5", "abc", "true"]
            elif isinstance(default, float):
                bad = ["-1", "1e30", "NaN", "Infinity", "abc"]
            elif isinstance(default, tuple):
                bad = ["[1.5]", "[]", "[100001]", "[2]", "[1,3,5,7,9,11,13,15,17]", "3"]
            elif f.name == "encoder":
                bad = ['""', "7"]
            else:  # a choice among names
                bad = ["nonsense", "1"]
            out += [(section, f.name, value) for value in bad]
    return out


SET_CASES = set_cases()


def test_the_set_table_covers_every_config_field():
    import dataclasses

    from dhim_ray.config import FeatureConfig, ModelConfig, TrainConfig

    fields = {(s, f.name) for s, k in (("features", FeatureConfig), ("model", ModelConfig), ("train", TrainConfig))
              for f in dataclasses.fields(k)}
    assert {(s, f) for s, f, _ in SET_CASES} == fields and len(fields) >= 30


@pytest.mark.parametrize("section, field, value", SET_CASES, ids=[f"{s}.{f}={v}" for s, f, v in SET_CASES])
def test_every_set_field_refuses_a_bad_value_in_one_line(section, field, value, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    line = refused_in_one_line(["train", *PREFIX["train"], "--set", f"{section}.{field}={value}"], capsys, tmp_path)
    assert "--set" in line and f"{section}.{field}" in line, line
