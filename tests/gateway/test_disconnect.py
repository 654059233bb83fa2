import asyncio

import pytest

from tgi_llm.gateway.disconnect import until_disconnect


def _receiver(disconnect_after: float | None):
    async def receive() -> dict:
        if disconnect_after is None:
            await asyncio.Event().wait()  # the client stays
        await asyncio.sleep(disconnect_after)
        return {"type": "http.disconnect"}

    return receive


def test_work_that_ends_first_gives_its_result() -> None:
    async def work() -> int:
        await asyncio.sleep(0.01)
        return 7

    task = asyncio.run(until_disconnect(_receiver(None), work()))
    assert not task.cancelled() and task.result() == 7


def test_a_disconnect_cancels_the_work_and_waits_for_its_cleanup() -> None:
    cleaned = []

    async def work() -> int:
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0)  # cleanup that itself awaits (as a Triton cancel does)
            cleaned.append(True)
        return 1

    task = asyncio.run(until_disconnect(_receiver(0.01), work()))
    assert task.cancelled()
    assert cleaned == [True]


def test_the_work_error_is_kept_for_the_caller() -> None:
    async def work() -> None:
        raise ValueError("upstream broke")

    task = asyncio.run(until_disconnect(_receiver(None), work()))
    with pytest.raises(ValueError, match="upstream broke"):
        task.result()
