"""``pykbroker serve --processes N``: the derived settings of each broker process and the restart
policy of the supervisor, without processes (pykbroker/multiprocess/plan.py, restarts.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pykbroker.cli import main
from pykbroker.config import LOCAL_ENDPOINTS, BrokerConfig, ConfigError, parse_local_endpoints
from pykbroker.multiprocess.plan import plan_processes
from pykbroker.multiprocess.restarts import GiveUp, Restart, RestartPolicy, describe_exit

ZK = "127.0.0.1:2181/pyk"


def cfg(**kv: str) -> BrokerConfig:
    raw = {"zookeeper.connect": ZK, "broker.id": "1", "listeners": "PLAINTEXT://127.0.0.1:9092",
           "log.dirs": "/d1,/d2"}
    raw.update({k.replace("_", "."): v for k, v in kv.items()})
    return BrokerConfig(raw)


def test_ids_ports_dirs_and_rack_are_derived_per_process() -> None:
    plans = plan_processes(cfg(), 3, "host-a")
    assert [p.broker_id for p in plans] == [1, 2, 3]
    assert [p.overrides["broker.id"] for p in plans] == ["1", "2", "3"]
    assert [p.overrides["listeners"] for p in plans] == [
        "PLAINTEXT://127.0.0.1:9092", "PLAINTEXT://127.0.0.1:9093", "PLAINTEXT://127.0.0.1:9094"]
    assert plans[2].overrides["log.dirs"] == f"{Path('/d1') / 'broker-3'},{Path('/d2') / 'broker-3'}"
    assert {p.overrides["broker.rack"] for p in plans} == {"host-a"}
    assert [p.probe for p in plans] == [("127.0.0.1", 9092), ("127.0.0.1", 9093), ("127.0.0.1", 9094)]
    # Each derived configuration is itself a valid broker configuration with those values.
    child = BrokerConfig({"zookeeper.connect": ZK, **plans[1].overrides})
    assert child.broker_id == 2 and child.listeners[0].port == 9093 and child["broker.rack"] == "host-a"


def test_explicit_rack_node_id_log_dir_and_advertised_listeners() -> None:
    c = BrokerConfig({"zookeeper.connect": ZK, "node.id": "10", "broker.rack": "r1", "log.dir": "/x",
                      "listeners": "PLAINTEXT://0.0.0.0:9092,INTERNAL://[::1]:9192",
                      "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT",
                      "advertised.listeners": "PLAINTEXT://kafka.example:19092",
                      "pykbroker.metrics.listener": "http://0.0.0.0:9404",
                      "pykbroker.console.listener": "http://127.0.0.1:8080",
                      "pykbroker.schema.registry.listener": "https://0.0.0.0:8181",
                      "pykbroker.schema.registry.advertised.listener": "https://registry.example:18181"})
    plans = plan_processes(c, 2, "ignored")
    second = plans[1].overrides
    assert "broker.id" not in second and second["node.id"] == "11"
    assert second["broker.rack"] == "r1"
    assert second["log.dirs"] == str(Path("/x") / "broker-11")
    assert second["listeners"] == "PLAINTEXT://0.0.0.0:9093,INTERNAL://[::1]:9193"
    assert second["advertised.listeners"] == "PLAINTEXT://kafka.example:19093"
    assert second["pykbroker.metrics.listener"] == "http://0.0.0.0:9405"
    assert second["pykbroker.console.listener"] == "http://127.0.0.1:8081"
    assert second["pykbroker.schema.registry.listener"] == "https://0.0.0.0:8182"
    assert second["pykbroker.schema.registry.advertised.listener"] == "https://registry.example:18182"
    assert plans[1].probe == ("127.0.0.1", 9093)  # a wildcard listener is reached on loopback


def test_one_process_keeps_the_base_id_and_ports() -> None:
    (plan,) = plan_processes(cfg(), 1, "h")
    assert plan.broker_id == 1 and plan.overrides["listeners"] == "PLAINTEXT://127.0.0.1:9092"


@pytest.mark.parametrize(("config", "processes", "says"), [
    (lambda: BrokerConfig({"listeners": "PLAINTEXT://127.0.0.1:9092"}), 2, "needs 'zookeeper.connect'"),
    (lambda: cfg(), 0, "--processes must be 1 or more"),
    # Two listeners 1 apart: process 1's PLAINTEXT port is process 0's INTERNAL port.
    (lambda: cfg(listeners="PLAINTEXT://127.0.0.1:9092,INTERNAL://127.0.0.1:9093",
                 listener_security_protocol_map="PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT"),
     2, "brokers 1 and 2 would both listen on port 9093"),
    # A wildcard host collides with a specific one on the same port.
    (lambda: cfg(listeners="PLAINTEXT://0.0.0.0:9092,INTERNAL://10.0.0.1:9093",
                 listener_security_protocol_map="PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT"),
     2, "would both listen on port 9093"),
    (lambda: cfg(pykbroker_metrics_listener="http://127.0.0.1:9093"), 2, "would both listen on port 9093"),
    (lambda: cfg(pykbroker_console_listener="http://127.0.0.1:0"), 2, "console.listener' has port 0"),
    (lambda: cfg(pykbroker_console_listener="http://127.0.0.1:9093"), 2, "would both listen on port 9093"),
    (lambda: cfg(pykbroker_schema_registry_listener="http://127.0.0.1:0"), 2, "registry.listener' has port 0"),
    (lambda: cfg(pykbroker_schema_registry_listener="http://127.0.0.1:9093"), 2, "would both listen on port 9093"),
    (lambda: cfg(listeners="PLAINTEXT://127.0.0.1:65535"), 2, "above 65535"),
    (lambda: cfg(broker_id="2147483647"), 2, "above 2147483647"),
])
def test_settings_that_cannot_be_shared_are_refused(config: object, processes: int, says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace("-", r"\-")):
        plan_processes(config(), processes, "h")  # type: ignore[operator]


def test_two_listeners_far_enough_apart_are_accepted() -> None:
    c = cfg(listeners="PLAINTEXT://127.0.0.1:9092,INTERNAL://127.0.0.1:9094",
            listener_security_protocol_map="PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT")
    assert plan_processes(c, 2, "h")[1].overrides["listeners"] == (
        "PLAINTEXT://127.0.0.1:9093,INTERNAL://127.0.0.1:9095")


def test_cli_refuses_at_start_with_one_line(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The parent checks every child's configuration before starting any (exit 2, as a refused config)."""
    assert main(["serve", "--processes", "2", "--override", f"log.dirs={tmp_path}"]) == 2
    assert "invalid configuration: --processes needs 'zookeeper.connect'" in capfd.readouterr().err
    assert main(["serve", "--processes", "2", "--override", f"zookeeper.connect={ZK}", "--override",
                 f"log.dirs={tmp_path}", "--override", "listeners=PLAINTEXT://127.0.0.1:9092,B://127.0.0.1:9093",
                 "--override", "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,B:PLAINTEXT"]) == 2
    err = capfd.readouterr().err
    assert "invalid configuration: with --processes 2, brokers 0 and 1 would both listen on port 9093" in err
    assert len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing was started


def test_restart_backoff_doubles_and_is_bounded() -> None:
    policy = RestartPolicy(max_restarts=3, window_s=100.0, initial_backoff_s=1.0, max_backoff_s=3.0)
    delays = []
    for now in (0.0, 10.0, 20.0):
        d = policy.on_exit(-9, now, ever_listened=True)
        assert isinstance(d, Restart)
        delays.append(d.at - now)
    assert delays == [1.0, 2.0, 3.0]
    d = policy.on_exit(1, 30.0, ever_listened=True)
    assert isinstance(d, GiveUp) and d.exit_status == 1 and "after 3 restarts within 100 s" in d.reason
    # Once the window has passed, the count starts again.
    assert isinstance(policy.on_exit(-9, 200.0, ever_listened=True), Restart)


def test_refused_configuration_or_failed_start_is_not_restarted() -> None:
    d = RestartPolicy().on_exit(2, 0.0, ever_listened=True)
    assert isinstance(d, GiveUp) and d.exit_status == 2
    d = RestartPolicy().on_exit(1, 0.0, ever_listened=False)
    assert isinstance(d, GiveUp) and "before it listened" in d.reason
    # Killed before it listened (e.g. by the OOM killer): a crash, restarted.
    assert isinstance(RestartPolicy().on_exit(-9, 0.0, ever_listened=False), Restart)
    # --max-restarts 0: the first death stops the host.
    assert isinstance(RestartPolicy(max_restarts=0).on_exit(-9, 0.0, ever_listened=True), GiveUp)


def test_describe_exit() -> None:
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(3) == "exit status 3"


def test_siblings_are_reached_on_loopback_when_the_inter_broker_listener_allows() -> None:
    plans = plan_processes(cfg(listeners="PLAINTEXT://0.0.0.0:9092",
                               advertised_listeners="PLAINTEXT://kafka.example:9092"), 3, "h")
    assert plans[0].overrides[LOCAL_ENDPOINTS] == "2@127.0.0.1:9093,3@127.0.0.1:9094"
    assert plans[2].overrides[LOCAL_ENDPOINTS] == "1@127.0.0.1:9092,2@127.0.0.1:9093"
    child = BrokerConfig({"zookeeper.connect": ZK, **plans[1].overrides})
    assert parse_local_endpoints(child[LOCAL_ENDPOINTS]) == {1: ("127.0.0.1", 9092), 3: ("127.0.0.1", 9094)}
    # The inter-broker listener is the one named, not the first.
    two = cfg(listeners="PLAINTEXT://10.0.0.1:9092,INTERNAL://[::]:9192",
              listener_security_protocol_map="PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT",
              inter_broker_listener_name="INTERNAL")
    assert plan_processes(two, 2, "h")[0].overrides[LOCAL_ENDPOINTS] == "2@[::1]:9193"


@pytest.mark.parametrize("overrides", [
    {"listeners": "PLAINTEXT://10.0.0.1:9092"},  # bound to one address: loopback does not reach it
    {"listeners": "SSL://0.0.0.0:9092", "ssl.keystore.type": "PEM"},  # TLS: the certificate names the host
])
def test_no_loopback_endpoints_when_the_listener_does_not_allow(overrides: dict[str, str]) -> None:
    c = BrokerConfig({"zookeeper.connect": ZK, "log.dirs": "/d", **overrides})
    assert all(LOCAL_ENDPOINTS not in p.overrides for p in plan_processes(c, 2, "h"))
    assert LOCAL_ENDPOINTS not in plan_processes(cfg(), 1, "h")[0].overrides


def test_local_endpoints_setting_is_checked() -> None:
    with pytest.raises(ConfigError, match="'x@127.0.0.1:1' is not of the form BROKER_ID@host:port"):
        BrokerConfig({LOCAL_ENDPOINTS: "x@127.0.0.1:1"})
    with pytest.raises(ConfigError, match="not of the form"):
        BrokerConfig({LOCAL_ENDPOINTS: "1@127.0.0.1"})


def test_child_log_lines_carry_the_broker_id(capfd: pytest.CaptureFixture[str]) -> None:
    import json
    import logging

    from pykbroker import logsetup
    from pykbroker.multiprocess.logtag import tag_log_lines

    logsetup.configure("INFO", "json")
    tag_log_lines(7)
    logging.getLogger("pykbroker.test").info("hello", extra={"kv": {"topic": "t"}})
    logging.getLogger("pykbroker.test").info("plain")
    lines = [json.loads(x) for x in capfd.readouterr().err.splitlines()]
    assert lines[0]["msg"] == "hello" and lines[0]["topic"] == "t" and lines[0]["broker"] == 7
    assert lines[1]["broker"] == 7
