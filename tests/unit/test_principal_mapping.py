"""ssl.principal.mapping.rules against the examples of Kafka's security.md."""

from __future__ import annotations

import pytest

from pykbroker.security.principal_mapping import MappingError, dn_from_ssl_subject, map_dn, parse_rules

KAFKA_DOC_RULES = ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
                   "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,"
                   "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L,"
                   "DEFAULT")


@pytest.mark.parametrize(("dn", "name"), [
    ("CN=serviceuser,OU=ServiceUsers,O=Unknown,L=Unknown,ST=Unknown,C=Unknown", "serviceuser"),
    ("CN=adminUser,OU=Admin,O=Unknown,L=Unknown,ST=Unknown,C=Unknown", "adminuser@admin"),
    ("CN=Alice.Smith,O=Acme", "alice.smith"),
    ("OU=NoCommonName,O=Acme", "OU=NoCommonName,O=Acme"),
])
def test_kafka_doc_examples(dn: str, name: str) -> None:
    assert map_dn(parse_rules(KAFKA_DOC_RULES), dn) == name


def test_default_and_empty_keep_the_dn() -> None:
    assert map_dn(parse_rules("DEFAULT"), "CN=a,O=b") == "CN=a,O=b"
    assert map_dn(parse_rules(""), "CN=a") == "CN=a"


def test_upper_case_and_newline_separated() -> None:
    rules = parse_rules("RULE:^CN=([^,]*).*$/$1/U\nDEFAULT")
    assert map_dn(rules, "CN=bob,O=x") == "BOB"


def test_no_rule_matches_is_an_error() -> None:
    with pytest.raises(MappingError):
        map_dn(parse_rules("RULE:^CN=x$/y/"), "CN=z")


@pytest.mark.parametrize("bad", ["RULE:^CN=(.*)", "NOTARULE", "RULE:([/x/"])
def test_bad_rules_refused(bad: str) -> None:
    with pytest.raises(MappingError):
        parse_rules(bad)


def test_dn_from_peercert_subject_is_rfc2253_order() -> None:
    subject = ((("countryName", "US"),), (("organizationName", "Acme, Inc"),), (("commonName", "alice"),))
    assert dn_from_ssl_subject(subject) == "CN=alice,O=Acme\\, Inc,C=US"
