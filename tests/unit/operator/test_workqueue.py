"""The reconcile queue keeps controller-runtime's promises: one run per burst, one worker per key, keys side by side,
a failing key backing off (as the server asks, when it asks) without holding up the others."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from mmfleet.workqueue import WorkQueue, serve
from tests.helpers.wait import until


def _fixed(seconds: float) -> WorkQueue[str]:
    return WorkQueue(lambda failures, retry_after: retry_after if retry_after is not None else seconds)


def test_a_key_added_100_times_while_it_runs_runs_once_more_not_100_times() -> None:
    async def main() -> Counter[str]:
        queue = _fixed(1.0)
        runs: Counter[str] = Counter()
        started, release = asyncio.Event(), asyncio.Event()

        async def process(key: str) -> None:
            runs[key] += 1
            if runs[key] == 1:
                started.set()
                await release.wait()

        workers = asyncio.create_task(serve(queue, 4, process))
        queue.add("ml/a")
        await started.wait()
        for _ in range(100):
            queue.add("ml/a")
        assert len(queue) == 0, "a key being processed is not handed to another worker"
        release.set()
        await until(lambda: runs["ml/a"] == 2)
        await asyncio.sleep(0.05)
        queue.shut_down()
        await workers
        return runs

    assert asyncio.run(main()) == Counter({"ml/a": 2})


def test_two_keys_run_in_parallel_and_one_key_never_does() -> None:
    async def main() -> tuple[int, int]:
        queue = _fixed(1.0)
        running: Counter[str] = Counter()
        most_at_once = most_per_key = 0
        both = asyncio.Event()

        async def process(key: str) -> None:
            nonlocal most_at_once, most_per_key
            running[key] += 1
            most_at_once = max(most_at_once, sum(running.values()))
            most_per_key = max(most_per_key, running[key])
            if sum(running.values()) == 2:
                both.set()
            await asyncio.wait_for(both.wait(), 2)
            queue.add(key)  # asks for itself again while running: never a second worker on it
            await asyncio.sleep(0.01)
            running[key] -= 1

        workers = asyncio.create_task(serve(queue, 4, process))
        queue.add("ml/a")
        queue.add("ml/b")
        await asyncio.sleep(0.3)
        queue.shut_down()
        await workers
        return most_at_once, most_per_key

    at_once, per_key = asyncio.run(main())
    assert at_once == 2 and per_key == 1


def test_a_failing_key_backs_off_as_the_server_asks_without_slowing_other_keys() -> None:
    async def main() -> tuple[list[float], dict[str, float]]:
        queue = _fixed(0.05)
        tries: list[float] = []
        done_at: dict[str, float] = {}
        start = time.monotonic()

        async def process(key: str) -> None:
            if key == "ml/failing":
                tries.append(time.monotonic() - start)
                if len(tries) < 3:
                    queue.add_rate_limited(key, retry_after=0.3)  # a 429 with Retry-After: 0.3
                    return
                queue.forget(key)
            done_at[key] = time.monotonic() - start

        workers = asyncio.create_task(serve(queue, 2, process))
        queue.add("ml/failing")
        for name in ("ml/b", "ml/c", "ml/d"):
            queue.add(name)
        await until(lambda: "ml/failing" in done_at)
        queue.shut_down()
        await workers
        return tries, done_at

    tries, done_at = asyncio.run(main())
    assert len(tries) == 3
    assert tries[1] - tries[0] >= 0.29 and tries[2] - tries[1] >= 0.29, f"Retry-After honoured: {tries}"
    assert all(done_at[k] < 0.2 for k in ("ml/b", "ml/c", "ml/d")), f"the others were not held up: {done_at}"


def test_the_backoff_grows_with_failures_and_success_resets_it() -> None:
    async def main() -> list[float]:
        queue: WorkQueue[str] = WorkQueue(lambda failures, retry_after: 5.0 * 2**failures)
        delays = [queue.add_rate_limited("ml/a") for _ in range(3)]
        queue.forget("ml/a")
        delays.append(queue.backoff("ml/a"))
        queue.shut_down()
        return delays

    assert asyncio.run(main()) == [5.0, 10.0, 20.0, 5.0]


def test_of_several_delays_the_earliest_stands_and_a_discarded_key_never_comes() -> None:
    async def main() -> tuple[list[str], float]:
        queue = _fixed(1.0)
        seen: list[str] = []
        start = time.monotonic()
        taken_at = 0.0

        async def process(key: str) -> None:
            nonlocal taken_at
            seen.append(key)
            taken_at = time.monotonic() - start

        workers = asyncio.create_task(serve(queue, 1, process))
        queue.add_after("ml/a", 5.0)
        queue.add_after("ml/a", 0.05)  # earlier: stands
        queue.add_after("ml/a", 3.0)  # later: ignored
        queue.add_after("ml/gone", 0.05)
        queue.discard("ml/gone")
        await asyncio.sleep(0.3)
        assert queue.waiting() == 0
        queue.shut_down()
        await workers
        return seen, taken_at

    seen, taken_at = asyncio.run(main())
    assert seen == ["ml/a"] and taken_at < 0.25


def test_an_error_escaping_a_reconcile_ends_its_turn_not_the_worker() -> None:
    async def main() -> list[str]:
        queue = _fixed(1.0)
        seen: list[str] = []

        async def process(key: str) -> None:
            seen.append(key)
            if key == "ml/bug":
                raise RuntimeError("a bug")

        workers = asyncio.create_task(serve(queue, 1, process))
        queue.add("ml/bug")
        queue.add("ml/next")
        await until(lambda: len(seen) == 2)
        queue.add("ml/bug")  # not stuck as processed
        await until(lambda: len(seen) == 3)
        queue.shut_down()
        await workers
        return seen

    assert asyncio.run(main()) == ["ml/bug", "ml/next", "ml/bug"]
