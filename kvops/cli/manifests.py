"""`kvops manifests`: deployment artifacts for an engine and its kvops sidecar, from the plan, the alert rules and
the watcher."""

from __future__ import annotations

import re
from pathlib import Path

import click

from kvops import __version__
from kvops.cli.options import POSITIVE, deployment_options, runbook_option, warn, workload_options
from kvops.errors import UsageError
from kvops.render.quote import shell_word
from kvops.watch.rules import alert_rules

TARGETS = ("k8s", "compose", "llm-d", "dynamo", "production-stack")
AUTOSCALERS = ("keda", "hpa")
NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")  # an RFC 1035 label, short enough for '<name>-kvops-policy'
RELEASE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # an RFC 1123 label, as Kubernetes names namespaces
# an image reference: [registry[:port]/]path[:tag][@digest] (the distribution spec's grammar, loosely)
IMAGE = re.compile(
    r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*(:[\w][\w.-]{0,127})?(@sha256:[0-9a-f]{64})?$"
)


@click.command()
@workload_options
@click.option(
    "--target",
    "-t",
    type=click.Choice(TARGETS),
    default="k8s",
    show_default=True,
    help="k8s: Deployment, Service, PodMonitor, PrometheusRule, policy ConfigMap; compose: engine, sidecar, Prometheus "
    "and Grafana; llm-d: k8s and the endpoint picker's saturation settings and request classes; dynamo: the "
    "frontend's rejection thresholds; production-stack: the chart's values and a KEDA ScaledObject.",
)
@click.option(
    "--autoscale",
    type=click.Choice(AUTOSCALERS),
    help="k8s, llm-d: also scale the Deployment on its KV demand, with a KEDA ScaledObject or an HPA and the "
    "prometheus-adapter rule feeding it (production-stack always writes the ScaledObject).",
)
@click.option(
    "--max-replicas",
    type=POSITIVE,
    metavar="N",
    help="With autoscaling: the most pods  [default: 4 x --replicas]",
)
@click.option(
    "--prometheus-url",
    default="http://prometheus-operated.monitoring.svc:9090",
    show_default=True,
    metavar="URL",
    help="With KEDA: the Prometheus its trigger queries.",
)
@click.option(
    "--release",
    default="vllm",
    show_default=True,
    metavar="NAME",
    help="production-stack: the Helm release the chart is installed as (its Deployment is <release>-<name>-deployment-vllm).",
)
@click.option(
    "--out",
    "-o",
    "out_dir",
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Write one file per object into DIR (created) [k8s default: print one multi-document YAML].",
)
@click.option(
    "--name",
    metavar="NAME",
    help="Name of the Deployment, Service and PodMonitor (compose: the project is kvops-NAME)  [default: the engine]",
)
@click.option(
    "--namespace",
    metavar="NS",
    help="The namespace you apply the files in (kubectl -n NS): the rules and KEDA's query read its series alone, so a "
    "deployment of the same name in another namespace scraped by the same Prometheus is not mixed in.",
)
@click.option(
    "--replicas", type=POSITIVE, default=1, show_default=True, help="k8s: pods, each an engine with its sidecar."
)
@click.option(
    "--kvops-image",
    default=f"kvops:{__version__}",
    show_default=True,
    metavar="IMAGE",
    help="Image with kvops installed (the repository's Dockerfile): the sidecar, and the init step that gives vLLM the KV guard.",
)
@click.option(
    "--kvops-port",
    type=click.IntRange(1, 65535),
    default=9400,
    show_default=True,
    help="The sidecar's port, /kvops/*; its admission proxy, where it applies the levels, listens on the next one.",
)
@click.option(
    "--scrape-interval",
    type=click.IntRange(min=1),
    default=15,
    show_default=True,
    metavar="SECONDS",
    help="Prometheus' scrape interval (PodMonitor / prometheus.yml), also what the stale-metrics alert counts in.",
)
@runbook_option
@click.pass_context
def manifests(
    ctx,
    target,
    autoscale,
    max_replicas,
    prometheus_url,
    release,
    out_dir,
    name,
    namespace,
    replicas,
    kvops_image,
    kvops_port,
    scrape_interval,
    runbook_url,
    **params,
):
    """Deployment artifacts for an engine with the kvops sidecar, from the plan, the alert rules and the watcher.

    The engine runs the plan's flags (as `kvops plan` prints them); beside it `kvops watch` watches it. The levels
    apply to requests in vLLM's own API server (--middleware) where one API server serves it; elsewhere (TGI,
    data-parallel vLLM, a gateway's fleet) the sidecar's admission proxy applies them, and the Service, or the
    published compose port, goes through it. Prometheus scrapes both and evaluates `kvops alerts`. Exits 3 when the
    plan does not fit, like `kvops plan`.
    """
    from kvops import engines
    from kvops.deploy.stack import Stack
    from kvops.files import SETTINGS_LIMIT, read_text, write_files
    from kvops.plan import PlanError
    from kvops.planner import plan as make_plan
    from kvops.policy import default_policy_text, load_policy
    from kvops.render.plan import does_not_fit_message
    from kvops.watch.rules import PlanFigures

    options = deployment_options(ctx, params)
    engine = engines.get(options.engine)
    name = engine.name if name is None else name
    if not NAME.match(name):
        raise click.BadParameter(
            f"{name!r} must be lowercase letters, digits and '-', starting with a letter, at most 40 characters",
            param_hint="--name",
        )
    _check_target(target, engine.name, bool(options.guard), release)
    _check_namespace(namespace, target, autoscale)
    _check_values(prometheus_url, kvops_image)
    if options.device != "gpu":
        raise UsageError(
            "kvops manifests deploys the engine's official GPU image; --device cpu plans the CPU build, which has none"
        )
    if target == "compose" and not out_dir:
        raise click.UsageError(
            "--target compose writes compose.yaml and the files it mounts (Prometheus, Grafana, rules, policy): give --out DIR"
        )
    if autoscale and target not in ("k8s", "llm-d"):
        raise click.UsageError(f"--autoscale applies to --target k8s and llm-d, not {target}")
    plan = make_plan(options.plan_inputs())
    if not plan.fits:
        raise PlanError(does_not_fit_message(plan))
    policy_path = options.policy
    figures = PlanFigures.from_plan(engine.name, plan.to_dict())
    deployment = f"{release}-{name}-deployment-vllm" if target == "production-stack" else None
    rules = alert_rules(
        engine.name,
        "rules" if target == "compose" else "prometheusrule",
        runbook_url=runbook_url,
        policy_path=policy_path,
        selector=_selector(engine.name, name, deployment, namespace),
        scrape_interval=scrape_interval,
        capacity=engine.watch_capacity(plan),
        capacity_options={"--plan": "plan.json"},
        plan=figures,
        resource_name=f"kvops-{name}",
    )
    stack = Stack(
        plan=plan,
        rules=rules,
        policy_text=read_text(policy_path, "--policy", SETTINGS_LIMIT) if policy_path else default_policy_text(),
        command=given_command(ctx),
        name=name,
        kvops_image=kvops_image,
        kvops_port=kvops_port,
        scrape_interval=scrape_interval,
        replicas=replicas,
        policy=load_policy(policy_path),
        figures=figures,
        fleet=target == "llm-d",
        namespace=namespace,
    )
    _check_ports(stack)
    for message in plan.all_warnings:
        warn(message)
    if plan.local_model and target != "compose":  # compose mounts it (kvops/deploy/compose.py)
        warn(
            f"the engine loads {plan.local_model}, a folder on this machine: a pod sees it only where a volume holds it "
            "at that path; mount one, or plan with the model's Hub id"
        )
    files = target_files(stack, target, autoscale, max_replicas, prometheus_url, deployment)
    if out_dir:
        write_files(Path(out_dir), files)
        click.echo(f"wrote {out_dir}: {', '.join(files)}")
    else:
        click.echo("---\n".join(files.values()), nl=False)


def _selector(engine: str, name: str, deployment: str | None, namespace: str | None) -> str | None:
    """The engine's series: production-stack's chart pods, else the scrape job (the engine's name is the rules'
    default), in the namespace where one is given."""
    from kvops.deploy.autoscale import pod_matcher

    matchers = [pod_matcher(deployment)] if deployment else [f'job="{name}"']
    matchers += [f'namespace="{namespace}"'] if namespace else []
    return None if matchers == [f'job="{engine}"'] else "{" + ",".join(matchers) + "}"


def _check_namespace(namespace: str | None, target: str, autoscale: str | None) -> None:
    """A namespace is a Kubernetes target's; KEDA's query without one sums every namespace's pods of that name."""
    if namespace is None:
        if autoscale == "keda":
            warn(
                "--autoscale keda without --namespace: the ScaledObject's query sums kvops:kv_demand_tokens of every "
                "namespace whose pods carry this name; give --namespace NS, the namespace you apply the files in"
            )
        return
    if target == "compose":
        raise UsageError("--namespace names a Kubernetes namespace; --target compose has none")
    if not NAMESPACE.match(namespace):
        raise click.BadParameter(
            f"{namespace!r} must be lowercase letters, digits and '-', starting and ending with a letter or digit, "
            "at most 63 characters",
            param_hint="--namespace",
        )


def _check_target(target: str, engine: str, guard: bool, release: str) -> None:
    """What a target deploys: production-stack's chart and Dynamo's frontend serve vLLM alone, from their own
    images (no kvops plugin); a Helm release is a DNS label of at most 53 characters."""
    if target in ("production-stack", "dynamo") and engine != "vllm":
        raise UsageError(f"--target {target} serves vLLM; for {engine} give --target k8s or compose")
    if target in ("production-stack", "dynamo") and guard:
        raise UsageError(
            f"--guard: --target {target} runs its own vLLM image, without the kvops plugin; give --target k8s, llm-d "
            "or compose for the KV guard"
        )
    if target == "production-stack" and not (RELEASE.match(release) and len(release) <= 53):
        raise click.BadParameter(
            f"{release!r} must be lowercase letters, digits and '-', starting with a letter, at most 53 characters "
            "(a Helm release name)",
            param_hint="--release",
        )


def _check_values(prometheus_url: str, kvops_image: str) -> None:
    from kvops.files import is_http_url

    if not is_http_url(prometheus_url):
        raise click.BadParameter(f"{prometheus_url!r} is not an http(s) URL with a host", param_hint="--prometheus-url")
    if not IMAGE.match(kvops_image):
        raise click.BadParameter(
            f"{kvops_image!r} is not an image reference (e.g. registry.example.com/kvops:0.1.0)",
            param_hint="--kvops-image",
        )


def _check_ports(stack) -> None:
    """The sidecar's port and, where its proxy applies the levels, the next one are free in the engine's pod and
    within TCP's range."""
    if stack.kvops_port == stack.engine_port:
        raise click.BadParameter(
            f"{stack.kvops_port} is the engine's port; the sidecar needs another", param_hint="--kvops-port"
        )
    if not stack.proxied:
        return
    if stack.proxy_port > 65535:
        raise click.BadParameter(
            f"{stack.kvops_port}: the sidecar's admission proxy listens on the next port, {stack.proxy_port}, past "
            "65535; give at most 65534",
            param_hint="--kvops-port",
        )
    if stack.proxy_port == stack.engine_port:
        raise click.BadParameter(
            f"{stack.kvops_port}: the sidecar's admission proxy listens on the next port, {stack.proxy_port}, the "
            "engine's port; give another",
            param_hint="--kvops-port",
        )


def target_files(stack, target, autoscale, max_replicas, prometheus_url, deployment) -> dict[str, str]:
    """File name -> text for a target (and its autoscaler)."""
    from kvops.deploy import autoscale as scaling
    from kvops.deploy import compose, gateways, k8s
    from kvops.deploy.grafana import dashboard

    if target == "compose":
        return compose.files(stack, dashboard(stack.policy))
    if target == "dynamo":
        return gateways.dynamo_files(stack)
    scale = scaling.scaling(stack, max_replicas, prometheus_url, k8s.engine_container(stack.plan)["readinessProbe"])
    if target == "production-stack":
        return gateways.production_stack_files(stack, scale, deployment)
    files = k8s.manifests(stack)
    if target == "llm-d":
        files |= gateways.llm_d_files(stack)
    if autoscale:
        files |= scaling.files(stack, autoscale, scale)
    return files


def given_command(ctx: click.Context) -> str:
    """The command line as given, options in their declared order, without --out: the header of every file."""
    from click.core import ParameterSource

    words = ["kvops", ctx.info_name or "manifests"]
    for param in ctx.command.params:
        if (
            not isinstance(param, click.Option)
            or param.name == "out_dir"
            or ctx.get_parameter_source(param.name) != ParameterSource.COMMANDLINE
        ):
            continue
        value = ctx.params[param.name]
        if param.is_flag:
            words.append(param.opts[0] if value or not param.secondary_opts else param.secondary_opts[0])
        else:
            words += [param.opts[0], shell_word(str(value))]
    return " ".join(words)
