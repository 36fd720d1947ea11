"""Client quota enforcement, sans I/O: entity precedence, Kafka's sampled rate, the throttle formula,
what each request is charged, the step timer that measures handler time, the controller mutation
token bucket (KIP-599) and the ip entities' connection_creation_rate."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from pykbroker.metadata.store import QuotaEntity
from pykbroker.quotas import STRICT_SINCE, QuotaManager, ThrottlingQuotaExceeded, Usage, charge, run_timed
from pykbroker.quotas.entities import CONTROLLER_MUTATION, FETCH, PRODUCE, REQUEST, precedence, resolve
from pykbroker.quotas.manager import INACTIVE_SENSOR_MS
from pykbroker.quotas.mutation import THROTTLING_QUOTA_EXCEEDED_MESSAGE
from pykbroker.quotas.stats import Rate, SampledStat, TokenBucket, throttle_time_ms
from pykbroker.server.connection_quotas import ConnectionQuotas

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


# --- controller mutation quota (KIP-599) -------------------------------------------------------------

def test_token_bucket_starts_full_refills_at_the_quota_and_caps_at_the_burst() -> None:
    bucket = TokenBucket()
    assert bucket.measure(2.0, 22.0, 5_000.0) == 22.0  # a new bucket is full
    assert bucket.record(30.0, 2.0, 22.0, 5_000.0) == -8.0  # one burst may take it into debt
    assert bucket.measure(2.0, 22.0, 6_000.0) == pytest.approx(-6.0)  # 2 credits a second come back
    assert bucket.measure(2.0, 22.0, 60_000.0) == 22.0  # never above the burst
    assert bucket.record(-100.0, 2.0, 22.0, 60_000.0) == 22.0


def _mutations(quota: float = 2.0) -> QuotaManager:
    return QuotaManager(lambda: {ent(client=C): {CONTROLLER_MUTATION: quota}})


def test_no_controller_mutation_rate_means_no_quota() -> None:
    assert QuotaManager(lambda: {ent(client=C): {PRODUCE: 1.0}}).controller_mutation(U, C, True, 0.0) is None
    assert _mutations().controller_mutation(U, "other", True, 0.0) is None


def test_strict_quota_accepts_while_credit_is_left_then_refuses_with_the_time_to_refill() -> None:
    quotas = _mutations(2.0)  # burst: 11 windows x 1 s x 2 = 22 partitions
    q = quotas.controller_mutation(U, C, True, 1_000.0)
    assert q is not None
    q.record(20, 1_000.0)  # 22 -> 2
    q.record(5, 1_000.0)  # any credit left accepts a topic of any size: 2 -> -3
    assert q.throttle_time_ms(1_000.0) == 0  # nothing refused, no throttle (Kafka's strict quota)
    with pytest.raises(ThrottlingQuotaExceeded) as refused:
        q.record(1, 1_000.0)
    assert refused.value.throttle_ms == 1500  # -(-3) / 2 per second
    assert str(refused.value) == THROTTLING_QUOTA_EXCEEDED_MESSAGE
    with pytest.raises(ThrottlingQuotaExceeded):  # a refused topic took nothing: still 1.5 s of debt
        q.record(1, 1_000.0)
    # The response's throttle is what is left of the last one given.
    assert q.throttle_time_ms(1_400.0) == 1100
    # The next request, once the debt is paid back, is accepted again.
    later = quotas.controller_mutation(U, C, True, 2_500.0)
    assert later is not None
    later.record(1, 2_500.0)
    assert later.throttle_time_ms(2_500.0) == 0


def test_permissive_quota_accepts_everything_and_throttles_on_debt() -> None:
    quotas = _mutations(2.0)
    q = quotas.controller_mutation(U, C, False, 0.0)
    assert q is not None
    q.record(22, 0.0)
    assert q.throttle_time_ms(0.0) == 0  # exactly empty is not over the quota
    q.record(4, 0.0)
    q.record(4, 0.0)  # never refused
    assert q.throttle_time_ms(0.0) == 4000  # -(-8) / 2 per second


def test_mutation_bucket_is_shared_per_metric_tags_and_keeps_its_credits_when_the_quota_changes() -> None:
    stored: dict[QuotaEntity, dict[str, float]] = {ent(U): {CONTROLLER_MUTATION: 1.0}}
    quotas = QuotaManager(lambda: stored)
    a = quotas.controller_mutation(U, "app-a", True, 0.0)
    assert a is not None
    a.record(12, 0.0)  # 11 -> -1: the user's quota is shared by all of the user's client ids
    b = quotas.controller_mutation(U, "app-b", True, 0.0)
    assert b is not None
    with pytest.raises(ThrottlingQuotaExceeded):
        b.record(1, 0.0)
    stored[ent(U)] = {CONTROLLER_MUTATION: 10.0}
    quotas.invalidate()
    c = quotas.controller_mutation(U, "app-c", True, 0.0)
    assert c is not None
    with pytest.raises(ThrottlingQuotaExceeded) as refused:  # still in debt, now paid back ten times faster
        c.record(1, 0.0)
    assert refused.value.throttle_ms == 100
    rows = [r for r in quotas.snapshot(0.0) if r.quota_type == "ControllerMutation"]
    assert [(r.user, r.client_id, r.quota, r.last_throttle_ms) for r in rows] == [(U, "", 10.0, 100)]


def test_zero_mutation_quota_refuses_after_the_first_and_asks_for_one_window() -> None:
    q = _mutations(0.0).controller_mutation(U, C, True, 0.0)
    assert q is not None
    q.record(3, 0.0)  # an empty (not negative) bucket accepts
    with pytest.raises(ThrottlingQuotaExceeded) as refused:
        q.record(1, 10_000.0)
    assert refused.value.throttle_ms == 1000


def test_strict_since_is_the_first_version_with_the_error() -> None:
    assert STRICT_SINCE == {19: 6, 20: 5, 37: 3}


# --- ip connection_creation_rate (KIP-612) -----------------------------------------------------------

def _ip_quotas(stored: dict[QuotaEntity, dict[str, float]], **kw: Any) -> ConnectionQuotas:
    return ConnectionQuotas(listeners=["PLAINTEXT"], client_quotas=lambda: stored, samples=2, window_s=1.0, **kw)


def test_ip_quota_is_the_address_own_else_the_default() -> None:
    stored = {(("ip", "10.0.0.1"),): {"connection_creation_rate": 5.0},
              (("ip", "0:0::1"),): {"connection_creation_rate": 7.0},
              (("ip", None),): {"connection_creation_rate": 3.0}}
    cq = _ip_quotas(stored)
    assert cq.ip_creation_rate("10.0.0.1") == 5.0
    assert cq.ip_creation_rate("::1") == 7.0  # names compare as addresses
    assert cq.ip_creation_rate("10.0.0.2") == 3.0
    del stored[(("ip", None),)]
    assert cq.ip_creation_rate("10.0.0.2") is None
    assert ConnectionQuotas(listeners=["PLAINTEXT"]).ip_creation_rate("10.0.0.1") is None


def test_connection_over_the_ip_rate_is_refused_and_not_counted() -> None:
    stored = {(("ip", "10.0.0.1"),): {"connection_creation_rate": 3.0}}
    cq = _ip_quotas(stored, max_creation_rate=100)
    # 2 windows of 1 s: the rate is counted over at least 1 s, so 3 pass within the first second.
    assert [cq.record_ip_creation("PLAINTEXT", "10.0.0.1", 0.1 * i) for i in range(3)] == [0.0, 0.0, 0.0]
    delay = cq.record_ip_creation("PLAINTEXT", "10.0.0.1", 0.3)
    assert delay == pytest.approx((4 - 3) / 3)  # Kafka's (rate - quota) / quota x window, at most one window
    # Refused connections are taken back out: of the address's rate and of the broker's.
    assert cq._ip_rates["10.0.0.1"].rate(0.3) == pytest.approx(3.0)
    assert cq.record_ip_creation("PLAINTEXT", "10.0.0.2", 0.3) == 0.0  # other addresses are not limited
    # Once the rate is back within the quota, connections are accepted again.
    assert cq.record_ip_creation("PLAINTEXT", "10.0.0.1", 1.4) == 0.0


def test_ip_quota_changes_apply_to_the_next_connection() -> None:
    stored: dict[QuotaEntity, dict[str, float]] = {}
    cq = _ip_quotas(stored)
    for i in range(10):
        assert cq.record_ip_creation("PLAINTEXT", "10.0.0.1", 0.01 * i) == 0.0  # no quota: not measured
    assert "10.0.0.1" not in cq._ip_rates
    stored[(("ip", None),)] = {"connection_creation_rate": 2.0}
    assert cq.record_ip_creation("PLAINTEXT", "10.0.0.1", 0.2) == 0.0
    assert cq.record_ip_creation("PLAINTEXT", "10.0.0.1", 0.2) == 0.0
    assert cq.record_ip_creation("PLAINTEXT", "10.0.0.1", 0.2) > 0
    stored[(("ip", None),)] = {"connection_creation_rate": 50.0}  # raised: the measurement is kept
    assert cq.record_ip_creation("PLAINTEXT", "10.0.0.1", 0.2) == 0.0
    stored.clear()
    assert cq.record_ip_creation("PLAINTEXT", "10.0.0.1", 0.2) == 0.0
    assert "10.0.0.1" not in cq._ip_rates  # no quota any more: the measurement is dropped


def test_controller_quota_window_settings_size_the_bucket() -> None:
    """controller.quota.window.num x controller.quota.window.size.seconds of credit, as Kafka's bucket."""
    from pykbroker.quotas.mutation import MutationSensor

    small = MutationSensor(10.0, 0.0, samples=2, window_ms=1000.0)
    assert small.burst == 20.0
    assert small.take(25.0, 0.0) == pytest.approx(-5.0)  # 20 credits, 25 taken
    assert small.throttle_ms(-5.0, 0.0) == 500  # the debt refills at 10/s
    assert MutationSensor(10.0, 0.0).burst == 110.0  # Kafka's defaults: 11 windows of 1 s
