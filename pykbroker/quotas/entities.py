"""Which stored quota applies to a (user, client-id) pair, and which clients share it.

Kafka looks quotas up in a fixed order of precedence (docs/design "Quotas", ``DefaultQuotaCallback``),
most specific first:

1. /config/users/<user>/clients/<client-id>
2. /config/users/<user>/clients/<default>
3. /config/users/<user>
4. /config/users/<default>/clients/<client-id>
5. /config/users/<default>/clients/<default>
6. /config/users/<default>
7. /config/clients/<client-id>
8. /config/clients/<default>

The level that matches also says who shares one measurement ("metric tags"): a quota on a user alone
(levels 3 and 6) is shared by all of that user's client ids; a quota on client ids alone (7 and 8) by
every user of that client id; the others are per (user, client id).  A default entity gives each
user or client id its own measurement with the default's value, never one shared by all of them.
"""

from __future__ import annotations

from collections.abc import Mapping

from pykbroker.metadata.store import QuotaEntity

USER = "user"
CLIENT_ID = "client-id"

# (user, client id) a measurement is kept under; "" stands for "any".
MetricTags = tuple[str, str]

# Quota keys (KIP-546 names) and the quota type Kafka reports them as.
PRODUCE = "producer_byte_rate"
FETCH = "consumer_byte_rate"
REQUEST = "request_percentage"
CONTROLLER_MUTATION = "controller_mutation_rate"


def precedence(user: str, client_id: str) -> list[tuple[QuotaEntity, MetricTags]]:
    """The eight entities Kafka tries for this client, in order, with the tags each match implies.

    Entity keys are sorted by type ("client-id" before "user"), as the metadata store keys them."""
    both = (user, client_id)
    return [
        (((CLIENT_ID, client_id), (USER, user)), both),
        (((CLIENT_ID, None), (USER, user)), both),
        (((USER, user),), (user, "")),
        (((CLIENT_ID, client_id), (USER, None)), both),
        (((CLIENT_ID, None), (USER, None)), both),
        (((USER, None),), (user, "")),
        (((CLIENT_ID, client_id),), ("", client_id)),
        (((CLIENT_ID, None),), ("", client_id)),
    ]


def resolve(quotas: Mapping[QuotaEntity, Mapping[str, float]], key: str, user: str, client_id: str
            ) -> tuple[MetricTags, float] | None:
    """The quota ``key`` that applies to (user, client id) and the tags of its measurement; None when no
    stored entity sets that key for this client (it is not limited)."""
    for entity, tags in precedence(user, client_id):
        values = quotas.get(entity)
        if values is not None:
            bound = values.get(key)
            if bound is not None:
                return tags, bound
    return None


def describe_tags(tags: MetricTags) -> str:
    """How logs and metrics name a measurement: user=..,client-id=.. (empty parts left out)."""
    user, client_id = tags
    parts = ([f"user={user}"] if user else []) + ([f"client-id={client_id}"] if client_id else [])
    return ",".join(parts) or "all clients"
