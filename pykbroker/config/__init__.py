"""Broker configuration: Kafka's ``server.properties`` names, types and defaults, topic, group and
client-metrics configs, and the dynamic layers.

The package reads bottom-up: :mod:`.parsing` (plain values) < :mod:`.definitions` (the settings table) <
:mod:`.broker` (BrokerConfig, loading) < :mod:`.topic` < :mod:`.dynamic`. Importers use the names re-exported
here.
"""

from __future__ import annotations

from pykbroker.config.broker import (
    BrokerConfig,
    load_config,
)
from pykbroker.config.definitions import (
    BROKER_CONFIG_DEFS,
    TOPIC_CONFIG_SYNONYMS,
    broker_config_synonyms,
)
from pykbroker.config.dynamic import (
    BROKER_DYNAMIC_NOT_APPLIED,
    CLIENT_MATCH_PARAMS,
    CLIENT_METRICS_CONFIG_DEFS,
    GROUP_CONFIG_DEFS,
    GROUP_CONFIG_SYNONYMS,
    OP_APPEND,
    OP_DELETE,
    OP_SET,
    OP_SUBTRACT,
    apply_incremental_ops,
    effective_group_config,
    validate_client_metrics_configs,
    validate_dynamic_broker_configs,
    validate_group_configs,
)
from pykbroker.config.parsing import (
    ENV_PREFIX,
    INT_MAX,
    LISTENER_CONFIGS,
    LISTENER_PREFIX,
    LISTENER_RE,
    LOCAL_ENDPOINTS,
    LONG_MAX,
    SECURITY_PROTOCOLS,
    SSL_CONFIGS,
    ZK_DEFAULT_PORT,
    ConfigDef,
    ConfigError,
    ConfigRequestError,
    Listener,
    at_least,
    env_to_key,
    one_of,
    parse_ip_overrides,
    parse_listener,
    parse_local_endpoints,
    parse_metrics_listener,
    parse_protocol_map,
    parse_zk_connect,
    settings_from_env,
)
from pykbroker.config.topic import (
    KAFKA_TOPIC_CONFIGS_NOT_IMPLEMENTED,
    TOPIC_CONFIG_DEFS,
    effective_topic_config,
    log_config_for,
    topic_config_default,
    validate_topic_configs,
)
from pykbroker.properties import parse_properties

__all__ = [
    "BROKER_CONFIG_DEFS",
    "BROKER_DYNAMIC_NOT_APPLIED",
    "CLIENT_MATCH_PARAMS",
    "CLIENT_METRICS_CONFIG_DEFS",
    "ENV_PREFIX",
    "GROUP_CONFIG_DEFS",
    "GROUP_CONFIG_SYNONYMS",
    "INT_MAX",
    "KAFKA_TOPIC_CONFIGS_NOT_IMPLEMENTED",
    "LISTENER_CONFIGS",
    "LISTENER_PREFIX",
    "LISTENER_RE",
    "LOCAL_ENDPOINTS",
    "LONG_MAX",
    "OP_APPEND",
    "OP_DELETE",
    "OP_SET",
    "OP_SUBTRACT",
    "SECURITY_PROTOCOLS",
    "SSL_CONFIGS",
    "TOPIC_CONFIG_DEFS",
    "TOPIC_CONFIG_SYNONYMS",
    "ZK_DEFAULT_PORT",
    "BrokerConfig",
    "ConfigDef",
    "ConfigError",
    "ConfigRequestError",
    "Listener",
    "apply_incremental_ops",
    "at_least",
    "broker_config_synonyms",
    "effective_group_config",
    "effective_topic_config",
    "env_to_key",
    "load_config",
    "log_config_for",
    "one_of",
    "parse_ip_overrides",
    "parse_listener",
    "parse_local_endpoints",
    "parse_metrics_listener",
    "parse_properties",
    "parse_protocol_map",
    "parse_zk_connect",
    "settings_from_env",
    "topic_config_default",
    "validate_client_metrics_configs",
    "validate_dynamic_broker_configs",
    "validate_group_configs",
    "validate_topic_configs",
]
