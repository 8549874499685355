"""The analysis result is a typed structure defined once (``recoverydash.recovery.result``):
what the core returns has exactly its shape, a reader that names a key it does not have fails
the type check, and the readers of ``Analysis.result`` are type-checked clean against it.
"""
from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints, is_typeddict

import pytest
from mypy import api as mypy_api
from scenarios import NAMES as SCENARIOS
from scenarios import load
from test_scenarios import object_checks

from recoverydash.recovery import RunInput, analyze
from recoverydash.recovery.result import AnalysisResult, ClockFields

ROOT = Path(__file__).resolve().parents[2]

#: The modules that read the stored analysis result (or build it): what
#: ``mypy --follow-imports=silent`` must find clean (CONTRIBUTING.md, the type gate). A module
#: that starts reading ``Analysis.result`` annotates the value with AnalysisResult and joins.
READERS = (
    "recoverydash/recovery/result.py",
    "recoverydash/recovery/analysis.py",
    "recoverydash/alerts/rules.py",
    "recoverydash/alerts/settle.py",
    "recoverydash/metrics/collector.py",
    "recoverydash/ingest/read_api.py",
    "recoverydash/dashboard/queries.py",
    "recoverydash/dashboard/charts.py",
    "recoverydash/dashboard/compare.py",
    "recoverydash/runs/models.py",
    "recoverydash/runs/analysis.py",
    "recoverydash/storage/confirm.py",
    "tools/mypy_result_keys.py",  # the plugin that checks .get("key") too
)


def mypy(*args: str) -> tuple[list[str], int]:
    """mypy with the project's configuration (its plugin included) on ``args``: (the lines of
    its report but the note on unused config sections, its exit status)."""
    out, err, status = mypy_api.run(
        ["--config-file", str(ROOT / "pyproject.toml"), "--follow-imports=silent",
         "--no-error-summary", *[str(ROOT / a) if a.endswith(".py") and not a.startswith("/")
                                 else a for a in args]])
    lines = [line for line in (out + err).splitlines() if "unused section(s)" not in line]
    return lines, status


def problems(value: Any, tp: Any, where: str = "result") -> list[str]:
    """How ``value`` departs from the type ``tp`` (TypedDicts checked key by key, recursively;
    lists, dicts, unions, None, str, int, float, bool): one line per departure, [] when it fits.
    Every key of :class:`AnalysisResult` is required here: the core writes them all (the type
    leaves them optional for stored results of older versions)."""
    if tp is Any:
        return []
    if is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, expected {tp.__name__}"]
        hints = get_type_hints(tp)
        required = set(hints) if tp is AnalysisResult else set(tp.__required_keys__)
        out = [f"{where}: no key {k!r}" for k in sorted(required - set(value))]
        out += [f"{where}: key {k!r} not in {tp.__name__}" for k in sorted(set(value) - set(hints))]
        for key in sorted(set(value) & set(hints)):
            out += problems(value[key], hints[key], f"{where}.{key}")
        return out
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        if any(not problems(value, a, where) for a in args):
            return []
        return [f"{where}: {value!r:.80} is none of {tp}"]
    if tp is type(None):
        return [] if value is None else [f"{where}: {value!r:.80}, expected None"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, expected a list"]
        return [p for i, v in enumerate(value) for p in problems(v, args[0], f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, expected a dict"]
        return [p for k, v in value.items()
                for p in problems(k, args[0], f"{where} key") + problems(v, args[1],
                                                                        f"{where}[{k!r}]")]
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, tp)
    return [] if ok else [f"{where}: {value!r:.80}, expected {tp.__name__}"]


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_core_result_has_exactly_the_typed_shape(name, tmp_path):
    events, _ = load(name, tmp_path)
    run = RunInput.from_events(events, object_checks(events))
    result = analyze(run, now=run.first_event_at + 600).to_dict()
    assert problems(result, AnalysisResult) == []
    # the scenarios fill the lists the check walks into
    assert result["restarts"] and result["generations"] and result["strata"]
    assert result["charts"]["committed_cursor"] and result["costs"]["incidents"]


def test_a_run_without_attempts_has_the_typed_shape_too():
    run = RunInput.from_events([], run_id="r0")
    assert problems(analyze(run, now=100.0).to_dict(), AnalysisResult) == []


def test_the_checker_names_a_renamed_key_a_missing_one_and_a_wrong_type(tmp_path):
    events, _ = load(SCENARIOS[0], tmp_path)
    result = analyze(RunInput.from_events(events), now=10.0**10).to_dict()
    broken: Any = dict(result)
    broken["updates_at_rsik"] = broken.pop("updates_at_risk")
    broken["restarts"] = [dict(r, replayed="3") for r in result["restarts"]]
    assert problems(broken, AnalysisResult) == (
        ["result: no key 'updates_at_risk'",
         "result: key 'updates_at_rsik' not in AnalysisResult"]
        + [f"result.restarts[{i}].replayed: '3', expected int"
           for i in range(len(result["restarts"]))])


SNIPPET = '''
from recoverydash.recovery.result import AnalysisResult

def at_risk(result: AnalysisResult) -> object:
    return result.get("updates_at_rsik")

def replayed(result: AnalysisResult) -> int:
    return result["restarts"][-1]["replayd"]

def fine(result: AnalysisResult) -> int:
    return result["restarts"][-1]["replayed"] + result.get("updates_at_risk", 0)
'''


def test_mypy_fails_a_reader_that_misspells_a_key(tmp_path):
    (tmp_path / "reader.py").write_text(SNIPPET)
    report, status = mypy("--cache-dir", str(tmp_path / "cache"), str(tmp_path / "reader.py"))
    errors = [line.split(": error: ")[1] for line in report if ": error: " in line]
    assert status == 1
    assert errors == [
        'TypedDict "AnalysisResult" has no key "updates_at_rsik"  [typeddict-item]',
        'TypedDict "RestartEntry" has no key "replayd"  [typeddict-item]']


def test_the_readers_type_check_clean_against_the_result():
    report, status = mypy(*READERS)
    assert (status, report) == (0, [])


def test_every_reader_of_the_stored_result_is_in_the_type_gate():
    """A module that annotates a value with the result's types is one of :data:`READERS`."""
    users = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "recoverydash").rglob("*.py")
                   if "recovery.result import" in p.read_text() or p.name == "result.py")
    assert set(users) <= set(READERS), set(users) - set(READERS)


def key_paths() -> list[tuple[str, list[str]]]:
    """The keys of ``Analysis.result`` read in SQL (``KeyTransform("k", "result")``,
    ``result__k__k2`` lookups), each as (where, path)."""
    out = []
    for path in sorted((ROOT / "recoverydash").rglob("*.py")):
        if "migrations" in path.parts:
            continue
        text = path.read_text()
        where = path.relative_to(ROOT).as_posix()
        out += [(where, [k]) for k in re.findall(r'KeyTransform\("(\w+)", "result"\)', text)]
        out += [(where, m.split("__")) for m in re.findall(r"\bresult__(\w+)", text)]
    return out


def test_the_keys_read_in_sql_are_keys_of_the_result():
    from recoverydash.dashboard.queries import SMALL_KEYS

    paths = key_paths() + [("dashboard/queries.py SMALL_KEYS", [k]) for k in SMALL_KEYS]
    assert len(paths) >= 12
    unknown = []
    for where, keys in paths:
        tp: Any = AnalysisResult
        for key in keys:
            while get_origin(tp) in (Union, types.UnionType):  # X | None
                tp = next(a for a in get_args(tp) if a is not type(None))
            if key in ("isnull",):  # a lookup, not a key
                break
            hints = get_type_hints(tp) if is_typeddict(tp) else {}
            if key not in hints:
                unknown.append(f"{where}: {'__'.join(keys)}")
                break
            tp = hints[key]
    assert unknown == []


def test_the_stored_clock_is_typed_too(tmp_path):
    from recoverydash.runs.models import clock_of

    events, _ = load(SCENARIOS[0], tmp_path)
    run = RunInput.from_events(events)
    result = analyze(run, now=run.first_event_at + 600).to_dict()
    clock = clock_of(result)
    hints = get_type_hints(ClockFields)
    assert set(clock) <= set(hints)
    assert problems(clock, ClockFields, "clock") == []
