"""Client quota enforcement (KIP-13, KIP-55, KIP-124, KIP-219, KIP-599): sans-I/O accounting and policy.

``entities`` resolves which stored quota applies to a client, ``stats`` is Kafka's sampled rate and
token bucket, ``manager`` keeps the measurements and computes throttle times, ``enforcement`` says
what each request is charged, ``mutation`` is the controller mutation quota the admin handlers
charge partition creations and deletions to.  The dispatcher calls ``enforcement.charge`` and the
network edge mutes a throttled connection (``Session.muted_until``).
"""

from pykbroker.quotas.enforcement import Throttle, Usage, charge, run_timed
from pykbroker.quotas.manager import QuotaManager, QuotaSnapshot
from pykbroker.quotas.mutation import STRICT_SINCE, MutationQuota, ThrottlingQuotaExceeded

__all__ = ["STRICT_SINCE", "MutationQuota", "QuotaManager", "QuotaSnapshot", "Throttle", "ThrottlingQuotaExceeded",
           "Usage", "charge", "run_timed"]
