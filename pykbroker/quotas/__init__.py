"""Client quota enforcement (KIP-13, KIP-55, KIP-124, KIP-219): sans-I/O accounting and policy.

``entities`` resolves which stored quota applies to a client, ``stats`` is Kafka's sampled rate,
``manager`` keeps the measurements and computes throttle times, ``enforcement`` says what each
request is charged.  The dispatcher calls ``enforcement.charge`` and the network edge mutes a
throttled connection (``Session.muted_until``).
"""

from pykbroker.quotas.enforcement import Throttle, Usage, charge, run_timed
from pykbroker.quotas.manager import QuotaManager, QuotaSnapshot

__all__ = ["QuotaManager", "QuotaSnapshot", "Throttle", "Usage", "charge", "run_timed"]
