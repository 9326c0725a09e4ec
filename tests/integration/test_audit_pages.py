"""The /audit pages in headless Chromium (Selenium): pages of real responses and a real
conversation, what they show, escaped, and a screenshot of each that is a picture of
the page. Authentication and tenant scoping over plain HTTP."""

from __future__ import annotations

import shutil
import struct
import zlib
from collections.abc import Iterator

import httpx
import pytest

from steno.infra.processes import Stack

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
# Markup in what the model said and what a client sent: shown as text, never run.
HOSTILE = '<script>document.title="pwned"</script><b>bold</b> & déjà vu'


def site(stack: Stack) -> str:
    return stack.base_url.removesuffix("/v1")


@pytest.fixture(scope="module")
def chromium() -> Iterator:
    """Headless Chromium through chromedriver (Debian's ``chromium`` and
    ``chromium-driver``; ``.ci/run`` installs them)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra)")
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip("Chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1400", "--hide-scrollbars"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.set_page_load_timeout(60)
    driver.execute_cdp_cmd("Network.enable", {})
    try:
        yield driver
    finally:
        driver.quit()


def as_tenant(driver, stack: Stack, tenant: str = "a") -> None:
    """Every request the browser makes carries the tenant's key."""
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": stack.headers(tenant)})


def tool_round_trip(client) -> tuple:
    asked = client.responses.create(model=MODEL, input=f"Paris {HOSTILE}", tools=[WEATHER],
                                    instructions=f"Be brief. {HOSTILE}")
    call = asked.output[-1]
    answered = client.responses.create(
        model=MODEL, tools=[WEATHER], previous_response_id=asked.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": f"sunny, 21C {HOSTILE}"}])
    return asked, call, answered


def png_pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and pixels of an 8-bit RGB or RGBA PNG (what Chromium writes)."""
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    position, data, header = 8, b"", None
    while position < len(png):
        length, kind = struct.unpack(">I4s", png[position:position + 8])
        body = png[position + 8:position + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            data += body
        position += 12 + length
    assert header is not None
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0
    size = 3 if color == 2 else 4
    raw, stride = zlib.decompress(data), width * size
    rows: list[bytearray] = []
    previous = bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - size] if x >= size else 0
            up, corner = previous[x], previous[x - size] if x >= size else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                estimate = left + up - corner
                nearest = min((abs(estimate - left), 0, left), (abs(estimate - up), 1, up),
                              (abs(estimate - corner), 2, corner))[2]
                line[x] = (line[x] + nearest) & 0xFF
        rows.append(line)
        previous = line
    pixels = [bytes(row[x:x + 3]) for row in rows for x in range(0, stride, size)]
    return width, height, pixels


def assert_a_picture_of_the_page(driver) -> None:
    width, height, pixels = png_pixels(driver.get_screenshot_as_png())
    assert (width, height) == tuple(driver.execute_cdp_cmd(
        "Page.getLayoutMetrics", {})["cssVisualViewport"][key] for key in ("clientWidth", "clientHeight"))
    white = bytes((255, 255, 255))
    drawn = sum(pixel != white for pixel in pixels)
    # Text, tables and the verdict's coloured box: far from blank, far from one colour.
    assert drawn > len(pixels) // 100, f"{drawn} of {len(pixels)} pixels are not white"
    assert len(set(pixels)) > 20


def text_of(driver) -> str:
    return driver.find_element("tag name", "body").text


def test_a_response_page_shows_its_timeline_and_verification(stack, client, chromium):
    asked, _, answered = tool_round_trip(client)
    as_tenant(chromium, stack)
    chromium.get(f"{site(stack)}/audit/responses/{answered.id}")
    assert chromium.title == f"Audit: {answered.id}"
    text = text_of(chromium)
    assert "Verification" in text and "Intact" in text
    assert f"hash chain unbroken (chained to {asked.id} seq" in text
    assert "Event timeline" in text and "response.created" in text and "response.completed" in text
    rows = chromium.find_elements("css selector", "table.timeline tbody tr")
    assert len(rows) == len(list(client.responses.retrieve(answered.id, stream=True)))
    assert rows[0].find_elements("tag name", "td")[0].text == "0"
    assert len(rows[0].find_elements("tag name", "td")[3].text) == 16  # the hash, shortened
    # What the model echoed, markup and all, is text on the page.
    assert HOSTILE.replace("  ", " ") in text
    assert chromium.find_elements("tag name", "script") == []
    assert chromium.find_elements("css selector", "td b") == []
    assert chromium.title != "pwned"
    assert_a_picture_of_the_page(chromium)

    chromium.find_element("link text", asked.id).click()
    assert chromium.title == f"Audit: {asked.id}"


def test_a_transcript_page_holds_the_whole_chain(stack, client, chromium):
    asked, call, answered = tool_round_trip(client)
    as_tenant(chromium, stack)
    chromium.get(f"{site(stack)}/audit/responses/{answered.id}/transcript")
    text = text_of(chromium)
    assert f"Turn 1: {asked.id}" in text and f"Turn 2: {answered.id}" in text
    assert f"tool call get_weather ({call.call_id})" in text and call.arguments in text
    assert f"sunny, 21C {HOSTILE}" in text
    assert f"Be brief. {HOSTILE}" in text
    assert answered.output_text in text
    assert chromium.find_elements("tag name", "script") == []
    assert_a_picture_of_the_page(chromium)


def test_a_conversation_page_verifies_its_responses(stack, client, chromium):
    conversation = client.conversations.create(metadata={"topic": HOSTILE[:64]})
    first = client.responses.create(model=MODEL, input="Paris", tools=[WEATHER], conversation=conversation.id)
    second = client.responses.create(
        model=MODEL, tools=[WEATHER], conversation=conversation.id,
        input=[{"type": "function_call_output", "call_id": first.output[-1].call_id, "output": "rainy, 12C"}])
    as_tenant(chromium, stack)
    chromium.get(f"{site(stack)}/audit/conversations/{conversation.id}")
    text = text_of(chromium)
    assert "2 of 2 responses intact" in text
    assert first.id in text and second.id in text and "rainy, 12C" in text and second.output_text in text
    assert HOSTILE[:64] in text
    assert_a_picture_of_the_page(chromium)


async def test_a_tampered_response_shows_the_event_that_fails(stack, client, chromium, db):
    reply = client.responses.create(model=MODEL, input="tamper with me")
    await db.execute("UPDATE response_events SET hash = sha256('forged') WHERE response_id = $1 AND seq = 4", reply.id)
    as_tenant(chromium, stack)
    chromium.get(f"{site(stack)}/audit/responses/{reply.id}")
    assert "FAILED at seq 4" in text_of(chromium)
    assert chromium.find_element("id", "seq-4").get_attribute("class") == "bad"
    assert chromium.find_element("id", "seq-3").get_attribute("class") == ""
    assert_a_picture_of_the_page(chromium)


def test_another_tenants_pages_are_not_found(stack, client, chromium):
    reply = client.responses.create(model=MODEL, input="mine")
    conversation = client.conversations.create()
    as_tenant(chromium, stack, "b")
    chromium.get(f"{site(stack)}/audit/responses/{reply.id}")
    assert "Not found" in text_of(chromium)
    for path in (f"/audit/responses/{reply.id}", f"/audit/responses/{reply.id}/transcript",
                 f"/audit/responses/{reply.id}/replay", f"/audit/conversations/{conversation.id}",
                 "/audit/responses/resp_missing"):
        assert httpx.get(site(stack) + path, headers=stack.headers("b")).status_code == 404
        assert httpx.get(site(stack) + path, headers=stack.headers("a")).status_code == (
            404 if path.endswith("missing") else 200)


def test_the_pages_take_the_api_keys_and_nothing_else(stack, client):
    reply = client.responses.create(model=MODEL, input="who may look")
    page = f"{site(stack)}/audit/responses/{reply.id}"
    refused = httpx.get(page)
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic")
    assert httpx.get(page, headers={"Authorization": "Bearer sk-steno-nope"}).status_code == 401
    # A browser's own sign-in: the key as the password.
    signed_in = httpx.get(page, auth=("", stack.keys["a"]))
    assert signed_in.status_code == 200 and signed_in.headers["content-type"].startswith("text/html")
    assert "script-src" not in signed_in.headers["content-security-policy"]
    assert signed_in.headers["content-security-policy"].startswith("default-src 'none'")
    replay = httpx.get(page + "/replay", headers=stack.headers())
    assert replay.headers["content-type"].startswith("text/plain") and replay.text.startswith(": stored ")
