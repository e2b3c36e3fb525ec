"""Engine flags as command-line words, engine-neutral."""

from __future__ import annotations


def with_kept(args: list[str], flags: dict[str, object], kept: tuple[tuple[str, ...], ...]) -> list[str]:
    """The plan's arguments, then a pasted command's options it did not read, as given (each kept as (its canonical
    spelling, its words)), but those the plan states itself: options typed beside the command win."""
    return [*args, *(word for option, *words in kept if option.lstrip("-") not in flags for word in words)]


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
