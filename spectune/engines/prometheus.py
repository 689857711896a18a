"""A server's ``/metrics`` page (Prometheus text format) read down to the few numbers spectune keeps.

The page is parsed by ``prometheus_client``'s own text parser (the format's reference implementation in Python,
which vLLM and SGLang use to write it), so escapes, label sets and ``_created`` samples are read as the format
defines them. A counter is summed over its series (one per engine index, model name or finish reason); a gauge
is averaged over them; a sample split by a label keeps one key per value of that label (``name{label="v"}``). A name
the page does not carry is absent from the result, never zero: a server without speculation exports no
speculative counters.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from spectune.errors import SpectuneError


def read_metrics(text: str, engine: str, *, summed: Iterable[str] = (), averaged: Iterable[str] = (),
                 split: Mapping[str, str] | None = None) -> dict[str, float]:
    """The samples named in ``summed`` (summed over their series) and ``averaged`` (mean over their series) of the
    Prometheus ``text``; ``split`` maps a sample name to the label that keeps its series apart. ``engine`` names
    the server in the one-line error a page that is not Prometheus text raises."""
    from prometheus_client.parser import text_string_to_metric_families

    summed, averaged, split = set(summed), set(averaged), dict(split or {})
    values: dict[str, list[float]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in summed | averaged:
                    continue
                key = sample.name
                if sample.name in split:
                    label = split[sample.name]
                    if label not in sample.labels:
                        raise ValueError(f"sample {sample.name} has no label {label!r}")
                    key = f'{sample.name}{{{label}="{sample.labels[label]}"}}'
                values[key].append(float(sample.value))
    except ValueError as err:  # prometheus_client raises ValueError on a malformed line
        raise SpectuneError(f"the /metrics page of engine={engine} is not Prometheus text: "
                            f"{str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    out: dict[str, float] = {}
    for key, found in sorted(values.items()):
        name = key.split("{", 1)[0]
        out[key] = sum(found) if name in summed else sum(found) / len(found)
    return out
