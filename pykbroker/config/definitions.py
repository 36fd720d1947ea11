"""The broker's settings table: Kafka's ``server.properties`` names, types and defaults, the topic
configs each broker key supplies the default of, and Kafka's synonym groups among broker keys.
"""

from __future__ import annotations

from pykbroker.config.parsing import (
    INT_MAX,
    LONG_MAX,
    ConfigDef,
    at_least,
    one_of,
    valid_authorizer_class,
    valid_console_listener,
    valid_ibp_version,
    valid_ip_overrides,
    valid_listeners,
    valid_local_endpoints,
    valid_log_levels,
    valid_metrics_listener,
    valid_policy,
    valid_protocol_map,
    valid_schema_registry_listener,
    valid_security_protocol,
    valid_super_users,
    valid_topic_name_or_empty,
    valid_zk_connect,
)

_D = ConfigDef
BROKER_CONFIG_DEFS: dict[str, ConfigDef] = {
    d.name: d
    for d in [
        _D("broker.id", "int", 0, "This broker's id.", at_least(-1)),
        _D("broker.id.generation.enable", "bool", True, "Kafka: generate a broker id when broker.id is -1.",
           no_effect="ids are never generated: broker.id must be set (0 or more) with zookeeper.connect, and a "
           "broker.id of -1 is refused there"),
        _D("node.id", "int", -1, "Alias of broker.id (KRaft naming); -1 means use broker.id."),
        _D("listeners", "list", ["PLAINTEXT://127.0.0.1:9092"], "Addresses to listen on.", valid_listeners),
        _D("advertised.listeners", "list", [], "Addresses given to clients; defaults to listeners.",
           valid_listeners),
        _D("listener.security.protocol.map", "string",
           "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
           "Security protocol of each listener name; only PLAINTEXT listeners can be served.",
           valid_protocol_map),
        _D("inter.broker.listener.name", "string", "", "The listener other brokers (followers) connect to. "
           "Set this or security.inter.broker.protocol, not both; with neither, the listener named PLAINTEXT, or "
           "else the first listener."),
        _D("security.inter.broker.protocol", "string", "PLAINTEXT", "Security protocol between brokers: the "
           "inter-broker listener is the listener named after it (PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL). "
           "Set this or inter.broker.listener.name, not both.", valid_security_protocol),
        _D("control.plane.listener.name", "string", "", "Kafka: a listener of its own for controller-to-broker "
           "requests; when set it must name a listener other than the inter-broker one.",
           no_effect="the controller sends no requests to brokers (they follow ZooKeeper's state themselves), "
           "so there is no control-plane traffic to separate; the listener is served like any other"),
        _D("early.start.listeners", "string", "", "Kafka: listeners that may start before the authorizer is "
           "ready; when set, names listeners of 'listeners'.",
           no_effect="the authorizer is ready before any listener starts"),
        _D("inter.broker.protocol.version", "string", "3.9-IV0", "Kafka: the inter-broker protocol version of a "
           "rolling upgrade (for example 3.9 or 3.9-IV0).", valid_ibp_version,
           no_effect="brokers of a pykbroker cluster speak every request version they implement to each other; "
           "there is no protocol-version step in an upgrade"),
        _D("log.dirs", "list", [], "Directories holding partition logs."),
        _D("log.dir", "string", "/tmp/kafka-logs", "Used when log.dirs is unset."),
        _D("zookeeper.connect", "string", "", "host:port[,host:port...][/chroot] of the ZooKeeper ensemble "
           "that coordinates a cluster; empty runs one broker with embedded metadata.", valid_zk_connect),
        _D("zookeeper.session.timeout.ms", "int", 18000, "ZooKeeper session timeout.", at_least(1)),
        _D("zookeeper.connection.timeout.ms", "int", None, "How long to wait for the ZooKeeper connection at "
           "start; unset means zookeeper.session.timeout.ms.", at_least(1)),
        _D("zookeeper.max.in.flight.requests", "int", 10, validator=at_least(1),
           no_effect="kazoo pipelines every request on one connection"),
        _D("broker.rack", "string", None, "Rack of this broker: replica assignment spreads replicas over racks."),
        _D("num.partitions", "int", 1, "Default partition count for new topics.", at_least(1)),
        _D("default.replication.factor", "int", 1, "Default replication factor of new topics.", at_least(1)),
        _D("auto.create.topics.enable", "bool", True),
        _D("delete.topic.enable", "bool", True),
        _D("log.segment.bytes", "int", 1073741824, validator=at_least(14), dynamic=True),
        _D("log.roll.ms", "long", None, dynamic=True),
        _D("log.roll.hours", "int", 168, validator=at_least(1)),
        _D("log.roll.jitter.ms", "long", None, dynamic=True),
        _D("log.roll.jitter.hours", "int", 0, validator=at_least(0)),
        _D("log.retention.ms", "long", None, dynamic=True),
        _D("log.retention.minutes", "int", None),
        _D("log.retention.hours", "int", 168),
        _D("log.retention.bytes", "long", -1, dynamic=True),
        _D("log.retention.check.interval.ms", "long", 300000, validator=at_least(1)),
        _D("log.index.interval.bytes", "int", 4096, validator=at_least(0), dynamic=True),
        _D("log.index.size.max.bytes", "int", 10485760, validator=at_least(4), dynamic=True),
        _D("log.flush.interval.messages", "long", LONG_MAX, validator=at_least(1), dynamic=True),
        _D("log.flush.interval.ms", "long", None, dynamic=True),
        _D("log.flush.scheduler.interval.ms", "long", LONG_MAX),
        _D("log.flush.offset.checkpoint.interval.ms", "int", 60000, validator=at_least(0)),
        _D("log.flush.start.offset.checkpoint.interval.ms", "int", 60000, validator=at_least(0),
           no_effect="log start offsets are checkpointed with the recovery points, every "
                     "log.flush.offset.checkpoint.interval.ms"),
        _D("log.segment.delete.delay.ms", "long", 60000, validator=at_least(0), dynamic=True),
        _D("log.cleanup.policy", "list", ["delete"], validator=valid_policy, dynamic=True),
        _D("log.cleaner.enable", "bool", True),
        _D("log.cleaner.delete.retention.ms", "long", 86400000, dynamic=True),
        _D("log.cleaner.min.compaction.lag.ms", "long", 0, dynamic=True),
        _D("log.cleaner.max.compaction.lag.ms", "long", LONG_MAX, dynamic=True),
        _D("log.cleaner.min.cleanable.ratio", "double", 0.5, dynamic=True),
        _D("log.cleaner.backoff.ms", "long", 15000),
        _D("log.cleaner.threads", "int", 1, validator=at_least(0), dynamic=True,
           no_effect="one cleaner task compacts the logs in turn; set log.cleaner.enable=false to stop it"),
        _D("log.preallocate", "bool", False, dynamic=True),
        _D("log.message.timestamp.type", "string", "CreateTime",
           validator=one_of("CreateTime", "LogAppendTime"), dynamic=True),
        _D("log.message.timestamp.before.max.ms", "long", LONG_MAX, validator=at_least(0), dynamic=True),
        _D("log.message.timestamp.after.max.ms", "long", LONG_MAX, validator=at_least(0), dynamic=True),
        _D("log.message.timestamp.difference.max.ms", "long", LONG_MAX, dynamic=True),
        _D("log.message.downconversion.enable", "bool", True, "Whether Fetch v0-3 (clients from before "
           "Kafka 0.11) get their data down-converted to message format v0/v1; false answers them "
           "UNSUPPORTED_VERSION.", dynamic=True),
        _D("message.max.bytes", "int", 1048588, validator=at_least(0), dynamic=True),
        _D("socket.request.max.bytes", "int", 104857600, validator=at_least(1)),
        _D("socket.send.buffer.bytes", "int", 102400),
        _D("socket.receive.buffer.bytes", "int", 102400),
        _D("connections.max.idle.ms", "long", 600000),
        _D("connection.failed.authentication.delay.ms", "int", 100, "After a failed SASL authentication the "
           "broker waits this long before it answers, then closes the connection (KIP-306: slows down password "
           "guessing).", at_least(0)),
        # --- SASL (pykbroker.security.sasl) ---
        _D("sasl.enabled.mechanisms", "list", ["GSSAPI"], "SASL mechanisms of SASL_* listeners: PLAIN, SCRAM-SHA-256, "
           "SCRAM-SHA-512. Kafka's default GSSAPI is not implemented: a broker with a SASL listener refuses to "
           "start until this is set."),
        _D("sasl.mechanism.inter.broker.protocol", "string", "GSSAPI", "SASL mechanism of inter-broker "
           "connections when the inter-broker listener is SASL_*."),
        _D("sasl.jaas.config", "password", None, "JAAS login module configuration (PlainLoginModule users, "
           "ScramLoginModule/PlainLoginModule username and password for inter-broker connections)."),
        _D("connections.max.reauth.ms", "long", 0, "KIP-368: SASL sessions last this long, then the client "
           "must re-authenticate; 0 disables.", at_least(0)),
        _D("sasl.server.max.receive.size", "int", 524288, "Largest request accepted before authentication.",
           at_least(1)),
        # --- end SASL ---
        # --- ACL authorizer (pykbroker.security.acl_authorizer) ---
        _D("authorizer.class.name", "string", "", "Authorizer: kafka.security.authorizer.AclAuthorizer or "
           "org.apache.kafka.metadata.authorizer.StandardAuthorizer (both: Kafka's ACL semantics); empty: none "
           "(everything allowed).", valid_authorizer_class),
        _D("super.users", "string", "", "Semicolon-separated principals allowed everything (User:admin;User:b).",
           valid_super_users),
        _D("allow.everyone.if.no.acl.found", "bool", False, "With an authorizer: allow an operation on a "
           "resource that has no ACL at all."),
        # --- end ACL authorizer ---
        # --- schema registry security (pykbroker.schema_registry.security) ---
        _D("pykbroker.schema.registry.authentication", "string", "none", "pykbroker: none, or basic: every "
           "schema registry request needs HTTP basic credentials of a SCRAM user of the brokers (the users "
           "pykbroker scram and AlterUserScramCredentials create).", one_of("none", "basic")),
        # --- end schema registry security ---
        # --- TLS (pykbroker.security.tls); each also settable as listener.name.<l>.<key> ---
        _D("ssl.keystore.type", "string", "JKS", "PEM or PKCS12 (JKS, Kafka's default, is not implemented).",
           one_of("JKS", "PKCS12", "PEM")),
        _D("ssl.keystore.location", "string", None, "Keystore file (PKCS12, or PEM with key and certificate chain)."),
        _D("ssl.keystore.password", "password", None, "Password of the keystore file."),
        _D("ssl.key.password", "password", None, "Password of the private key (PEM: of the encrypted key)."),
        _D("ssl.keystore.certificate.chain", "password", None, "Inline PEM certificate chain (ssl.keystore.type=PEM)."),
        _D("ssl.keystore.key", "password", None, "Inline PEM private key (ssl.keystore.type=PEM)."),
        _D("ssl.truststore.type", "string", "JKS", "PEM or PKCS12 (JKS is not implemented).",
           one_of("JKS", "PKCS12", "PEM")),
        _D("ssl.truststore.location", "string", None, "Truststore file: CA certificates clients are checked against."),
        _D("ssl.truststore.password", "password", None, "Password of the truststore file (PKCS12)."),
        _D("ssl.truststore.certificates", "password", None, "Inline PEM CA certificates (ssl.truststore.type=PEM)."),
        _D("ssl.client.auth", "string", "none", "required, requested or none: whether clients present certificates.",
           one_of("required", "requested", "none")),
        _D("ssl.enabled.protocols", "list", ["TLSv1.2", "TLSv1.3"], "TLS versions accepted (TLSv1.2, TLSv1.3)."),
        _D("ssl.protocol", "string", "TLSv1.3", "TLS protocol of the context (TLSv1.2 or TLSv1.3; TLS accepted).",
           one_of("TLS", "TLSv1.2", "TLSv1.3")),
        _D("ssl.cipher.suites", "list", [], "OpenSSL cipher names for TLSv1.2 (empty: OpenSSL's defaults)."),
        _D("ssl.principal.mapping.rules", "string", "DEFAULT", "Rules mapping a client certificate's subject DN "
           "to a principal name (Kafka's RULE:pattern/replacement/[LU] syntax)."),
        _D("ssl.endpoint.identification.algorithm", "string", "https", "https: the broker's own inter-broker "
           "connections check the peer's host name; empty: they do not."),
        # --- end TLS ---
        # --- connection limits and request memory ---
        _D("max.connections", "int", INT_MAX, "Connections the broker accepts at once; above it listeners "
           "stop accepting (also listener.name.X.max.connections).", at_least(0)),
        _D("max.connections.per.ip", "int", INT_MAX, "Connections allowed from one address; more are closed "
           "at once.", at_least(0)),
        _D("max.connections.per.ip.overrides", "string", "", "Per-address or per-host limits, host:count,...",
           valid_ip_overrides),
        _D("max.connection.creation.rate", "int", INT_MAX, "New connections per second before accepting is "
           "throttled (also listener.name.X.max.connection.creation.rate).", at_least(0)),
        _D("queued.max.request.bytes", "long", -1, "Bytes of requests being read before the broker stops "
           "reading from sockets; -1 (or 0) means unbounded, as in Kafka."),
        _D("pykbroker.request.receive.timeout.ms", "long", 30000,
           "pykbroker: a request must arrive whole within this time of its first byte or the connection is "
           "closed (slow senders); 0 or -1 disables.", at_least(-1)),
        _D("pykbroker.max.inflight.requests.per.connection", "int", 5,
           "pykbroker: requests of one connection read and processed before they are answered, while earlier "
           "ones wait only for an acknowledgement and one of them waits for the ISR (acks=all). Responses "
           "still go out in request order. 1: each request is answered before the next is read. TLS "
           "listeners always use 1. An eager reader takes away the backpressure that makes producers batch, "
           "and each smaller request is one more acknowledgement for the followers (docs/performance.md, "
           "'acks=all and replication').", at_least(1)),
        _D("pykbroker.max.inflight.flush.requests.per.connection", "int", 1024,
           "pykbroker: as pykbroker.max.inflight.requests.per.connection, while the unanswered requests wait "
           "only for this broker's fsync (log.flush.on.ack), not for the ISR. One fsync covers them all, and a "
           "connection that stops reading stops appending, so a slow fsync would hold up the partition's "
           "consumers too: at 1,000 requests a second, 1024 rides out a one-second fsync (docs/performance.md, "
           "'Sharing the CPU'). The byte bound still applies. TLS listeners always use 1.", at_least(1)),
        _D("pykbroker.max.inflight.bytes.per.connection", "long", 4 * 1024 * 1024,
           "pykbroker: the connection also stops reading while its unanswered requests hold this many request "
           "bytes (a single request may be larger).", at_least(1)),
        # --- end connection limits ---
        _D("pykbroker.scheduler.slice.us", "int", 200,
           "pykbroker: the CPU time slice the serve process's threads ask Linux's scheduler for (sched_setattr, "
           "Linux 6.12+; threads started later inherit it; 0 leaves the slice the process started with, the "
           "kernel's default of 1.4 ms on 2 CPUs unless its parent set one). With a short slice a broker thread "
           "woken by a request runs before a CPU-bound neighbour's slice ends: beside two busy processes on 2 "
           "vCPUs the event loop's run-queue waits of 1 ms or more were a tenth of those with the kernel's "
           "slice, and e2e p99 with log.flush.on.ack was lower in 33 of 44 paired cells, with no throughput "
           "lost quiet (docs/performance.md, 'Sharing the CPU'). Where the kernel keeps no slice per thread, "
           "the default is a log line and a value set explicitly fails the start. 0 or 100-100000.",
           lambda v: None if v == 0 or 100 <= v <= 100_000 else "value must be 0 or between 100 and 100000"),
        _D("pykbroker.event.loop", "string", "asyncio",
           "pykbroker: the event loop that serves every connection: asyncio (Python's own) or uvloop (libuv; "
           "install it with pip install 'pykbroker[uvloop]'; a start with uvloop chosen and not installed fails, "
           "saying so). uvloop runs the same code for less CPU per request (docs/performance.md, 'CPU per "
           "request').", one_of("asyncio", "uvloop")),
        _D("pykbroker.gil.switch.interval.us", "int", 5000,
           "pykbroker: how long a thread waiting for Python's GIL lets the thread holding it run before asking "
           "for it (sys.setswitchinterval; 5000 is Python's own default). Where the C extension is not built, "
           "the fsync threads of log.flush.on.ack need the GIL after each fsync to hand the result to the event "
           "loop, and under CPU contention they often waited the whole interval: 500 cut that wait "
           "(docs/performance.md, 'Sharing the CPU'). The native fsync threads never take the GIL.",
           lambda v: None if 50 <= v <= 100_000 else "value must be between 50 and 100000"),
        _D("num.network.threads", "int", dynamic=True, default=3, validator=at_least(1),
           no_effect="one event loop serves every connection"),
        _D("num.io.threads", "int", dynamic=True, default=8, validator=at_least(1),
           no_effect="requests are handled on the event loop; fsyncs and compaction use worker threads"),
        _D("num.recovery.threads.per.data.dir", "int", dynamic=True, default=2, validator=at_least(1),
           no_effect="logs are loaded and recovered one after another"),
        _D("num.replica.fetchers", "int", 1, validator=at_least(1), dynamic=True),
        _D("min.insync.replicas", "int", 1, validator=at_least(1), dynamic=True),
        _D("unclean.leader.election.enable", "bool", False, dynamic=True),
        _D("compression.type", "string", "producer",
           validator=one_of("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"), dynamic=True),
        _D("offsets.topic.num.partitions", "int", 50, validator=at_least(1)),
        _D("offsets.topic.replication.factor", "int", 3, "With embedded metadata capped at 1; in a cluster, "
           "creation waits until this many brokers are live, as in Kafka.",
           at_least(1)),
        _D("offsets.retention.minutes", "int", 10080, validator=at_least(1)),
        _D("offsets.topic.segment.bytes", "int", 104857600, validator=at_least(1)),
        _D("transaction.state.log.num.partitions", "int", 50, validator=at_least(1)),
        _D("transaction.state.log.replication.factor", "int", 3, "With embedded metadata capped at 1; in a cluster, "
           "creation waits until this many brokers are live, as in Kafka.",
           at_least(1)),
        _D("transaction.state.log.min.isr", "int", 2, "Capped at the replication factor actually used.",
           at_least(1)),
        _D("transaction.max.timeout.ms", "int", 900000, validator=at_least(1)),
        _D("transactional.id.expiration.ms", "int", 604800000, validator=at_least(1)),
        _D("transaction.partition.verification.enable", "bool", True, dynamic=True),
        _D("producer.id.expiration.ms", "int", 86400000, validator=at_least(1), dynamic=True),
        _D("producer.id.expiration.check.interval.ms", "int", 600000, validator=at_least(1)),
        _D("group.initial.rebalance.delay.ms", "int", 3000),
        _D("group.min.session.timeout.ms", "int", 6000),
        _D("group.max.session.timeout.ms", "int", 1800000),
        _D("group.max.size", "int", 2147483647, validator=at_least(1)),
        # --- group coordinator ---
        _D("offsets.retention.check.interval.ms", "long", 600000, validator=at_least(1)),
        _D("offset.metadata.max.bytes", "int", 4096, validator=at_least(0)),
        _D("offsets.load.buffer.size", "int", 5242880, validator=at_least(1),
           no_effect="offsets partitions are read in fixed 4 MiB chunks"),
        _D("offsets.commit.timeout.ms", "int", 5000, "In a cluster, how long a group coordinator's write waits "
           "for the ISR to have it before answering.", at_least(1)),
        _D("group.coordinator.rebalance.protocols", "list", ["classic", "consumer"]),
        _D("group.consumer.session.timeout.ms", "int", 45000, validator=at_least(1)),
        _D("group.consumer.min.session.timeout.ms", "int", 45000, validator=at_least(1)),
        _D("group.consumer.max.session.timeout.ms", "int", 60000, validator=at_least(1)),
        _D("group.consumer.heartbeat.interval.ms", "int", 5000, validator=at_least(1)),
        _D("group.consumer.min.heartbeat.interval.ms", "int", 5000, validator=at_least(1),
           no_effect="group.consumer.heartbeat.interval.ms is not checked against it"),
        _D("group.consumer.max.heartbeat.interval.ms", "int", 15000, validator=at_least(1),
           no_effect="group.consumer.heartbeat.interval.ms is not checked against it"),
        _D("group.consumer.max.size", "int", 2147483647, validator=at_least(1)),
        _D("group.consumer.assignors", "list", ["uniform", "range"]),
        _D("group.consumer.migration.policy", "string", "bidirectional",
           validator=one_of("disabled", "downgrade", "upgrade", "bidirectional")),
        # --- end group coordinator ---
        # --- share groups (KIP-932; pykbroker/coordinator/share) ---
        _D("group.share.enable", "bool", False, "Serve share groups (KIP-932): advertise and answer the share "
           "APIs. Kafka 4.2 gates them on the share.version feature; pykbroker has no finalized features, so "
           "this static switch stands in for it (docs/queues.md)."),
        _D("group.share.record.lock.duration.ms", "int", 30000, "How long a share consumer holds the records "
           "it acquired before they are released for redelivery.", at_least(1)),
        _D("group.share.delivery.count.limit", "int", 5, "Deliveries of a record after which it is archived "
           "(and sent to the dead-letter topic, if any) instead of released.", at_least(1)),
        _D("group.share.partition.max.record.locks", "int", 2000, "In-flight records per share-partition: "
           "no records past start offset + this are acquired.", at_least(1)),
        _D("group.share.heartbeat.interval.ms", "int", 5000, validator=at_least(1)),
        _D("group.share.session.timeout.ms", "int", 45000, validator=at_least(1)),
        _D("group.share.max.size", "int", 200, "Members per share group.", at_least(1)),
        _D("pykbroker.dlq.topic", "string", "", "pykbroker: default of the topic config pykbroker.dlq.topic, the "
           "dead-letter topic of share groups reading a topic (docs/queues.md); empty: none.",
           valid_topic_name_or_empty),
        _D("share.coordinator.state.topic.num.partitions", "int", 50, validator=at_least(1)),
        _D("share.coordinator.state.topic.replication.factor", "int", 3, validator=at_least(1)),
        _D("share.coordinator.state.topic.segment.bytes", "int", 104857600, validator=at_least(14)),
        _D("share.coordinator.state.topic.min.isr", "int", 2, "Capped at the replication factor actually used.",
           at_least(1)),
        _D("share.coordinator.write.timeout.ms", "int", 5000, "How long the share coordinator waits for a state "
           "write to reach the ISR before answering it failed.", at_least(1)),
        # --- end share groups ---
        _D("fetch.max.bytes", "int", 57671680, validator=at_least(1024)),
        _D("max.incremental.fetch.session.cache.slots", "int", 1000, "Incremental fetch sessions (KIP-227) the "
           "broker keeps; 0 answers every client sessionless.", at_least(0)),
        # --- client quota enforcement (pykbroker.quotas) ---
        _D("quota.window.num", "int", 11, "Samples client quota rates are measured over.", at_least(1)),
        _D("quota.window.size.seconds", "int", 1, "Length of one client quota sample.", at_least(1)),
        _D("controller.quota.window.num", "int", 11, "Samples of the controller mutation quota (KIP-599): "
           "its token bucket holds this many windows of credit.", at_least(1)),
        _D("controller.quota.window.size.seconds", "int", 1, "Length of one controller mutation quota "
           "sample.", at_least(1)),
        # --- end client quota enforcement ---
        # --- client telemetry (KIP-714) ---
        _D("telemetry.max.bytes", "int", 1048576, "The largest metrics payload a client may push "
           "(PushTelemetry); larger ones get TELEMETRY_TOO_LARGE.", at_least(1)),
        _D("pykbroker.client.telemetry.enable", "string", "auto", "pykbroker: when ApiVersions advertises "
           "GetTelemetrySubscriptions and PushTelemetry (KIP-714), as a Kafka broker does only with a client "
           "telemetry reporter: auto (while a CLIENT_METRICS subscription exists), true (always), false (never).",
           one_of("auto", "true", "false")),
        # --- end client telemetry ---
        # --- observability (pykbroker.observability) ---
        _D("pykbroker.metrics.listener", "string", "", "pykbroker: where the Prometheus endpoint listens, as "
           "http://host:port (path /metrics); empty turns it off.", valid_metrics_listener),
        _D("pykbroker.console.listener", "string", "", "pykbroker: where the web console for operators listens, "
           "as http://host:port; empty turns it off.", valid_console_listener),
        _D("pykbroker.console.read.only", "bool", True, "pykbroker: the web console only shows the cluster; false "
           "also lets its users create and delete topics, produce messages and reset a group's offsets (as far "
           "as the broker's ACLs allow them)."),
        _D("pykbroker.metrics.partition.series", "bool", True, "pykbroker: export Kafka's per-partition log "
           "gauges (size, segments, start/end offsets, high watermark, under-replicated); false exports them "
           "summed per topic, for brokers with thousands of partitions (each sample costs scrape time)."),
        _D("pykbroker.log.format", "string", "text", "pykbroker: log line format: text, logfmt or json.",
           one_of("text", "logfmt", "json")),
        _D("pykbroker.log.levels", "string", "", "pykbroker: levels of single loggers on top of --log-level, "
           "as logger=LEVEL pairs separated by commas (log4j's level names too), e.g. "
           "pykbroker.request=DEBUG,pykbroker.network=WARN; a logger's children inherit its level.",
           valid_log_levels),
        # --- end observability ---
        # --- cluster and replication (ZooKeeper mode) ---
        _D("pykbroker.local.broker.endpoints", "list", [], "pykbroker: brokers that are other processes of this "
           "host (serve --processes sets it), as BROKER_ID@host:port of their inter-broker listener on loopback; "
           "inter-broker connections to them go there instead of to their registered endpoint.",
           valid_local_endpoints),
        _D("replica.lag.time.max.ms", "long", 30000, "A follower that has not caught up for this long leaves "
           "the ISR.", at_least(1)),
        _D("replica.fetch.max.bytes", "int", 1048576, validator=at_least(0)),
        _D("replica.fetch.response.max.bytes", "int", 10485760, validator=at_least(0)),
        _D("replica.fetch.min.bytes", "int", 1, validator=at_least(1)),
        _D("replica.fetch.wait.max.ms", "int", 500, validator=at_least(0)),
        _D("replica.fetch.backoff.ms", "int", 1000, validator=at_least(0)),
        _D("replica.socket.timeout.ms", "int", 30000, validator=at_least(1)),
        _D("replica.socket.receive.buffer.bytes", "int", 65536,
           no_effect="follower connections use the operating system's default receive buffer"),
        _D("replica.high.watermark.checkpoint.interval.ms", "long", 5000, validator=at_least(1)),
        _D("request.timeout.ms", "int", 30000, "Timeout of requests to other brokers.", at_least(1)),
        _D("controlled.shutdown.enable", "bool", True, "On SIGTERM, move this broker's leaderships to other "
           "replicas before stopping."),
        _D("controlled.shutdown.max.retries", "int", 3, validator=at_least(0)),
        _D("controlled.shutdown.retry.backoff.ms", "long", 5000, validator=at_least(0)),
        _D("auto.leader.rebalance.enable", "bool", True, "The controller moves leadership back to the preferred "
           "replica when a broker's imbalance exceeds leader.imbalance.per.broker.percentage."),
        _D("leader.imbalance.check.interval.seconds", "long", 300, validator=at_least(1)),
        _D("leader.imbalance.per.broker.percentage", "int", 10, validator=at_least(0)),
        # --- end cluster and replication ---
        _D("log.flush.on.ack", "bool", False,
           "pykbroker: fsync the log before acknowledging acks=1/all, so that a lone broker loses nothing "
           "acknowledged on power loss. Kafka itself relies on replication instead."),
        # --- delayed delivery (pykbroker/delay; docs/queues.md "Delayed delivery") ---
        _D("pykbroker.delay.enable", "bool", False,
           "pykbroker: hold records carrying a pykbroker.delay.ms or pykbroker.deliver.at.ms header, or produced "
           "to a topic with pykbroker.delay.ms, in __delayed_records until they fall due. Off: the headers are "
           "ordinary headers and the produce path pays nothing. In a ZooKeeper cluster, set it on every broker."),
        _D("pykbroker.delay.ms", "long", 0,
           "pykbroker: default delay of every record produced to a topic (topic config pykbroker.delay.ms "
           "overrides it); 0 delivers at once. Needs pykbroker.delay.enable.", at_least(0)),
        _D("pykbroker.delay.max.ms", "long", 604800000,
           "pykbroker: the longest delay a header or topic may ask for; a record asking more is refused with "
           "INVALID_RECORD.", at_least(1)),
        _D("pykbroker.delay.topic.replication.factor", "int", 3,
           "pykbroker: replication factor of __delayed_records; capped at the one broker with embedded metadata, "
           "in a cluster the topic is created once that many brokers are live.", at_least(1)),
        _D("pykbroker.delay.topic.min.isr", "int", 2,
           "pykbroker: min.insync.replicas of __delayed_records (capped at its replication factor).", at_least(1)),
        # --- end delayed delivery ---
        # --- schema registry (pykbroker/schema_registry; docs/schema-registry.md) ---
        _D("pykbroker.schema.registry.listener", "string", "",
           "pykbroker: where the Confluent-compatible schema registry listens, as http://host:port or "
           "https://host:port; empty turns it off. In a ZooKeeper cluster, set it on every broker.",
           valid_schema_registry_listener),
        _D("pykbroker.schema.registry.advertised.listener", "string", "",
           "pykbroker: the registry URL other brokers forward writes to; empty: the listener, a wildcard host "
           "replaced as in advertised.listeners.", valid_schema_registry_listener),
        _D("pykbroker.schema.registry.topic", "string", "_schemas",
           "pykbroker: the compacted topic (one partition) holding the registry's schemas, configs and modes.",
           lambda v: valid_topic_name_or_empty(v) if v else "value must be a legal topic name"),
        _D("pykbroker.schema.registry.topic.replication.factor", "int", 3,
           "pykbroker: replication factor of the registry's topic; with embedded metadata capped at 1; in a "
           "cluster, creation waits until this many brokers are live, as offsets.topic.replication.factor.",
           at_least(1)),
        _D("pykbroker.schema.registry.compatibility.level", "string", "BACKWARD",
           "pykbroker: the registry's compatibility level while none is set through PUT /config.",
           one_of("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL",
                  "FULL_TRANSITIVE")),
        _D("pykbroker.schema.registry.max.request.bytes", "int", 4194304,
           "pykbroker: the largest request body the registry reads; larger ones get HTTP 413.", at_least(1024)),
        # --- end schema registry ---
        _D("pykbroker.fault.drop.produce.response", "int", 0,
           "Testing hook: drop the connection after appending but before answering this many Produce "
           "requests (0 disables)."),
    ]
}

# Kafka's topic-level configs: name -> (broker default key, type).
TOPIC_CONFIG_SYNONYMS: dict[str, str] = {
    "segment.bytes": "log.segment.bytes",
    "segment.ms": "log.roll.ms",
    "segment.jitter.ms": "log.roll.jitter.ms",
    "segment.index.bytes": "log.index.size.max.bytes",
    "index.interval.bytes": "log.index.interval.bytes",
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "message.timestamp.difference.max.ms": "log.message.timestamp.difference.max.ms",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "cleanup.policy": "log.cleanup.policy",
    "pykbroker.delay.ms": "pykbroker.delay.ms",
    "pykbroker.dlq.topic": "pykbroker.dlq.topic",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "min.insync.replicas": "min.insync.replicas",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
    "compression.type": "compression.type",
    "preallocate": "log.preallocate",
    "message.downconversion.enable": "log.message.downconversion.enable",
}


# --- dynamic broker configs (KIP-226) ---------------------------------------------------------------

# Kafka's synonym groups among broker keys (DynamicBrokerConfig.brokerConfigSynonyms): the first that
# is set wins; a dynamic layer setting any of them hides the lower layers' values of all of them.
_BROKER_SYNONYM_GROUPS = (
    ("log.roll.ms", "log.roll.hours"),
    ("log.roll.jitter.ms", "log.roll.jitter.hours"),
    ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
)


def broker_config_synonyms(name: str) -> list[str]:
    """Kafka's synonyms of a broker key, in precedence order (including the key itself)."""
    if name == "log.flush.interval.ms":  # log.flush.scheduler.interval.ms stands in as its default
        return ["log.flush.interval.ms", "log.flush.scheduler.interval.ms"]
    for group in _BROKER_SYNONYM_GROUPS:
        if name in group:
            return list(group)
    return [name]
