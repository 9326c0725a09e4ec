"""The work stream as a test reads it."""

from steno.services.common import bus


async def queued_requests(settings) -> int:
    """Messages in the work stream: requests (and checks) waiting or being generated."""
    names = bus.Names.from_settings(settings)
    nc = await bus.connect(settings, "test-queue-depth")
    try:
        return (await nc.jetstream().stream_info(names.gen_stream)).state.messages
    finally:
        await nc.close()
