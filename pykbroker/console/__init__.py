"""The web console for operators (pykbroker.console.listener): pages over the cluster, read through Kafka's Admin
API as a client of this broker, served by uvicorn inside the broker's event loop. See docs/console.md."""
