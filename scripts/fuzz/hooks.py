"""Schemathesis hooks for scripts/fuzz-api.sh (loaded through SCHEMATHESIS_HOOKS).

1. A check of our own on top of schemathesis's, `error_shape`: every 4xx, from the edge or
   the core, answers `Content-Type: application/json` with the body
   `{"error": {"code": "<documented code>", "message": "<text>"}}`, the shape
   docs/openapi.yaml promises for every error, whether or not the spec lists that status
   for the operation (a 405 for an unexpected method, a 404 for a path nginx refuses).
   The codes are the spec's own list, read from the spec the run uses.

2. Ways past the first refusal, so the fuzz reaches what lies behind it. Random ids name
   nothing, so some cases (chosen by Hypothesis, so a run repeats) name the fixtures the
   script made instead: an event on sale now with an unseated and a seated category, and
   an order of the run's user. Only ids that are valid already are replaced, by other
   valid ids, so a case generated as valid stays valid and an invalid one stays invalid.
   A purchase of the fixture event names one of its categories, and a new event valid by
   the schema is made valid by the rules it cannot state (see _plausible_event).
   Purchases rotate over the buyers' tokens (the core allows a user 5 a second), and half
   of the payment callbacks carry the right signature (the provider secret), so the body's
   own checks are fuzzed and not only the signature's.

Environment (set by scripts/fuzz-api.sh): FUZZ_SPEC, FUZZ_USER_TOKEN, FUZZ_BUYER_TOKENS
(comma-separated), FUZZ_EVENT_ID, FUZZ_CATEGORY_IDS (unseated,seated), FUZZ_ORDER_NO and
FUZZ_ORDER_AMOUNT (empty when no order could be made), FUZZ_PROVIDER_SECRET_FILE.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import os
from datetime import datetime, timedelta

import schemathesis
import yaml
from hypothesis import strategies as st


def _documented_codes() -> frozenset[str]:
    with open(os.environ["FUZZ_SPEC"], encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    error = spec["components"]["schemas"]["Error"]["properties"]["error"]
    return frozenset(error["properties"]["code"]["enum"])


def _int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value else None


CODES = _documented_codes()
USER_AUTH = "Bearer " + os.environ.get("FUZZ_USER_TOKEN", "")
BUYERS = itertools.cycle([t for t in os.environ.get("FUZZ_BUYER_TOKENS", "").split(",") if t] or [""])
EVENT = _int("FUZZ_EVENT_ID")
CATEGORIES = [int(c) for c in os.environ.get("FUZZ_CATEGORY_IDS", "").split(",") if c]
ORDER = _int("FUZZ_ORDER_NO")
ORDER_AMOUNT = _int("FUZZ_ORDER_AMOUNT")
_secret_file = os.environ.get("FUZZ_PROVIDER_SECRET_FILE", "")
SECRET = open(_secret_file, "rb").read().strip() if _secret_file and os.path.exists(_secret_file) else None

PURCHASE = ("POST", "/api/events/{id}/orders")
CALLBACK = ("POST", "/api/payments/callback")


def _op(ctx) -> tuple[str, str]:
    return (ctx.operation.method.upper(), ctx.operation.path)


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _either(original, *alternatives):
    """The case as generated, or one of the alternatives: Hypothesis picks."""
    return st.sampled_from([original, *alternatives])


@schemathesis.hook
def flatmap_path_parameters(ctx, params):
    if not isinstance(params, dict):
        return st.just(params)
    if EVENT is not None and _is_id(params.get("id")) and ctx.operation.path.startswith(("/api/events/", "/admin/events/")):
        return _either(params, {**params, "id": EVENT})
    if ORDER is not None and _is_id(params.get("order_no")):
        return _either(params, {**params, "order_no": ORDER})
    return st.just(params)


@schemathesis.hook
def flatmap_query(ctx, query):
    # GET /api/events/{id}/seats?category=: the fixture's seated category.
    if len(CATEGORIES) > 1 and isinstance(query, dict) and _is_id(query.get("category")):
        return _either(query, {**query, "category": CATEGORIES[1]})
    return st.just(query)


@schemathesis.hook
def flatmap_body(ctx, body):
    if not isinstance(body, dict):
        return st.just(body)
    op = _op(ctx)
    if op == CALLBACK and ORDER is not None and isinstance(body.get("order_no"), str):
        paid = {**body, "order_no": str(ORDER)}
        if ORDER_AMOUNT is not None and isinstance(body.get("amount_cents"), int):
            return _either(body, paid, {**paid, "amount_cents": ORDER_AMOUNT})
        return _either(body, paid)
    return st.just(body)


def _positive(case) -> bool:
    return case.meta is None or not case.meta.generation.mode.is_negative


@schemathesis.hook
def map_case(ctx, case):
    op = _op(ctx)
    body = case.body
    # A purchase of the fixture event buys one of its categories: seats by id from the
    # seated one, a quantity from either (a seated category then picks the best seats).
    if op == PURCHASE and len(CATEGORIES) > 1 and isinstance(body, dict) and _is_id(body.get("category_id")):
        if (case.path_parameters or {}).get("id") == EVENT:
            quantity = body.get("quantity")
            seated = "seat_ids" in body or (isinstance(quantity, int) and quantity % 2 == 0)
            case.body = {**body, "category_id": CATEGORIES[1] if seated else CATEGORIES[0]}
    # A valid new event also obeys what JSON Schema cannot say: the sale starts before it
    # ends, category names are unique, a grid has at most 100 000 seats.
    if op == ("POST", "/admin/events") and _positive(case) and isinstance(body, dict):
        case.body = _plausible_event(body)
    return case


def _plausible_event(body: dict) -> dict:
    body = dict(body)
    try:
        start, end = (datetime.fromisoformat(body[k].replace("z", "Z")) for k in ("sale_start", "sale_end"))
        if start > end:
            body["sale_start"], body["sale_end"] = body["sale_end"], body["sale_start"]
        elif start == end:
            body["sale_end"] = (end + timedelta(seconds=1)).isoformat()
    except (KeyError, TypeError, ValueError):
        pass
    categories = body.get("categories")
    if isinstance(categories, list):
        seen, fixed = set(), []
        for i, c in enumerate(categories):
            if isinstance(c, dict):
                c = dict(c)
                name = c.get("name")
                if isinstance(name, str) and name.strip() in seen:
                    c["name"] = f"{name[:90]} {i}"
                if isinstance(c.get("name"), str):
                    seen.add(c["name"].strip())
                seats = c.get("seats")
                if isinstance(seats, dict) and all(isinstance(seats.get(k), int) for k in ("rows", "cols")):
                    rows = max(seats["rows"], 1)
                    c["seats"] = {**seats, "cols": min(seats["cols"], 100_000 // rows)}
            fixed.append(c)
        body["categories"] = fixed
    return body


@schemathesis.hook
def before_call(ctx, case, kwargs):
    op = (case.method.upper(), case.operation.path)
    headers = case.headers if case.headers is not None else {}
    # A purchase with the run's user token goes out with the next buyer's instead.
    if op == PURCHASE and headers.get("Authorization") == USER_AUTH:
        token = next(BUYERS)
        if token:
            headers["Authorization"] = "Bearer " + token
    # A callback whose generated signature has an even length is signed for real: the
    # body as requests serialises a `json=` body (json.dumps, allow_nan=False, UTF-8).
    signature = headers.get("X-Signature")
    if op == CALLBACK and SECRET and isinstance(signature, str) and len(signature) % 2 == 0 and case.body is not None:
        try:
            raw = json.dumps(case.body, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError):
            return
        headers["X-Signature"] = hmac.new(SECRET, raw, hashlib.sha256).hexdigest()


@schemathesis.check
def error_shape(ctx, response, case):
    """Every 4xx has the JSON error shape: {"error": {"code", "message"}}, a documented code."""
    if not 400 <= response.status_code < 500:
        return None
    where = f"{response.status_code} for {case.method.upper()} {response.request.url}"
    ctype = ",".join(response.headers.get("content-type", []))
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise AssertionError(f"{where}: Content-Type is {ctype!r}, not application/json")
    try:
        body = json.loads(response.content)
    except ValueError as e:
        raise AssertionError(f"{where}: the body is not JSON ({e}): {response.content[:200]!r}")
    error = body.get("error") if isinstance(body, dict) else None
    if (
        not isinstance(error, dict)
        or not isinstance(error.get("code"), str)
        or not isinstance(error.get("message"), str)
    ):
        raise AssertionError(f'{where}: the body is not {{"error":{{"code","message"}}}}: {body!r}')
    if error["code"] not in CODES:
        raise AssertionError(f"{where}: error code {error['code']!r} is not one docs/openapi.yaml lists")
    return None
