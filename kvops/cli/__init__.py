"""The `kvops` command: a thin click layer. Subcommands load on first use so `kvops kv` starts fast."""

from __future__ import annotations

import importlib
import sys
import traceback

import click

from kvops import __version__
from kvops.errors import KvopsError

# name -> "module:function"; a module is imported only when its command runs (or --help lists it).
COMMANDS = {
    "kv": "kvops.cli.kv:kv",
    "table": "kvops.cli.table:table",
    "plot": "kvops.cli.plot:plot",
    "models": "kvops.cli.models:models",
    "tokens": "kvops.cli.tokens:tokens",
    "plan": "kvops.cli.plan:plan",
    "calibrate": "kvops.cli.calibrate:calibrate",
    "explain": "kvops.cli.explain:explain",
    "sweep": "kvops.cli.sweep:sweep",
    "watch": "kvops.cli.watch:watch",
    "alerts": "kvops.cli.alerts:alerts",
    "report": "kvops.cli.report:report",
    "manifests": "kvops.cli.manifests:manifests",
    "dashboard": "kvops.cli.dashboard:dashboard",
    "lint": "kvops.cli.lint:lint",
    "simulate": "kvops.cli.simulate:simulate",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attribute = target.split(":")
        return getattr(importlib.import_module(module), attribute)

    def main(self, *args, **kwargs):
        """Run with one-line errors: user mistakes never show a traceback."""
        kwargs["standalone_mode"] = False
        argv = list(kwargs.get("args") or (args[0] if args else None) or sys.argv[1:])
        probe = self._probe_exit(argv)
        try:
            status = super().main(*args, **kwargs)
        except click.exceptions.Exit as done:
            sys.exit(done.exit_code)
        except click.exceptions.Abort:
            click.echo("kvops: aborted", err=True)
            sys.exit(130)
        except click.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx else "kvops"
            message = " ".join(exc.format_message().split())  # one line: click lists choices on several
            click.echo(f"{command}: error: {message} (see `{command} --help`)", err=True)
            sys.exit(probe or exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"kvops: error: {exc.format_message()}", err=True)
            sys.exit(probe or exc.exit_code)
        except KvopsError as exc:
            click.echo(f"kvops: error: {exc}", err=True)
            sys.exit(probe or exc.exit_code)
        except BrokenPipeError:
            sys.exit(0)
        except Exception:
            if probe is None:
                raise
            traceback.print_exc()  # a fault of kvops: the traceback is for its report, the exit code for the probe
            sys.exit(probe)
        sys.exit(status if isinstance(status, int) else 0)

    def _probe_exit(self, argv: list[str]) -> int | None:
        """The exit code a command gives every error of its run, where it has one (`kvops watch --once`, a probe
        whose 1-3 are levels); None for the usual codes."""
        name = next((word for word in argv if not word.startswith("-")), None)
        if name not in COMMANDS:
            return None
        command = self.get_command(click.Context(self), name)
        error_exit_code = getattr(command, "error_exit_code", None)
        return error_exit_code(argv) if error_exit_code else None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="kvops")
def main() -> None:
    """Keep LLM serving engines inside their GPU memory: KV-cache math, engine plans, pressure watch."""
