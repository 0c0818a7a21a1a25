"""What the daemon tests share: the server from AIRLOCK_URL / AIRLOCK_API_KEY
(test/sdk/python_test.go starts one and sets them; without them the daemon
tests skip) and a unique marker per run."""

from __future__ import annotations

import os
import secrets
import unittest

URL = os.environ.get("AIRLOCK_URL", "")
KEY = os.environ.get("AIRLOCK_API_KEY", "")
#: a key of another tenant, for the isolation checks
OTHER_KEY = os.environ.get("AIRLOCK_TEST_OTHER_KEY", "")

needs_daemon = unittest.skipUnless(URL and KEY, "needs a daemon: AIRLOCK_URL and AIRLOCK_API_KEY (test/sdk/python_test.go sets them)")


def token() -> str:
    return secrets.token_hex(8)
