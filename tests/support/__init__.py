"""What the tests share: fixtures' makers, servers, oracles and background jobs (not tests)."""
