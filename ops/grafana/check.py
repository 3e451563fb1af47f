#!/usr/bin/env python3
"""Checks the Grafana dashboard in this folder without Grafana and without network.

- Its shape: a title and uid, the `datasource` variable every panel and query uses (so the
  dashboard imports into any Grafana with a Prometheus data source), unique panel ids, panels
  on the 24-column grid without overlapping, a unit and at least one query per graph, unique
  query ids within a panel.
- Every query is PromQL that Prometheus parses: each becomes a recording rule of a throwaway
  rules file (Grafana's `$__rate_interval` read as 5m) that `promtool check rules` checks.

Which series the queries name is checked against a running process's /metrics by the test
suite (tests/it/ops_files.rs). Exit status 0 when all holds; each problem is printed.
"""
import json
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
DASHBOARD = HERE / "aptix-dashboard.json"

problems = []


def problem(what):
    problems.append(what)
    print(f"{DASHBOARD.name}: {what}")


dash = json.loads(DASHBOARD.read_text())
for key in ("title", "uid", "panels", "schemaVersion"):
    if key not in dash:
        problem(f"no {key}")
variables = [v.get("name") for v in dash.get("templating", {}).get("list", [])]
if "datasource" not in variables:
    problem("no `datasource` variable")

ids = set()
cells = {}
queries = []
for panel in dash.get("panels", []):
    title = panel.get("title", "?")
    pid = panel.get("id")
    if pid in ids:
        problem(f"panel id {pid} used twice ({title})")
    ids.add(pid)
    grid = panel.get("gridPos", {})
    x, y, w, h = (grid.get(k) for k in ("x", "y", "w", "h"))
    if None in (x, y, w, h) or x < 0 or w <= 0 or h <= 0 or x + w > 24:
        problem(f"{title}: gridPos {grid} is not on the 24-column grid")
        continue
    for cx in range(x, x + w):
        for cy in range(y, y + h):
            if (cx, cy) in cells:
                problem(f"{title} overlaps {cells[(cx, cy)]}")
                break
            cells[(cx, cy)] = title
    if panel.get("type") == "row":
        continue
    if panel.get("datasource", {}).get("uid") != "${datasource}":
        problem(f"{title}: does not use the datasource variable")
    if not panel.get("fieldConfig", {}).get("defaults", {}).get("unit"):
        problem(f"{title}: no unit")
    targets = panel.get("targets", [])
    if not targets:
        problem(f"{title}: no query")
    refs = [t.get("refId") for t in targets]
    if len(set(refs)) != len(refs):
        problem(f"{title}: query ids {refs} repeat")
    for t in targets:
        if t.get("datasource", {}).get("uid") != "${datasource}":
            problem(f"{title} {t.get('refId')}: does not use the datasource variable")
        expr = t.get("expr", "")
        if "aptix_" not in expr:
            problem(f"{title} {t.get('refId')}: names no aptix series: {expr!r}")
        queries.append((title, expr.replace("$__rate_interval", "5m")))

rules = {
    "groups": [
        {
            "name": "dashboard",
            "rules": [
                {"record": f"dashboard:query{i}", "expr": expr}
                for i, (_, expr) in enumerate(queries)
            ],
        }
    ]
}
with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
    json.dump(rules, f)  # JSON is YAML
    path = f.name
checked = subprocess.run(["promtool", "check", "rules", path], capture_output=True, text=True)
pathlib.Path(path).unlink()
if checked.returncode != 0:
    problem("promtool refuses a query:\n" + checked.stdout + checked.stderr)

if problems:
    sys.exit(1)
print(f"{DASHBOARD.name}: {len(queries)} queries in {len(ids)} panels hold")
