"""The one remote fetcher (issue 31): a record's URL reaches public addresses only, at every hop,
against real HTTP servers on loopback addresses. To let a first hop count as public, a test
resolves a made-up name to 127.0.0.2 and treats that one address as public; every other loopback
address stays refused, so the hop that enters one is the hop that fails."""

from __future__ import annotations

import ipaddress

import pytest

from clef_cli.locations import remote_fetch
from clef_cli.locations.public_address import address_problem, domain_allowed, ipv4_spelling, spelling_problem
from clef_cli.locations.remote_fetch import MAX_REDIRECTS, FetchError, FetchPolicy, fetch, resolve

from .support.helpers import MEDIA, require
from .support.media_server import body, endless, media_server, redirect

IMAGE = (MEDIA / "image_a.png").read_bytes()
POLICY = FetchPolicy(max_bytes=1 << 20, timeout_seconds=10)
PRIVATE_OK = FetchPolicy(max_bytes=1 << 20, timeout_seconds=10, allow_private=True)
PUBLIC_NAME, PUBLIC_STAND_IN = "media.example", ipaddress.ip_address("127.0.0.2")


@pytest.mark.parametrize(
    ("host", "meaning"),
    [
        ("2130706433", "127.0.0.1"),  # decimal
        ("0177.0.0.1", "127.0.0.1"),  # octal
        ("0x7f.1", "127.0.0.1"),  # hex, two parts
        ("0x7f000001", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("0251.0376.0251.0376", "169.254.169.254"),
        ("10.0.0.1.", "10.0.0.1"),  # a trailing dot
        ("08.0.0.1", None),  # not octal: glibc refuses it, so must we
        ("256.0.0.1", None),
        ("a.0x10", None),  # ends in a number: never a name
    ],
)
def test_ipv4_spellings_other_than_dotted_decimal_are_refused(host, meaning):
    assert str(ipv4_spelling(host.rstrip("."))) == str(meaning)
    problem = spelling_problem(host)
    assert problem is not None and (meaning is None or meaning in problem)


@pytest.mark.parametrize("host", ["127.0.0.1", "8.8.8.8", "example.com", "1e3.example", "xn--bcher-kva.example"])
def test_names_and_dotted_decimal_addresses_are_spelled_fine(host):
    assert spelling_problem(host) is None


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),  # the cloud metadata endpoint
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "non-public"),  # carrier-grade NAT
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fe80::1", "link-local"),
        ("fc00::1", "private"),
        ("ff02::1", "multicast"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
        ("::ffff:169.254.169.254", "link-local"),
        ("::127.0.0.1", "reserved"),  # IPv4-compatible (deprecated)
        ("2002:7f00:1::", "loopback"),  # 6to4
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64
        ("8.8.8.8", None),
        ("2606:4700::1111", None),
        ("::ffff:8.8.8.8", None),
        ("64:ff9b::808:808", None),  # NAT64 of a public address: DNS64 networks need it
        ("64:ff9b:1::7f00:1", "loopback"),  # the local-use NAT64 prefix (RFC 8215)
        ("64:ff9b:1::a9fe:a9fe", "link-local"),
        ("64:ff9b:1::808:808", None),
    ],
)
def test_address_classes(address, problem):
    assert address_problem(ipaddress.ip_address(address)) == problem


def test_allowed_domains_are_exact_unless_starred():
    allowed = ("media.example", "*.cdn.example")
    assert domain_allowed("media.example", allowed) and domain_allowed("MEDIA.example.", allowed)
    assert not domain_allowed("evil.media.example", allowed)
    assert domain_allowed("a.cdn.example", allowed) and domain_allowed("a.b.cdn.example", allowed)
    assert not domain_allowed("cdn.example", allowed) and not domain_allowed("xcdn.example", allowed)
    assert domain_allowed("anything.example", ())


def no_lookup(host, port):
    raise AssertionError(f"{host} must be refused before any lookup")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://2130706433/a.png", "non-standard spelling of the IPv4 address 127.0.0.1"),
        ("http://0177.0.0.1/a.png", "non-standard spelling of the IPv4 address 127.0.0.1"),
        ("http://0x7f.1/a.png", "non-standard spelling of the IPv4 address 127.0.0.1"),
        ("http://169.254.169.254/latest/meta-data/", "resolves to a link-local address 169.254.169.254"),
        ("http://[::ffff:127.0.0.1]/a.png", "loopback address ::ffff:7f00:1 (IPv4 127.0.0.1 inside)"),
        ("http://[64:ff9b::a9fe:a9fe]/", "link-local address 64:ff9b::a9fe:a9fe (IPv4 169.254.169.254 inside)"),
        ("http://[::1]:8080/a.png", "resolves to a loopback address ::1"),
        ("http://\uff11\uff12\uff17.0.0.1/a.png", "resolves to a loopback address 127.0.0.1"),  # full-width digits
        ("http://a..b/a.png", "not a usable host name"),
        ("ftp://example.com/a.png", "only http and https"),
        ("http://user:secret@example.com/a.png", "user name or password"),
    ],
)
def test_refused_before_any_lookup_or_connection(url, reason):
    with pytest.raises(FetchError) as refused:
        fetch(url, POLICY, resolver=no_lookup)
    assert reason in str(refused.value) and not refused.value.transient


def test_a_direct_loopback_url_is_refused_by_default_and_fetched_with_the_opt_out():
    with media_server(routes={"/a.png": body(IMAGE, "image/png")}) as server:
        with pytest.raises(FetchError) as refused:
            fetch(server.url("/a.png"), POLICY)
        assert "resolves to a loopback address 127.0.0.1" in str(refused.value)
        assert "--allow-private-media-hosts" in str(refused.value) and not refused.value.transient
        with pytest.raises(FetchError, match="resolves to a loopback address"):
            fetch(server.url("/a.png", host="localhost"), POLICY)  # a name that resolves there: the same
        assert server.requests == []
        assert fetch(server.url("/a.png"), PRIVATE_OK) == IMAGE
        assert server.requests == ["/a.png"]


@pytest.fixture
def public_stand_in(monkeypatch):
    """`media.example` resolves to 127.0.0.2, and that one address counts as public."""
    real_problem = remote_fetch.address_problem
    monkeypatch.setattr(
        remote_fetch, "address_problem", lambda address: None if address == PUBLIC_STAND_IN else real_problem(address)
    )
    lookups: list[str] = []

    def resolver(host, port):
        lookups.append(host)
        return [PUBLIC_STAND_IN] if host in (PUBLIC_NAME, "other.example") else resolve(host, port)

    return resolver, lookups


def test_a_redirect_into_a_private_address_is_refused_at_the_hop_that_enters_it(public_stand_in):
    resolver, lookups = public_stand_in
    with media_server("127.0.0.1", {"/secret": body(b"internal")}) as inside:
        routes = {
            "/hop1": redirect("/hop2"),
            "/hop2": redirect(inside.url("/secret")),
            "/to-metadata": redirect("http://169.254.169.254/latest/meta-data/"),
            "/to-localhost": redirect(inside.url("/secret", host="localhost")),
        }
        with media_server(str(PUBLIC_STAND_IN), routes) as outside:
            with pytest.raises(FetchError) as refused:
                fetch(outside.url("/hop1", host=PUBLIC_NAME), POLICY, resolver)
            assert str(refused.value) == (
                f"{inside.url('/secret')}: host 127.0.0.1 resolves to a loopback address 127.0.0.1; "
                f"{remote_fetch.PRIVATE_HINT}"
            )
            assert not refused.value.transient
            with pytest.raises(FetchError, match=r"169\.254\.169\.254 resolves to a link-local address"):
                fetch(outside.url("/to-metadata", host=PUBLIC_NAME), POLICY, resolver)
            with pytest.raises(FetchError, match="host localhost resolves to a loopback address"):
                fetch(outside.url("/to-localhost", host=PUBLIC_NAME), POLICY, resolver)
            assert outside.requests == ["/hop1", "/hop2", "/to-metadata", "/to-localhost"]
        assert inside.requests == []  # never reached
    assert lookups == [PUBLIC_NAME, PUBLIC_NAME, PUBLIC_NAME, PUBLIC_NAME, "localhost"]  # one lookup per hop


def test_the_checked_address_is_the_one_connected_to(public_stand_in):
    """DNS rebinding: a second answer (here loopback) is never asked for, so never used."""
    _, lookups = public_stand_in
    answers = iter([[PUBLIC_STAND_IN], [ipaddress.ip_address("127.0.0.1")]])

    def rebinding(host, port):
        lookups.append(host)
        return next(answers)

    with media_server(str(PUBLIC_STAND_IN), {"/a.png": body(IMAGE)}) as server:
        assert fetch(server.url("/a.png", host=PUBLIC_NAME), POLICY, rebinding) == IMAGE
        assert server.requests == ["/a.png"]
    assert lookups == [PUBLIC_NAME]


def test_allowed_domains_hold_at_every_hop(public_stand_in):
    resolver, _ = public_stand_in
    policy = FetchPolicy(max_bytes=1 << 20, allowed_domains=(PUBLIC_NAME,))
    with media_server(str(PUBLIC_STAND_IN)) as server:
        server.routes.update({"/a.png": body(IMAGE), "/away": redirect(server.url("/a.png", host="other.example"))})
        assert fetch(server.url("/a.png", host=PUBLIC_NAME), policy, resolver) == IMAGE
        with pytest.raises(FetchError, match=r"host other\.example is not in --allowed-media-domains"):
            fetch(server.url("/away", host=PUBLIC_NAME), policy, resolver)
        with pytest.raises(FetchError, match="not in --allowed-media-domains"):
            fetch(server.url("/a.png", host="other.example"), policy, resolver)
        assert server.requests == ["/a.png", "/away"]


def test_a_redirect_loop_and_a_long_chain_are_refused():
    with media_server() as server:
        server.routes.update({"/loop": redirect("/loop2"), "/loop2": redirect(server.url("/loop"), 301)})
        for number in range(1, MAX_REDIRECTS + 2):
            server.routes[f"/chain{number}"] = redirect(f"/chain{number - 1}", 307)
        server.routes["/chain0"] = body(IMAGE)
        with pytest.raises(FetchError, match=r"a redirect loop: .*/loop2 leads back to .*/loop$") as loop:
            fetch(server.url("/loop"), PRIVATE_OK)
        assert not loop.value.transient and server.requests == ["/loop", "/loop2"]
        server.requests.clear()
        assert fetch(server.url(f"/chain{MAX_REDIRECTS}"), PRIVATE_OK) == IMAGE  # five redirects: fine
        server.requests.clear()
        with pytest.raises(FetchError, match=f"more than {MAX_REDIRECTS} redirects"):
            fetch(server.url(f"/chain{MAX_REDIRECTS + 1}"), PRIVATE_OK)
        assert len(server.requests) == MAX_REDIRECTS + 1


def test_a_huge_body_is_cut_at_the_byte_limit():
    limit = 256 * 1024
    policy = FetchPolicy(max_bytes=limit, allow_private=True)
    routes = {"/huge": endless(64 << 20), "/declared": endless(64 << 20, declare_length=True), "/fits": body(IMAGE)}
    with media_server(routes=routes) as server:
        with pytest.raises(FetchError) as cut:
            fetch(server.url("/huge"), policy)
        assert str(cut.value) == f"{server.url('/huge')} is over the limit of {limit} bytes"
        assert not cut.value.transient
        with pytest.raises(FetchError, match=f"is {64 << 20} bytes, over the limit of {limit}"):
            fetch(server.url("/declared"), policy)
        assert fetch(server.url("/fits"), FetchPolicy(max_bytes=len(IMAGE), allow_private=True)) == IMAGE
        with pytest.raises(FetchError, match="over the limit"):
            fetch(server.url("/fits"), FetchPolicy(max_bytes=len(IMAGE) - 1, allow_private=True))


def test_network_failures_are_transient_and_say_so():
    with media_server() as server:
        missing, closed = server.url("/missing"), server.url("/a.png")
        with pytest.raises(FetchError, match="HTTP 404") as not_found:
            fetch(missing, PRIVATE_OK)
    assert not_found.value.transient
    with pytest.raises(FetchError, match="cannot fetch") as refused:
        fetch(closed, PRIVATE_OK)  # the server is gone: connection refused
    assert refused.value.transient


def test_a_path_with_spaces_or_non_ascii_is_percent_encoded():
    with media_server(routes={"/a%20b/%C3%A9t%C3%A9.png?x=1": body(IMAGE)}) as server:
        assert fetch(server.url("/a b/été.png?x=1"), PRIVATE_OK) == IMAGE


def self_signed(name: str, folder):
    """A certificate for `name` (and its key), signed by itself: the test's only trusted CA."""
    import datetime

    x509 = require("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def test_https_verifies_the_certificate_against_the_urls_host_not_the_address(public_stand_in, tmp_path, monkeypatch):
    import ssl

    resolver, _ = public_stand_in
    cert, key = self_signed(PUBLIC_NAME, tmp_path)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    names: list[str | None] = []
    server_tls.sni_callback = lambda sock, name, context: names.append(name)
    with media_server(str(PUBLIC_STAND_IN), {"/a.png": body(IMAGE)}, tls=server_tls) as server:
        with pytest.raises(FetchError) as untrusted:  # the system CAs: unknown (OpenSSL's words vary)
            fetch(server.url("/a.png", host=PUBLIC_NAME), POLICY, resolver)
        assert untrusted.value.transient
        monkeypatch.setattr(remote_fetch, "_tls_context", lambda: ssl.create_default_context(cafile=str(cert)))
        assert fetch(server.url("/a.png", host=PUBLIC_NAME), POLICY, resolver) == IMAGE
        with pytest.raises(FetchError):  # same address and CA, another name: refused before any request
            fetch(server.url("/a.png", host="other.example"), POLICY, resolver)
        assert server.requests == ["/a.png"]
    assert names == [PUBLIC_NAME, PUBLIC_NAME, "other.example"]  # SNI: the URL's host, never the address


ELSEWHERE = ipaddress.ip_address("93.184.216.34")  # a public address no test ever connects to


def test_every_resolved_address_is_checked_not_only_the_first():
    """A name resolving to a public and a loopback address is refused (and not as transient): the
    fetcher may connect to any address the name gave, so one bad one refuses the hop."""
    for answer in ([ELSEWHERE, ipaddress.ip_address("127.0.0.1")], [ELSEWHERE, ipaddress.ip_address("10.0.0.7")]):
        with pytest.raises(FetchError) as refused:
            remote_fetch.checked_hop(f"http://{PUBLIC_NAME}/a.png", POLICY, lambda host, port, answer=answer: answer)
        assert f"host {PUBLIC_NAME} resolves to a" in str(refused.value) and str(answer[1]) in str(refused.value)
        assert not refused.value.transient


def test_a_dead_public_address_then_loopback_never_reaches_the_inside_server(monkeypatch):
    """End to end: the first address takes no connection, the second is 127.0.0.1, where a
    server listens. Checking only the first address would fall through to the inside server.
    Connections go nowhere but 127.0.0.1 (any other address is refused here, as a dead host)."""
    real_connect, attempts = remote_fetch.socket.create_connection, []

    def loopback_only(address, *args, **kwargs):
        attempts.append(address[0])
        if address[0] != "127.0.0.1":
            raise ConnectionRefusedError(f"nothing listens on {address[0]} (test)")
        return real_connect(address, *args, **kwargs)

    monkeypatch.setattr(remote_fetch.socket, "create_connection", loopback_only)
    with media_server("127.0.0.1", {"/secret": body(b"internal")}) as inside:
        resolver = lambda host, port: [ELSEWHERE, ipaddress.ip_address("127.0.0.1")]  # noqa: E731
        with pytest.raises(FetchError, match=r"resolves to a loopback address 127\.0\.0\.1") as refused:
            fetch(inside.url("/secret", host=PUBLIC_NAME), POLICY, resolver)
        assert not refused.value.transient
        assert inside.requests == [] and attempts == []  # refused before any connection
