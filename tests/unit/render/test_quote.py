"""Nothing kvops emits can be broken out of: every value quoted for the context it lands in (a shell line, a docker
command, an environment file, a YAML comment), checked by running or parsing what was emitted, as a user would."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from kvops.render.quote import ShellText, comment, shell_line
from tests.support.tiny_model import TINY_LLAMA

pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install -e '.[test]'; .ci/run does)")
from hypothesis import given, settings
from hypothesis import strategies as st

HOSTILE = ["~/m;touch PWNED;#", "m $(touch PWNED) `touch PWNED`", "m\ntouch PWNED", "m' ; touch PWNED ; '", "a*b? [c]"]


def bash_words(line: str, cwd) -> list[str]:
    """The words bash reads from `line` (a command line kvops printed), without running it."""
    script = f"set -- {line}\nprintf '%s\\0' \"$@\""
    ran = subprocess.run(
        ["bash", "-c", script], capture_output=True, cwd=cwd, timeout=30
    )  # bytes: no newline translation
    assert ran.returncode == 0, ran.stderr
    return [word.decode("utf-8", "surrogateescape") for word in ran.stdout.split(b"\0")[:-1]]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.lists(
        st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))),
        min_size=1,
        max_size=4,
    )
)
def test_a_shell_line_reads_back_as_its_words(tmp_path_factory, words):
    assert bash_words(shell_line(words), tmp_path_factory.getbasetemp()) == words


def test_shell_text_kvops_writes_is_expanded_and_nothing_else(tmp_path):
    home = str(tmp_path)
    line = shell_line([ShellText("~/.cache:/c"), ShellText('"$PWD"/data:/data'), "~/x", "$PWD"])
    words = subprocess.run(
        ["bash", "-c", f"set -- {line}; printf '%s\\0' \"$@\""],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "HOME": home},
    ).stdout.split("\0")[:-1]
    assert words == [f"{home}/.cache:/c", f"{tmp_path}/data:/data", "~/x", "$PWD"]


def local_model(home, name: str):
    folder = home / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    return folder


@pytest.mark.parametrize("name", HOSTILE)
def test_the_emitted_commands_run_nothing_a_model_path_holds(run_kvops, tmp_path, monkeypatch, name):
    monkeypatch.setenv("HOME", str(tmp_path))
    local_model(tmp_path, name.removeprefix("~/"))
    model = name if name.startswith("~/") else str(tmp_path / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in ("docker", "vllm"):
        (bin_dir / program).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / program).chmod(0o755)
    env = {**os.environ, "HOME": str(tmp_path), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    args = ("plan", "--model", model, "--gpu", "l4", "--max-model-len", "1024")
    for fmt in ("shell", "docker"):
        line = run_kvops(*args, "--format", fmt).stdout.strip()
        assert "\n" not in line
        subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, timeout=30, check=True)
        assert not (tmp_path / "PWNED").exists(), fmt
    environment = run_kvops(*args, "--format", "env").stdout
    script = f"{environment}\nprintf '%s\\0' \"${{VLLM_ARGS[@]}}\""
    words = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env).stdout.split(
        "\0"
    )[:-1]
    plan = json.loads(run_kvops(*args, "--format", "json").stdout)
    assert words == plan["command"]["argv"][2:] and not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("option", ["--runbook-url", "--name-in-model"])
def test_a_newline_in_an_option_cannot_add_a_manifest(run_kvops, tmp_path, option):
    injected = "x\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: owned}"
    args = ["manifests", "-m", "llama-3-8b", "--gpu", "h100", "--max-model-len", "8192"]
    if option == "--runbook-url":
        args += ["--runbook-url", "https://runbooks.example/" + injected]
    else:
        local_model(tmp_path, injected.replace("/", "_"))
        args[2] = str(tmp_path / injected.replace("/", "_"))
    documents = [document for document in yaml.safe_load_all(run_kvops(*args).stdout) if document]
    assert [document["kind"] for document in documents] == [
        "ConfigMap",
        "Deployment",
        "Service",
        "PodMonitor",
        "PrometheusRule",
    ]


def test_comments_keep_every_line_a_comment():
    text = comment("a\nb\r\x1bc")
    assert all(line.startswith("# ") for line in text.splitlines()) and "\x1b" not in text
