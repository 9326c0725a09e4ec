"""A service's Prometheus metrics, read from its ``/metrics`` endpoint."""

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` that carry ``labels``."""
    wanted = set(labels.items())
    return sum(v for (sample, sample_labels), v in samples.items() if sample == name and wanted <= sample_labels)
