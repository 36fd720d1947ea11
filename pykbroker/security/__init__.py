"""Security: who a connection is (TLS and SASL), and what it may do (ACLs).

Sans-I/O pieces (principal mapping, SASL mechanisms, ACL matching) live here; the network edge
(TLS handshakes) and the dispatcher (SASL gating, authorization) call into them.
"""
