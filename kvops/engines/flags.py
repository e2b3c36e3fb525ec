"""Engine flags as command-line words, engine-neutral."""

from __future__ import annotations


def flag_args(flags: dict[str, object]) -> list[str]:
    """`--flag value ...` in order; True is a bare switch, None and False are left out, floats lose trailing zeros,
    a tuple is the flag's list of values."""
    args: list[str] = []
    for name, value in flags.items():
        if value is True:
            args.append(f"--{name}")
        elif isinstance(value, tuple):
            args += [f"--{name}", *map(str, value)] if value else []
        elif value is not None and value is not False:
            args += [f"--{name}", f"{value:g}" if isinstance(value, float) else str(value)]
    return args
