"""A trace through the installed vLLM's own scheduler on the simulated clock: what the loop records is what the
scheduler did (tokens, preemptions, prefix-cache hits) at the times the step model gives."""

from __future__ import annotations

import pytest

from kvops.simulate.prompts import prompt_tokens
from kvops.simulate.results import Slo, summarize
from kvops.simulate.run import Admission, ClientSettings, run_trace
from kvops.simulate.trace import Trace, TraceRequest

pytestmark = pytest.mark.vllm
STEP = 0.01  # seconds per step, whatever the batch


def core(num_blocks: int = 64, *, async_scheduling: bool = False, scheduler_cls: str | None = None, **flags):
    from kvops.engines.vllm.simulator import CacheGroup, CoreSettings, VllmCore

    settings = CoreSettings(
        num_blocks=num_blocks,
        block_size=16,
        groups=(CacheGroup("full", None, 16),),
        max_model_len=1024,
        max_num_seqs=64,
        max_num_batched_tokens=512,
        async_scheduling=async_scheduling,
        scheduler_cls=scheduler_cls,
        **flags,
    )
    return VllmCore(settings)


def replay(
    scheduler,
    requests,
    *,
    api_s: float = 0.0,
    input_s: float = 0.0,
    clients: ClientSettings | None = None,
    door=None,
):
    trace = Trace(tuple(requests), "test")
    return run_trace(
        scheduler,
        trace,
        lambda batch: STEP,
        max_model_len=1024,
        api_s=api_s,
        input_s=input_s,
        clients=clients,
        prompt=prompt_tokens,
        door=door,
    )


def test_a_lone_request_one_batch_at_a_time():
    log = replay(core(), [TraceRequest(0.0, 32, 4, max_tokens=4)], api_s=0.005)
    entry = log.requests[0]
    assert entry.tokens == 4 and entry.outcome == "length"
    assert entry.first_token == pytest.approx(STEP + 0.005)  # one prefill step, then the API server's time
    assert entry.finished == pytest.approx(4 * STEP + 0.005)
    assert log.steps == 4 and list(log.gaps) == pytest.approx([STEP] * 3)


def test_the_hand_off_delays_a_request_to_an_idle_engine_but_not_one_that_arrives_during_a_step():
    handoff = 0.004
    alone = replay(core(), [TraceRequest(0.0, 32, 4, max_tokens=4)], input_s=handoff)
    assert alone.requests[0].sent == 0.0
    assert alone.requests[0].first_token == pytest.approx(handoff + STEP)  # the idle core waits the hand-off out
    assert alone.requests[0].queued == pytest.approx(handoff)  # vLLM's QUEUED stamp: when the scheduler has it
    # the first request's steps end at 14, 24, ... ms; the second, sent at 15 ms, reaches the core at 19 ms and joins
    # the step that starts at 24 ms, as it would have at 15: its first token at 34 ms, no later
    busy = replay(
        core(), [TraceRequest(0.0, 32, 40, max_tokens=40), TraceRequest(0.015, 32, 4, max_tokens=4)], input_s=handoff
    )
    assert busy.requests[1].sent == pytest.approx(0.015)
    assert busy.requests[1].first_token == pytest.approx(handoff + 3 * STEP)
    assert busy.requests[1].queued == pytest.approx(handoff + 2 * STEP)  # at the end of the step running then


def test_the_api_server_hands_a_burst_in_one_request_at_a_time():
    handoff = 0.004
    burst = replay(core(), [TraceRequest(0.0, 32, 4, max_tokens=4) for _ in range(3)], input_s=handoff)
    # the first reaches the idle core at 4 ms and runs alone; the second (handed in at 8 ms) and the third (12 ms)
    # wait for that step to end at 14 ms and share the next
    assert [entry.queued for entry in burst.requests] == pytest.approx([handoff, 0.014, 0.014])
    assert [entry.first_token for entry in burst.requests] == pytest.approx([0.014, 0.024, 0.024])


def test_async_scheduling_keeps_two_steps_in_flight_on_one_device():
    log = replay(core(async_scheduling=True), [TraceRequest(0.0, 32, 4, max_tokens=4)])
    entry = log.requests[0]
    assert entry.tokens == 4
    assert entry.first_token == pytest.approx(STEP)
    assert entry.finished == pytest.approx(4 * STEP)  # the device runs one step at a time


def test_a_burst_on_a_small_pool_preempts_and_every_request_still_gets_its_tokens():
    burst = [TraceRequest(0.0, 64, 200, max_tokens=200) for _ in range(8)]
    log = replay(core(num_blocks=40), burst)
    assert log.preemptions > 0
    assert [entry.tokens for entry in log.requests] == [200] * 8
    assert sum(entry.recomputed_tokens for entry in log.requests) > 0
    assert max(log.timeline.usage) == pytest.approx(1.0, abs=0.05)


def test_the_kv_guard_queues_the_same_burst_instead_of_preempting():
    burst = [TraceRequest(0.0, 64, 200, max_tokens=200) for _ in range(8)]
    log = replay(
        core(num_blocks=40, async_scheduling=True, scheduler_cls="kvops_vllm.scheduler.KVGuardScheduler"), burst
    )
    assert log.preemptions == 0
    assert [entry.tokens for entry in log.requests] == [200] * 8


def test_a_shared_prefix_is_found_in_the_prefix_cache():
    shared = (("system", 64),)
    requests = [
        TraceRequest(0.0, 100, 2, max_tokens=2, prefix=shared),
        TraceRequest(1.0, 100, 2, max_tokens=2, prefix=shared),
    ]
    log = replay(core(), requests)
    assert log.requests[0].cached_tokens == 0
    assert log.requests[1].cached_tokens == 64  # four full blocks of 16


def test_unknown_lengths_stop_where_the_trace_says():
    clients = ClientSettings(max_tokens="none")
    log = replay(core(), [TraceRequest(0.0, 16, 7)], clients=clients)
    assert log.requests[0].tokens == 7 and log.requests[0].outcome == "stop"


def test_clients_keep_at_most_their_concurrency_in_flight():
    requests = [TraceRequest(0.0, 16, 5, max_tokens=5) for _ in range(6)]
    log = replay(core(), requests, clients=ClientSettings(max_concurrency=2))
    assert max(log.timeline.running) <= 2
    assert all(entry.tokens == 5 for entry in log.requests)
    assert log.requests[2].sent == pytest.approx(log.requests[0].finished)


def test_a_prompt_the_context_cannot_hold_is_rejected_as_vllm_rejects_it():
    log = replay(core(), [TraceRequest(0.0, 1024, 4, max_tokens=4), TraceRequest(0.0, 16, 2, max_tokens=2)])
    assert log.requests[0].outcome.startswith("rejected: a prompt of 1024 tokens leaves no room")
    assert log.requests[1].tokens == 2


def answers(*given: Admission):
    """A door that answers the sends in turn with `given` (the last one from then on), recording each send's time."""
    sends: list[float] = []

    def door(now: float, usage: float) -> Admission:
        sends.append(now)
        return given[min(len(sends), len(given)) - 1]

    door.sends = sends  # type: ignore[attr-defined]
    return door


def test_a_refused_request_is_sent_again_after_its_retry_after_and_its_ttft_counts_from_the_first_send():
    door = answers(Admission(retry_after_s=2.0), Admission())
    log = replay(core(), [TraceRequest(0.5, 32, 4, max_tokens=4)], door=door)
    entry = log.requests[0]
    assert door.sends == pytest.approx([0.5, 2.5])
    assert entry.refusals == 1 and entry.tokens == 4 and entry.outcome == "length"
    assert entry.sent == 0.5 and entry.first_token == pytest.approx(2.5 + STEP)


def test_a_request_refused_at_every_send_is_given_up_after_the_clients_retries():
    door = answers(Admission(retry_after_s=1.0))
    log = replay(core(), [TraceRequest(0.0, 32, 4, max_tokens=4)], clients=ClientSettings(retries=2), door=door)
    summary = summarize(log, Slo(1.0, 1.0))
    assert door.sends == pytest.approx([0.0, 1.0, 2.0])
    assert log.requests[0].outcome == "refused: 3 times, with Retry-After"
    assert (summary.refused, summary.refusals, summary.completed, summary.slo_met) == (1, 3, 0, 0)


def test_a_refused_request_keeps_its_clients_slot_while_it_waits_to_send_again():
    door = answers(Admission(retry_after_s=1.0), Admission())
    requests = [TraceRequest(0.0, 16, 2, max_tokens=2), TraceRequest(0.0, 16, 2, max_tokens=2)]
    log = replay(core(), requests, clients=ClientSettings(max_concurrency=1), door=door)
    assert log.requests[0].first_token > 1.0  # sent again at 1 s
    assert log.requests[1].sent == pytest.approx(log.requests[0].finished)  # the slot freed only when it finished


def test_a_capped_request_stops_at_the_cap_and_counts_as_capped():
    door = answers(Admission(max_tokens=3))
    requests = [TraceRequest(0.0, 16, 8, max_tokens=8), TraceRequest(0.0, 16, 2, max_tokens=2)]
    log = replay(core(), requests, door=door)
    assert [(entry.tokens, entry.capped) for entry in log.requests] == [(3, True), (2, False)]
    assert log.requests[0].outcome == "length"
    assert summarize(log, Slo(1.0, 1.0)).capped == 1


def test_a_request_that_arrives_while_others_finish_is_sent_when_it_arrives():
    """Open-loop traffic: no client waits for another's answer, so a request that arrives during a step in which a
    request finishes is sent at its arrival (the loop hands the step's tokens out first)."""
    requests = [TraceRequest(0.0, 16, 2, max_tokens=2), TraceRequest(0.015, 16, 2, max_tokens=2)]
    log = replay(core(), requests, api_s=0.002)
    assert log.requests[0].finished == pytest.approx(2 * STEP + 0.002)  # it ends after the second has arrived
    assert [entry.sent for entry in log.requests] == [0.0, 0.015]


def test_a_held_back_request_is_sent_when_a_slot_frees_and_not_before_it_arrives():
    requests = [TraceRequest(0.0, 16, 2, max_tokens=2), TraceRequest(0.001, 16, 2, max_tokens=2),
                TraceRequest(0.05, 16, 2, max_tokens=2)]  # fmt: skip
    log = replay(core(), requests, clients=ClientSettings(max_concurrency=1))
    assert log.requests[1].sent == pytest.approx(log.requests[0].finished)  # held back: its client's slot was taken
    assert log.requests[2].sent == pytest.approx(0.05)  # a slot was free when it arrived
