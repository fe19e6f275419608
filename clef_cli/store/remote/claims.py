"""`clef checkpoint unclaim s3://…`: breaking a store's claim by hand.

A claim ends by itself a lease after its manifest was written (by the bucket's clock), so this is
for a claim whose holder is known to be gone and that nobody wants to wait out. Breaking one whose
holder still runs is safe for the store (a holder commits only while its own claim is in the
latest manifest: it gives up), but that holder's work is lost; hence the confirmation.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from clef_cli.errors import ClefError, UsageError
from clef_cli.store.remote.manifests import Chain, Manifest, holder


def claim_said(claim: dict[str, Any], uri: str) -> str:
    """Whose claim it is, when it was taken (by its holder's clock) and how long it still holds."""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(claim.get("since", 0))))
    left = int(float(claim.get("left", 0)))
    holds = f"it holds for {left} s more" if left > 0 else "its lease has run out"
    return f"the claim on {uri} of {holder(claim)}, taken at {since} UTC by that host's clock ({holds})"


def unclaim(uri: str, confirm: bool) -> dict[str, Any] | None:
    """Break the claim the latest manifest names (held or run out); without `confirm`, refused
    (UsageError) naming it. The claim broken, with `left` (seconds it still held); None: none."""
    chain = Chain(uri)
    latest = chain.latest()
    if latest is None:
        raise UsageError(f"{uri} holds no clef store (no manifest)")
    if not latest.claim:
        return None
    held = chain.holding(latest)
    claim = latest.claim | {"left": held["left"] if held is not None else 0}
    if not confirm:
        raise UsageError(
            f"{claim_said(claim, uri)}: breaking it ends that job's work if it still runs (it then commits "
            "nothing); add --confirm to break it"
        )

    def broken(base: Manifest | None) -> Manifest:
        if base is None or (base.claim or {}).get("token") != claim.get("token"):
            raise ClefError(f"the claim on {uri} changed meanwhile (released or taken again): nothing broken")
        return replace(base, claim=None)

    chain.commit(broken, fresh=True)
    return claim
