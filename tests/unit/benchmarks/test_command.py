import argparse
import sys

import pytest

from steno.benchmarks import command


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(argv)


def test_without_the_bench_extra_the_command_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "httpx", None)  # what a plain install looks like to an import
    with pytest.raises(SystemExit) as exited:
        command.run(parsed("--scenarios", "parser"))
    assert "httpx" in str(exited.value) and "steno[bench]" in str(exited.value)


def test_an_unknown_scenario_is_refused_before_anything_starts():
    with pytest.raises(SystemExit) as exited:
        command.run(parsed("--scenarios", "parser,warp"))
    assert "warp" in str(exited.value)


def test_the_profile_rate_is_a_positive_whole_number(capsys):
    assert parsed("--profile", "--profile-rate", "1000").profile_rate == 1000
    assert parsed().profile_rate == command.SAMPLES_PER_S
    for refused in ("0", "-5", "fast"):
        with pytest.raises(SystemExit):
            parsed("--profile-rate", refused)
    assert "--profile-rate" in capsys.readouterr().err
