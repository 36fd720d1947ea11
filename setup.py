"""Build hook for the optional C extension; everything else is in pyproject.toml.

``pykbroker._native.recordwalk`` walks record batches at native speed on the produce path, and
``pykbroker._native.syncer`` runs the fsyncs of ``log.flush.on.ack`` in native threads that never
take the GIL.  Both are optional: without a C compiler the install still succeeds and the broker
uses the identical pure-Python walk (and logs a warning at start) and Python flusher threads.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "pykbroker._native.recordwalk",
            sources=["pykbroker/_native/recordwalk.c"],
            optional=True,
        ),
        Extension(
            "pykbroker._native.syncer",
            sources=["pykbroker/_native/syncer.c"],
            optional=True,
        ),
    ]
)
