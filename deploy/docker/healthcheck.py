#!/usr/bin/env python3
"""Container HEALTHCHECK: exit 0 if the hydrator's /healthz answers 200, else 1.

Stdlib only (it runs inside the image without importing the package). The URL defaults to the
daemon's default port on loopback; set HYDRATOR_HEALTHCHECK_URL when [http] listen differs.
"""

import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:9620/healthz"
TIMEOUT_S = 4.0


def main() -> int:
    url = os.environ.get("HYDRATOR_HEALTHCHECK_URL", DEFAULT_URL)
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:  # noqa: S310 (fixed http URL)
            status = response.status
    except (urllib.error.URLError, OSError) as exc:  # HTTPError (e.g. 503) is a URLError
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"unhealthy: {url}: HTTP {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
