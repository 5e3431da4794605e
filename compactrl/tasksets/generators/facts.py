"""The catalogue of facts a generated code task can hinge on.

Each :class:`FactSpec` is one constant of the buggy module whose correct value is stated somewhere
else in the project (a config file, a documentation page, another module's docstring), together
with distractor statements that look alike but are wrong (outdated values, neighbouring settings).

Statements are single lines; ``pattern`` matches the true statement and none of the distractors
(the generator checks that every fact's pattern matches exactly one line of the project).

What a task records: the generator writes each chosen fact into ``Task.metadata["facts"]`` (``key``,
``compare``, ``transform``, ``location``, ``file``, ``line``, ``pattern``, ``stated``, ``value``,
``wrong_value``, ``function``, ``distractors``). Readers of a task (the scripted oracles, the sim's
grading) take the facts from there, never from :data:`CATALOGUE`; :func:`code_value` turns a stated
text into the constant under the recorded ``transform``, the same conversion the generator made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Location = str  # "config" | "doc" | "docstring"


@dataclass(frozen=True)
class FactSpec:
    """One fact template. ``{v}`` in templates is the stated value, ``{u}`` its unit word."""

    key: str
    """Name of the module-level constant in the buggy module."""
    compare: str
    """How the sim judges the constant: ``int`` (an int, not a bool), ``number``, ``str``."""
    values: tuple[str, ...]
    """Candidate stated values, as written in the project's text."""
    transform: str
    """How the stated value becomes the constant (see :func:`code_value`)."""
    statements: dict[Location, tuple[str, str]]
    """Location -> (statement template, regex with one group capturing the stated value)."""
    distractors: dict[Location, tuple[str, ...]]
    """Location -> distractor templates (must not match the statement's regex)."""
    function: str
    """Source of the function that uses the constant (module level, no trailing newline)."""
    test: Callable[[object], str]
    """Correct constant value -> body lines of the hidden spec test (4-space indented)."""
    units: dict[str, str] | None = None
    """Stated value -> unit word for ``{u}``."""

    @property
    def func_name(self) -> str:
        return self.function.split("(", 1)[0].removeprefix("def ")


def code_value(transform: str, stated: str) -> object:
    """The constant's value given the stated text, under one of the catalogue's transforms (a recorded
    fact's ``transform``): the generator's conversion, which the scripted oracle repeats on what it reads."""
    if transform == "percent":
        return float(stated) / 100
    if transform == "minutes_to_s":
        return int(stated) * 60
    if transform == "s_to_ms":
        return int(stated) * 1000
    if transform == "int":
        return int(stated)
    if transform == "str":
        return stated
    raise ValueError(f"unknown transform {transform!r}")


def _fee_test(rate: object) -> str:
    return f"    assert service_fee(200.0) == pytest.approx({round(200.0 * rate, 2)!r})\n    assert service_fee(0) == 0\n"


def _pages_test(size: object) -> str:
    n = 3 * size + 7
    lengths = [len(range(n)[i : i + size]) for i in range(0, n, size)]
    return f"    pages = paginate(list(range({n})))\n    assert [len(p) for p in pages] == {lengths!r}\n"


CATALOGUE: tuple[FactSpec, ...] = (
    FactSpec(
        key="SERVICE_FEE_RATE",
        compare="number",
        values=("1.5", "2", "2.5", "3", "3.5", "4", "4.5", "5", "6", "7.5"),
        transform="percent",
        statements={
            "config": ("service_fee_percent = {v}", r"^service_fee_percent = ([0-9.]+)$"),
            "doc": ("A service fee of {v}% is added to every order.", r"^A service fee of ([0-9.]+)% is added to every order\.$"),
            "docstring": ("Contract: the service fee is {v}% of the order amount.", r"^\s*Contract: the service fee is ([0-9.]+)% of the order amount\.$"),
        },
        distractors={
            "config": ("legacy_service_fee_percent = {v}", "partner_fee_percent = {v}"),
            "doc": ("Until release 2.0 a service fee of {v}% was added to every order.", "Wholesale partners pay a reduced fee of {v}% per order."),
            "docstring": ("The retired fee schedule charged {v}% of the order amount.",),
        },
        function='def service_fee(amount):\n    """Fee added to an order of ``amount``, rounded to cents."""\n    return round(amount * SERVICE_FEE_RATE, 2)',
        test=_fee_test,
    ),
    FactSpec(
        key="PAGE_SIZE",
        compare="int",
        values=("20", "25", "30", "40", "50", "64", "75", "80", "100", "128"),
        transform="int",
        statements={
            "config": ("page_size = {v}", r"^page_size = (\d+)$"),
            "doc": ("Every listing endpoint returns pages of exactly {v} records.", r"^Every listing endpoint returns pages of exactly (\d+) records\.$"),
            "docstring": ("Contract: callers must request pages of exactly {v} records.", r"^\s*Contract: callers must request pages of exactly (\d+) records\.$"),
        },
        distractors={
            "config": ("max_page_size = {v}", "legacy_page_size = {v}"),
            "doc": ("Administrative exports use pages of {v} records.", "Older clients requested pages of {v} records."),
            "docstring": ("Bulk readers may fetch up to {v} records at once.",),
        },
        function='def paginate(items):\n    """Split ``items`` into consecutive pages of PAGE_SIZE records."""\n    return [items[i : i + PAGE_SIZE] for i in range(0, len(items), PAGE_SIZE)]',
        test=_pages_test,
    ),
    FactSpec(
        key="TICKS_PER_SECOND",
        compare="number",
        values=("10", "100", "1000", "1000000"),
        transform="int",
        units={"10": "deciseconds", "100": "centiseconds", "1000": "milliseconds", "1000000": "microseconds"},
        statements={
            "config": ("ticks_per_second = {v}", r"^ticks_per_second = (\d+)$"),
            "doc": ("The scheduler clock counts in {u}: one second is {v} ticks.", r"^The scheduler clock counts in \w+: one second is (\d+) ticks\.$"),
            "docstring": ("Contract: the clock counts in {u}, one second is {v} ticks.", r"^\s*Contract: the clock counts in \w+, one second is (\d+) ticks\.$"),
        },
        distractors={
            "config": ("legacy_ticks_per_second = {v}",),
            "doc": ("The legacy timer counted in {u}: one second was {v} ticks.",),
            "docstring": ("The old timer counted in {u}, one second was {v} ticks.",),
        },
        function='def to_ticks(seconds):\n    """Convert a duration in seconds to scheduler ticks."""\n    return int(round(seconds * TICKS_PER_SECOND))',
        test=lambda t: f"    assert to_ticks(2.5) == {int(round(2.5 * t))}\n    assert to_ticks(0) == 0\n",
    ),
    FactSpec(
        key="MAX_RETRIES",
        compare="int",
        values=("2", "3", "4", "5", "6", "7", "8"),
        transform="int",
        statements={
            "config": ("max_retries = {v}", r"^max_retries = (\d+)$"),
            "doc": ("A failed request is retried at most {v} times before giving up.", r"^A failed request is retried at most (\d+) times before giving up\.$"),
            "docstring": ("Contract: transient failures are retried at most {v} times.", r"^\s*Contract: transient failures are retried at most (\d+) times\.$"),
        },
        distractors={
            "config": ("max_redirects = {v}", "legacy_max_retries = {v}"),
            "doc": ("Health checks are retried at most {v} times.", "Before release 1.4 a failed request was retried {v} times."),
            "docstring": ("Idempotent reads were once retried {v} times.",),
        },
        function='def retry_delays():\n    """Back-off delays in seconds before each retry of a failed request."""\n    return [0.5 * 2**attempt for attempt in range(MAX_RETRIES)]',
        test=lambda n: f"    delays = retry_delays()\n    assert len(delays) == {n}\n    assert delays[0] == 0.5\n",
    ),
    FactSpec(
        key="CSV_DELIMITER",
        compare="str",
        values=(",", ";", "|", ":"),
        transform="str",
        statements={
            "config": ('csv_delimiter = "{v}"', r'^csv_delimiter = "(.)"$'),
            "doc": ('Exported CSV files separate fields with "{v}".', r'^Exported CSV files separate fields with "(.)"\.$'),
            "docstring": ('Contract: exported rows are joined with "{v}".', r'^\s*Contract: exported rows are joined with "(.)"\.$'),
        },
        distractors={
            "config": ('log_delimiter = "{v}"', 'legacy_csv_delimiter = "{v}"'),
            "doc": ('Imported spreadsheets may separate fields with "{v}".',),
            "docstring": ('Debug dumps join fields with "{v}".',),
        },
        function='def format_row(fields):\n    """Join ``fields`` into one line of an exported CSV file."""\n    return CSV_DELIMITER.join(str(f) for f in fields)',
        test=lambda d: f'    assert format_row(["a", 1, 2.5]) == {d.join(["a", "1", "2.5"])!r}\n',
    ),
    FactSpec(
        key="CACHE_TTL_SECONDS",
        compare="number",
        values=("5", "10", "15", "20", "30", "45", "60", "90"),
        transform="minutes_to_s",
        statements={
            "config": ("cache_ttl_minutes = {v}", r"^cache_ttl_minutes = (\d+)$"),
            "doc": ("Cached responses expire after {v} minutes.", r"^Cached responses expire after (\d+) minutes\.$"),
            "docstring": ("Contract: cache entries live for {v} minutes.", r"^\s*Contract: cache entries live for (\d+) minutes\.$"),
        },
        distractors={
            "config": ("session_ttl_minutes = {v}",),
            "doc": ("Session tokens expire after {v} minutes.", "Before release 3.1, cached responses expired after {v} minutes."),
            "docstring": ("Negative lookups are cached for {v} minutes.",),
        },
        function='def expires_at(now):\n    """Expiry timestamp (seconds) of a cache entry stored at ``now``."""\n    return now + CACHE_TTL_SECONDS',
        test=lambda s: f"    assert expires_at(1000) == {1000 + s}\n",
    ),
    FactSpec(
        key="MAX_USERNAME_LENGTH",
        compare="number",
        values=("12", "16", "20", "24", "30", "32", "40", "48"),
        transform="int",
        statements={
            "config": ("max_username_length = {v}", r"^max_username_length = (\d+)$"),
            "doc": ("Usernames may be at most {v} characters long.", r"^Usernames may be at most (\d+) characters long\.$"),
            "docstring": ("Contract: the storage layer rejects usernames longer than {v} characters.", r"^\s*Contract: the storage layer rejects usernames longer than (\d+) characters\.$"),
        },
        distractors={
            "config": ("max_display_name_length = {v}",),
            "doc": ("Display names may be at most {v} characters long.",),
            "docstring": ("Display names may be up to {v} characters long.",),
        },
        function='def is_valid_username(name):\n    """Whether ``name`` is a non-empty username the storage layer accepts."""\n    return 0 < len(name) <= MAX_USERNAME_LENGTH',
        test=lambda n: f'    assert is_valid_username("u" * {n})\n    assert not is_valid_username("u" * {n + 1})\n',
    ),
    FactSpec(
        key="API_PREFIX",
        compare="str",
        values=("/api/v1", "/api/v2", "/api/v3", "/v2", "/rest/v1", "/service/v4"),
        transform="str",
        statements={
            "config": ('api_prefix = "{v}"', r'^api_prefix = "([^"]+)"$'),
            "doc": ("All public endpoints are mounted under `{v}`.", r"^All public endpoints are mounted under `([^`]+)`\.$"),
            "docstring": ("Contract: routes are served below the prefix `{v}`.", r"^\s*Contract: routes are served below the prefix `([^`]+)`\.$"),
        },
        distractors={
            "config": ('legacy_api_prefix = "{v}"', 'admin_prefix = "{v}"'),
            "doc": ("Internal endpoints are mounted under `{v}`.", "Deprecated endpoints remain under `{v}`."),
            "docstring": ("Health probes are served below `{v}`.",),
        },
        function='def endpoint(path):\n    """Public URL path of the route ``path``."""\n    return API_PREFIX + "/" + path.lstrip("/")',
        test=lambda p: f'    assert endpoint("/users") == {p + "/users"!r}\n',
    ),
    FactSpec(
        key="BATCH_SIZE",
        compare="int",
        values=("16", "32", "48", "64", "96", "128", "256"),
        transform="int",
        statements={
            "config": ("flush_batch_size = {v}", r"^flush_batch_size = (\d+)$"),
            "doc": ("The writer flushes records to disk in batches of {v}.", r"^The writer flushes records to disk in batches of (\d+)\.$"),
            "docstring": ("Contract: writes are flushed in batches of exactly {v} records.", r"^\s*Contract: writes are flushed in batches of exactly (\d+) records\.$"),
        },
        distractors={
            "config": ("read_batch_size = {v}",),
            "doc": ("The reader loads records in batches of {v}.",),
            "docstring": ("Replication ships records in batches of {v}.",),
        },
        function='def flush_points(count):\n    """Record counts after which the writer flushes, for ``count`` records."""\n    return list(range(BATCH_SIZE, count + 1, BATCH_SIZE))',
        test=lambda b: f"    assert flush_points({3 * b + 1}) == {[b, 2 * b, 3 * b]!r}\n",
    ),
    FactSpec(
        key="REQUEST_TIMEOUT_MS",
        compare="number",
        values=("5", "10", "15", "20", "30", "45", "60"),
        transform="s_to_ms",
        statements={
            "config": ("request_timeout_s = {v}", r"^request_timeout_s = (\d+)$"),
            "doc": ("Requests time out after {v} seconds.", r"^Requests time out after (\d+) seconds\.$"),
            "docstring": ("Contract: a request is abandoned after {v} seconds.", r"^\s*Contract: a request is abandoned after (\d+) seconds\.$"),
        },
        distractors={
            "config": ("connect_timeout_s = {v}",),
            "doc": ("Connections time out after {v} seconds.", "Before release 2.4, requests timed out after {v} seconds."),
            "docstring": ("Idle connections are closed after {v} seconds.",),
        },
        function='def deadline_ms(start_ms):\n    """Deadline in milliseconds of a request started at ``start_ms``."""\n    return start_ms + REQUEST_TIMEOUT_MS',
        test=lambda t: f"    assert deadline_ms(500) == {500 + t}\n",
    ),
    FactSpec(
        key="DEFAULT_CURRENCY",
        compare="str",
        values=("EUR", "USD", "GBP", "CHF", "JPY", "SEK"),
        transform="str",
        statements={
            "config": ('currency = "{v}"', r'^currency = "([A-Z]{3})"$'),
            "doc": ("Prices are stored and displayed in {v}.", r"^Prices are stored and displayed in ([A-Z]{3})\.$"),
            "docstring": ("Contract: amounts are always expressed in {v}.", r"^\s*Contract: amounts are always expressed in ([A-Z]{3})\.$"),
        },
        distractors={
            "config": ('report_currency = "{v}"',),
            "doc": ("Legacy invoices were issued in {v}.",),
            "docstring": ("Supplier quotes may arrive in {v}.",),
        },
        function='def format_price(amount):\n    """Human-readable price of ``amount``."""\n    return "%.2f %s" % (amount, DEFAULT_CURRENCY)',
        test=lambda c: f'    assert format_price(3.5) == {"3.50 " + c!r}\n',
    ),
    FactSpec(
        key="LOW_STOCK_THRESHOLD",
        compare="number",
        values=("3", "5", "8", "10", "12", "15", "20", "25"),
        transform="int",
        statements={
            "config": ("low_stock_threshold = {v}", r"^low_stock_threshold = (\d+)$"),
            "doc": ("An item counts as low on stock when fewer than {v} units remain.", r"^An item counts as low on stock when fewer than (\d+) units remain\.$"),
            "docstring": ("Contract: stock below {v} units is reported as low.", r"^\s*Contract: stock below (\d+) units is reported as low\.$"),
        },
        distractors={
            "config": ("reorder_quantity = {v}",),
            "doc": ("Suppliers are notified when fewer than {v} units remain in the warehouse.",),
            "docstring": ("Reorders are placed in multiples of {v} units.",),
        },
        function='def is_low_stock(units):\n    """Whether ``units`` left in stock count as low."""\n    return units < LOW_STOCK_THRESHOLD',
        test=lambda n: f"    assert is_low_stock({n - 1})\n    assert not is_low_stock({n})\n",
    ),
)

CATALOGUE_BY_KEY: dict[str, FactSpec] = {f.key: f for f in CATALOGUE}


def render(template: str, spec: FactSpec, stated: str) -> str:
    unit = (spec.units or {}).get(stated, "")
    return template.replace("{v}", stated).replace("{u}", unit)
