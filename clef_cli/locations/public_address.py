"""Which hosts a remote media fetch may reach: public addresses only, hosts spelled one way only.

A record's URL must not reach what the operator's machine can (loopback services, the LAN, a
cloud's metadata endpoint at 169.254.169.254). The check is on the addresses a host resolves to,
and the fetcher connects to a checked address, so a second DNS answer cannot differ from the
first (DNS rebinding). IPv6 forms that carry an IPv4 address (mapped, 6to4, NAT64) are judged by
that address. A host that ends in a number is an IPv4 address in some parsers and a name in
others (`2130706433`, `0177.0.0.1`, `0x7f.1` are all 127.0.0.1 to glibc): only the dotted-quad
decimal spelling is accepted.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

NAT64_PREFIXES = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
"""The well-known NAT64 prefix (RFC 6052) and the local-use one (RFC 8215): the last 32 bits are
the IPv4 address a DNS64 resolver translated."""

_NUMBER = re.compile(r"(0[xX][0-9a-fA-F]*|[0-9]+)")
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")


def _number(part: str) -> int | None:
    """One part of an inet_aton spelling: 0x hex, 0-led octal, or decimal; None if invalid."""
    if not _NUMBER.fullmatch(part):
        return None
    if part[:2].lower() == "0x":
        return int(part[2:] or "0", 16)
    if len(part) > 1 and part[0] == "0":
        return int(part, 8) if set(part) <= set("01234567") else None
    return int(part)


def ipv4_spelling(host: str) -> ipaddress.IPv4Address | None:
    """The address inet_aton reads in `host` (`127.1`, `0x7f000001`, `017700000001`), or None.
    The last part fills the bytes the others leave."""
    parts = host.split(".")
    numbers = [_number(part) for part in parts]
    if not 1 <= len(parts) <= 4 or any(number is None for number in numbers):
        return None
    *leading, last = numbers
    if any(number > 255 for number in leading) or last >= 256 ** (5 - len(parts)):  # type: ignore[operator]
        return None
    value = last
    for position, number in enumerate(leading):
        value += number << (8 * (3 - position))  # type: ignore[operator]
    return ipaddress.IPv4Address(value)


def ends_in_number(host: str) -> bool:
    """The WHATWG URL rule: such a host is an IPv4 address, never a name."""
    last = host.rstrip(".").rpartition(".")[2]
    return bool(last) and _NUMBER.fullmatch(last) is not None


def spelling_problem(host: str) -> str | None:
    """Why `host` is refused as written (an ambiguous IPv4 spelling), or None."""
    if ":" in host or not ends_in_number(host):  # an IPv6 literal may end in a dotted quad
        return None
    try:
        if str(ipaddress.IPv4Address(host)) == host:
            return None
    except ValueError:
        pass
    parsed = ipv4_spelling(host.rstrip("."))
    if parsed is None:
        return f"host {host!r} is neither a name nor a valid IPv4 address"
    return f"host {host!r} is a non-standard spelling of the IPv4 address {parsed}"


def literal_address(host: str) -> IPAddress | None:
    """The address a URL's host names literally (dotted-quad IPv4 or bracketed IPv6), or None."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for: mapped (::ffff:a.b.c.d), 6to4 (2002::/16), NAT64."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in prefix for prefix in NAT64_PREFIXES):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_problem(address: IPAddress) -> str | None:
    """What makes `address` non-public ('loopback', 'private', 'link-local', ...), or None when
    a record may reach it. An IPv6 address carrying an IPv4 one is judged by that one."""
    if isinstance(address, ipaddress.IPv6Address):
        address = ipaddress.IPv6Address(address.packed)  # drop a %zone
        inner = embedded_ipv4(address)
        if inner is not None:
            return address_problem(inner)
    checks = (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
        ("non-public", not address.is_global),
    )
    return next((name for name, found in checks if found), None)


def normal_host(host: str) -> str:
    """A host as compared against --allowed-media-domains: lower case, no trailing dot, IDNA."""
    host = host.rstrip(".").lower()
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return host


def domain_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    """`host` is one of `allowed` (exact), or a subdomain of a `*.example.com` entry."""
    if not allowed:
        return True
    host = normal_host(host)
    for entry in allowed:
        if entry.startswith("*."):
            if host.endswith("." + normal_host(entry[2:])):
                return True
        elif host == normal_host(entry):
            return True
    return False


def described(address: IPAddress) -> str:
    """`address` as a refusal names it (with the IPv4 address it carries, if any)."""
    inner = embedded_ipv4(address)
    return str(address) if inner is None else f"{address} (IPv4 {inner} inside)"


def _suggested_host(entry: str) -> str:
    """The host name inside a URL-like allow-list entry (`http://a.example:8080/x` -> a.example),
    to name the fix; `example.com` when none can be read."""
    try:
        host = urlsplit(entry if "//" in entry else f"//{entry}").hostname
    except ValueError:
        host = None
    return host or "example.com"


def _url_part_problem(entry: str) -> str | None:
    """Why `entry` is a URL or host:port rather than a host name, or None."""
    only = f"give host names only, like {_suggested_host(entry)}"
    if "://" in entry:
        return f"has a scheme; {only}"
    if "@" in entry:
        return f"has a user name; {only}"
    if any(mark in entry for mark in "/?#"):
        return f"has a path; {only}"
    if entry.startswith("[") or entry.endswith("]"):
        return "has brackets; give an IPv6 address bare, like 2001:db8::1"
    if ":" in entry and literal_address(entry) is None:
        return f"has a port; {only} (the list names hosts, on any port)"
    return None


def allow_list_problem(entry: object) -> str | None:
    """Why `entry` cannot stand in --allowed-media-domains, or None. The list must fail closed:
    an entry that is empty, spelled as a URL or host:port, or no host name at all would match no
    host (every record refused) or, dropped, lift the list; so it is refused before any fetch."""
    if not isinstance(entry, str):
        return "is not a host name; give host names as text, like example.com"
    if not entry.strip():
        return "is empty; give host names, like example.com (to allow every public host, leave the option out)"
    if "," in entry:
        return "has a comma; give each host as its own entry, like ('a.example', 'b.example')"
    if any(character.isspace() for character in entry):
        return "has spaces; give host names only, like example.com (separate several with commas)"
    if (problem := _url_part_problem(entry)) is not None:
        return problem
    if literal_address(entry) is not None:
        return None
    name = entry[2:] if entry.startswith("*.") else entry
    if "*" in name:
        return "has a '*' other than a leading '*.'; write subdomains as *.example.com"
    if not name.rstrip("."):
        return "is a wildcard without a domain; write subdomains as *.example.com"
    if (problem := spelling_problem(name)) is not None:
        return f"is refused: {problem}"
    try:
        labels = name.rstrip(".").encode("idna").decode("ascii").lower().split(".")
    except UnicodeError:
        return "is not a valid host name; give one like example.com"
    if not all(_LABEL.fullmatch(label) for label in labels):
        return "is not a valid host name; give one like example.com"
    return None
