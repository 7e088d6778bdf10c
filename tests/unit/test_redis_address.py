"""One URL says where Redis is, a server's or its Sentinels' (workers/state/redis_address.py), and the
broker reads the Sentinels' addresses the way kombu's Sentinel transport does."""

from __future__ import annotations

import ssl

import pytest
import redis
from redis.sentinel import MasterNotFoundError

from producer.status.model import RedisPlace
from producer.status.redis_place import redis_place
from producer.status.view import redis_place_line
from workers.broker.broker import BrokerOptions, broker_config
from workers.errors import InvalidSetting
from workers.settings import WorkerSettings, has_password, redacted_url
from workers.state.redis_address import BadRedisAddress, SentinelAddress, is_sentinel_url, sentinel_address
from workers.state.redis_client import SENTINEL_TIMEOUT_S, client_for, no_primary_reason
from workers.state.sentinel_connection import PrimarySSLConnection


def broker_options(url: str) -> BrokerOptions:
    return BrokerOptions(redis_url=url, visibility_timeout_s=60, unacked_restore_interval_s=5)


URL = "sentinel://gpu-node:s3cret@10.0.0.1:26379/2?master_name=draftgen;sentinel://10.0.0.2;sentinel://10.0.0.3:26380"


def test_a_sentinel_url_names_every_sentinel_the_primary_the_db_and_the_login() -> None:
    assert is_sentinel_url(URL) and not is_sentinel_url("redis://127.0.0.1:6379/0")
    assert sentinel_address(URL) == SentinelAddress(
        sentinels=(("10.0.0.1", 26379), ("10.0.0.2", 26379), ("10.0.0.3", 26380)),
        master_name="draftgen",
        db=2,
        username="gpu-node",
        password="s3cret",
    )


def test_the_primary_name_and_db_may_come_on_any_address() -> None:
    address = sentinel_address("sentinel://10.0.0.1;sentinel://10.0.0.2/1?master_name=m")
    assert (address.master_name, address.db, address.password) == ("m", 1, None)


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("sentinel://10.0.0.1:26379", "names no primary: add ?master_name=NAME"),
        ("sentinel://a?master_name=x;sentinel://b?master_name=y", "names more than one primary"),
        ("sentinel://a?master_name=x;redis://b", "address 2 of the Sentinel URL is not sentinel://host:port"),
        ("sentinel://a:notaport?master_name=x", "address 1 of the Sentinel URL has a bad port"),
        ("sentinel://a/zero?master_name=x", "names db 'zero', not a number"),
        ("sentinel://u:p@a?master_name=m&sentinel_auth=maybe", "sentinel_auth must be true or false"),
        ("sentinel://a?master_name=m&sentinel_auth=true", "sentinel_auth=true but gives no login"),
    ],
)
def test_a_sentinel_url_that_does_not_say_enough_is_refused_naming_what(url: str, complaint: str) -> None:
    with pytest.raises(BadRedisAddress, match=complaint.replace("?", r"\?")):
        sentinel_address(url)


def test_kombu_gets_the_sentinels_with_the_login_and_db_on_the_first_and_the_primary_as_an_option() -> None:
    config = broker_config(broker_options(URL))
    assert config["broker_url"] == (
        "sentinel://gpu-node:s3cret@10.0.0.1:26379/2;sentinel://10.0.0.2:26379;sentinel://10.0.0.3:26380"
    )
    assert config["broker_transport_options"]["master_name"] == "draftgen"


def test_a_sentinel_urls_password_is_told_and_never_shown() -> None:
    assert has_password(URL)
    shown = redacted_url(URL)
    assert "s3cret" not in shown and "gpu-node" not in shown
    assert "master_name=draftgen" in shown
    assert "sentinel_auth=true" in redacted_url(
        URL.replace("master_name=", "sentinel_auth=true&master_name=")
    )


def test_status_says_where_the_sentinels_primary_is_and_how_often_it_failed_over() -> None:
    place = RedisPlace(
        master_name="draftgen", primary="10.0.0.2:6379", sentinels=3, answering=2, failovers=1, replicas=1
    )
    assert redis_place_line(place) == (
        "Redis: primary draftgen at 10.0.0.2:6379, as 2 of 3 Sentinels say; 1 failover since they began "
        "watching; 1 replica"
    )
    assert redis_place("redis://127.0.0.1:6379/0") is None  # one server: nothing to say


def test_a_clients_primary_connections_keep_the_callers_timeouts_and_only_the_sentinels_get_theirs() -> None:
    # A blocking read on the primary (a seat's subscription) must not time out after the Sentinels' 2 s.
    client = client_for(URL, socket_connect_timeout=5.0)
    pool = client.connection_pool
    assert (
        pool.connection_kwargs.get("socket_timeout"),
        pool.connection_kwargs["socket_connect_timeout"],
    ) == (
        None,
        5.0,
    )
    sentinel_pool = pool.sentinel_manager.sentinels[0].connection_pool
    assert sentinel_pool.connection_kwargs["socket_timeout"] == SENTINEL_TIMEOUT_S


def test_a_worker_refuses_a_sentinel_url_without_a_primary_at_start_naming_the_variable() -> None:
    with pytest.raises(InvalidSetting, match="DRAFTGEN_REDIS_URL: the Sentinel URL names no primary"):
        WorkerSettings.from_env({"DRAFTGEN_REDIS_URL": "sentinel://10.0.0.1:26379"})


def test_no_primary_found_is_said_in_one_line_without_redis_pys_client_reprs() -> None:
    unreachable = MasterNotFoundError("No master found for 'm' : <redis.client.Redis(<...>)> - network:Error")
    unknown = MasterNotFoundError("No master found for 'm'")
    assert no_primary_reason(unreachable) == "No master found for 'm': no Sentinel of the URL answered"
    assert no_primary_reason(unknown) == (
        "No master found for 'm': its Sentinels know no primary by that name that is up"
    )
    assert no_primary_reason(redis.ConnectionError("refused")) is None


TLS_URL = (
    "sentinel://w:pw@10.0.0.1:26379/0?master_name=draftgen&ssl_ca_certs=/etc/draftgen/redis-ca.pem"
    ";sentinel://10.0.0.2:26379"
)


def test_a_sentinel_url_with_tls_options_is_tls_to_the_sentinels_and_to_the_primary() -> None:
    address = sentinel_address(TLS_URL)
    tls = {"ssl": True, "ssl_ca_certs": "/etc/draftgen/redis-ca.pem", "ssl_cert_reqs": ssl.CERT_REQUIRED}
    assert address.ssl_kwargs() == tls
    # the state client: the Sentinels and the primary's connections both over TLS, the certificate checked
    client = client_for(TLS_URL)
    pool = client.connection_pool
    assert pool.connection_kwargs["ssl_ca_certs"] == "/etc/draftgen/redis-ca.pem"
    assert pool.connection_class is PrimarySSLConnection  # asks the Sentinels on every connect
    sentinel_client = pool.sentinel_manager.sentinels[0]
    assert sentinel_client.connection_pool.connection_class is redis.SSLConnection
    # the broker (and Flower, which reads the same settings): TLS to the primary and to the Sentinels
    config = broker_config(
        BrokerOptions(redis_url=TLS_URL, visibility_timeout_s=60, unacked_restore_interval_s=5)
    )
    assert config["broker_use_ssl"] == address.tls_options()
    assert config["broker_transport_options"]["sentinel_kwargs"]["ssl"] is True
    assert "ssl_ca_certs" not in config["broker_url"]  # kombu reads TLS from broker_use_ssl only


def test_a_sentinel_url_without_tls_options_stays_plain_tcp() -> None:
    assert sentinel_address(URL).ssl_kwargs() == {}
    config = broker_config(broker_options(URL))
    assert config["broker_use_ssl"] is None


@pytest.mark.parametrize(
    ("query", "complaint"),
    [
        ("ssl_cert_reqs=sometimes", "ssl_cert_reqs='sometimes' in the Redis URL: use one of required"),
        ("ssl_ca_certs=/a;sentinel://b?ssl_ca_certs=/b", "gives ssl_ca_certs twice, differently"),
    ],
)
def test_a_sentinel_url_with_bad_tls_options_is_refused_naming_them(query: str, complaint: str) -> None:
    with pytest.raises(BadRedisAddress, match=complaint):
        sentinel_address(f"sentinel://a?master_name=m&{query}")


def test_with_sentinel_auth_the_sentinels_are_asked_with_the_url_s_login_and_without_it_with_none() -> None:
    with_login = sentinel_address(URL + "?sentinel_auth=true")
    assert with_login.sentinel_login() == {"username": "gpu-node", "password": "s3cret"}
    kwargs = broker_config(broker_options(URL + "?sentinel_auth=true"))["broker_transport_options"]
    assert kwargs["sentinel_kwargs"]["password"] == "s3cret"  # kombu's and Flower's Sentinel clients
    pool = client_for(URL + "?sentinel_auth=true").connection_pool
    sentinel_kwargs = pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
    assert (sentinel_kwargs["username"], sentinel_kwargs["password"]) == ("gpu-node", "s3cret")
    assert sentinel_address(URL).sentinel_login() == {}
    assert "password" not in broker_config(broker_options(URL))["broker_transport_options"]["sentinel_kwargs"]
