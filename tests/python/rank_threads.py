"""W CPU ranks of one process, one thread each: how the tests run a collective on a CpuFleet."""

import threading


def run_ranks(world, rank_main, timeout=120):
    """rank_main(r) for every rank r on its own thread; fails listing each rank's exception."""
    errors = []

    def run(r):
        try:
            rank_main(r)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((r, e))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not errors, errors
