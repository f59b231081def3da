"""`pdsim.plan`'s plan-file helpers and the runner's small helpers worked by hand (tests/MUTANTS.md,
branch mutcfg): `load_plan` (read, --set overrides, the file and folder it names), the search space's
pool entries (`_pool`, `_pp`, `_pp_name`, `_device`), the plan's key vocabulary for did-you-mean
(`_plan_vocabulary`), the duplicate-name check (`_unique_names`), and `_Runner`'s `__init__`, `_task`
(the task dict a simulation is run from) and its result cache (`_path`, `_load`, `_store`).

No simulation runs here: every value is written out from the plan in the test and the rules in
pdsim/plan.py (a pool entry is the plan's `search.pool`, then the device's name, then the keys the
search space sets, then the device's price if it has one; a pipeline depth of 1 adds no key and no
name part; a task's window at scale k is k x the search window's requests).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import pdsim.plan as plan_mod
from pdsim.config import SLOSpec
from pdsim.errors import ConfigError
from pdsim.plan import (Config, DeviceChoice, _device, _plan_vocabulary, _pool, _pp, _pp_name, _Runner,
                        _unique_names, load_plan, parse_plan, task_key)

COST = {"kind": "constant", "step_s": 0.1}
WORKLOAD = {"arrival": "poisson", "num_requests": 100, "prompt_tokens": 8, "output_tokens": 1}


def _raw(devices=None, colocated=None, goodput=None, **top):
    """A small plan: llama-3.1-8b at constant cost, 100-request windows (seed 7), SLO 0.5 s / 0.05 s."""
    raw = {"name": "hand", "model": "llama-3.1-8b", "seed": 7, "workload": dict(WORKLOAD),
           "slo": {"ttft_s": 0.5, "tpot_s": 0.05},
           "search": {"devices": devices or [{"name": "h100-sxm", "price_per_hour_usd": 1.0}],
                      "colocated": colocated or {"replicas": [1]},
                      "pool": {"max_running": 4, "kv_blocks": 1000, "cost_model": dict(COST)}},
           "goodput": {"min_duration_s": 0, "seeds": 1, **(goodput or {})}}
    raw.update(top)
    return raw


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- load_plan -------------------------------------------------------------------------------------

PLAN_YAML = """\
name: hand
model: llama-3.1-8b
seed: 7
workload: {arrival: poisson, num_requests: 100, prompt_tokens: 8, output_tokens: 1}
slo: {ttft_s: 0.5, tpot_s: 0.05}
search:
  devices: [{name: h100-sxm, price_per_hour_usd: 1.0}]
  colocated: {replicas: [1, 2]}
  pool: {max_running: 4, kv_blocks: 1000, cost_model: {kind: constant, step_s: 0.1}}
goodput: {min_duration_s: 0, seeds: 1}
"""


def test_load_plan_reads_the_file_and_names_it_and_its_folder(tmp_path):
    path = _write(tmp_path / "plans" / "p.yaml", PLAN_YAML)
    for given in (path, str(path)):                  # a Path or a str
        plan = load_plan(given)
        assert plan.file == str(path)
        assert plan.base_dir == tmp_path / "plans"    # the file's folder, not the working directory
        assert plan.spec.name == "hand" and plan.spec.seed == 7
        # replicas 1 and 2 at $1/GPU-h: the cheaper first
        assert [(c.name, c.gpus, c.usd_per_hour) for c in plan.configs] == [
            ("colo-h100-sxm-tp1x1", 1, 1.0), ("colo-h100-sxm-tp1x2", 2, 2.0)]


def test_load_plan_applies_the_overrides(tmp_path):
    path = _write(tmp_path / "p.yaml", PLAN_YAML)
    plan = load_plan(path, ["seed=11", "search.colocated.replicas=[3]", "goodput.seeds=2"])
    assert plan.spec.seed == 11 and plan.spec.goodput.seeds == 2
    assert [(c.name, c.gpus, c.usd_per_hour) for c in plan.configs] == [("colo-h100-sxm-tp1x3", 3, 3.0)]
    # no overrides (None or []): the file as written
    assert load_plan(path, None).spec.seed == 7
    assert load_plan(path, []).spec.seed == 7


def test_load_plan_names_the_file_in_its_errors(tmp_path):
    path = _write(tmp_path / "p.yaml", PLAN_YAML)
    # a --set below a non-mapping (name is a string): apply_overrides' error, naming the plan file
    with pytest.raises(ConfigError) as e:
        load_plan(path, ["name.x=1"])
    assert (e.value.file, e.value.key) == (str(path), "name.x")
    assert str(e.value) == f"{path}: name.x: cannot set a key below a non-mapping"
    # a bad value: parse_plan's validation error, naming the plan file
    with pytest.raises(ConfigError) as e:
        load_plan(path, ["goodput.seeds=0"])
    assert e.value.file == str(path) and e.value.key == "goodput.seeds"


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", ""])
def test_load_plan_refuses_a_file_that_is_not_a_mapping(tmp_path, text):
    path = _write(tmp_path / "p.yaml", text)        # a list, a string, an empty file (None)
    with pytest.raises(ConfigError) as e:
        load_plan(path)
    assert (e.value.file, e.value.key, e.value.reason) == (str(path), None, "a plan must be a YAML mapping")
    assert str(e.value) == f"{path}: a plan must be a YAML mapping"


# --- the search space's pool entries -----------------------------------------------------------------

def test_device_choice_from_a_name_or_as_given():
    d = _device("h100-sxm")
    assert isinstance(d, DeviceChoice) and (d.name, d.price_per_hour_usd) == ("h100-sxm", None)
    given = DeviceChoice(name="b200", price_per_hour_usd=6.5)
    assert _device(given) is given                   # the choice itself, its price kept


def test_pool_entry_is_the_plan_pool_then_device_then_keys_then_price():
    plan = parse_plan(_raw())
    priced = DeviceChoice(name="h100-sxm", price_per_hour_usd=2.5)
    assert _pool(plan, priced, tp=2, instances=3) == {
        "max_running": 4, "kv_blocks": 1000, "cost_model": COST, "device": "h100-sxm", "tp": 2, "instances": 3,
        "price_per_gpu_hour_usd": 2.5}
    # no price: no price key (the preset's own price applies); a price of 0 is a price
    assert _pool(plan, DeviceChoice(name="a100-80gb-sxm"), tp=1) == {
        "max_running": 4, "kv_blocks": 1000, "cost_model": COST, "device": "a100-80gb-sxm", "tp": 1}
    assert _pool(plan, DeviceChoice(name="h100-sxm", price_per_hour_usd=0.0))["price_per_gpu_hour_usd"] == 0.0
    # the search space's keys win over the plan's pool
    assert _pool(plan, priced, max_running=8)["max_running"] == 8


def test_pipeline_depth_key_and_name_part():
    assert _pp(1) == {} and _pp_name(1) == ""      # depth 1: no key, no name part (names as before pp)
    assert _pp(2) == {"pp": 2} and _pp_name(2) == "pp2"
    assert _pp(4) == {"pp": 4} and _pp_name(4) == "pp4"


def test_enumerated_configs_carry_the_pool_entries_by_hand():
    # two devices (h100 at $1.5/GPU-h, a100 with no price: the preset's, $0), TP 1, PP 1 and 2
    plan = parse_plan(_raw(devices=[{"name": "h100-sxm", "price_per_hour_usd": 1.5}, "a100-80gb-sxm"],
                           colocated={"replicas": [1], "pp": [1, 2]}))
    pool = {"max_running": 4, "kv_blocks": 1000, "cost_model": COST}
    got = {c.name: (c.topology, c.gpus, c.usd_per_hour) for c in plan.configs}
    assert got == {
        "colo-h100-sxm-tp1x1": ({"kind": "colocated", "replicas": 1, **pool, "device": "h100-sxm", "tp": 1,
                                 "price_per_gpu_hour_usd": 1.5}, 1, 1.5),
        "colo-h100-sxm-tp1pp2x1": ({"kind": "colocated", "replicas": 1, **pool, "device": "h100-sxm", "tp": 1,
                                    "pp": 2, "price_per_gpu_hour_usd": 1.5}, 2, 3.0),
        "colo-a100-80gb-sxm-tp1x1": ({"kind": "colocated", "replicas": 1, **pool, "device": "a100-80gb-sxm",
                                      "tp": 1}, 1, 0.0),
        "colo-a100-80gb-sxm-tp1pp2x1": ({"kind": "colocated", "replicas": 1, **pool, "device": "a100-80gb-sxm",
                                         "tp": 1, "pp": 2}, 2, 0.0)}


# --- the vocabulary and the names ----------------------------------------------------------------------

def test_plan_vocabulary_holds_the_scenario_keys_and_every_plan_sections_keys():
    v = _plan_vocabulary()
    assert isinstance(v, set)
    # a scenario key, and one key only each plan section has
    for key in ("kv_blocks", "arrival", "price_per_hour_usd", "chunked_prefill", "decode_devices", "pool",
                "max_usd_per_hour", "rate", "confirm_top", "objective"):
        assert key in v, key
    # so a misspelt plan key gets a did-you-mean from the plan's own keys
    with pytest.raises(ConfigError) as e:
        parse_plan(_raw(goodput={"confirm_tpo": 1}), "p.yaml")
    assert str(e.value) == "p.yaml: goodput.confirm_tpo: unknown key; did you mean 'confirm_top'?"


DUP = ("two configurations of the search space are both named {}: device choices must differ in name (a preset "
       "listed twice, e.g. at two prices, or two profiles with the same file name); copy the profile to a file "
       "of another name")


def test_unique_names_refuses_the_first_repeated_name():
    plan = parse_plan(_raw(), "p.yaml")
    _unique_names(plan, ["a", "b", "c"])              # all different: nothing raised
    _unique_names(plan, [])
    with pytest.raises(ConfigError) as e:
        _unique_names(plan, ["a", "b", "c", "b", "a"])
    assert (e.value.file, e.value.key, e.value.reason) == ("p.yaml", "search.devices", DUP.format("b"))
    assert str(e.value) == "p.yaml: search.devices: " + DUP.format("b")


def test_a_preset_listed_twice_at_two_prices_is_refused():
    raw = _raw(devices=[{"name": "h100-sxm", "price_per_hour_usd": 1.0},
                        {"name": "h100-sxm", "price_per_hour_usd": 2.0}])
    with pytest.raises(ConfigError) as e:
        parse_plan(raw, "p.yaml")
    assert str(e.value) == "p.yaml: search.devices: " + DUP.format("colo-h100-sxm-tp1x1")


# --- _Runner's small helpers ---------------------------------------------------------------------------

def _runner(cache_dir=None, progress=False, executor=None, **goodput):
    return _Runner(parse_plan(_raw(goodput=goodput), "p.yaml"), executor, cache_dir, progress)


def test_runner_starts_with_nothing_counted(monkeypatch):
    monkeypatch.setattr(plan_mod.time, "perf_counter", lambda: 1234.5)
    ex = object()
    plan = parse_plan(_raw(), "p.yaml")
    r = _Runner(plan, ex, None, True)
    assert (r.plan, r.ex, r.cache_dir, r.progress) == (plan, ex, None, True)
    assert (r.simulated, r.cached, r.requests_total, r.requests_settled) == (0, 0, 0, 0)
    assert r.skipped == {"worst_seed": 0, "early_stop_pass": 0, "early_stop_fail": 0}
    assert r.t0 == 1234.5                               # the log's clock starts here


@pytest.mark.parametrize("early_stop, aggregate, early", [(True, "worst_seed", "both"), (False, "worst_seed", None),
                                                          (True, "pooled", None), (False, "pooled", None)])
def test_runner_stops_early_only_for_worst_seed(early_stop, aggregate, early):
    # pooled sums need exact counts: early stop only with aggregate worst_seed
    assert _runner(early_stop=early_stop, aggregate=aggregate).early == early


def test_runner_makes_its_cache_folder_and_takes_an_existing_one(tmp_path):
    deep = tmp_path / "a" / "b" / "cache"             # two missing parents
    r = _runner(deep)
    assert deep.is_dir() and r.cache_dir == deep
    _runner(deep)                                     # there already: fine
    assert deep.is_dir()


def _cfg(slo=None):
    return Config("A", {"kind": "colocated", "replicas": 1, "max_running": 4, "kv_blocks": 1000, "cost_model": COST,
                        "device": "h100-sxm", "tp": 1}, 1, 1.0, slo=slo)


def test_task_is_the_scenario_at_a_rate_and_seed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = parse_plan(_raw(goodput={"warmup_fraction": 0.3}), "p.yaml", base_dir="sub")
    r = _Runner(plan, None, None, False)
    t = r._task(_cfg(), 2.5, 9)
    # rate 2.5 x min_duration_s 0 adds no requests: the plan's 100; early stop not asked
    assert t == {"scenario": {"name": "hand", "seed": 9, "model": "llama-3.1-8b", "weight_dtype": "bf16",
                              "kv_dtype": "bf16", "workload": {**WORKLOAD, "rate": 2.5},
                              "slo": {"mode": "attainment", "ttft_s": 0.5, "tpot_s": 0.05, "ttft_percentile": 90,
                                      "tpot_percentile": 90, "attainment_target": 0.9},
                              "topologies": {"A": _cfg().topology}},
                 "file": "p.yaml", "base_dir": str(tmp_path / "sub"),    # resolved against the working dir
                 "warmup_fraction": 0.3, "early": None}
    # a long run at 10 x the window (1000 requests), asked to stop early
    t = r._task(_cfg(), 4.0, 1007, scale=10.0, early="both")
    assert t["scenario"]["workload"] == {**WORKLOAD, "num_requests": 1000, "rate": 4.0}
    assert t["scenario"]["seed"] == 1007 and t["early"] == "both"


def test_task_judges_at_the_configs_own_slo():
    r = _runner()
    tight = SLOSpec(ttft_s=0.25, tpot_s=0.02, attainment_target=0.9)     # e.g. bounds over an error margin
    sc = r._task(_cfg(tight), 1.0, 7)["scenario"]
    assert sc["slo"] == {"mode": "attainment", "ttft_s": 0.25, "tpot_s": 0.02, "ttft_percentile": 90,
                         "tpot_percentile": 90, "attainment_target": 0.9}
    assert r._task(_cfg(), 1.0, 7)["scenario"]["slo"]["ttft_s"] == 0.5     # none: the plan's


def test_cache_path_store_and_load(tmp_path):
    r = _runner(tmp_path)
    t1, t2 = r._task(_cfg(), 1.0, 7), r._task(_cfg(), 2.0, 7)
    p1 = r._path(t1)
    assert p1 == tmp_path / f"{task_key(t1)}.json"
    assert len(p1.stem) == 24 and p1.suffix == ".json"   # 24 hex digits of a sha256
    assert r._path(t2) != p1                              # another rate, another file
    assert r._load(t1) is None                            # nothing stored yet
    r._store(t1, {"ok": 90, "n": 100, "early": None})
    assert p1.read_text() == '{"ok": 90, "n": 100, "early": null}'
    assert r._load(t1) == {"ok": 90, "n": 100, "early": None}
    assert r._load(t2) is None
    assert sorted(tmp_path.iterdir()) == [p1]


def test_cache_reads_a_damaged_entry_as_missing(tmp_path, monkeypatch):
    r = _runner(tmp_path)
    t = r._task(_cfg(), 1.0, 7)
    p = r._path(t)
    p.write_text('{"ok": 9')                              # cut short (a killed writer): ValueError
    assert r._load(t) is None
    p.write_bytes(b"\xff\xfe")                            # not UTF-8: ValueError too
    assert r._load(t) is None
    p.write_text('{"ok": 9}')
    def unreadable(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))
    monkeypatch.setattr(Path, "read_text", unreadable)
    assert r._load(t) is None                             # unreadable: OSError


def test_a_folder_in_the_cache_is_not_an_entry(tmp_path):
    r = _runner(tmp_path)
    t = r._task(_cfg(), 1.0, 7)
    r._path(t).mkdir()
    assert r._load(t) is None


def test_without_a_cache_nothing_is_stored_or_loaded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = _runner(None)
    t = r._task(_cfg(), 1.0, 7)
    assert r._path(t) is None
    r._store(t, {"ok": 1})
    assert r._load(t) is None
    assert list(tmp_path.iterdir()) == []
