"""The README's promises: its embedding example runs, and its commands exist."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_readme_embedding_example_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert blocks, "README has no python example"
    code = blocks[0]
    assert len(code.strip().splitlines()) <= 25
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 5
    assert all(line.startswith("succeeded") for line in lines)
    assert lines[3].startswith("succeeded 2 ")  # 3.png failed once and was retried


def test_readme_commands_are_the_contract() -> None:
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[dev]" && trioq demo' in readme
    assert 'pip install -e ".[dev]" && pytest' in readme


@pytest.mark.slow
def test_trioq_demo_runs_kills_the_server_and_loses_nothing() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trioq", "demo", "--jobs", "200"],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kill -9 after" in proc.stdout
    assert re.search(r"jobs acknowledged by the server\s+200\n", proc.stdout)
    assert re.search(r"acknowledged but unfinished \(must be 0\)\s+0\n", proc.stdout)
    assert "every acknowledged job finished" in proc.stdout


def test_testing_guide_shows_the_example_tests_as_they_are() -> None:
    # docs/testing.md quotes examples/test_shop.py (which tests/test_plugin.py runs):
    # every quoted test exists there, and every quoted line is one of its lines.
    guide = (ROOT / "docs" / "testing.md").read_text()
    example = {line.strip() for line in (ROOT / "examples" / "test_shop.py").read_text().splitlines()}
    blocks = [b for b in re.findall(r"```python\n(.*?)```", guide, flags=re.S) if "async def test_" in b]
    assert len(blocks) >= 5
    for block in blocks:
        for name in re.findall(r"async def (test_\w+)", block):
            assert any(line.startswith(f"async def {name}(") for line in example), name
        for line in block.splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "async def ", "@pytest")):
                assert line in example, line


def deploy_files() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted((ROOT / "deploy").iterdir()) if path.is_file()}


def test_deploying_quotes_the_deploy_files_as_they_are() -> None:
    # docs/deploying.md shows each file of deploy/ whole, in a fenced block of its own.
    page = (ROOT / "docs" / "deploying.md").read_text()
    blocks = set(re.findall(r"^```[\w-]*\n(.*?)^```$", page, flags=re.S | re.M))
    files = deploy_files()
    expected = {"Dockerfile", "compose.yaml", "kubernetes.yaml", "trioq-serve.service", "trioq-worker@.service"}
    assert set(files) >= expected
    for name, text in files.items():
        assert text in blocks, f"docs/deploying.md does not quote deploy/{name} as it is"


def first(pattern: str, text: str) -> str:
    found = re.search(pattern, text, flags=re.M | re.S)
    assert found is not None, pattern
    return found.group(1)


def deploy_commands() -> dict[str, list[str]]:
    """Every trioq command line in deploy/, without the leading ``trioq``, by where it is."""
    import shlex

    yaml = pytest.importorskip("yaml")
    files = deploy_files()
    found: dict[str, list[str]] = {}
    dockerfile = files["Dockerfile"]
    assert json.loads(first(r"^ENTRYPOINT (\[.*?\])$", dockerfile)) == ["trioq"]
    found["Dockerfile CMD"] = json.loads(first(r"^CMD (\[.*?\])$", dockerfile))
    for name, service in yaml.safe_load(files["compose.yaml"])["services"].items():
        if service.get("image") == "trioq:local":
            found[f"compose {name}"] = [str(arg) for arg in service["command"]]
    for doc in yaml.safe_load_all(files["kubernetes.yaml"]):
        if doc["kind"] == "Deployment":
            spec = doc["spec"]["template"]["spec"]
            for container in spec.get("initContainers", []) + spec["containers"]:
                found[f"kubernetes {doc['metadata']['name']} {container['name']}"] = container["args"]
    for name in ("trioq-serve.service", "trioq-worker@.service"):
        line = first(r"^ExecStart=(.*?)(?<!\\)$", files[name])
        argv = shlex.split(line.replace("\\\n", " "))
        assert argv[0].endswith("/bin/trioq"), argv
        found[name] = argv[1:]
    return found


def test_deploy_commands_parse_with_the_real_cli() -> None:
    from trioq._app.cli import _parser

    commands = deploy_commands()
    for where, argv in commands.items():
        try:
            _parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{where}: trioq {' '.join(argv)} does not parse")
    kinds = {tuple(argv[:2]) if argv[0] == "pg" else (argv[0],) for argv in commands.values()}
    assert kinds == {("serve",), ("worker",), ("pg", "migrate")}


def test_deploy_supervisors_wait_longer_than_the_shutdown_grace() -> None:
    # SIGKILL must not come before trioq has given running attempts their --shutdown-grace.
    yaml = pytest.importorskip("yaml")
    files = deploy_files()

    def grace(argv: list[str]) -> float:
        return float(argv[argv.index("--shutdown-grace") + 1]) if "--shutdown-grace" in argv else 10.0

    compose = yaml.safe_load(files["compose.yaml"])["services"]
    for name, service in compose.items():
        if service.get("image") == "trioq:local" and service["command"][0] != "pg":
            assert float(service["stop_grace_period"].removesuffix("s")) > grace(service["command"]), name
    for doc in yaml.safe_load_all(files["kubernetes.yaml"]):
        if doc["kind"] == "Deployment":
            spec = doc["spec"]["template"]["spec"]
            for container in spec["containers"]:
                pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
                waited = float(pre_stop[1]) if pre_stop[:1] == ["sleep"] else 0.0
                assert spec["terminationGracePeriodSeconds"] > waited + grace(container["args"]), container["name"]
    commands = deploy_commands()
    for name in ("trioq-serve.service", "trioq-worker@.service"):
        stop = float(first(r"^TimeoutStopSec=(\d+)$", files[name]))
        assert stop > grace(commands[name]), name


def test_benchmarks_page_cites_result_lines_that_exist() -> None:
    # docs/benchmarks.md names the result lines of each table (`core.jsonl:2-3`); a rerun that
    # changes a results file must update the page. Every results file is cited, and each holds JSON.
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    results = ROOT / "benchmarks" / "results"
    lines = {path.name: path.read_text().splitlines() for path in results.glob("*.jsonl")}
    for name, text in lines.items():
        assert name in page, f"docs/benchmarks.md does not cite benchmarks/results/{name}"
        for line in text:
            json.loads(line)
    cited = re.findall(r"`(\w+\.jsonl):(\d+)(?:-(\d+))?`", page)
    assert cited
    for name, first_line, last_line in cited:
        assert name in lines, name
        assert 1 <= int(first_line) <= int(last_line or first_line) <= len(lines[name]), f"{name}:{first_line}"
