import asyncio
import gc
import os
import signal

import pytest

from steno.services.common.runtime import YOUNG_COLLECTION_THRESHOLD, run_until_signalled


@pytest.fixture
def restored_collector():
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_a_service_runs_with_its_start_up_heap_frozen_and_young_objects_collected_less_often(restored_collector):
    seen = {}

    async def main(stop: asyncio.Event) -> None:
        seen["threshold"] = gc.get_threshold()[0]
        seen["frozen"] = gc.get_freeze_count()
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(stop.wait(), 5)
        seen["stopped"] = True

    run_until_signalled(main)
    assert seen["threshold"] == YOUNG_COLLECTION_THRESHOLD > 700
    assert seen["frozen"] > 10_000  # the modules and types imported so far
    assert seen["stopped"]
