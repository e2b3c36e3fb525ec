"""Synthetic workloads, seeded and reproducible: arrivals as vLLM's benchmark draws them, lengths from a spec.

Arrivals follow vLLM's `get_request` (vLLM 0.32, vllm/benchmarks/serve.py): each gap is drawn from a gamma
distribution with shape = burstiness and scale = 1 / (rate x burstiness), so the mean gap is 1 / rate; burstiness 1
is a Poisson process (exponential gaps), lower is burstier, higher more even, infinite a constant gap. Arrival i is
the sum of the first i + 1 gaps, and all are then scaled so the last is at n / rate exactly (vLLM's normalisation,
which keeps a run's mean rate at the rate asked for). An infinite rate sends everything at 0. The draws are Python's
`random.gammavariate`, not numpy's: the same distribution, not the same numbers as vLLM's.

Length specs, each draw rounded to an integer of at least 1:

    fixed:N                    N tokens
    uniform:LOW-HIGH           integers LOW..HIGH, inclusive, equally likely
    normal:mean=M,std=S        normal
    lognormal:mean=M,sigma=S   log-normal whose arithmetic mean is M tokens and whose log has sigma S
                               (so mu = ln M - S^2 / 2)
    sharegpt                   (prompt, output) pairs shaped like ShareGPT as vLLM's benchmark samples it

`sharegpt` is an approximation of the data set, not the data set. vLLM samples ShareGPT_V3_unfiltered_cleaned_split.json
by its first two turns, keeping pairs of at least 4 tokens each, a prompt of at most 1024 and at most 2048 together
(`vllm_valid_sequence`). Published means after that filter, with Llama 3.1 8B's tokenizer: 215 prompt tokens a
request (215,196 prompt tokens over 1,000 requests, the figure `vllm bench serve --dataset-name sharegpt` prints
for meta-llama/Llama-3.1-8B-Instruct with seed 0, quoted in several public benchmark logs); 224 and 221 prompt and
188 and 190 output tokens (vLLM PR #14036, `benchmark_throughput.py` on 1,000 ShareGPT requests: 16,360.76 total
and 7,468.34 output tokens/s at 39.72 requests/s, and 15,570.40 and 7,188.78 at 37.88; the throughput benchmark
counts each request's expected output length, vllm/benchmarks/throughput.py). The model: prompt and output drawn
independently, round(LogNormal(mu=5.059, sigma=1.2)) and round(LogNormal(mu=4.784, sigma=1.0)), a pair outside
vLLM's filter drawn again; the mus are fitted so the filtered means are 220 prompt and 189 output tokens. The sigmas
are assumptions (no published percentiles were found): they give a p50/p90/p99 of 144/537/935 prompt and 119/423/1087
output tokens, the model's figures, not measured ones.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from itertools import accumulate

from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.simulate.formats import vllm_valid_sequence
from kvops.simulate.trace import Trace, TraceRequest

FORMS = "fixed:N, uniform:LOW-HIGH, normal:mean=M,std=S, lognormal:mean=M,sigma=S (M: mean tokens) or sharegpt"
MAX_TOKENS_MODES = "exact (max_tokens = the output), none (omitted) or cap:N (max_tokens N, outputs cut to it)"


@frozen
class Fixed:
    tokens: int

    def draw(self, rng: random.Random) -> int:
        return self.tokens


@frozen
class Uniform:
    low: int
    high: int

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)


@frozen
class Normal:
    mean: float
    std: float

    def draw(self, rng: random.Random) -> int:
        return max(1, round(rng.gauss(self.mean, self.std)))


@frozen
class LogNormal:
    """Parametrised by the arithmetic mean of the tokens and the sigma of their log."""

    mean: float
    sigma: float

    def draw(self, rng: random.Random) -> int:
        return max(1, round(rng.lognormvariate(math.log(self.mean) - self.sigma**2 / 2, self.sigma)))


@frozen
class ShareGPTLike:
    """(prompt, output) pairs shaped like vLLM's ShareGPT sample: the module docstring has the model and sources."""

    prompt_mu: float = 5.059
    prompt_sigma: float = 1.2
    output_mu: float = 4.784
    output_sigma: float = 1.0

    def draw_pair(self, rng: random.Random) -> tuple[int, int]:
        while True:
            prompt = max(1, round(rng.lognormvariate(self.prompt_mu, self.prompt_sigma)))
            output = max(1, round(rng.lognormvariate(self.output_mu, self.output_sigma)))
            if vllm_valid_sequence(prompt, output):
                return prompt, output


Lengths = Fixed | Uniform | Normal | LogNormal
PairDraw = Callable[[random.Random], tuple[int, int]]


def arrivals(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> tuple[float, ...]:
    """n arrival times in seconds at `rate` requests a second, as vLLM's benchmark draws them (module docstring)."""
    if n < 0:
        raise UsageError(f"{n} requests: expected a number of at least 0")
    if not rate > 0:
        raise UsageError(f"rate {rate}: expected requests a second above 0 (inf: all at once)")
    if not burstiness > 0:
        raise UsageError(f"burstiness {burstiness}: expected a number above 0 (1: Poisson; lower: burstier)")
    if math.isinf(rate):
        return (0.0,) * n
    if math.isinf(burstiness):
        gaps = [1 / rate] * n
    else:
        rng = random.Random(seed)
        gaps = [rng.gammavariate(burstiness, 1 / (rate * burstiness)) for _ in range(n)]
    times = list(accumulate(gaps))
    factor = n / rate / times[-1] if times and times[-1] > 0 else 1.0
    return tuple(time * factor for time in times)


def parse_lengths(spec: str, option: str = "lengths") -> Lengths | ShareGPTLike:
    """A length spec (module docstring) as a sampler; a bad one is one line naming `option`, the spec and the forms."""
    kind, _, arguments = spec.strip().partition(":")
    parser = PARSERS.get(kind.strip().lower())
    try:
        if parser is None:
            raise ValueError(f'unknown kind "{kind}"')
        return parser(arguments.strip())
    except ValueError as exc:
        raise UsageError(f'{option} "{spec}": {exc}; valid forms: {FORMS}') from None


def _fixed(arguments: str) -> Fixed:
    return Fixed(_tokens(arguments))


def _uniform(arguments: str) -> Uniform:
    low, separator, high = arguments.partition("-")
    if not separator:
        raise ValueError("expected LOW-HIGH")
    bounds = Uniform(_tokens(low), _tokens(high))
    if bounds.low > bounds.high:
        raise ValueError("LOW is above HIGH")
    return bounds


def _normal(arguments: str) -> Normal:
    values = _keyed(arguments, ("mean", "std"))
    return Normal(values["mean"], values["std"])


def _lognormal(arguments: str) -> LogNormal:
    values = _keyed(arguments, ("mean", "sigma"))
    return LogNormal(values["mean"], values["sigma"])


def _sharegpt(arguments: str) -> ShareGPTLike:
    if arguments:
        raise ValueError("sharegpt takes no arguments")
    return ShareGPTLike()


def _tokens(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f'"{text}" is not a positive number of tokens')
    return int(text)


def _keyed(arguments: str, names: tuple[str, str]) -> dict[str, float]:
    """ "mean=M,std=S": the mean above 0, the spread at least 0."""
    values: dict[str, float] = {}
    for item in arguments.split(","):
        name, _, text = item.partition("=")
        try:
            values[name.strip()] = float(text)
        except ValueError:
            raise ValueError(f'"{item}" is not NAME=NUMBER') from None
    if sorted(values) != sorted(names):
        raise ValueError(f"expected {names[0]}=... and {names[1]}=...")
    mean, spread = values[names[0]], values[names[1]]
    if not (0 < mean < math.inf and 0 <= spread < math.inf):
        raise ValueError(f"{names[0]} must be above 0 and {names[1]} at least 0")
    return values


PARSERS: dict[str, Callable[[str], Lengths | ShareGPTLike]] = {
    "fixed": _fixed,
    "uniform": _uniform,
    "normal": _normal,
    "lognormal": _lognormal,
    "sharegpt": _sharegpt,
}


def synthetic_trace(
    n: int,
    rate: float | None,
    burstiness: float = 1.0,
    prompt: str = "sharegpt",
    output: str = "sharegpt",
    seed: int = 0,
    max_tokens_mode: str = "exact",
) -> Trace:
    """n requests, their lengths drawn from the `prompt` and `output` specs and their arrivals at `rate` (None:
    untimed, for a caller that gives a concurrency). `max_tokens_mode` is what the client sends: "exact" (max_tokens
    = the output, as vLLM's benchmark sends), "none" (omitted: the engine allows up to max-model-len minus the
    prompt) or "cap:N" (max_tokens N, each output cut to it). Lengths and arrivals draw from separate seeded streams,
    so a new rate keeps the lengths."""
    draw = _pairs(parse_lengths(prompt, "prompt lengths"), parse_lengths(output, "output lengths"))
    cap = _cap(max_tokens_mode)
    rng = random.Random(f"{seed}/lengths")
    times = (0.0,) * max(n, 0) if rate is None else arrivals(n, rate, burstiness, seed)
    requests = tuple(_request(time, *draw(rng), max_tokens_mode, cap) for time in times)
    sent = "untimed" if rate is None else timing(rate, burstiness)
    shape = f"prompt {prompt}, output {output}, seed {seed}"
    source = f"synthetic ({n:,} requests, {sent}, {shape})"
    drawn = rate if rate is not None and math.isfinite(rate) else None
    return Trace(requests, source, timed=rate is not None, drawn_rate=drawn)


def _pairs(prompt: Lengths | ShareGPTLike, output: Lengths | ShareGPTLike) -> PairDraw:
    """One draw of (prompt, output): a ShareGPT pair whole when both sides are sharegpt, else a side each."""
    if isinstance(prompt, ShareGPTLike) and isinstance(output, ShareGPTLike):
        return prompt.draw_pair
    prompt_draw = (lambda rng: prompt.draw_pair(rng)[0]) if isinstance(prompt, ShareGPTLike) else prompt.draw
    output_draw = (lambda rng: output.draw_pair(rng)[1]) if isinstance(output, ShareGPTLike) else output.draw
    return lambda rng: (prompt_draw(rng), output_draw(rng))


def check_max_tokens_mode(mode: str) -> None:
    """--max-tokens: trace, exact, none or cap:N, N a whole number of tokens from 1 (vLLM refuses max_tokens 0)."""
    if mode == "trace":
        return
    try:
        _cap(mode)
    except UsageError:
        raise UsageError(f"--max-tokens {mode!r}; valid: trace, exact, none, cap:N (N tokens, 1 or more)") from None


def _cap(mode: str) -> int | None:
    kind, _, tokens = mode.partition(":")
    if mode in ("exact", "none"):
        return None
    if kind == "cap" and tokens.isdigit() and int(tokens) >= 1:
        return int(tokens)
    raise UsageError(f'max_tokens mode "{mode}": expected {MAX_TOKENS_MODES}')


def _request(time: float, prompt: int, output: int, mode: str, cap: int | None) -> TraceRequest:
    if cap is not None:
        return TraceRequest(time, prompt, min(output, cap), max_tokens=cap)
    return TraceRequest(time, prompt, output, max_tokens=output if mode == "exact" else None)


def timing(rate: float, burstiness: float) -> str:
    """How arrivals at `rate` are drawn, as a trace's source names them."""
    if math.isinf(rate):
        return "all sent at once"
    if burstiness == 1:
        return f"Poisson arrivals at {rate:g}/s"
    return f"gamma arrivals at {rate:g}/s, burstiness {burstiness:g}"
