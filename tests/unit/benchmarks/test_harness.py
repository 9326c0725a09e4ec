import gc
import time
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


def test_a_paused_block_s_cpu_leaves_out_the_collection_after_it():
    gc.collect()
    with collector_paused() as paused:
        started = time.process_time()
        for _ in range(300_000):  # cycles the collection after the block has to walk and free
            pair = [Node()]
            pair.append(pair)
        within = time.process_time() - started
    after = time.process_time() - started
    collection = after - paused.cpu_s
    assert collection > 0.02  # what the block must leave out is not negligible here
    assert within <= paused.cpu_s < within + 0.005
