"""Read each TGI release's own launcher options from its tag and write kvops/engines/tgi/release_options.json.

    python bench/tgi_options.py REPO     # a clone of huggingface/text-generation-inference with its tags

For every tag vX.Y.Z: the `text-generation-launcher` options of `struct Args` in launcher/src/main.rs (each a
`#[clap(... long ...)]` field, spelled `--field-name`, with its line) and the `enum Quantization` values
(`--quantize`), read with `git show TAG:launcher/src/main.rs`. kvops plans a release with the option set of the
newest tag read at or before it (kvops/engines/tgi/options.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "kvops" / "engines" / "tgi" / "release_options.json"
FILE = "launcher/src/main.rs"
_FIELD = re.compile(r"^\s*(?:pub\s+)?([a-z_][a-z0-9_]*)\s*:\s*[A-Za-z]")


def launcher(repo: Path, tag: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "show", f"{tag}:{FILE}"], capture_output=True, text=True, check=True
    ).stdout


def options(text: str) -> dict[str, int]:
    """`--field-name` -> line of each `long` field of `struct Args`."""
    lines = text.splitlines()
    start = next(index for index, line in enumerate(lines) if re.match(r"^\s*struct Args\s*\{", line))
    found: dict[str, int] = {}
    long = False
    for index in range(start + 1, len(lines)):
        line = lines[index]
        if line.startswith("}"):
            break
        if "#[clap(" in line or "#[arg(" in line:
            long = long or "long" in line
            continue
        match = _FIELD.match(line)
        if match:
            if long:
                found["--" + match.group(1).replace("_", "-")] = index + 1
            long = False
    return found


def quantize_values(text: str) -> list[str]:
    """The `enum Quantization` variants as clap spells them (kebab case, or their `name = "..."`)."""
    match = re.search(r"enum Quantization\s*\{(.*?)\n\}", text, re.S)
    if not match:
        return []
    values, named = [], None
    for line in match.group(1).splitlines():
        line = line.strip()
        rename = re.search(r'name\s*=\s*"([^"]+)"', line)
        if rename:
            named = rename.group(1)
            continue
        variant = re.match(r"^([A-Z][A-Za-z0-9]*)\s*,?$", line)
        if variant:
            kebab = re.sub(r"(?<=[a-z0-9])([A-Z])", r"-\1", variant.group(1)).lower()
            values.append(named or kebab)
            named = None
    return values


def main() -> None:
    repo = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/.mirror/huggingface+text-generation-inference/repo")
    tags = subprocess.run(["git", "-C", str(repo), "tag"], capture_output=True, text=True, check=True).stdout.split()
    releases = {}
    for tag in sorted(tags, key=lambda name: tuple(int(part) for part in re.findall(r"\d+", name))):
        try:
            text = launcher(repo, tag)
        except subprocess.CalledProcessError:
            continue
        releases[tag.removeprefix("v")] = {
            "options": {name: f"{FILE}:{line}" for name, line in sorted(options(text).items())},
            "quantize": quantize_values(text),
        }
    OUT.write_text(
        json.dumps(
            {
                "about": (
                    "Each TGI release's text-generation-launcher options (the long fields of `struct Args`) and "
                    "--quantize values (`enum Quantization`), read from launcher/src/main.rs at the release's tag of "
                    "huggingface/text-generation-inference by bench/tgi_options.py; a release not read here follows "
                    "the newest tag read at or before it."
                ),
                "releases": releases,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {OUT.relative_to(OUT.parents[3])}: {len(releases)} releases")


if __name__ == "__main__":
    main()
