"""The read-only HTTP API of records (`[http] tables = true`): `GET /tables` and `GET /tables/NAME`.

`GET /tables` lists each projected table served (columns, key, indexes);
`GET /tables/NAME?col=value&order_by=col&after=CURSOR&limit=N` answers one
page, `{"table", "rows": [{column: value}], "next": CURSOR | null}`, read on
the store's read connections (relay/store/records.py: keyset pagination).
A request takes a token of its client IP's REQ bucket (`[rate_limits]`, as a
`REQ` does); tables of `[auth] private_kinds` are never served (NIP-42: such
events go only to their author or recipient, and their rows would show them).
Every refusal is JSON, `{"error": "<NIP-01 prefix>: ...", "parameter": NAME}` (no "parameter" in a 429);
a table whose projector is being built answers 503 `{"error": "building", "progress": {"done", "total"}}`.
"""

from __future__ import annotations

from http import HTTPStatus
from urllib.parse import parse_qsl

import orjson

from relay.config import Config
from relay.server.ratelimit import REFUSALS, REQS, RateLimits
from relay.wire.http import HttpRequest, HttpResponse, Routes
from relay.store.records import DEFAULT_LIMIT, RecordQueryError, Records, TableBuilding
from relay.store.reads import ReadPool

PATH = "/tables"
"""The list of tables; a table's rows are at PATH/NAME."""
_RESERVED = frozenset({"order_by", "after", "limit"})
"""Query parameters that are not a column's equality."""


class TablesApi:
    """Answers `GET /tables` and `GET /tables/NAME` from `store`'s read connections (module docstring)."""

    def __init__(self, config: Config, store: ReadPool, rate_limits: RateLimits) -> None:
        self.records = Records(store, config.projectors, config.auth.private_kinds)
        self.max_limit = config.http.tables_max_limit
        self.rate_limits = rate_limits
        self._list = orjson.dumps({"tables": [view.describe() for view in self.records.tables.values()]})

    def add_routes(self, routes: Routes) -> None:
        """Route `GET /tables` and `GET /tables/<name>` to this API."""
        routes.add("GET", PATH, self.list_tables)
        routes.add("GET", PATH + "/", self.read_table, prefix=True)  # /tables/NAME

    async def list_tables(self, request: HttpRequest) -> HttpResponse:
        """Each served table's `{"name", "kind", "columns": [{"name", "type"}], "key", "indexes"}`."""
        if not self._allowed(request):
            return _refusal(HTTPStatus.TOO_MANY_REQUESTS, None, REFUSALS[REQS])
        return HttpResponse(HTTPStatus.OK, self._list, "application/json")

    async def read_table(self, request: HttpRequest) -> HttpResponse:
        """One page of the table named by the path; 400 naming the parameter at fault, 404 for no such table."""
        if not self._allowed(request):
            return _refusal(HTTPStatus.TOO_MANY_REQUESTS, None, REFUSALS[REQS])
        name = request.path[len(PATH) + 1:]
        if name not in self.records.tables:
            return _refusal(HTTPStatus.NOT_FOUND, "table", f"not found: no table {name!r} is served here")
        try:
            where, order_by, limit, after = self._parameters(request)
            page = await self.records.query_records(name, where, order_by, limit, after)
        except RecordQueryError as exc:
            return _refusal(HTTPStatus.BAD_REQUEST, exc.parameter, f"invalid: {exc}")
        except TableBuilding as exc:  # try again later: the rows are not all there yet
            body = {"error": "building", "progress": exc.progress}
            return HttpResponse(HTTPStatus.SERVICE_UNAVAILABLE, orjson.dumps(body), "application/json")
        body = {"table": name, "rows": page.rows, "next": page.next}
        return HttpResponse(HTTPStatus.OK, orjson.dumps(body), "application/json")

    def _parameters(self, request: HttpRequest) -> tuple[dict[str, str], str | None, int, str | None]:
        where: dict[str, str] = {}
        special: dict[str, str] = {}
        for name, value in parse_qsl(request.query, keep_blank_values=True):
            into = special if name in _RESERVED else where
            if name in into:
                raise RecordQueryError(name, "given twice")
            into[name] = value
        text = special.get("limit")
        if text is None:
            limit = min(DEFAULT_LIMIT, self.max_limit)
        elif text.isascii() and text.isdecimal() and int(text) >= 1:
            limit = min(int(text), self.max_limit)  # `[http] tables_max_limit` clamps
        else:
            raise RecordQueryError("limit", f"must be an integer >= 1, got {text!r}")
        return where, special.get("order_by"), limit, special.get("after")

    def _allowed(self, request: HttpRequest) -> bool:
        """Take a token of the client IP's REQ bucket (one request is one connection: its own bucket is new)."""
        forwarded = request.header("x-forwarded-for")
        proxied = bool(forwarded or request.header("forwarded"))
        ip = self.rate_limits.client_ip(request.peer, forwarded or None)
        rate = self.rate_limits.open(ip, proxied)
        try:
            return rate is None or rate.allow(REQS)
        finally:
            self.rate_limits.close(rate)


def _refusal(status: HTTPStatus, parameter: str | None, message: str) -> HttpResponse:
    """`{"error": message, "parameter": parameter}`; None: no parameter is at fault (a rate limit), whereas ""
    names the empty parameter name of `?=x`."""
    body = {"error": message, **({"parameter": parameter} if parameter is not None else {})}
    return HttpResponse(status, orjson.dumps(body), "application/json")
