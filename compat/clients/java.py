"""The Java client, kafka-clients 3.9.0, through compat/java/CompatDriver.java in one JVM per worker."""

from __future__ import annotations

import shutil

from compat import env
from compat.clients import base
from compat.clients.rpc import RpcClient, RpcProcess


class JavaClient(RpcClient):
    name = "java"
    caps = base.COMPLETE

    def __init__(self, bootstrap: str, sasl: base.Sasl | None = None) -> None:
        super().__init__(bootstrap, sasl)
        cp = env.java_classpath()
        java = shutil.which("java") or "java"
        # A small heap and the client VM's quick start: the suite runs on two cores.
        self.rpc = RpcProcess([java, "-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                               "-Xshare:auto", "-cp", cp, "CompatDriver", bootstrap, *self.security_args()])
