"""Client drivers: one per protocol implementation, all behind compat.clients.base.Client."""

from __future__ import annotations

from compat.clients.base import Client, Sasl

# The table's column order.
CLIENT_NAMES = ["confluent-kafka", "kcat", "kafka-python", "aiokafka", "kafkajs", "java", "franz-go", "sarama",
                "kafka-go"]


def make_client(name: str, bootstrap: str, sasl: Sasl | None = None) -> Client:
    """A driver for ``name``; with ``sasl``, one that authenticates over SASL_PLAINTEXT as that user
    (raises NotSupportedByClient for a mechanism the library lacks)."""
    if name == "confluent-kafka":
        from compat.clients.confluent import ConfluentClient
        return ConfluentClient(bootstrap, sasl)
    if name == "kcat":
        from compat.clients.kcat import KcatClient
        return KcatClient(bootstrap, sasl)
    if name == "kafka-python":
        from compat.clients.kafka_python import KafkaPythonClient
        return KafkaPythonClient(bootstrap, sasl)
    if name == "aiokafka":
        from compat.clients.aiokafka_client import AiokafkaClient
        return AiokafkaClient(bootstrap, sasl)
    if name == "kafkajs":
        from compat.clients.kafkajs import KafkajsClient
        return KafkajsClient(bootstrap, sasl)
    if name == "java":
        from compat.clients.java import JavaClient
        return JavaClient(bootstrap, sasl)
    if name == "franz-go":
        from compat.clients.franz import FranzClient
        return FranzClient(bootstrap, sasl)
    if name == "sarama":
        from compat.clients.sarama import SaramaClient
        return SaramaClient(bootstrap, sasl)
    if name == "kafka-go":
        from compat.clients.kafkago import KafkaGoClient
        return KafkaGoClient(bootstrap, sasl)
    raise ValueError(f"unknown client {name!r}")


def client_versions() -> dict[str, str]:
    """Library versions, for the results file."""
    import json
    import shutil
    import subprocess
    from pathlib import Path

    out: dict[str, str] = {}
    try:
        import confluent_kafka
        out["confluent-kafka"] = f"{confluent_kafka.__version__} (librdkafka {confluent_kafka.libversion()[0]})"
    except Exception:
        pass
    try:
        import kafka
        out["kafka-python"] = kafka.__version__
    except Exception:
        pass
    try:
        import aiokafka
        out["aiokafka"] = aiokafka.__version__
    except Exception:
        pass
    pkg = Path(__file__).resolve().parent.parent / "js" / "node_modules" / "kafkajs" / "package.json"
    if pkg.exists():
        out["kafkajs"] = json.loads(pkg.read_text())["version"]
    out["java"] = "kafka-clients 3.9.0"
    out.update(go_versions())
    kcat = shutil.which("kcat")
    if kcat:
        try:
            v = subprocess.run([kcat, "-V"], capture_output=True, text=True, timeout=10).stdout
            line = next((x for x in v.splitlines() if x.startswith("Version")), "")
            out["kcat"] = line.replace("Version ", "").split(" (")[0] + (
                f" (librdkafka {line.split('librdkafka ')[1].split()[0]})" if "librdkafka " in line else "")
        except Exception:
            pass
    return out


def go_versions() -> dict[str, str]:
    """The Go modules each Go driver's go.mod pins (the library and, for franz-go, kadm)."""
    from compat.env import GO_DIR, GO_DRIVERS

    libs = {"franz-go": ["github.com/twmb/franz-go", "github.com/twmb/franz-go/pkg/kadm"],
            "sarama": ["github.com/IBM/sarama"], "kafka-go": ["github.com/segmentio/kafka-go"]}
    out: dict[str, str] = {}
    for client, directory in GO_DRIVERS.items():
        try:
            text = (GO_DIR / directory / "go.mod").read_text()
        except OSError:
            continue
        found = []
        for lib in libs[client]:
            for line in text.splitlines():
                parts = line.split()
                if len(parts) >= 2 and parts[0] == lib:
                    found.append(f"{lib.split('/')[-1]} {parts[1]}")
        out[client] = ", ".join(found)
    return out
