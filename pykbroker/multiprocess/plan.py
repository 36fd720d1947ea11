"""The settings of each broker process that ``pykbroker serve --processes N`` starts (sans-I/O).

The N processes share one configuration; what must differ between them is derived here, and what
cannot be shared is refused before anything starts, so a mistake is one line at start rather than N
brokers fighting over a port or an id:

- ``broker.id`` (or ``node.id`` when that is the one set): base id + i;
- every ``listeners`` and ``advertised.listeners`` port: port + i (port 0 is refused: an ephemeral
  port cannot be registered in ZooKeeper, and N of them could not be found by the others);
- every log dir: ``<dir>/broker-<id>``, so one process's logs never mix with another's;
- ``pykbroker.metrics.listener``, ``pykbroker.console.listener`` and ``pykbroker.schema.registry.listener``
  (and its advertised listener) ports: port + i;
- ``broker.rack``: shared, the host name unless set, so the controller's rack-aware assignment puts a
  partition's replicas on different hosts before it puts two on one host;
- ``pykbroker.local.broker.endpoints``: the other processes' inter-broker listeners on loopback, so
  replication between processes of one host never leaves it, whatever ``advertised.listeners`` says
  (a NAT'd or published address, a name a load balancer answers). Only when that listener accepts
  loopback connections (wildcard or loopback host) and is not TLS (a certificate names the host, not
  127.0.0.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pykbroker.config import (
    INT_MAX,
    LOCAL_ENDPOINTS,
    BrokerConfig,
    ConfigError,
    Listener,
    parse_console_listener,
    parse_listener,
    parse_metrics_listener,
    parse_schema_registry_listener,
)

WILDCARD_HOSTS = ("", "0.0.0.0", "::")
def _loopback_of(host: str) -> str | None:
    """The loopback address a listener bound to ``host`` accepts, or None if it accepts none."""
    if host in ("", "0.0.0.0", "localhost") or host.startswith("127."):
        return "127.0.0.1" if not host.startswith("127.") else host
    if host in ("::", "::1"):
        return "::1"
    return None


@dataclass(frozen=True, slots=True)
class ProcessPlan:
    """One child broker: its index, id, the overrides that make it itself, and where it listens."""

    index: int
    broker_id: int
    overrides: dict[str, str] = field(default_factory=dict)
    # Where the parent can connect to see that the child has bound its listeners (first listener).
    probe: tuple[str, int] = ("127.0.0.1", 0)
    # (host, port) of everything the child binds: listeners and the metrics endpoint.
    binds: tuple[tuple[str, int], ...] = ()


def _shift(listener: Listener, offset: int, key: str) -> Listener:
    if listener.port == 0:
        raise ConfigError(f"configuration '{key}' has port 0 (an ephemeral port): with --processes each process "
                          "listens on the configured port + its index, so give every listener a fixed port")
    port = listener.port + offset
    if port > 65535:
        raise ConfigError(f"configuration '{key}': port {listener.port} + process index {offset} is above 65535")
    return Listener(listener.name, listener.host, port)


def _render(listener: Listener) -> str:
    host = f"[{listener.host}]" if ":" in listener.host else listener.host
    return f"{listener.name}://{host}:{listener.port}"


def _probe_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    return "::1" if host == "::" else host


def _collide(a: tuple[str, int], b: tuple[str, int]) -> bool:
    """Two binds on one host conflict on the same port if the hosts are equal or either is a wildcard."""
    return a[1] == b[1] and (a[0] == b[0] or a[0] in WILDCARD_HOSTS or b[0] in WILDCARD_HOSTS)


def plan_processes(config: BrokerConfig, processes: int, hostname: str) -> list[ProcessPlan]:
    """The N children's plans, or ConfigError saying which setting cannot be shared by N processes."""
    if processes < 1:
        raise ConfigError(f"--processes must be 1 or more, not {processes}")
    if not str(config["zookeeper.connect"]).strip():
        raise ConfigError("--processes needs 'zookeeper.connect': each process is a broker of a ZooKeeper "
                          "cluster, and embedded metadata (zookeeper.connect empty) belongs to one process")
    base = config.broker_id
    if base + processes - 1 > INT_MAX:
        raise ConfigError(f"configuration 'broker.id' {base} + {processes - 1} processes is above {INT_MAX}")
    id_key = "node.id" if int(config["node.id"]) >= 0 else "broker.id"
    advertised = [parse_listener(x) for x in config["advertised.listeners"]]
    metrics = str(config["pykbroker.metrics.listener"]).strip()
    console = str(config["pykbroker.console.listener"]).strip()
    rack = config["broker.rack"] if config["broker.rack"] is not None else hostname
    plans: list[ProcessPlan] = []
    for i in range(processes):
        broker_id = base + i
        listeners = [_shift(lst, i, "listeners") for lst in config.listeners]
        overrides = {
            id_key: str(broker_id),
            "listeners": ",".join(_render(lst) for lst in listeners),
            "log.dirs": ",".join(str(Path(d) / f"broker-{broker_id}") for d in config.log_dirs),
            "broker.rack": rack,
        }
        if advertised:
            overrides["advertised.listeners"] = ",".join(
                _render(_shift(a, i, "advertised.listeners")) for a in advertised)
        binds = [(lst.host, lst.port) for lst in listeners]
        for key, value, parse, serves in (("pykbroker.metrics.listener", metrics, parse_metrics_listener,
                                           "serves metrics"),
                                          ("pykbroker.console.listener", console, parse_console_listener,
                                           "serves its console")):
            if value:
                host, port = parse(value)
                if port == 0 and processes > 1:
                    raise ConfigError(f"configuration '{key}' has port 0: with --processes each process {serves} "
                                      "on the configured port + its index; give a fixed port")
                if port + i > 65535:
                    raise ConfigError(f"configuration '{key}': port {port} + process index {i} is above 65535")
                overrides[key] = f"http://{f'[{host}]' if ':' in host else host}:{port + i}"
                binds.append((host, port + i))
        for key in ("pykbroker.schema.registry.listener", "pykbroker.schema.registry.advertised.listener"):
            value = str(config[key]).strip()
            if value:
                scheme, host, port = parse_schema_registry_listener(value, key)
                if port == 0 and processes > 1:
                    raise ConfigError(f"configuration '{key}' has port 0: with --processes each process serves "
                                      "its schema registry on the configured port + its index; give a fixed port")
                if port + i > 65535:
                    raise ConfigError(f"configuration '{key}': port {port} + process index {i} is above 65535")
                overrides[key] = f"{scheme}://{f'[{host}]' if ':' in host else host}:{port + i}"
                if key == "pykbroker.schema.registry.listener":
                    binds.append((host, port + i))
        first = listeners[0]
        plans.append(ProcessPlan(i, broker_id, overrides, (_probe_host(first.host), first.port), tuple(binds)))
    _refuse_shared_binds(plans)
    return _with_local_endpoints(config, plans)


def _with_local_endpoints(config: BrokerConfig, plans: list[ProcessPlan]) -> list[ProcessPlan]:
    if len(plans) < 2:
        return plans
    inter = config.inter_broker_listener
    if config.security_protocols[inter] not in ("PLAINTEXT", "SASL_PLAINTEXT"):
        return plans
    position = [lst.name for lst in config.listeners].index(inter)
    loopback = _loopback_of(config.listeners[position].host)
    if loopback is None:
        return plans
    address = f"[{loopback}]" if ":" in loopback else loopback
    ports = {p.broker_id: config.listeners[position].port + p.index for p in plans}
    for plan in plans:
        plan.overrides[LOCAL_ENDPOINTS] = ",".join(
            f"{other}@{address}:{port}" for other, port in ports.items() if other != plan.broker_id)
    return plans


def _refuse_shared_binds(plans: list[ProcessPlan]) -> None:
    seen: list[tuple[int, tuple[str, int]]] = []
    for plan in plans:
        for bind in plan.binds:
            for other_id, other in seen:
                if other_id != plan.broker_id and _collide(bind, other):
                    raise ConfigError(
                        f"with --processes {len(plans)}, brokers {other_id} and {plan.broker_id} would both listen "
                        f"on port {bind[1]} (each process adds its index to every configured port): space the "
                        f"ports of 'listeners' and 'pykbroker.metrics.listener' at least {len(plans)} apart")
        seen.extend((plan.broker_id, b) for b in plan.binds)
