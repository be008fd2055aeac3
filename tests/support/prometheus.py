"""Scraping a Prometheus endpoint in tests: every sample of ``/metrics`` by name and labels.

The text is parsed by prometheus_client's own parser (the exposition format Prometheus reads),
so a malformed exposition fails the test.
"""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]


class Scrape(dict[tuple[str, Labels], float]):
    """Samples by (sample name, labels)."""

    def value(self, name: str, **labels: str) -> float | None:
        """The one sample of ``name`` whose labels include ``labels`` (None: there is none)."""
        found = [v for (n, ls), v in self.items() if n == name and set(labels.items()) <= ls]
        assert len(found) <= 1, f"{len(found)} samples of {name} match {labels}"
        return found[0] if found else None

    def names(self) -> set[str]:
        return {n for n, _ in self}


def scrape(url: str) -> Scrape:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    result = Scrape()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            result[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return result
