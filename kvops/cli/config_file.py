"""`-f kvops.yaml`: a command's options in one declarative file; flags on the command line override it, and a
pasted --from-command does too. A relative path in it (a model folder, a policy, a workload) is read from the
file's folder where it is there.

The file's keys are the command's long options (`max-model-len: 8192`, or `max_model_len`), plus the seed's
`kv_cache:` block, mapped onto the options the engines implement:

    kv_cache.max_length             -> max-model-len
    kv_cache.precision              -> kv-dtype (fp16, bf16, fp32: the unquantized KV)
    kv_cache.compression.method     -> kv-dtype, when compression.enabled (int8, fp8, int4: quantized KV)
    kv_cache.swap.max_size          -> kv-offloading-size in GiB, when swap.enabled (vLLM's host KV tier)

Keys no engine implements are named, one line each, with what the engine offers instead; a key that is neither
an option nor the seed's is an error naming the valid ones. The values go through click's `default_map`, so a
value from the file is parsed and checked exactly as the same flag would be.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import click

from kvops.units import GiB, parse_bytes

# the seed ranks KV quality bf16 > int8 > fp8 (fp16 and fp32 as bf16: unquantized)
SEED_QUALITY = ("bf16", "int8", "fp8")
UNSUPPORTED = {
    "kv_cache.chunk_size": "no engine pools the KV cache in chunks (mean-pooling compression); vLLM and TGI keep "
    "every token: --kv-dtype fp8 halves its bytes, the prefix cache shares repeated prompts",
    "kv_cache.swap.path": "vLLM's host KV tier lives in host RAM, not on a disk path (LMCache's local disk backend, "
    "--kv-offloading-backend lmcache, is configured in LMCache's own file)",
}
SEED_KEYS = {
    "kv_cache": {"max_length", "chunk_size", "precision", "compression", "swap"},
    "kv_cache.compression": {"enabled", "method"},
    "kv_cache.swap": {"enabled", "path", "max_size"},
}


def file_option(function: Callable) -> Callable:
    """`-f/--file FILE`: the command's options from a YAML file, read before the flags (which override it); and
    `--file-schema`, the JSON schema of that file."""
    function = click.option(
        "--file-schema",
        is_flag=True,
        is_eager=True,
        expose_value=False,
        callback=_print_schema,
        help="Print the JSON schema of the -f file for this command, and exit.",
    )(function)
    return click.option(
        "-f",
        "--file",
        "config_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        metavar="FILE",
        is_eager=True,
        expose_value=False,
        callback=_load,
        help="kvops.yaml: these options (long names as keys) and the seed's kv_cache block; flags override it.",
    )(function)


def _load(ctx: click.Context, param: click.Parameter, path: Path | None) -> None:
    if path is None:
        return
    from kvops.errors import KvopsError
    from kvops.files import SETTINGS_LIMIT, read_yaml

    try:  # a regular file of at most 1 MiB, its YAML bounded in depth and aliases
        data = read_yaml(path, "", SETTINGS_LIMIT, as_typed=True) or {}
    except KvopsError as exc:
        raise click.BadParameter(str(exc), param=param) from None
    if not isinstance(data, dict):
        raise click.BadParameter(f"{path}: want a mapping of option names to values", param=param)
    multiple = {param.name for param in ctx.command.params if getattr(param, "multiple", False)}
    flags = {p.name: p for p in ctx.command.params if isinstance(p, click.Option) and p.is_flag and p.name}
    off = {opt[2:] for flag in flags.values() for opt in flag.secondary_opts}  # --no-enforce-eager: a switch's off form
    values, notes = options_from(data, _option_names(ctx.command), str(path), multiple, flags, off)
    values = {
        name: _beside(path, value) if name in _path_params(ctx.command) else value for name, value in values.items()
    }
    for note in notes:
        click.echo(f"kvops: warning: {note}", err=True)
    ctx.default_map = {**(ctx.default_map or {}), **values}


def _path_params(command: click.Command) -> set[str]:
    """The parameters that name files or folders: click paths, and the model (a folder, or a catalog or Hub id)."""
    return {
        param.name
        for param in command.params
        if param.name and (isinstance(param.type, click.Path) or param.name == "model")
    }


def _beside(file: Path, value: Any) -> Any:
    """A relative path in the file is read from the file's folder where it is there (as a compose file's are),
    else as given (a catalog or Hub id, or a path from the current folder); `~` is the home folder."""
    if isinstance(value, list):
        return [_beside(file, item) for item in value]
    if not isinstance(value, str) or not value:
        return value
    expanded = Path(value).expanduser()
    if expanded.is_absolute():
        return str(expanded)
    there = file.parent / expanded
    return str(there) if there.exists() else value


def _print_schema(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value:
        return
    import json

    click.echo(json.dumps(schema(ctx.command), indent=2))
    ctx.exit(0)


def schema(command: click.Command) -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of the -f file: each long option by its name, and the seed's kv_cache block."""
    properties: dict[str, Any] = {}
    for option, name in _option_names(command).items():
        param = next(p for p in command.params if p.name == name)
        spec = {"description": (getattr(param, "help", None) or "").strip(), **_type(param)}
        properties[option] = properties[option.replace("-", "_")] = spec  # both spellings are read
    section = {"type": "object", "additionalProperties": False}
    properties["kv_cache"] = {
        **section,
        "description": "The seed's KV cache block, mapped onto the engines' options.",
        "properties": {
            "max_length": {"type": "integer", "minimum": 1, "description": "-> max-model-len"},
            "chunk_size": {"type": "integer", "description": "not used: " + UNSUPPORTED["kv_cache.chunk_size"]},
            "precision": {"type": "string", "description": "-> kv-dtype (unquantized)"},
            "compression": {
                **section,
                "properties": {"enabled": {"type": "boolean"}, "method": {"type": "string"}},
            },
            "swap": {
                **section,
                "properties": {
                    "enabled": {"type": "boolean"},
                    "path": {"type": "string", "description": "not used: " + UNSUPPORTED["kv_cache.swap.path"]},
                    "max_size": {
                        "type": ["string", "number"],
                        "description": "-> kv-offloading-size: GiB, or a size with its unit",
                    },
                },
            },
        },
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"kvops {command.name} -f FILE",
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }


def _type(param: click.Parameter) -> dict[str, Any]:
    """A click parameter's values as JSON schema; sizes and numbers with units are strings."""
    kind = param.type
    if isinstance(param, click.Option) and param.is_flag:
        return {"type": "boolean"}
    if isinstance(kind, click.Choice):
        return {"enum": list(kind.choices)}
    if isinstance(kind, click.IntRange | type(click.INT)):
        low = getattr(kind, "min", None)
        bounds = {"minimum": low} if low is not None else {}
        return {"type": "integer", **bounds}
    if param.multiple:
        return {"type": "array", "items": {"type": "string"}}
    return {"type": ["string", "number"]}


def _option_names(command: click.Command) -> dict[str, str]:
    """Every long option of the command (dashes), a switch's off form (`--no-enforce-eager`) too -> its parameter
    name."""
    names = {}
    for param in command.params:
        if isinstance(param, click.Option) and param.name not in (None, "config_file", "file_schema"):
            for opt in (*param.opts, *param.secondary_opts):
                if opt.startswith("--"):
                    names[opt[2:]] = param.name
    return names


def options_from(
    data: dict[str, Any],
    options: dict[str, str],
    where: str,
    multiple: Collection[str | None] = (),
    flags: dict[str, click.Option] | None = None,
    off: Collection[str] = (),
) -> tuple[dict[str, Any], list[str]]:
    """The file's values by parameter name, and a note for each key no engine implements. Pure. A list is taken
    for an option given more than once (`multiple`) only; a mapping for none; true or false for a switch (`flags`)
    only: true as the key typed, false as its other form typed (`enforce-eager: false` is --no-enforce-eager,
    `no-enforce-eager: true` too) or, for a switch with no off form, left out. `off` names the off forms."""
    values: dict[str, Any] = {}
    notes: list[str] = []
    switched: dict[str, str] = {}  # a switch's parameter -> the key that set it
    for key, value in data.items():
        name = str(key).replace("_", "-")
        if key == "kv_cache":
            seed, seed_notes = _seed(value, where)
            values.update({options[option]: v for option, v in seed.items()})
            notes += seed_notes
        elif name in options:
            if isinstance(value, dict) or (isinstance(value, list) and options[name] not in multiple):
                raise click.UsageError(f"{where}: {key} is a {type(value).__name__}; --{name} takes one value")
            flag = (flags or {}).get(options[name])
            if flag is not None:
                if options[name] in switched:
                    raise click.UsageError(f"{where}: {switched[options[name]]} and {key} set one switch; keep one")
                switched[options[name]] = str(key)
                values[options[name]] = _switch(flag, value, f"{where}: {key}", name in off)
            elif isinstance(value, bool):
                raise click.UsageError(f"{where}: {key} is {str(value).lower()}; --{name} takes a value, not a switch")
            elif value is not None:  # `key:` with no value (null) leaves the option at its default
                values[options[name]] = _flag_value(value)
        elif name.startswith("no-") and options.get(name[3:]) in (flags or {}):
            raise click.UsageError(
                f"{where}: unknown key {key!r}: --{name[3:]} has no off form; write {name[3:]}: false, or leave it out"
            )
        else:
            raise click.UsageError(
                f"{where}: unknown key {key!r}; valid: kv_cache (the seed's block) or an option of this command: "
                + ", ".join(sorted(options))
            )
    return values, notes


def _switch(flag: click.Option, value: Any, at: str, off_form: bool = False) -> Any:
    """A switch's value: true is the key typed; false its other form typed (a `--X/--no-X` pair: click's True and
    False) or, for a lone switch, left out; null left out."""
    if value is not None and not isinstance(value, bool):
        raise click.UsageError(f"{at} {value!r}: a switch, true or false")
    if flag.secondary_opts and value is not None:
        return value != off_form
    unset = getattr(click.core, "UNSET", None)  # click 8.3 marks a flag_value or default not given so
    on = True if flag.flag_value is unset else flag.flag_value
    off = (not on if isinstance(on, bool) else None) if flag.default is unset else flag.default
    return on if value else off


def _flag_value(value: Any) -> Any:
    """A YAML value as click takes it from a default: lists for repeated options, strings otherwise."""
    if isinstance(value, list):
        return [str(item) for item in value]
    return value if isinstance(value, bool) or value is None else str(value)


def _seed(block: Any, where: str) -> tuple[dict[str, Any], list[str]]:
    """The seed's kv_cache block as options (by long name), and a note for each key no engine implements."""
    _check(block, "kv_cache", where)
    compression, swap = block.get("compression") or {}, block.get("swap") or {}
    _check(compression, "kv_cache.compression", where)
    _check(swap, "kv_cache.swap", where)
    for name, section in (("compression", compression), ("swap", swap)):
        if section.get("enabled") is not None and not isinstance(section["enabled"], bool):
            raise click.UsageError(f"{where}: kv_cache.{name}.enabled {section['enabled']!r}: true or false")
    options: dict[str, Any] = {}
    notes = [
        f"{where}: {key} ({_get(block, key)}) is not used: {why}"
        for key, why in UNSUPPORTED.items()
        if _get(block, key) is not None and (key != "kv_cache.swap.path" or swap.get("enabled"))
    ]
    if block.get("max_length") is not None:
        options["max-model-len"] = str(block["max_length"])
    if compression.get("enabled") and compression.get("method"):
        method = _kv_dtype(compression["method"], f"{where}: kv_cache.compression.method")
        options["kv-dtype"] = method
        notes.append(
            f"{where}: kv_cache.compression.method {method} -> --kv-dtype {method} (kv_cache.precision "
            f"{block.get('precision', 'auto')} is the unquantized type it replaces); the seed ranks KV quality "
            f"{' > '.join(SEED_QUALITY)}: evaluate a quantized KV on your own traffic before serving"
        )
    elif block.get("precision") is not None:
        options["kv-dtype"] = _kv_dtype(block["precision"], f"{where}: kv_cache.precision")
    if swap.get("enabled") and swap.get("max_size") is not None:
        options["kv-offloading-size"] = _gib(str(swap["max_size"]), f"{where}: kv_cache.swap.max_size")
    return options, notes


def _kv_dtype(value: Any, at: str) -> str:
    """A seed key mapped to --kv-dtype, checked here so that a bad one is named as the file wrote it."""
    from kvops.dtypes import KV_DTYPE_CHOICES, canonical_dtype_name

    text = str(value)
    if text.strip().lower() != "auto" and canonical_dtype_name(text) is None:
        raise click.UsageError(f"{at} {text!r} is not a KV dtype; valid: {', '.join(KV_DTYPE_CHOICES)}")
    return text


def _gib(text: str, where: str) -> str:
    """kv_cache.swap.max_size as --kv-offloading-size takes it, GiB: a bare number is GiB already (as typed), a size
    with its unit converted exactly."""
    try:
        float(text)
        return text
    except ValueError:
        return repr(parse_bytes(text, where) / GiB)


def _check(block: Any, name: str, where: str) -> None:
    if not isinstance(block, dict):
        raise click.UsageError(f"{where}: {name} must be a mapping with keys {', '.join(sorted(SEED_KEYS[name]))}")
    extra = sorted(str(key) for key in set(block) - SEED_KEYS[name])
    if extra:
        raise click.UsageError(f"{where}: unknown key '{name}.{extra[0]}'; valid: {', '.join(sorted(SEED_KEYS[name]))}")


def _get(block: dict, dotted: str) -> Any:
    value: Any = {"kv_cache": block}
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value
