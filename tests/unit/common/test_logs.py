"""Log lines as an operator reads them: text by default, JSON objects on request, with
the fields of the response they are about and never its text unless asked."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from datetime import datetime

import orjson
import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext

from steno.services.common import logs
from steno.services.common.config import Settings

PROMPT = "the secret recipe for tomato soup"
log = logging.getLogger("steno.test")

Configure = Callable[..., Callable[[], list[str]]]


@pytest.fixture
def configure(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Configure]:
    """Configures the process's logging as a service would; gives a reader of the lines
    written since. The test's logging is put back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    monkeypatch.setattr(logs, "_content_logged", False)
    for switch in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, switch, getattr(logging, switch))

    def configured(**settings: object) -> Callable[[], list[str]]:
        logs.configure_logging("api", Settings(**settings))
        capsys.readouterr()
        return lambda: capsys.readouterr().err.splitlines()

    yield configured
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(False)


def test_a_json_line_carries_the_response_it_is_about(configure: Configure) -> None:
    lines = configure(log_format="json")
    with logs.response_context(response_id="resp_1", tenant="a", attempt=0, model="steno-simulator"):
        log.info("response accepted", extra={"stream": True})
    log.info("unrelated")
    first, second = (orjson.loads(line) for line in lines())
    assert datetime.fromisoformat(first.pop("time")).utcoffset().total_seconds() == 0
    assert first == {"level": "INFO", "service": "api", "logger": "steno.test", "message": "response accepted",
                     "response_id": "resp_1", "tenant": "a", "attempt": 0, "model": "steno-simulator",
                     "stream": True}
    assert "response_id" not in second and second["message"] == "unrelated"


def test_fields_bound_later_in_a_context_are_dropped_when_it_ends(configure: Configure) -> None:
    lines = configure(log_format="json")
    with logs.response_context(tenant="a"):
        logs.bind(response_id="resp_2", attempt=1)
        log.warning("retrying")
    log.warning("after")
    inside, after = (orjson.loads(line) for line in lines())
    assert (inside["tenant"], inside["response_id"], inside["attempt"]) == ("a", "resp_2", 1)
    assert not {"tenant", "response_id", "attempt"} & after.keys()


def test_an_exception_is_a_field_of_its_one_line(configure: Configure) -> None:
    lines = configure(log_format="json")
    try:
        raise ValueError("the bus is gone")
    except ValueError:
        log.exception("publishing failed")
    [line] = lines()
    parsed = orjson.loads(line)
    assert parsed["level"] == "ERROR" and parsed["message"] == "publishing failed"
    assert "Traceback" in parsed["exc_info"] and "ValueError: the bus is gone" in parsed["exc_info"]


def test_a_line_logged_in_a_trace_names_it(configure: Configure) -> None:
    lines = configure(log_format="json")
    span = NonRecordingSpan(SpanContext(trace_id=0x1234, span_id=0x99, is_remote=False))
    with trace.use_span(span):
        log.info("in a trace")
    assert orjson.loads(lines()[0])["trace_id"] == f"{0x1234:032x}"


def test_the_level_is_configurable(configure: Configure) -> None:
    lines = configure(log_format="json", log_level="warning")
    log.info("quiet")
    log.warning("loud")
    assert [orjson.loads(line)["message"] for line in lines()] == ["loud"]


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_no_text_content_unless_asked(configure: Configure, log_format: str) -> None:
    lines = configure(log_format=log_format, log_level="DEBUG")
    logs.debug_content(log, "response input", input=PROMPT)
    assert not any(PROMPT in line for line in lines())


def test_text_content_at_debug_when_asked(configure: Configure) -> None:
    lines = configure(log_format="json", log_level="DEBUG", log_content=True)
    logs.debug_content(log, "response input", input=PROMPT)
    [line] = lines()
    assert orjson.loads(line) | {"time": None} == {"time": None, "level": "DEBUG", "service": "api",
                                                   "logger": "steno.test", "message": "response input",
                                                   "input": PROMPT}


def test_text_format_is_as_before_with_the_fields_after(configure: Configure) -> None:
    lines = configure()
    log.info("worker %s ready", "w-1")
    with logs.response_context(response_id="resp_3", tenant="a"):
        log.info("response accepted")
    plain, about = lines()
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
    assert re.fullmatch(stamp + r" api INFO steno.test: worker w-1 ready", plain)
    assert re.fullmatch(stamp + r" api INFO steno.test: response accepted response_id=resp_3 tenant=a", about)


def test_warnings_go_through_the_same_format(configure: Configure) -> None:
    import warnings

    lines = configure(log_format="json")
    warnings.warn("an old option", DeprecationWarning, stacklevel=1)
    [line] = lines()
    assert "an old option" in orjson.loads(line)["message"]
