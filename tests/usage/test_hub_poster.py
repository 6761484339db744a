"""The http downstream against a real hub on loopback: the post, the answer, every fault."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import structlog
from pydantic import SecretStr

from api_sender import UsageEvent
from tests.support.hub import Hub
from worker.downstream import ContentRefused, DownstreamError, HubDownstream, make_downstream
from worker.downstream.http import parse_answer
from worker.settings import Settings


@pytest.fixture
async def poster(hub: Hub) -> AsyncIterator[HubDownstream]:
    """A hub poster with a one-second timeout, pointed at the test hub."""
    downstream = HubDownstream(hub.url, hub.client_id, SecretStr(hub.client_secret), timeout=1.0)
    try:
        yield downstream
    finally:
        await downstream.aclose()


def _events(n: int, **extra: object) -> list[dict[str, object]]:
    return [UsageEvent("api.calls", i, "w1", **extra).to_job_data() for i in range(n)]


async def test_batch_is_posted_whole_with_basic_auth_and_json(
    hub: Hub, poster: HubDownstream
) -> None:
    """One request carries the whole batch, Basic auth of id:secret, a JSON content type."""
    events = _events(5)
    outcome = await poster.deliver(events)
    assert outcome.accepted == {e["id"] for e in events}
    seen = hub.snapshot()
    assert seen.batch_sizes == [5]
    token = base64.b64encode(f"{hub.client_id}:{hub.client_secret}".encode()).decode()
    assert seen.authorizations == {f"Basic {token}"}
    assert seen.content_types == {"application/json"}


async def test_duplicates_and_window_holds_are_parsed(hub: Hub, poster: HubDownstream) -> None:
    """The hub's duplicate and held lists come back in the outcome, with the held reason."""
    events = _events(3)
    await poster.deliver(events[:1])
    future = UsageEvent(
        "m", 1, "w", occurred_at=datetime.now(UTC) + timedelta(hours=1)
    ).to_job_data()
    outcome = await poster.deliver([*events, future])
    assert outcome.duplicate == {events[0]["id"]}
    assert outcome.accepted == {events[1]["id"], events[2]["id"]}
    assert [(h.id, h.reason) for h in outcome.held] == [(future["id"], "occurred_at_window")]


@pytest.mark.parametrize(
    ("mode", "status", "match"),
    [("fail", 503, "answered 503"), ("unauthorized", 401, "answered 401")],
)
async def test_non_2xx_fails_the_batch(
    hub: Hub, poster: HubDownstream, mode: str, status: int, match: str
) -> None:
    """5xx and 401 raise DownstreamError (not a content refusal): the whole batch is retried."""
    hub.set(mode=mode)
    with pytest.raises(DownstreamError, match=match) as caught:
        await poster.deliver(_events(2))
    assert not isinstance(caught.value, ContentRefused)
    assert hub.accepted_ids() == set()


async def test_wrong_secret_is_a_401(hub: Hub) -> None:
    """A poster with the wrong secret is refused, and the error never shows the secret."""
    wrong = HubDownstream(hub.url, hub.client_id, SecretStr("not-the-secret"), timeout=1.0)
    try:
        with pytest.raises(DownstreamError, match="401") as caught:
            await wrong.deliver(_events(1))
    finally:
        await wrong.aclose()
    assert "not-the-secret" not in str(caught.value)
    assert "not-the-secret" not in repr(wrong)


async def test_a_poison_event_is_a_content_refusal(hub: Hub, poster: HubDownstream) -> None:
    """A 400 answer raises ContentRefused, the signal to split the batch."""
    events = _events(3)
    hub.set(refuse_ids={events[1]["id"]})
    with pytest.raises(ContentRefused, match="400"):
        await poster.deliver(events)


async def test_a_hanging_hub_times_out(hub: Hub, poster: HubDownstream) -> None:
    """A hub that does not answer fails the batch after the timeout, not after it answers."""
    hub.set(mode="hang", hang_seconds=10)
    started = time.monotonic()
    with pytest.raises(DownstreamError, match="timed out"):
        await poster.deliver(_events(1))
    assert time.monotonic() - started < 3


async def test_a_malformed_2xx_fails_the_batch(hub: Hub, poster: HubDownstream) -> None:
    """A 200 whose body is not the documented shape delivers nothing."""
    hub.set(mode="malformed")
    with pytest.raises(DownstreamError, match="malformed"):
        await poster.deliver(_events(1))


async def test_an_unreachable_hub_fails_the_batch() -> None:
    """Nothing listening at HUB_URL is a DownstreamError."""
    dead = Hub()  # bound, never started: connections are refused
    dead.stop()
    poster = HubDownstream(dead.url, "id", SecretStr("s"), timeout=1.0)
    try:
        with pytest.raises(DownstreamError, match="unreachable"):
            await poster.deliver(_events(1))
    finally:
        await poster.aclose()


@pytest.mark.parametrize(
    "answer",
    [
        [],
        {"accepted": "x"},
        {"duplicate": [1]},
        {"held": ["id"]},
        {"held": [{"reason": "r"}]},
        {"held": {}},
    ],
)
def test_malformed_answers_are_refused(answer: object) -> None:
    """Bodies not of the documented shape parse to None."""
    assert parse_answer(answer) is None


def test_lists_are_optional_and_unknown_keys_ignored() -> None:
    """An empty object, or one with extra keys, is a well-formed answer."""
    assert parse_answer({}) is not None
    parsed = parse_answer({"accepted": ["a"], "note": "hi"})
    assert parsed is not None
    assert parsed.accepted == {"a"}


async def test_the_secret_never_reaches_the_logs(hub: Hub) -> None:
    """Through success, 401 and timeout, no log line carries the client secret."""
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        usage_downstream="http",
        hub_url=hub.url,
        hub_client_id=hub.client_id,
        hub_client_secret=hub.client_secret,
        hub_timeout_seconds=0.5,
    )
    downstream = make_downstream(settings)
    with structlog.testing.capture_logs() as logs:
        await downstream.deliver(_events(1))
        for mode in ("unauthorized", "hang"):
            hub.set(mode=mode, hang_seconds=3)
            with pytest.raises(DownstreamError) as caught:
                await downstream.deliver(_events(1))
            assert hub.client_secret not in str(caught.value)
    await downstream.aclose()
    assert hub.client_secret not in repr(logs)
    assert hub.client_secret not in repr(downstream)
    assert hub.client_secret not in repr(settings)


def test_a_worker_that_does_not_post_to_the_hub_never_imports_httpx() -> None:
    """The hub poster and httpx load only when asked for: everything ``chassis-worker run``
    imports leaves them out (about 2 MB of the worker's resident memory), and
    ``make_downstream`` for the hub brings them in."""
    code = (
        "import sys\n"
        "import worker.boot, worker.cli, worker.commands.jobs, worker.runtime\n"
        "assert 'httpx' not in sys.modules, 'httpx imported at boot'\n"
        "from worker.downstream import HubDownstream\n"
        "assert 'httpx' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
