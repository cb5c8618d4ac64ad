"""Parses a Prometheus exposition on stdin with the official Python client's parsers and
prints it as JSON: {"families": {name: type}, "samples": [[name, labels, value], ...]}.

Usage: parse_metrics.py prometheus|openmetrics   (run by tests/e2e/test_ops.py with the
interpreter of the ops venv, PVISOR_OPS_PYTHON; a parse error exits non-zero).
"""

import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_prometheus


def main() -> None:
    parse = {"prometheus": parse_prometheus, "openmetrics": parse_openmetrics}[sys.argv[1]]
    families, samples = {}, []
    for fam in parse(sys.stdin.read()):
        families[fam.name] = fam.type
        samples.extend([s.name, s.labels, s.value] for s in fam.samples)
    json.dump({"families": families, "samples": samples}, sys.stdout)


if __name__ == "__main__":
    main()
