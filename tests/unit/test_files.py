"""kvops/files.py: every file a user names is read bounded (issue 23). A FIFO or a device is refused before a byte
is read, a file past its limit is refused (after gunzip too: a gzip bomb stops at the limit), JSON and YAML are
bounded in depth, and YAML in aliases and in the values they expand to (billion laughs)."""

from __future__ import annotations

import gzip
import os

import pytest

from kvops.errors import KvopsError
from kvops.files import (
    MAX_ALIASES,
    MAX_DEPTH,
    MiB,
    load_json,
    load_yaml,
    read_bytes,
    read_text,
    read_yaml,
)
from tests.support.hostile import HOSTILE_YAML, billion_laughs, deadline


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "policy.yaml"
    os.mkfifo(fifo)
    with deadline(30), pytest.raises(KvopsError) as caught:
        read_text(fifo, "--policy")
    assert (
        str(caught.value)
        == f"--policy {fifo}: a FIFO (named pipe), which could block forever; kvops reads regular files only"
    )


def test_a_device_and_a_folder_are_refused(tmp_path):
    with pytest.raises(KvopsError, match=r"^--model /dev/zero: a device, which may never end"):
        read_bytes("/dev/zero", "--model", 1 << 20)
    with pytest.raises(KvopsError, match=r"cannot read \(Is a directory\)"):
        read_text(tmp_path, "--vllm-log")
    with pytest.raises(KvopsError, match=r"cannot read \(No such file or directory\)"):
        read_text(tmp_path / "absent", "--vllm-log")


def test_a_file_past_its_limit_is_refused_unread(tmp_path):
    big = tmp_path / "big.log"
    big.write_text("x" * (2 * MiB))
    with pytest.raises(KvopsError, match=r"2,097,152 bytes, more than the 1 MiB kvops reads from it"):
        read_text(big, "--policy", 1 * MiB)
    assert len(read_text(big, "--vllm-log", 4 * MiB)) == 2 * MiB


def test_a_gzip_bomb_stops_at_the_limit(tmp_path):
    bomb = tmp_path / "run.log.gz"
    bomb.write_bytes(gzip.compress(b"x" * (8 * MiB)))  # 8 KiB on disk
    with pytest.raises(KvopsError, match="more than 1 MiB once decompressed"):
        read_text(bomb, "--vllm-log", 1 * MiB)
    assert read_text(bomb, "--vllm-log", 16 * MiB) == "x" * (8 * MiB)
    damaged = tmp_path / "damaged.gz"
    damaged.write_bytes(gzip.compress(b"hello")[:-6])
    with pytest.raises(KvopsError, match="a damaged gzip file"):
        read_text(damaged, "--vllm-log")


@pytest.mark.parametrize("text", list(HOSTILE_YAML.values()), ids=list(HOSTILE_YAML))
def test_hostile_yaml_is_one_line(text):
    with deadline(60), pytest.raises(KvopsError) as caught:
        load_yaml(text, "policy.yaml")
    assert str(caught.value).startswith("policy.yaml: ") and "\n" not in str(caught.value)


def test_the_yaml_bounds_say_which():
    with pytest.raises(KvopsError, match=f"more than {MAX_ALIASES} YAML aliases"):
        load_yaml(billion_laughs(), "p.yaml")
    with pytest.raises(KvopsError, match="more than 100,000 values once its aliases are expanded"):
        load_yaml(billion_laughs(7), "p.yaml")
    with pytest.raises(KvopsError, match=f"nested more than {MAX_DEPTH} levels deep"):
        load_yaml("a: &a [*a]", "p.yaml")
    assert load_yaml("base: &b {warn: 0.5}\nlevels:\n  <<: *b\n", "p.yaml") == {
        "base": {"warn": 0.5},
        "levels": {"warn": 0.5},
    }  # an alias or two, as people write them, are fine


def test_json_is_bounded_in_depth_and_its_numbers_in_digits():
    with pytest.raises(KvopsError, match=f"nested more than {MAX_DEPTH} levels deep"):
        load_json("[" * 100_000 + "]" * 100_000, "plan.json")
    with pytest.raises(KvopsError, match=f"nested more than {MAX_DEPTH} levels deep"):
        load_json("[" * 100 + "]" * 100, "plan.json")  # under the recursion limit, over the bound
    with pytest.raises(KvopsError, match="not usable JSON"):
        load_json("9" * 5000, "plan.json")
    with pytest.raises(KvopsError, match=r"not valid JSON \(line 1, column 2"):
        load_json("{", "plan.json")
    assert load_json('{"time_step_limit": [0.0, Infinity]}', "config.json")["time_step_limit"][1] == float("inf")


def test_read_yaml_names_the_option_and_the_file(tmp_path):
    path = tmp_path / "kvops.yaml"
    path.write_text("a: [")
    with pytest.raises(KvopsError, match=rf"^-f {path}: not valid YAML at line 1, column 5"):
        read_yaml(path, "-f")
