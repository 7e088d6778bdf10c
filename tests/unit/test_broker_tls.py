"""A rediss:// URL's TLS settings reach Celery's broker_use_ssl, which Flower's Broker tab reads."""

from __future__ import annotations

import ssl

import pytest

from workers.app import celery_config
from workers.broker.broker_tls import broker_use_ssl
from workers.errors import InvalidSetting
from workers.settings import WorkerSettings

TLS_URL = "rediss://worker:pw@head:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/etc/draftgen/redis-ca.pem"


def test_a_tls_url_gives_its_ca_and_certificate_check_to_celery() -> None:
    config = celery_config(WorkerSettings(redis_url=TLS_URL))
    assert config["broker_use_ssl"] == {
        "ssl_ca_certs": "/etc/draftgen/redis-ca.pem",
        "ssl_cert_reqs": ssl.CERT_REQUIRED,
    }


def test_a_plain_url_asks_for_no_tls() -> None:
    assert broker_use_ssl("redis://127.0.0.1:6379/0") is None


def test_a_tls_url_without_a_check_named_still_checks_the_certificate() -> None:
    assert broker_use_ssl("rediss://head:6380/0") == {"ssl_cert_reqs": ssl.CERT_REQUIRED}


@pytest.mark.parametrize(("given", "meant"), [("none", ssl.CERT_NONE), ("CERT_OPTIONAL", ssl.CERT_OPTIONAL)])
def test_the_check_may_be_spelled_as_kombu_and_redis_py_accept(given: str, meant: ssl.VerifyMode) -> None:
    assert broker_use_ssl(f"rediss://head:6380/0?ssl_cert_reqs={given}") == {"ssl_cert_reqs": meant}


def test_an_unknown_check_is_refused_with_the_accepted_values() -> None:
    with pytest.raises(InvalidSetting, match="required, optional, none"):
        broker_use_ssl("rediss://head:6380/0?ssl_cert_reqs=sometimes")
