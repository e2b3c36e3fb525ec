"""Options several commands share, named as users say them."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from kvops.dtypes import KV_DTYPE_CHOICES

POSITIVE = click.IntRange(min=1)


def model_option(function: Callable) -> Callable:
    return click.option(
        "--model",
        "-m",
        required=True,
        metavar="MODEL",
        help="config.json file or folder, a model id in the local HF cache, or a catalog id/alias (`kvops models`).",
    )(function)


def kv_dtype_option(function: Callable) -> Callable:
    return click.option(
        "--kv-dtype",
        default="auto",
        show_default=True,
        type=click.Choice(KV_DTYPE_CHOICES, case_sensitive=False),
        help="KV cache element type; auto is the model's own dtype.",
    )(function)


def tp_option(function: Callable) -> Callable:
    return click.option(
        "--tp", default=1, show_default=True, type=POSITIVE, help="Tensor-parallel size (GPUs sharing one replica)."
    )(function)


def json_option(function: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON (every byte figure an exact integer).")(
        function
    )


def int_list(text: str, option: str) -> list[int]:
    """'1,4,8' -> [1, 4, 8], each a positive integer."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a comma-separated list of integers, e.g. 1,4,8", param_hint=option
        ) from None
    if not values or any(value < 1 for value in values):
        raise click.BadParameter(f"{text!r} must list positive integers, e.g. 1,4,8", param_hint=option)
    return values


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


def warn(message: str) -> None:
    click.echo(f"kvops: warning: {message}", err=True)
