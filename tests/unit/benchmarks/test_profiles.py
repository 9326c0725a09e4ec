from steno.benchmarks.profiles import EVERYWHERE, function_of, summarize


def test_a_frame_s_line_is_dropped_so_a_function_s_lines_add_up():
    assert function_of("ParserService._settle (services/parser/service.py:194)") == \
        "ParserService._settle (services/parser/service.py)"
    assert function_of("<module> (<frozen runpy>:88)") == "<module> (<frozen runpy>)"


def test_a_frame_without_a_line_is_kept_as_it_is():
    assert function_of("epoll_wait (libc.so.6)") == "epoll_wait (libc.so.6)"
    assert function_of("bare") == "bare"
    assert function_of("f (a.py:x)") == "f (a.py:x)"


def test_shares_are_of_all_samples_by_function_largest_first():
    profile = summarize([
        "main (m.py:1);loop (m.py:5);parse (p.py:10) 60\n",
        "main (m.py:1);loop (m.py:5);parse (p.py:11) 20\n",
        "main (m.py:1);loop (m.py:6);commit (c.py:3);execute (c.py:9) 15\n",
        "main (m.py:1);loop (m.py:6);commit (c.py:4) 5\n",
    ])
    assert profile.samples == 100
    assert profile.own == [("parse (p.py)", 0.8), ("execute (c.py)", 0.15), ("commit (c.py)", 0.05)]
    assert dict(profile.on_stack) == {"parse (p.py)": 0.8, "commit (c.py)": 0.2, "execute (c.py)": 0.15}


def test_functions_on_the_stack_of_nearly_every_sample_are_left_out():
    profile = summarize(["run (r.py:1);work (w.py:2) 95\n", "other (o.py:1) 5\n"])
    assert all(share < EVERYWHERE for _, share in profile.on_stack)
    assert [function for function, _ in profile.own] == ["work (w.py)", "other (o.py)"]
    assert profile.on_stack == [("other (o.py)", 0.05)]


def test_a_recursing_function_counts_once_per_sample():
    profile = summarize(["walk (t.py:3);walk (t.py:4);walk (t.py:4) 3\n", "idle (i.py:1) 7\n"])
    assert dict(profile.on_stack)["walk (t.py)"] == 0.3


def test_lines_that_are_not_a_stack_and_a_count_are_skipped():
    profile = summarize(["\n", "no count here\n", " 12\n", "f (a.py:1) 4\n"])
    assert profile.samples == 4 and profile.own == [("f (a.py)", 1.0)]


def test_no_samples_make_an_empty_profile():
    profile = summarize([])
    assert (profile.samples, profile.own, profile.on_stack) == (0, [], [])


def test_the_lists_are_cut_at_their_lengths():
    profile = summarize([f"f{i} (a.py:{i}) {i + 1}\n" for i in range(40)], top_own=3, top_on_stack=4)
    assert [function for function, _ in profile.own] == ["f39 (a.py)", "f38 (a.py)", "f37 (a.py)"]
    assert len(profile.on_stack) == 4


def test_entry_points_are_left_out_though_other_threads_lack_them():
    profile = summarize(["main (m.py:1);loop (m.py:2);serve (s.py:3) 50\n",
                         "main (m.py:1);loop (m.py:2);log (l.py:4) 20\n",
                         "worker_thread (t.py:1);flush (t.py:9) 30\n"])
    assert dict(profile.on_stack) == {"serve (s.py)": 0.5, "flush (t.py)": 0.3, "worker_thread (t.py)": 0.3,
                                      "log (l.py)": 0.2}
