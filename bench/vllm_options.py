"""Read each vLLM release's own option set from its PyPI wheel and write kvops/engines/vllm/release_options.json.

    pip download vllm==X --no-deps -d WHEELS; unzip the wheel's vllm/**/*.py under SRC/X/
    python bench/vllm_options.py SRC          # SRC/<version>/vllm/... for every release read

For every release: which of the options a plan emits or suggests its `vllm serve` takes (each with the file and line
that adds it: vllm/engine/arg_utils.py, the frontend's cli_args.py), the `--kv-cache-dtype` values (CacheDType, or the
argparse choices before it), the `--quantization` methods (QuantizationMethods / QUANTIZATION_METHODS) and the
`--block-size` choices, each with its file and line. The wheels are read as text (ast), never installed or imported.
kvops plans a release with the option set of the newest release read at or before it
(kvops/engines/vllm/options.py).
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "kvops" / "engines" / "vllm" / "release_options.json"

# the options a kvops plan emits, suggests as a way out, or reads from a pasted command
PLAN_OPTIONS = (
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--data-parallel-size",
    "--enable-expert-parallel",
    "--dtype",
    "--revision",
    "--language-model-only",
    "--cpu-offload-gb",
    "--speculative-config",
    "--disable-hybrid-kv-cache-manager",
    "--disable-custom-all-reduce",
    "--compilation-config",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    # added on 2026-12-07 and read in the 0.32.0-0.34.0 wheels only (kvops/engines/vllm/options.py READ_SINCE,
    # emptied once every wheel is read again)
    "--enable-chunked-prefill",
    "--no-enable-chunked-prefill",
    "--performance-mode",
    "--async-scheduling",
    "--no-async-scheduling",
    "--disable-sliding-window",
    "--kv-cache-dtype-skip-layers",
    "--enable-lora",
    "--max-loras",
    "--max-lora-rank",
    "--fully-sharded-loras",
    "--lora-dtype",
    "--decode-context-parallel-size",
    "--mamba-cache-mode",
    "--mamba-cache-dtype",
    "--mamba-ssm-cache-dtype",
    "--max-model-len",
    "--gpu-memory-utilization",
    "--kv-cache-memory-bytes",
    "--num-gpu-blocks-override",
    "--enable-extensible-kv-cache",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--block-size",
    "--kv-cache-dtype",
    "--enforce-eager",
    "--scheduler-cls",
    "--max-num-queued-reqs",
    "--kv-offloading-size",
    "--kv-offloading-backend",
    "--quantization",
    "--swap-space",
    "--middleware",
    "--max-num-active-seqs",
    "--watermark",
)
_OPTION = re.compile(r"""["'](--[a-z0-9][a-z0-9-]*)["']""")


def option_files(root: Path) -> list[Path]:
    """Where a release adds its `vllm serve` options: the engine's arguments and the OpenAI frontend's."""
    vllm = root / "vllm"
    found = [vllm / "engine" / "arg_utils.py"]
    found += sorted(vllm.glob("entrypoints/**/cli_args.py"))
    return [path for path in found if path.exists()]


def options(root: Path) -> dict[str, str]:
    """Each plan option the release spells, with the first file:line that names it."""
    seen: dict[str, str] = {}
    for path in option_files(root):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for name in _OPTION.findall(line):
                if name in PLAN_OPTIONS and name not in seen:
                    seen[name] = f"{path.relative_to(root)}:{number}"
    for path in option_files(root)[1:]:  # the frontend's dataclass fields become options (`--field-name`)
        for name, number in _frontend_fields(path):
            if name in PLAN_OPTIONS and name not in seen:
                seen[name] = f"{path.relative_to(root)}:{number} (a FrontendArgs field)"
    # BooleanOptionalAction adds the --no- spelling of a boolean without writing it out
    for switch in ("--enable-prefix-caching", "--enable-chunked-prefill", "--async-scheduling"):
        negated = "--no-" + switch[2:]
        if switch in seen and negated not in seen and _boolean_optional(root):
            seen[negated] = seen[switch] + " (BooleanOptionalAction)"
    return dict(sorted(seen.items()))


def _frontend_fields(path: Path) -> list[tuple[str, int]]:
    """The annotated fields of the `...Args` dataclasses in a frontend cli_args.py, as the options they make."""
    tree = ast.parse(path.read_text(errors="replace"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name.endswith("Args"):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    out.append(("--" + item.target.id.replace("_", "-"), item.lineno))
    return out


def _boolean_optional(root: Path) -> bool:
    text = (root / "vllm" / "engine" / "arg_utils.py").read_text(errors="replace")
    return "BooleanOptionalAction" in text


def literal(root: Path, name: str, candidates: tuple[str, ...]) -> tuple[list, str] | None:
    """`NAME = Literal[...]` (or a list) in the first candidate file that defines it: its values and file:line."""
    for relative in candidates:
        path = root / relative
        if not path.exists():
            continue
        tree = ast.parse(path.read_text(errors="replace"))
        for node in ast.walk(tree):
            target = _assigned(node)
            if target != name:
                continue
            value = node.value  # type: ignore[attr-defined]
            values = _values(value)
            if values is not None:
                return values, f"{relative}:{node.lineno}"
    return None


def _assigned(node: ast.AST) -> str | None:
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return node.target.id
    return None


def _values(node: ast.AST) -> list | None:
    if isinstance(node, ast.Subscript):  # Literal[...]
        inner = node.slice
        elements = inner.elts if isinstance(inner, ast.Tuple) else [inner]
        return [element.value for element in elements if isinstance(element, ast.Constant)]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [element.value for element in node.elts if isinstance(element, ast.Constant)]
    if isinstance(node, ast.Dict):
        return [key.value for key in node.keys if isinstance(key, ast.Constant)]
    return None


def argparse_choices(root: Path, flag: str) -> tuple[list, str] | None:
    """`add_argument(FLAG, choices=[...])` in arg_utils.py, for releases that spelled the choices out."""
    path = root / "vllm" / "engine" / "arg_utils.py"
    tree = ast.parse(path.read_text(errors="replace"))
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
            continue
        if node.args[0].value != flag:
            continue
        for keyword in node.keywords:
            if keyword.arg == "choices":
                values = _values(keyword.value)
                if values is not None:
                    return values, f"vllm/engine/arg_utils.py:{node.lineno}"
    return None


CONFIG_FILES = ("vllm/config/cache.py", "vllm/config.py", "vllm/config/__init__.py")
QUANT_FILE = ("vllm/model_executor/layers/quantization/__init__.py",)


def read_release(root: Path) -> dict:
    kv = literal(root, "CacheDType", CONFIG_FILES) or argparse_choices(root, "--kv-cache-dtype")
    quant = literal(root, "QuantizationMethods", QUANT_FILE) or literal(root, "QUANTIZATION_METHODS", QUANT_FILE)
    blocks = literal(root, "BlockSize", CONFIG_FILES) or argparse_choices(root, "--block-size")
    return {
        "options": options(root),
        "kv_cache_dtypes": {"values": kv[0], "source": kv[1]} if kv else None,
        "quantization": {"values": quant[0], "source": quant[1]} if quant else None,
        # None: any positive block size passes config validation (the backend then constrains it)
        "block_sizes": {"values": blocks[0], "source": blocks[1]} if blocks else None,
    }


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def main() -> None:
    source = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/wheels/src")
    releases = {}
    for root in sorted(
        (path for path in source.iterdir() if (path / "vllm").is_dir()), key=lambda p: _version_key(p.name)
    ):
        releases[root.name] = read_release(root)
    data = {
        "about": (
            "Each vLLM release's own option set, read from its PyPI wheel (pip download vllm==X --no-deps; the "
            "files named, at the line given, in that wheel) by bench/vllm_options.py: the `vllm serve` options a "
            "kvops plan emits or suggests, the --kv-cache-dtype values, the --quantization methods and the "
            "--block-size choices. A release not read here follows the newest release read at or before it."
        ),
        "releases": releases,
    }
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(OUT.parents[3])}: {len(releases)} releases ({', '.join(releases)})")


if __name__ == "__main__":
    main()
