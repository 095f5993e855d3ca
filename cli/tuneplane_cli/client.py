"""The console's REST API over HTTP: a bearer token, JSON in and out, and its errors as they
come (``{"error": {"code", "message", ...}}``) raised as one exception the commands print."""

import time

import httpx

from . import __version__
from .config import Config

TIMEOUT = httpx.Timeout(30.0, connect=10.0)
# A 429 (the logs are rate-limited per user) is waited out this many times at most.
RETRIES = 3


class ApiError(Exception):
    """The console answered with an error: its status and its ``error`` object."""

    def __init__(self, status: int, error: dict):
        self.status = status
        self.error = error
        super().__init__(error.get("message") or f"HTTP {status}")

    @property
    def code(self) -> str:
        return self.error.get("code", "")

    @property
    def message(self) -> str:
        return str(self)


class Unreachable(Exception):
    """The console could not be reached at all."""


class Client:
    def __init__(self, config: Config, *, transport=None):
        headers = {"User-Agent": f"tuneplane-cli/{__version__}", "Accept": "application/json"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        self.server = config.server
        self.http = httpx.Client(
            base_url=config.server, headers=headers, timeout=TIMEOUT, transport=transport
        )

    def request(self, method: str, path: str, *, params=None, body=None):
        """The decoded JSON body of a 2xx answer (None when empty); ApiError otherwise."""
        for attempt in range(RETRIES + 1):
            try:
                response = self.http.request(method, path, params=params, json=body)
            except httpx.TransportError as error:
                raise Unreachable(
                    f"Could not reach the console at {self.server}: {error or type(error).__name__}"
                ) from error
            if response.status_code == 429 and attempt < RETRIES:
                time.sleep(min(float(response.headers.get("Retry-After") or 1), 10.0))
                continue
            break
        if response.is_success:
            return response.json() if response.content else None
        raise ApiError(response.status_code, _error_of(response))

    def get(self, path: str, **params):
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body=None, **params):
        return self.request("POST", path, body=body, params=params or None)

    def listed(self, path: str, **params) -> list:
        """Every record of a paginated list (``{"results", "next"}``), or the list itself."""
        records, offset = [], 0
        while True:
            page = self.get(path, offset=offset or None, **params)
            if isinstance(page, list):
                return page
            records += page["results"]
            if not page.get("next") or not page["results"]:
                return records
            offset = len(records)


def _error_of(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body["error"]
    if isinstance(body, dict) and "detail" in body:
        return {"code": "error", "message": str(body["detail"])}
    return {
        "code": "error",
        "message": f"HTTP {response.status_code} from {response.request.url}",
    }
