"""Which credential a request to the upstream carries (upstream/client.py `credential`): the
configured `upstream.api_key`, else the userinfo of the upstream URL it goes to, else none
(the client's goes as it came)."""

from __future__ import annotations

import base64

from wsmode.config import UpstreamSettings
from wsmode.upstream.client import UpstreamClient, split_credentials


def basic(pair: str) -> str:
    return "Basic " + base64.b64encode(pair.encode()).decode()


def test_userinfo_is_taken_out_of_the_url_and_becomes_a_basic_credential() -> None:
    assert split_credentials("http://u:p@h:1/v1") == ("http://h:1/v1", basic("u:p"))
    assert split_credentials("https://tok@h/v1") == ("https://h/v1", basic("tok:"))
    # percent-encoded characters are the credential's own
    assert split_credentials("http://a%3Ab:c%40d@h/v1")[1] == basic("a:b:c@d")
    assert split_credentials("http://h:1/v1") == ("http://h:1/v1", None)


def test_each_url_has_its_own_credential_and_api_key_wins() -> None:
    client = UpstreamClient("http://a:1@one:80/v1/", UpstreamSettings())
    assert client.base_url == "http://one:80/v1"
    assert client.register("http://b:2@two:80/v1") == "http://two:80/v1"
    assert client.register("http://three:80/v1") == "http://three:80/v1"
    assert client.credential("http://one:80/v1/responses") == basic("a:1")
    assert client.credential("http://two:80/v1/models?x=1") == basic("b:2")
    assert client.credential("http://two:80/tokenize") == basic("b:2")  # same server, root
    assert client.credential("http://three:80/v1/responses") is None
    keyed = UpstreamClient("http://a:1@one:80/v1", UpstreamSettings(api_key="k"))
    assert keyed.credential("http://one:80/v1/responses") == "Bearer k"


def test_the_credential_replaces_the_clients_whatever_its_case() -> None:
    client = UpstreamClient("http://a:1@one:80/v1", UpstreamSettings())
    headers = {"authorization": "Bearer client", "X-Other": "x"}
    client._outgoing_headers(headers, client.base_url)
    assert headers == {"X-Other": "x", "Authorization": basic("a:1")}
