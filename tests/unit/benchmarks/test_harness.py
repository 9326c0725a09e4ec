import gc
import weakref

from steno.benchmarks.harness import collector_paused


class Node:
    pass


def test_the_load_generator_collects_no_cycles_while_it_measures_and_all_of_them_after():
    gc.collect()
    node = Node()
    node.self = node  # a cycle only the collector frees
    gone = weakref.ref(node)
    with collector_paused():
        assert not gc.isenabled()
        del node
        for _ in range(50_000):  # far past any threshold
            pair = [Node()]
            pair.append(pair)
        assert gone() is not None
    assert gc.isenabled()
    assert gone() is None


def test_a_collector_already_off_stays_off():
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
