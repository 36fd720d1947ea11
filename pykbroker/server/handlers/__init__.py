"""API handlers: one module per area, each handler turns a decoded request into a response dict."""
