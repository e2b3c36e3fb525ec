"""The KV guard inside a real vLLM scheduler, built in-process on the CPU with a tiny block pool (vLLM's own
scheduler tests do the same); a stand-in model runner samples one token per request per step."""

from __future__ import annotations

import itertools
import random

import pytest

from kvops.policy import Level, Limits
from tests.support.policy_endpoint import PolicyEndpoint
from tests.support.servers import captured_log
from tests.support.vllm_scheduler import Driver, Requests, build_scheduler

pytestmark = pytest.mark.vllm


@pytest.fixture
def stock(tiny_model):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    return lambda **options: build_scheduler(AsyncScheduler, tiny_model, **options)


@pytest.fixture
def guard(tiny_model, monkeypatch):
    from kvops_vllm.scheduler import KVGuardScheduler

    def build(env: dict[str, str] | None = None, **options):
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        scheduler = build_scheduler(KVGuardScheduler, tiny_model, **options)
        if scheduler.follower:
            scheduler.follower.stop()  # the tests poll it themselves
        return scheduler

    for name in (
        "KVOPS_POLICY",
        "KVOPS_HEADROOM_BLOCKS",
        "KVOPS_POLICY_URL",
        "KVOPS_LOG_SECONDS",
        "KVOPS_ADMISSION",
        "KVOPS_LEVELS",
        "KVOPS_OUTPUT_QUANTILE",
        "KVOPS_OUTPUT_HISTORY",
        "KVOPS_OUTPUT_MIN_ENDS",
        "KVOPS_COLD_START",
        "KVOPS_PAUSE_STEPS",
        "KVOPS_PREEMPT",
        "KVOPS_RESUME",
        "KVOPS_RESUME_WAIT_STEPS",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KVOPS_POLICY_TIMEOUT_SECONDS", "10")  # a busy 2-core machine's local watcher can be slow
    return build


@pytest.fixture
def requests():
    return Requests()


@pytest.fixture
def guard_log():
    with captured_log("vllm.kvops_guard") as (_, records):
        yield records


@pytest.fixture
def watcher():
    with PolicyEndpoint() as endpoint:
        yield endpoint


def mixed_burst(requests: Requests, count: int = 6):
    """Prompts of 20-45 tokens, 30-65 new tokens: 4-7 blocks of 16 each, against a 10-block pool."""
    return [requests.make(f"r{i}", 20 + 5 * i, 30 + 7 * i, first_token=50 * i) for i in range(count)]


V1 = {"KVOPS_ADMISSION": "reserve"}
BOTH = pytest.mark.parametrize("admission", ["peak", "reserve"])


# --- admission: the future peak (v2) and the reservation (v1) -------------------------------------------------


@BOTH
def test_the_stock_scheduler_preempts_where_the_guard_queues(stock, guard, requests, admission):
    runs = {}
    for name, build in (("stock", stock), ("guard", lambda **o: guard({"KVOPS_ADMISSION": admission}, **o))):
        scheduler = build(num_blocks=11)
        burst = mixed_burst(requests)
        for request in burst:
            scheduler.add_request(request)
        runs[name] = Driver(scheduler).drain()
        assert {r: (f.finish_reason, f.tokens) for r, f in runs[name].finished.items()} == {
            r.request_id: ("length", r.max_tokens) for r in burst
        }
        assert not scheduler.waiting and not scheduler.running and not scheduler.requests
    assert runs["stock"].preemptions > 0
    assert runs["guard"].preemptions == 0
    assert runs["guard"].peak_waiting > 0  # it queued instead


def test_a_prompt_prefix_that_requests_share_is_counted_once(stock, guard, requests):
    """Prefix caching: 12 requests with one 72-token prompt (4 full blocks of 16, shared) and 8 new tokens each (a
    block of their own) need 4 + 12 blocks together; counted per request they looked like 60 on a pool of 19, and
    the guard ran them 3 at a time (37 steps against stock's 10). Then all 12 ran at once once the first 3 held
    the prefix (13 steps); now the blocks the first caches in the step count for the 11 behind it, as vLLM hits
    them in the same step (allocate_slots caches what it allocates), so all 12 start at once, as under stock."""
    runs = {}
    for name, build in (("stock", stock), ("guard", guard)):
        scheduler = build(num_blocks=20)
        for index in range(12):
            scheduler.add_request(requests.make(f"r{index}", 72, 8, first_token=7))
        runs[name] = Driver(scheduler).drain()
    assert runs["guard"].preemptions == runs["stock"].preemptions == 0
    assert runs["guard"].peak_running == runs["stock"].peak_running == 12
    assert runs["stock"].steps == runs["guard"].steps == 10


@pytest.mark.parametrize(("headroom", "concurrent"), [("0", 3), ("2", 2), ("5", 2), ("6", 1)])
def test_v1_admits_exactly_what_fits_the_free_blocks_less_the_headroom(guard, requests, headroom, concurrent):
    scheduler = guard({**V1, "KVOPS_HEADROOM_BLOCKS": headroom}, num_blocks=14)  # 13 usable blocks
    for i in range(8):
        scheduler.add_request(requests.make(f"r{i}", 20, 44, first_token=40 * i))  # 64 tokens: 4 blocks each
    assert scheduler.projected_blocks(scheduler.waiting.peek_request()) == 4
    run = Driver(scheduler).drain()
    assert run.peak_running == concurrent  # floor((13 - headroom) / 4), and at least one
    assert run.preemptions == 0 and len(run.finished) == 8


@pytest.mark.parametrize("headroom", ["0", "2", "5", "6"])
def test_v2_runs_more_at_once_than_v1_and_never_preempts_with_known_lengths(guard, requests, headroom):
    runs = {}
    for admission in ("reserve", "peak"):
        scheduler = guard({"KVOPS_ADMISSION": admission, "KVOPS_HEADROOM_BLOCKS": headroom}, num_blocks=14)
        for i in range(8):
            scheduler.add_request(requests.make(f"r{i}", 20, 44, first_token=40 * i))
        runs[admission] = run = Driver(scheduler).drain()
        assert run.preemptions == 0 and len(run.finished) == 8
        assert run.peak_usage <= max(13 - int(headroom), 4) / 13  # never beyond the pool less the headroom
    assert runs["peak"].peak_running >= runs["reserve"].peak_running
    assert runs["peak"].steps <= runs["reserve"].steps


@BOTH
def test_what_admitted_requests_will_still_grow_is_counted(guard, stock, requests, admission):
    for build, preempts in ((stock, True), (lambda **o: guard({"KVOPS_ADMISSION": admission}, **o), False)):
        scheduler = build(num_blocks=12)  # 11 usable blocks
        scheduler.add_request(requests.make("long", 16, 112))  # 128 tokens: 8 blocks, 1 held after its prefill
        driver = Driver(scheduler)
        driver.step()
        scheduler.add_request(requests.make("late", 48, 80, first_token=200))  # 128 tokens: 8 blocks; its prompt fits
        driver.step()
        if build is not stock:
            assert [r.request_id for r in scheduler.running] == ["long"]
            assert [r.request_id for r in scheduler.waiting] == ["late"]
            if admission == "reserve":
                assert scheduler.kv_slack() == 11 - 8  # free blocks less what "long" will still allocate
            else:
                from kvops_vllm.admission import future_peak

                running, waiting = scheduler.courses(scheduler.running), scheduler.courses(list(scheduler.waiting))
                assert future_peak(running, scheduler.kv_shapes) == 8  # "long" alone
                # at step 80 "late" would hold its 8 blocks while "long" holds 98 tokens: 7
                assert future_peak(running + waiting, scheduler.kv_shapes) == 8 + 7 > 11
        run = driver.drain()
        assert (run.preemptions > 0) == preempts
        assert set(run.finished) == {"long", "late"}


def test_v2_admits_a_request_that_ends_before_the_running_batch_peaks(guard, requests):
    for admission, admitted in (("reserve", False), ("peak", True)):
        scheduler = guard({"KVOPS_ADMISSION": admission}, num_blocks=12)  # 11 usable blocks
        scheduler.add_request(requests.make("long", 16, 112))  # 8 blocks at its end, 111 steps from now
        driver = Driver(scheduler)
        driver.step()
        scheduler.add_request(requests.make("short", 48, 16, first_token=200))  # 4 blocks, done in 16 steps
        driver.step()
        assert ("short" in {r.request_id for r in scheduler.running}) == admitted
        run = driver.drain()
        assert run.preemptions == 0 and set(run.finished) == {"long", "short"}


def test_a_blocked_queue_is_weighed_again_when_blocks_free_or_every_16_steps(guard, requests, monkeypatch):
    """Under load most steps admit nothing: the arithmetic is not redone for a head that did not fit until a
    request frees blocks (then at once) or 16 steps pass."""
    from kvops_vllm import scheduler as module

    scheduler = guard(num_blocks=12)  # 11 usable blocks
    scheduler.add_request(requests.make("long", 16, 100))  # 8 blocks at its end
    scheduler.add_request(requests.make("short", 16, 20, first_token=100))  # ends after 20 steps
    driver = Driver(scheduler)
    driver.step()
    weighed, freed = [], []
    admissible, free = module.KVGuardScheduler._admissible, module.KVGuardScheduler._free_request
    monkeypatch.setattr(
        module.KVGuardScheduler, "_admissible", lambda self, c: weighed.append(self.current_step) or admissible(self, c)
    )
    monkeypatch.setattr(
        module.KVGuardScheduler,
        "_free_request",
        lambda self, r, *a: freed.append(self.current_step) or free(self, r, *a),
    )
    scheduler.add_request(requests.make("next", 64, 40, first_token=200))  # 7 blocks: fits once "long" ends
    while "next" not in {request.request_id for request in scheduler.running}:
        driver.step()
    assert len(freed) == 2  # "short", then "long"
    for earlier, later in itertools.pairwise(weighed):
        assert later - earlier == 16 or any(earlier <= step <= later for step in freed)
    assert len(weighed) <= (weighed[-1] - weighed[0]) // 16 + 1 + len(freed)
    assert weighed[-1] == freed[-1]  # "long" freed its blocks: weighed again at once, and admitted
    assert driver.drain().preemptions == 0


@BOTH
def test_the_first_come_is_served_first(guard, requests, admission):
    scheduler = guard({"KVOPS_ADMISSION": admission}, num_blocks=12)
    scheduler.add_request(requests.make("running", 20, 108))  # 8 blocks
    driver = Driver(scheduler)
    driver.step()
    scheduler.add_request(requests.make("big", 64, 64, first_token=100))  # 8 blocks: must wait for "running"
    scheduler.add_request(requests.make("small", 8, 8, first_token=300))  # 1 block: fits, but comes after "big"
    driver.step()
    assert [r.request_id for r in scheduler.waiting] == ["big", "small"]
    order = []
    while scheduler.has_requests() or driver.in_flight:
        for request in scheduler.running:
            if request.request_id not in order:
                order.append(request.request_id)
        driver.step() if scheduler.has_requests() else driver.settle()
    assert order == ["running", "big", "small"]


@BOTH
def test_an_idle_engine_admits_a_request_larger_than_the_pool_less_the_headroom(guard, requests, admission):
    scheduler = guard({"KVOPS_ADMISSION": admission, "KVOPS_HEADROOM_BLOCKS": "10"}, num_blocks=12)
    scheduler.add_request(requests.make("only", 20, 44))  # 4 blocks > 11 - 10
    run = Driver(scheduler).drain()
    assert run.finished["only"].tokens == 44 and run.preemptions == 0


@BOTH
def test_a_sliding_window_group_is_projected_up_to_its_window(guard, requests, admission):
    scheduler = guard({"KVOPS_ADMISSION": admission}, num_blocks=80, sliding_window=32, max_num_batched_tokens=64)
    full, sliding = scheduler.kv_shapes
    manager = scheduler.kv_cache_manager.coordinator.single_type_managers[1]
    assert full.max_blocks is None
    assert sliding.window == 32
    # vLLM's own cap: (window - 1 + tokens in flight) / block size, + 1 block for alignment
    assert (
        sliding.max_blocks
        == manager.max_admission_blocks_per_request
        == (31 + scheduler.vllm_config.max_in_flight_tokens + 15) // 16 + 1
    )
    assert sliding.decode_blocks == 32 // 16 + 1  # decoding, one token in flight: the window and one block
    long = requests.make("long", 100, 412)  # 512 tokens
    assert scheduler.projected_blocks(long) == 32 + sliding.max_blocks
    assert scheduler.projected_blocks(requests.make("short", 10, 22)) == 2 + 2  # short: no cap reached
    for request in [long, *(requests.make(f"r{i}", 40, 200, first_token=30 * i) for i in range(4))]:
        scheduler.add_request(request)
    run = Driver(scheduler).drain()
    assert run.preemptions == 0 and len(run.finished) == 5


# --- unknown lengths: learned from the past, and the fallback ------------------------------------------------


def learn(scheduler, requests, count: int = 40, length: int = 10):
    """`count` requests that stop by themselves after `length` tokens (max_tokens 200): the engine's past."""
    driver = Driver(scheduler, lengths={f"past{i}": length for i in range(count)})
    for i in range(count):
        scheduler.add_request(requests.make(f"past{i}", 8, 200, stops=True, first_token=7 * i))
    run = driver.drain()
    assert {finished.tokens for finished in run.finished.values()} == {length}
    from kvops_vllm.scheduler import GuardCounts

    scheduler.guard_counts = GuardCounts()  # what a test counts starts here (a cold engine preempts as stock does)
    return driver


def test_lengths_from_the_past_let_more_requests_run_than_their_max_tokens(guard, requests):
    runs = {}
    for admission in ("reserve", "peak"):
        scheduler = guard({"KVOPS_ADMISSION": admission}, num_blocks=41)  # 40 usable blocks
        learn(scheduler, requests)
        lengths = {f"r{i}": 12 for i in range(10)}
        for i in range(10):  # 20 + 200 tokens at most: 14 blocks each; they stop after 12 tokens (2 blocks)
            scheduler.add_request(requests.make(f"r{i}", 20, 200, stops=True, first_token=300 + 9 * i))
        runs[admission] = Driver(scheduler, lengths=lengths).drain()
        assert {runs[admission].finished[f"r{i}"].tokens for i in range(10)} == {12}
        assert runs[admission].preemptions == 0
    assert runs["reserve"].peak_running == 2  # 40 // 14
    assert runs["peak"].peak_running == 10  # the past: 10 tokens, +1 for what they have generated
    assert runs["peak"].steps < runs["reserve"].steps / 2


def unknown_burst(requests: Requests, seed: int, max_tokens: int | None = 200, count: int = 16):
    """`count` requests of unknown length (a stop token), prompts of 20-50 tokens, and where each stops (20-200
    tokens); `max_tokens` None: the rest of the context, as vLLM's API server sets it for a client that sent none."""
    rng = random.Random(seed)
    burst, lengths = [], {}
    for i in range(count):
        prompt = rng.randint(20, 50)
        limit = 1024 - prompt if max_tokens is None else max_tokens
        burst.append(requests.make(f"r{i}", prompt, limit, stops=True, first_token=300 + 9 * i))
        lengths[f"r{i}"] = rng.randint(20, 200)
    return burst, lengths


def started(scheduler, burst, lengths: dict[str, int], steps: int) -> list[int]:
    """How many of `burst` (all sent at once) have started by each of the first `steps` steps."""
    for request in burst:
        scheduler.add_request(request)
    driver, seen, counts = Driver(scheduler, lengths=lengths), set(), []
    for _ in range(steps):
        driver.step()
        seen |= {request.request_id for request in scheduler.running}
        counts.append(len(seen))
    return counts


COLD_ARMS = ("stock", "guard", "max_tokens")  # the last: guard v2 before, every unknown length at its max_tokens


def cold_arm(name: str, stock, guard):
    """A scheduler builder for one of COLD_ARMS: a fresh engine, no lengths learned."""
    if name == "stock":
        return stock
    return lambda **o: guard({"KVOPS_COLD_START": "stock" if name == "guard" else "max_tokens"}, **o)


@pytest.mark.parametrize("max_tokens", [200, None])
def test_a_cold_guard_admits_unknown_lengths_as_stock_does(guard, stock, max_tokens):
    """No lengths learned yet (a freshly started engine): requests of unknown length are admitted while their
    prompts fit, as stock vLLM admits them, not one at a time by their max_tokens (or the whole context)."""
    first = {}
    for name in COLD_ARMS:
        scheduler = cold_arm(name, stock, guard)(num_blocks=41)  # 40 usable: 16 prompts of 2-4 blocks fit at once
        burst, lengths = unknown_burst(Requests(), seed=0, max_tokens=max_tokens)
        first[name] = started(scheduler, burst, lengths, 8)
    assert first["guard"] == first["stock"] and first["stock"][0] >= 12
    assert first["max_tokens"][-1] <= 3  # 200 tokens (or the whole context) each: a few at a time


def test_a_cold_guard_with_unknown_lengths_is_not_slower_than_stock(guard, stock):
    """Bursts on a fresh engine, each 16 requests into a pool that holds about 4 of them at their length: until
    lengths are learned the guard admits and preempts as stock vLLM does (no pause in place: it has no lengths to
    bet that a block frees soon), so it takes stock's steps; projected at max_tokens, the same bursts took twice as
    many."""
    steps = dict.fromkeys(COLD_ARMS, 0)
    for seed in range(4):
        for name in COLD_ARMS:
            scheduler = cold_arm(name, stock, guard)(num_blocks=41)
            burst, lengths = unknown_burst(Requests(), seed)
            for request in burst:
                scheduler.add_request(request)
            run = Driver(scheduler, lengths=lengths).drain(max_steps=5000)
            assert {request: finished.tokens for request, finished in run.finished.items()} == lengths
            steps[name] += run.steps
    assert steps["guard"] <= 1.02 * steps["stock"]
    assert steps["max_tokens"] > 1.5 * steps["stock"]


def test_requests_without_max_tokens_past_every_length_seen_are_projected_by_the_tail(guard, requests):
    """The past ended after 5 to 44 tokens. Four requests sent without max_tokens (the rest of the context: 63
    blocks each at their end, of 40) run past all of them; six short ones arrive meanwhile. Projected at the whole
    context, the four would hold the queue until they end; by the tail of the lengths seen (about 10 tokens more
    to go at every step), the short ones run beside them."""
    scheduler = guard(num_blocks=41)  # 40 usable blocks
    driver = Driver(scheduler, lengths={f"past{i}": 5 + i for i in range(40)})
    for i in range(40):
        scheduler.add_request(requests.make(f"past{i}", 8, 200, stops=True, first_token=7 * i))
    driver.drain()
    driver.lengths.update({**{f"long{i}": 100 for i in range(4)}, **{f"short{i}": 10 for i in range(6)}})
    for i in range(4):
        scheduler.add_request(requests.make(f"long{i}", 20, 1024 - 20, stops=True, first_token=400 + 9 * i))
    while min(scheduler.requests[f"long{i}"].num_output_tokens for i in range(4)) < 50:
        driver.step()
    for i in range(6):
        scheduler.add_request(requests.make(f"short{i}", 20, 200, stops=True, first_token=600 + 9 * i))
    finished = []
    while scheduler.has_requests() or driver.in_flight:
        before = set(driver.run.finished)
        driver.step() if scheduler.has_requests() else driver.settle()
        finished += sorted(set(driver.run.finished) - before)
    assert finished[:6] == sorted(f"short{i}" for i in range(6))  # every short one, before any long one ends
    assert {driver.run.finished[f"long{i}"].tokens for i in range(4)} == {100}


def test_a_misprediction_falls_back_to_preemption_without_hanging(guard, requests):
    scheduler = guard(num_blocks=21)  # 20 usable blocks
    learn(scheduler, requests)  # the past says: 10 tokens
    # but these run to their max_tokens (no stop sampled): 16 + 100 tokens = 8 blocks each, 6 of them
    for i in range(6):
        scheduler.add_request(requests.make(f"long{i}", 16 + 16 * (i % 2), 100, stops=True, first_token=300 + i))
    run = Driver(scheduler).drain(max_steps=3000)
    assert {run.finished[f"long{i}"].tokens for i in range(6)} == {100}  # all complete
    assert run.preemptions > 0
    counts = scheduler.guard_counts
    assert counts.mispredicted == 6 and counts.preempted == run.preemptions and counts.recomputed_tokens > 0
    assert not scheduler.requests


def test_a_misprediction_pauses_requests_in_place_before_preempting(guard, stock, requests):
    """Requests that outlive the past's lengths, ending one after another: where the pool runs short, the ones
    that would need a block sit a step out holding their blocks, and resume as the shorter ones end; vLLM preempts
    only when none of them could run."""
    lengths = {f"r{i}": 40 + 20 * i for i in range(6)}  # 40 to 140 tokens: 4 to 10 blocks each, of 20
    runs, schedulers = {}, {}
    for name, build in (("stock", stock), ("guard", guard)):
        scheduler = schedulers[name] = build(num_blocks=21)
        if name == "guard":
            learn(scheduler, requests)  # the past says: 10 tokens
        for i in range(6):
            scheduler.add_request(requests.make(f"r{i}", 20, 200, stops=True, first_token=300 + 9 * i))
        runs[name] = Driver(scheduler, lengths=lengths).drain(max_steps=3000)
        assert {request: finished.tokens for request, finished in runs[name].finished.items()} == lengths
    counts = schedulers["guard"].guard_counts
    assert counts.paused > 0 and counts.mispredicted == 6
    assert runs["guard"].preemptions < runs["stock"].preemptions
    assert counts.preempted == runs["guard"].preemptions


def sitting_out(scheduler) -> dict[str, int]:
    """Watch every step: the most steps in a row each running request was not scheduled (it sat out)."""
    original, streaks, longest = scheduler.schedule, {}, {}

    def schedule(*args, **kwargs):
        output = original(*args, **kwargs)
        for request in scheduler.running:
            name = request.request_id
            streaks[name] = 0 if name in output.num_scheduled_tokens else streaks.get(name, 0) + 1
            longest[name] = max(longest.get(name, 0), streaks[name])
        return output

    scheduler.schedule = schedule
    return longest


def test_a_request_sits_out_at_most_kvops_pause_steps_in_a_row(guard, requests):
    """Past that, the pool has stayed short for longer than a recompute costs: vLLM preempts the request that
    computed least. 0: never pause."""
    lengths = {f"r{i}": 40 + 20 * i for i in range(6)}  # as above: the past says 10 tokens, they run 40 to 140
    longest, preemptions = {}, {}
    for limit in (0, 3, 1000):
        scheduler = guard({"KVOPS_PAUSE_STEPS": str(limit)}, num_blocks=21)
        learn(scheduler, requests)
        sat_out = sitting_out(scheduler)
        for i in range(6):
            scheduler.add_request(requests.make(f"r{i}", 20, 200, stops=True, first_token=300 + 9 * i))
        run = Driver(scheduler, lengths=lengths).drain(max_steps=3000)
        assert {request: finished.tokens for request, finished in run.finished.items()} == lengths
        longest[limit], preemptions[limit] = max(sat_out.values()), run.preemptions
        assert scheduler.guard_counts.preempted == run.preemptions
    assert longest[0] == 0 and preemptions[0] > 0
    assert longest[1000] > 3  # unbounded, a request sits out longer here
    assert longest[3] <= 3
    assert preemptions[1000] < preemptions[3] <= preemptions[0]


SHORT_PROMPT, LONG_PROMPT = ("short-prompt", 8, 150), ("long-prompt", 100, 100)  # 10 and 13 blocks at their ends


def two_growing(scheduler, requests, first, then) -> Driver:
    """`first` admitted, `then` two steps later: of 16 usable blocks, the pool runs out after about 75 steps, when
    the long prompt has computed some 175 tokens and the short one some 85."""
    driver = Driver(scheduler)
    scheduler.add_request(requests.make(*first, stops=True))
    driver.step()
    driver.step()
    scheduler.add_request(requests.make(*then, stops=True, first_token=100))  # the newest
    return driver


def first_victims(builds, requests, first, then) -> dict[str, str]:
    """Each scheduler's first victim (the guards having learned that requests end after 4 tokens)."""
    victims = {}
    for name, build in builds:
        scheduler = build(num_blocks=17)  # 16 usable blocks
        if name != "stock":
            learn(scheduler, requests, length=4)
        run = two_growing(scheduler, requests, first, then).drain(max_steps=3000)
        assert {run.finished[request].tokens for request in ("short-prompt", "long-prompt")} == {150, 100}
        victims[name] = run.preempted[0]
    return victims


def test_the_fallback_preempts_the_request_that_computed_least(guard, stock, requests):
    """vLLM's FCFS victim is the newest request; KVOPS_PREEMPT=least-computed (guard v2) makes it the one with the
    least work to recompute."""
    builds = (("stock", stock), ("guard", lambda **o: guard({"KVOPS_PREEMPT": "least-computed"}, **o)))
    victims = first_victims(builds, requests, SHORT_PROMPT, LONG_PROMPT)
    assert victims == {"stock": "long-prompt", "guard": "short-prompt"}


def test_most_computed_preempts_the_request_that_computed_most(guard, stock, requests):
    """KVOPS_PREEMPT=most-computed (the default): the victim frees the most blocks (here the older request, where
    vLLM's FCFS victim and least-computed are the newest, which computed least)."""
    builds = (
        ("stock", stock),
        ("least", lambda **o: guard({"KVOPS_PAUSE_STEPS": "0", "KVOPS_PREEMPT": "least-computed"}, **o)),
        ("most", lambda **o: guard({"KVOPS_PAUSE_STEPS": "0", "KVOPS_PREEMPT": "most-computed"}, **o)),
    )
    victims = first_victims(builds, requests, LONG_PROMPT, SHORT_PROMPT)
    assert victims == {"stock": "short-prompt", "least": "short-prompt", "most": "long-prompt"}


def admission_order(scheduler, driver) -> list[str]:
    """Drain, noting each request that starts to run from now on (again, after a preemption), in the order vLLM
    admitted them (the order of its running list)."""
    order, running = [], {request.request_id for request in scheduler.running}
    while scheduler.has_requests() or driver.in_flight:
        now = [request.request_id for request in scheduler.running]
        order += [name for name in now if name not in running]
        running = set(now)
        driver.step() if scheduler.has_requests() else driver.settle()
    return order


@pytest.mark.parametrize("resume, wait", [("first", "200"), ("after-new", "200"), ("after-new", "0")])
def test_a_preempted_request_resumes_first_or_after_new_ones(guard, requests, resume, wait):
    """KVOPS_RESUME=after-new (the default): a request preempted after its first tokens lets a request that has none go first,
    for at most KVOPS_RESUME_WAIT_STEPS steps (0: never)."""
    settings = {"KVOPS_PAUSE_STEPS": "0", "KVOPS_PREEMPT": "least-computed", "KVOPS_RESUME": resume}
    scheduler = guard({**settings, "KVOPS_RESUME_WAIT_STEPS": wait}, num_blocks=17)
    learn(scheduler, requests, length=4)
    driver = two_growing(scheduler, requests, LONG_PROMPT, SHORT_PROMPT)
    while not driver.run.preempted:
        driver.step()
    assert driver.run.preempted == ["short-prompt"]  # least-computed: the newest
    scheduler.add_request(requests.make("new", 8, 8, stops=True, first_token=200))  # 1 block: it fits at once
    order = admission_order(scheduler, driver)
    new_first = resume == "after-new" and wait != "0"
    assert order[:2] == (["new", "short-prompt"] if new_first else ["short-prompt", "new"])
    assert {driver.run.finished[r].tokens for r in ("long-prompt", "short-prompt", "new")} == {100, 150, 8}


# --- priorities ------------------------------------------------------------------------------------------------


def test_the_priority_policy_admits_the_most_urgent_first(guard, requests):
    scheduler = guard(num_blocks=12, policy="priority")
    scheduler.add_request(requests.make("running", 20, 108))  # 8 of 11 blocks until it ends
    driver = Driver(scheduler)
    driver.step()
    for request_id, priority in (("sheddable", 1), ("standard", 0), ("protected", -1)):
        scheduler.add_request(requests.make(request_id, 60, 20, first_token=50, priority=priority))
    order = []
    while scheduler.has_requests() or driver.in_flight:
        order += [r.request_id for r in scheduler.running if r.request_id not in order]
        driver.step() if scheduler.has_requests() else driver.settle()
    assert order == ["running", "protected", "standard", "sheddable"]
    assert driver.run.preemptions == 0


# --- the policy at admission ------------------------------------------------------------------------------


def small_limits(level: str) -> Limits:
    """The shipped policy's actions at `level`, with a cap small enough to see in a few steps."""
    refuses = level in ("degrade", "critical")
    return Limits(
        Level.parse(level),
        max_tokens_cap=8,
        single_sequence=level != "warn",
        reject=level == "critical",
        retry_after_seconds=10 if refuses else None,
        reject_sheddable=refuses,
    )


def followed(guard, watcher, level: str, usage: float = 0.5, **options):
    scheduler = guard({"KVOPS_POLICY_URL": watcher.url, "KVOPS_POLICY_POLL_SECONDS": "3600"}, **options)
    watch(scheduler, watcher, level, usage)
    return scheduler


def watch(scheduler, watcher, level: str, usage: float = 0.5) -> None:
    """The watcher says `level` from now on (the follower reads it at once)."""
    watcher.follow(level, usage, limits=small_limits(level) if level != "ok" else None)
    scheduler.follower.poll()


def test_warn_caps_max_tokens_for_the_scheduler_and_the_model_runner(guard, watcher, requests):
    scheduler = followed(guard, watcher, "warn", num_blocks=20)
    long, short = requests.make("long", 10, 40, min_tokens=20), requests.make("short", 10, 5, first_token=100)
    scheduler.add_request(long)
    scheduler.add_request(short)
    assert (long.max_tokens, long.sampling_params.max_tokens, long.sampling_params.min_tokens) == (8, 8, 8)
    assert (short.max_tokens, short.sampling_params.max_tokens) == (5, 5)
    run = Driver(scheduler).drain()
    assert (run.finished["long"].finish_reason, run.finished["long"].tokens) == ("length", 8)
    assert run.finished["short"].tokens == 5
    assert scheduler.guard_counts.capped == 1


def test_degrade_keeps_the_siblings_of_a_fanned_out_n_and_sheddable_requests_waiting(guard, watcher, requests):
    scheduler = followed(guard, watcher, "degrade", usage=0.88, num_blocks=20)
    siblings = ("0_cmpl-a-0-1234abcd", "1_cmpl-a-0-1234abcd", "2_cmpl-a-0-1234abcd")
    for request_id in (*siblings, "cmpl-b-0-5678abcd"):
        scheduler.add_request(requests.make(request_id, 10, 20))
    scheduler.add_request(requests.make("cmpl-shed", 10, 20, priority=1))
    driver = Driver(scheduler)
    run = driver.drain(max_steps=60)
    assert set(run.finished) == {"0_cmpl-a-0-1234abcd", "cmpl-b-0-5678abcd"}  # served, capped at 8
    assert {run.finished[request].tokens for request in run.finished} == {8}
    assert {r.request_id for r in scheduler.waiting} == {"1_cmpl-a-0-1234abcd", "2_cmpl-a-0-1234abcd", "cmpl-shed"}
    assert scheduler.guard_counts.held_by_level == 3  # each counted once, however many steps it waited

    watch(scheduler, watcher, "ok")
    run = driver.drain()
    assert {request: run.finished[request].tokens for request in ("1_cmpl-a-0-1234abcd", "cmpl-shed")} == {
        "1_cmpl-a-0-1234abcd": 8,  # capped when it arrived, at degrade
        "cmpl-shed": 8,
    }
    assert all(finished.finish_reason == "length" for finished in run.finished.values())


def test_critical_keeps_new_requests_waiting_but_the_protected_and_never_answers_them_empty(guard, watcher, requests):
    scheduler = followed(guard, watcher, "critical", usage=0.97, num_blocks=20)
    scheduler.add_request(requests.make("plain", 10, 20))
    scheduler.add_request(requests.make("streamed", 10, 20, stream=True))
    scheduler.add_request(requests.make("protected", 10, 20, priority=-1))
    driver = Driver(scheduler)
    run = driver.drain(max_steps=60)
    assert set(run.finished) == {"protected"} and run.finished["protected"].tokens == 8
    assert {r.request_id for r in scheduler.waiting} == {"plain", "streamed"}  # waiting, not finished

    watch(scheduler, watcher, "ok", 0.1)
    scheduler.add_request(requests.make("after", 10, 20))
    run = driver.drain()
    assert {request: run.finished[request].tokens for request in ("plain", "streamed", "after")} == {
        "plain": 8,
        "streamed": 8,
        "after": 20,
    }
    assert {finished.finish_reason for finished in run.finished.values()} == {"length"}
    assert not scheduler.requests


def test_an_unusable_watcher_leaves_no_level(guard, watcher, requests, guard_log):
    scheduler = followed(guard, watcher, "critical", num_blocks=20)
    scheduler.add_request(requests.make("r", 10, 20))
    driver = Driver(scheduler)
    assert not driver.drain(max_steps=10).finished  # critical: it waits
    watcher.serve(b"", status=503)
    scheduler.follower.poll()
    assert driver.drain().finished["r"].tokens == 8  # capped at critical, when it arrived
    assert "kvops guard: level critical -> ok (watcher unusable): no limits" in guard_log
    assert f"kvops guard: watcher at {watcher.url} unusable (HTTP 503); no level until it answers" in guard_log


def write_policy(tmp_path, warn: float, degrade: float, critical: float) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(
        f"levels: {{warn: {warn}, degrade: {degrade}, critical: {critical}}}\n"
        "actions:\n  warn: {max_tokens_cap: 8}\n  degrade: {max_tokens_cap: 8, single_sequence: true}\n"
        "  critical: {max_tokens_cap: 8, single_sequence: true, reject: true, retry_after_seconds: 5}\n"
    )
    return str(path)


OWN = {"KVOPS_LEVELS": "own"}


def test_levels_follow_own_kv_usage_and_each_change_is_logged_once(guard, requests, tmp_path, guard_log):
    scheduler = guard({**OWN, "KVOPS_POLICY": write_policy(tmp_path, 0.3, 0.5, 0.9)}, num_blocks=11)  # 10 usable
    scheduler.add_request(requests.make("first", 60, 20))  # 4 blocks once prefilled, 5 at most
    driver = Driver(scheduler)
    driver.step()
    driver.step()
    scheduler.add_request(requests.make("second", 10, 40, first_token=100))
    assert scheduler.in_force[0].level == Level.WARN
    assert scheduler.requests["second"].max_tokens == 8
    assert [line for line in guard_log if " -> " in line] == [
        "kvops guard: level ok -> warn (own KV usage 40.0%): capped at 8 new tokens"
    ]
    driver.drain()


def test_own_kv_usage_sets_no_level_by_default(guard, requests, tmp_path, guard_log):
    """A guard that admits by the future peak runs the pool full on purpose: by default only the watcher grades."""
    scheduler = guard({"KVOPS_POLICY": write_policy(tmp_path, 0.3, 0.5, 0.9)}, num_blocks=11)
    scheduler.add_request(requests.make("first", 60, 20))
    driver = Driver(scheduler)
    driver.step()
    driver.step()
    scheduler.add_request(requests.make("second", 10, 40, first_token=100))
    assert scheduler.in_force[0].level == Level.OK and scheduler.requests["second"].max_tokens == 40
    assert not [line for line in guard_log if " -> " in line]
    driver.drain()


def test_a_watcher_below_own_usage_does_not_lower_the_level(guard, watcher, requests, tmp_path):
    scheduler = guard(
        {**OWN, "KVOPS_POLICY": write_policy(tmp_path, 0.3, 0.5, 0.9), "KVOPS_POLICY_URL": watcher.url},
        num_blocks=11,
    )
    scheduler.follower.stop()
    watcher.follow("ok", 0.0)
    scheduler.follower.poll()
    scheduler.add_request(requests.make("first", 60, 20))
    driver = Driver(scheduler)
    driver.step()
    driver.step()
    scheduler.add_request(requests.make("second", 10, 40, first_token=100))
    assert scheduler.in_force[0].level == Level.WARN and scheduler.in_force[1].startswith("own KV usage")
    driver.drain()


@pytest.mark.parametrize(
    ("name", "value", "line"),
    [
        ("KVOPS_HEADROOM_BLOCKS", "lots", "KVOPS_HEADROOM_BLOCKS='lots': must be a whole number of blocks, 0 or more"),
        ("KVOPS_ADMISSION", "greedy", "KVOPS_ADMISSION='greedy': must be one of peak, reserve"),
    ],
)
def test_a_bad_setting_stops_the_engine_at_startup_with_one_line(guard, guard_log, name, value, line):
    from kvops_vllm.config import GuardConfigError

    with pytest.raises(GuardConfigError):
        guard({name: value}, num_blocks=11)
    assert guard_log == [f"kvops guard: {line}"]


def startup_line(guard_log: list[str]) -> str:
    """The guard's first line (the follower's first poll, in its own thread, may log before it)."""
    return next(line for line in guard_log if line.startswith("kvops guard: admitting by "))


def test_the_startup_line_and_a_summary_when_the_engine_drains(guard, watcher, requests, guard_log):
    scheduler = followed(guard, watcher, "warn", num_blocks=14)  # 13 usable blocks
    for i in range(5):
        scheduler.add_request(requests.make(f"r{i}", 20, 44, first_token=40 * i))  # capped to 8: 2 blocks each
    scheduler.add_request(requests.make("long prompt", 100, 5, first_token=300))  # 7 blocks: waits for two to finish
    run = Driver(scheduler).drain()
    assert run.preemptions == 0 and len(run.finished) == 6
    assert startup_line(guard_log) == (
        "kvops guard: admitting by the future peak of the whole batch (lengths: max_tokens where known, else the "
        "last 1000 finished, the batch within the pool at p80; by what they hold now, as stock vLLM admits, until 32 "
        "ended) over 13 usable blocks, "
        "headroom 0; "
        "groups: full attention (16-token blocks); policy shipped default (warn 70%, degrade 85%, critical 95%); "
        f"levels from the watcher at {watcher.url}"
        "; short of blocks, requests pause up to 4 steps, then vLLM preempts the most computed not preempted before, "
        "which waits after new requests (for up to 200 steps)"
    )
    summaries = [line for line in guard_log if " in the last " in line]
    assert len(summaries) == 1
    assert summaries[0].endswith(
        " s: 1 queued for KV, 5 max_tokens capped, 0 kept waiting by the level, 0 paused a step for blocks, "
        "0 preempted (0 tokens to recompute), 0 past their projected length; peak KV usage 76.9% (10 of 13 blocks); now 0 running, 0 waiting, 13 blocks free, "
        "projected peak 0 of 13 usable"
    )


def test_v1_says_how_it_admits_as_before(guard, watcher, requests, guard_log):
    scheduler = guard(
        {**V1, **OWN, "KVOPS_POLICY_URL": watcher.url, "KVOPS_POLICY_POLL_SECONDS": "3600"}, num_blocks=14
    )
    watch(scheduler, watcher, "warn")
    for i in range(5):
        scheduler.add_request(requests.make(f"r{i}", 20, 44, first_token=40 * i))
    scheduler.add_request(requests.make("long prompt", 100, 5, first_token=300))
    run = Driver(scheduler).drain()
    assert run.preemptions == 0 and len(run.finished) == 6
    assert startup_line(guard_log) == (
        "kvops guard: admitting by projected KV (prompt + max_tokens) over 13 usable blocks, headroom 0; "
        "groups: full attention (16-token blocks); policy shipped default (warn 70%, degrade 85%, critical 95%); "
        f"levels from own KV usage, and the watcher at {watcher.url}"
        "; short of blocks, requests pause up to 4 steps, then vLLM preempts the most computed not preempted before, "
        "which waits after new requests (for up to 200 steps)"
    )
    summaries = [line for line in guard_log if " in the last " in line]
    assert summaries[0].endswith("now 0 running, 0 waiting, 13 blocks free, 0 reserved for admitted requests")


def test_scheduler_stats_cannot_carry_the_guards_counters_to_the_api_server():
    """Why the guard reports in its log and not in vLLM's /metrics: SchedulerStats crosses from the engine-core
    process to the API server as a fixed msgspec schema, and a subclass's extra fields are dropped on the way."""
    from dataclasses import dataclass

    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    @dataclass
    class GuardedStats(SchedulerStats):
        kvops_rejected: int = 0

    sent = EngineCoreOutputs(scheduler_stats=GuardedStats(num_running_reqs=3, kvops_rejected=7))
    received = MsgpackDecoder(EngineCoreOutputs).decode(MsgpackEncoder().encode(sent))
    assert received.scheduler_stats.num_running_reqs == 3
    assert type(received.scheduler_stats) is SchedulerStats and not hasattr(received.scheduler_stats, "kvops_rejected")
