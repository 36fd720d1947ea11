"""Client quota enforcement, sans I/O: entity precedence, Kafka's sampled rate, the throttle formula,
what each request is charged, and the step timer that measures handler time."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from pykbroker.metadata.store import QuotaEntity
from pykbroker.quotas import QuotaManager, Usage, charge, run_timed
from pykbroker.quotas.entities import FETCH, PRODUCE, REQUEST, precedence, resolve
from pykbroker.quotas.manager import INACTIVE_SENSOR_MS
from pykbroker.quotas.stats import Rate, SampledStat, throttle_time_ms

U, C = "alice", "app"


def ent(user: Any = False, client: Any = False) -> QuotaEntity:
    parts: list[tuple[str, str | None]] = []
    if client is not False:
        parts.append(("client-id", client))
    if user is not False:
        parts.append(("user", user))
    return tuple(parts)


# --- entity precedence ------------------------------------------------------------------------------

LEVELS = [  # Kafka's order, most specific first, with the tags the match gives
    (ent(U, C), (U, C)),
    (ent(U, None), (U, C)),
    (ent(U), (U, "")),
    (ent(None, C), (U, C)),
    (ent(None, None), (U, C)),
    (ent(None), (U, "")),
    (ent(client=C), ("", C)),
    (ent(client=None), ("", C)),
]


@pytest.mark.parametrize("level", range(len(LEVELS)))
def test_each_level_wins_over_every_less_specific_one(level: int) -> None:
    quotas = {entity: {PRODUCE: float(100 + i)} for i, (entity, _) in enumerate(LEVELS) if i >= level}
    # Other users, other client ids and other quota keys never match.
    quotas[ent("bob", C)] = {PRODUCE: 1.0}
    quotas[ent(U, "other")] = {PRODUCE: 2.0}
    quotas[ent(client="other")] = {PRODUCE: 3.0}
    quotas[ent(U, C)] = {**quotas.get(ent(U, C), {}), FETCH: 4.0}
    assert resolve(quotas, PRODUCE, U, C) == (LEVELS[level][1], float(100 + level))


def test_precedence_is_kafkas_order() -> None:
    assert [e for e, _ in precedence(U, C)] == [e for e, _ in LEVELS]


def test_no_matching_entity_means_unlimited() -> None:
    assert resolve({ent("bob"): {PRODUCE: 1.0}, ent(U, C): {FETCH: 9.0}}, PRODUCE, U, C) is None
    assert resolve({}, PRODUCE, U, C) is None


def test_user_quota_is_shared_by_client_ids_and_client_quota_by_users() -> None:
    m = QuotaManager(lambda: {ent(U): {PRODUCE: 1000.0}, ent(client="shared"): {PRODUCE: 1000.0}})
    assert m.active()
    m.record_produce(U, "a", 500, 0)
    m.record_produce(U, "b", 500, 0)
    m.record_produce("x", "shared", 500, 0)
    m.record_produce("y", "shared", 500, 0)
    rows = {(r.user, r.client_id): r for r in m.snapshot(0)}
    assert set(rows) == {(U, ""), ("", "shared")}
    assert rows[(U, "")].rate == pytest.approx(100.0)  # 1000 bytes over the minimum 10 s span
    assert rows[("", "shared")].rate == pytest.approx(100.0)


def test_default_entity_gives_each_client_its_own_measurement() -> None:
    m = QuotaManager(lambda: {ent(client=None): {PRODUCE: 1000.0}})
    m.record_produce("ANONYMOUS", "a", 500, 0)
    m.record_produce("ANONYMOUS", "b", 700, 0)
    assert {(r.client_id, r.rate) for r in m.snapshot(0)} == {("a", 50.0), ("b", 70.0)}


# --- sampled rate -----------------------------------------------------------------------------------

def test_rate_assumes_at_least_samples_minus_one_full_windows() -> None:
    r = Rate(11, 1000)
    r.record(1000, 0)
    assert r.window_size_ms(0) == 10_000
    assert r.measure(0) == pytest.approx(100.0)
    r.record(1000, 12_500)  # the first sample is outside 11 windows: purged
    assert r.window_size_ms(12_500) == 10_000
    assert r.measure(12_500) == pytest.approx(100.0)


def test_rate_over_more_than_the_minimum_span() -> None:
    r = Rate(3, 1000)
    for t in range(0, 2600, 100):  # 26 records of 10 over 2.5 s: 3 samples (plus the overlap slot)
        r.record(10, t)
    # The oldest live sample started at 0: 2.5 s elapsed, more than the 2-window minimum.
    assert r.window_size_ms(2500) == 2500
    assert r.measure(2500) == pytest.approx(260 / 2.5)


def test_samples_expire_by_their_last_event_and_the_ring_reuses_slots() -> None:
    s = SampledStat(2, 1000)
    s.record(5, 0)
    s.record(7, 1000)
    s.record(11, 2000)  # a third slot: samples + 1, for the window overlapping the oldest edge
    assert s.total(2000) == 7 + 11  # t=0's sample had no event for 2 windows: expired
    s.record(13, 3000)  # the ring wraps: the first slot is reused
    assert s.total(3000) == 11 + 13
    assert s.count(3000) == 2
    assert s.count(10_000) == 0


def test_throttle_formula() -> None:
    # (observed - bound) / bound * window, Kafka's QuotaUtils.throttleTime.
    assert throttle_time_ms(300.0, 100.0, 10_000, 2**31) == 20_000
    assert throttle_time_ms(100.0, 100.0, 10_000, 2**31) == 0
    assert throttle_time_ms(150.0, 100.0, 1_000, 2**31) == 500
    assert throttle_time_ms(300.0, 100.0, 10_000, 1_000) == 1_000  # bounded (request quotas)
    assert throttle_time_ms(5.0, 0.0, 10_000, 1_000) == 1_000  # a zero quota gets the bound


def test_produce_throttle_matches_the_formula() -> None:
    m = QuotaManager(lambda: {ent(client=C): {PRODUCE: 100.0}})
    assert m.record_produce(U, C, 1000, 0) == 0  # 100 B/s over 10 s: exactly the quota
    # 3000 bytes over 10 s = 300 B/s: (300 - 100) / 100 * 10 s = 20 s
    assert m.record_produce(U, C, 2000, 0) == 20_000
    row = m.snapshot(0)[0]
    assert (row.quota_type, row.quota, row.last_throttle_ms, row.throttle_time_ms) == ("Produce", 100.0, 20_000,
                                                                                      20_000.0)


@pytest.mark.parametrize("samples,window_s,size,step_ms", [(2, 1, 16_000, 3.0), (11, 1, 5_000, 10.0),
                                                         (5, 2, 20_000, 2.0), (3, 1, 32_000, 1.0)])
def test_a_client_that_waits_out_its_throttle_converges_on_the_quota(samples: int, window_s: int, size: int,
                                                                      step_ms: float) -> None:
    """A producer sending as fast as throttling lets it (muted for each throttle), simulated for 80 s:
    after the first windows its rate is the quota.  Kafka's windows make the rate bursty within a
    window span, so it is measured over the 60 s that follow the first 20."""
    quota = 200_000.0
    m = QuotaManager(lambda: {ent(client=C): {PRODUCE: quota}}, samples=samples, window_seconds=window_s)
    t, sent = 0.0, []
    for _ in range(200_000):
        if t > 80_000:
            break
        ms = m.record_produce(U, C, size, t)
        sent.append((t, size))
        t += max(ms, step_ms)
    steady = sum(n for when, n in sent if 20_000 <= when < 80_000) / 60.0
    assert steady == pytest.approx(quota, rel=0.05)
    unthrottled = size / step_ms * 1000
    assert unthrottled > 2 * quota  # the client could go much faster: the quota is what held it back


def test_request_time_is_percent_of_one_thread_and_bounded_to_one_window() -> None:
    m = QuotaManager(lambda: {ent(U): {REQUEST: 10.0}})
    # 0.5 s of handler time = 50 percent-seconds over the 10 s minimum span: 5 %, within 10 %.
    assert m.record_request_time(U, C, 0.5, 0) == 0
    # 3 s more: 35 % -> (35 - 10) / 10 * 10 s = 25 s, bounded to one window (1 s).
    assert m.record_request_time(U, C, 3.0, 0) == 1000
    assert m.snapshot(0)[0].rate == pytest.approx(35.0)


def test_quota_changes_apply_without_restart() -> None:
    store: dict[QuotaEntity, dict[str, float]] = {}
    m = QuotaManager(lambda: store)
    assert not m.active()
    store[ent(client=C)] = {PRODUCE: 100.0}  # changed in place (the embedded store): invalidate
    m.invalidate()
    assert m.active()
    assert m.record_produce(U, C, 3000, 0) == 20_000
    replaced = {ent(client=C): {PRODUCE: 1000.0}}  # a new map (the ZooKeeper store): noticed by itself
    m._source = lambda: replaced
    assert m.active()
    assert m.record_produce(U, C, 0, 0) == 0  # 3000 B over 10 s is within 1000 B/s
    assert m.snapshot(0)[0].quota == 1000.0


def test_fetch_max_bytes_is_what_the_windows_allow() -> None:
    m = QuotaManager(lambda: {ent(client=C): {FETCH: 1000.0}}, samples=11, window_seconds=1)
    assert m.fetch_max_bytes(U, C) == 10_000
    assert m.fetch_max_bytes(U, "other") is None


def test_idle_sensors_are_dropped_after_an_hour() -> None:
    m = QuotaManager(lambda: {ent(client=None): {PRODUCE: 1000.0}})
    m.record_produce(U, "gone", 1, 0)
    m.record_produce(U, "here", 1, INACTIVE_SENSOR_MS - 1)
    later = INACTIVE_SENSOR_MS + 60_000  # expiry is checked once a minute
    m.record_produce(U, "here", 1, later)
    assert [r.client_id for r in m.snapshot(later)] == ["here"]


# --- what a request is charged ----------------------------------------------------------------------

def _usage(api: int, size: int = 0, seconds: float = 0.0, follower: bool = False) -> Usage:
    return Usage(api, U, C, size, seconds, follower)


def test_throttled_fetch_is_answered_empty_and_taken_back() -> None:
    m = QuotaManager(lambda: {ent(client=C): {FETCH: 100.0}})
    assert charge(m, _usage(1), 1000, 0).ms == 0
    t = charge(m, _usage(1), 2000, 0)
    assert t.drop_fetch_data and t.ms == 20_000
    # The 2000 bytes not sent were taken back: only the first 1000 count.
    assert m.snapshot(0)[0].rate == pytest.approx(100.0)


def test_produce_charges_the_request_size_and_the_longest_throttle_wins() -> None:
    m = QuotaManager(lambda: {ent(client=C): {PRODUCE: 100.0, REQUEST: 1.0}})
    t = charge(m, _usage(0, size=3000, seconds=0.0), None, 0)  # acks=0: no response, still throttled
    assert t.ms == 20_000 and not t.drop_fetch_data
    t = charge(m, _usage(3, seconds=5.0), 10, 0)  # Metadata: request time only, at most one window
    assert t.ms == 1000


def test_brokers_requests_are_exempt() -> None:
    m = QuotaManager(lambda: {ent(None): {REQUEST: 0.001, FETCH: 1.0}})
    assert charge(m, _usage(1, seconds=10.0, follower=True), 10**6, 0).ms == 0
    assert charge(m, _usage(27, seconds=10.0), 100, 0).ms == 0
    assert m.snapshot(0) == []


# --- handler time -----------------------------------------------------------------------------------

async def _sleepy(steps: int) -> str:
    for _ in range(steps):
        await anyio.sleep(0.05)
    return "done"


@pytest.mark.anyio
async def test_run_timed_counts_running_not_waiting() -> None:
    result, seconds = await run_timed(_sleepy(4))
    assert result == "done"
    assert 0 <= seconds < 0.05  # 0.2 s were spent asleep


@pytest.mark.anyio
async def test_run_timed_passes_errors_and_cancellation_through() -> None:
    async def boom() -> None:
        await anyio.sleep(0)
        raise ValueError("x")

    with pytest.raises(ValueError):
        await run_timed(boom())
    with anyio.move_on_after(0.05) as scope:
        await run_timed(_sleepy(100))
    assert scope.cancelled_caught
