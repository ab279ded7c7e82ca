"""Trial plans: where no plan meets the deadline's risk limit, the planner starts the cheapest plan whose band
reaches the deadline, and the operator keeps it, moves it, lets it measure on or stops it as its speed is
measured."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from correction_helpers import CATALOG, CFG, SPEC, T0
from gpuscaler.api import AtRiskLimit, TrainingJobSpec
from gpuscaler.api.status import Phase
from gpuscaler.cli import plan_to_dict, render_plan
from gpuscaler.controller.policy import gated_plan
from gpuscaler.names import ConditionType
from gpuscaler.observe.controller import Observer
from gpuscaler.planner import decisions, plan, remaining_spec, trial
from gpuscaler.planner.binding import PROBABLY_MEETS, Kind
from gpuscaler.planner.correction import MEASURED_LOG_SIGMA_FLOOR, CorrectionConfig
from gpuscaler.planner.evaluate import STARTUP_S
from gpuscaler.runtime import constants as rc
from loop_harness import World, make_job

CAT = CATALOG
RESNET: dict[str, Any] = {"workload": {"model": "resnet50"}, "globalBatch": 1024, "training": {"epochs": 10},
                          "constraints": {"spot": "never"}}  # fmt: skip
TIGHT_H = 0.22
"""Ten ResNet-50 epochs on-demand in 0.22 h: the likeliest plan's P(miss) is about 17% (test_binding.py)."""


def spec(**constraints: Any) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({**RESNET, "constraints": {**RESNET["constraints"], **constraints}})


def test_where_no_plan_meets_the_risk_the_cheapest_plan_whose_band_reaches_the_deadline_is_tried() -> None:
    r = plan(spec(), CAT, deadline_h=TIGHT_H)
    assert r.trial and r.chosen is not None and r.ok
    # the refusal it stands in for is still said: the binding rule and the closest plans
    assert r.binding is not None and r.binding.kind is Kind.RISK and r.closest
    p = r.chosen.outlook.deadline_miss_probability
    assert 0.05 < p < trial.PLAUSIBLY_MEETS
    near = [c for c in r.pareto if c.outlook.deadline_miss_probability < trial.PLAUSIBLY_MEETS]
    assert r.chosen.expected_cost_usd == min(c.expected_cost_usd for c in near)
    # the likeliest plan is not the one tried: it costs more
    assert r.closest[0].plan.expected_cost_usd > r.chosen.expected_cost_usd
    assert r.why.startswith("trial: no plan meets maxDeadlineRisk 5.0%") and f"P(miss) {p:.1%}" in r.why
    assert "the cheapest below 90% (the deadline inside its band)" in r.why
    cost = trial.window_cost_usd(r.chosen, STARTUP_S)
    assert f"(${cost:,.2f})" in r.why and cost == pytest.approx(r.chosen.usd_per_hour * trial.window_s(STARTUP_S) / 3600)


def test_refuse_keeps_the_refusal_and_a_deadline_outside_every_band_is_never_tried() -> None:
    refused = plan(spec(atRiskLimit="Refuse"), CAT, deadline_h=TIGHT_H)
    assert refused.chosen is None and not refused.trial and refused.binding is not None
    assert refused.binding.kind is Kind.RISK
    late = plan(spec(), CAT, deadline_h=0.1)  # every plan's band is slower than the deadline
    assert late.chosen is None and not late.trial and late.binding is not None and late.binding.kind is Kind.TIME
    assert min(c.outlook.deadline_miss_probability for c in late.pareto) >= trial.PLAUSIBLY_MEETS


def test_where_time_binds_a_plan_whose_band_reaches_the_deadline_is_tried() -> None:
    """Every plan more likely to miss than not (time binds), but the deadline is inside some bands: the
    model cannot tell that they miss, so the cheapest of them is measured rather than refused."""
    hours = next(h for h in (0.18, 0.17, 0.16, 0.15, 0.14, 0.13, 0.12)
                 if (r := plan(spec(atRiskLimit="Refuse"), CAT, deadline_h=h)).binding is not None
                 and r.binding.kind is Kind.TIME
                 and any(c.outlook.deadline_miss_probability < trial.PLAUSIBLY_MEETS for c in r.pareto))  # fmt: skip
    r = plan(spec(), CAT, deadline_h=hours)
    assert r.trial and r.chosen is not None and r.binding is not None and r.binding.kind is Kind.TIME
    assert PROBABLY_MEETS <= r.chosen.outlook.deadline_miss_probability < trial.PLAUSIBLY_MEETS
    # the answer still says what binds: time, so "extend the deadline" stays in the text
    assert "Trial: " in render_plan(r) and "extend the deadline" in render_plan(r).lower()


def test_the_verdict_keeps_moves_continues_or_stops() -> None:
    assert trial.verdict(0.04, 0.05, can_move=True) is trial.Verdict.KEEP
    assert trial.verdict(0.3, 0.05, can_move=True) is trial.Verdict.MOVE
    assert trial.verdict(0.3, 0.05, can_move=False) is trial.Verdict.CONTINUE
    assert trial.verdict(PROBABLY_MEETS, 0.05, can_move=False) is trial.Verdict.STOP
    assert trial.verdict(0.99, 0.05, can_move=True) is trial.Verdict.MOVE


def test_the_rest_of_a_running_job_is_never_a_trial() -> None:
    whole = plan(spec(), CAT, deadline_h=TIGHT_H)
    assert whole.trial
    rest = remaining_spec(spec(), whole.job.total_samples, 0.0)
    assert rest.constraints.at_risk_limit is AtRiskLimit.REFUSE
    assert plan(rest, CAT, deadline_h=TIGHT_H).chosen is None


def test_window_is_start_up_warm_up_and_the_least_measuring_window() -> None:
    cfg = CorrectionConfig(warmup_s=100, min_window_s=50)
    assert trial.window_s(300, cfg) == 450
    assert trial.window_s(STARTUP_S) == STARTUP_S + CorrectionConfig().warmup_s + CorrectionConfig().min_window_s


def test_json_and_text_say_it_is_a_trial() -> None:
    r = plan(spec(), CAT, deadline_h=TIGHT_H)
    d = json.loads(json.dumps(plan_to_dict(r)))
    assert d["trial"] is True and d["feasible"] is True and d["binding"]["kind"] == "risk"
    assert d["chosen"]["instanceType"] == r.chosen.instance.name  # type: ignore[union-attr]
    text = render_plan(r)
    assert text.splitlines()[2].startswith("Trial: ") and "the risk limit binds" in text
    assert plan_to_dict(plan(spec(), CAT, deadline_h=24.0))["trial"] is False


# ------------------------------------------------------------------------------ in the reconcile loop

TRIAL_RISK = 0.01
"""At 2.7 h the A10G plan's P(miss) is about 4% and the V100 plan's about 2%: nothing meets 1%."""


def _trial_world(instances: tuple[str, ...] = ()) -> tuple[World, dict[str, Any], list[str]]:
    node = {"instance_type": "g5.xlarge", "capacity_type": "on-demand", "ready": "True", "created": T0}
    w = World(planner=functools.partial(gated_plan, catalog=CATALOG), pod_phase="Running", node=node)
    w.loop.observer = Observer(None, CFG, CATALOG)
    body = SPEC.model_dump(by_alias=True, exclude_none=True)
    body["constraints"]["maxDeadlineRisk"] = TRIAL_RISK
    if instances:
        body["constraints"]["instanceTypes"] = list(instances)
    job = make_job(body, maxDuration="2.7h", checkpoint={"intervalSeconds": 1800, "restartSeconds": 30, "writeSeconds": 0.1})
    seen = w.run_to(job, Phase.RUNNING)
    return w, job, seen


def _measure(w: World, job: dict[str, Any], rate: float, until: str) -> list[str]:
    seen: list[str] = []
    for t in range(5, 401, 5):
        w.annotate(**{rc.ANNOTATION_PROGRESS_SAMPLES: f"{rate * t:.0f}", rc.ANNOTATION_CHECKPOINT_STEP: "40"})
        seen += w.step(job, 5)
        if until in seen:
            return seen
    raise AssertionError(f"no {until}: {seen}; {w.status.observed}")


def test_a_trial_measured_on_time_is_kept() -> None:
    w, job, seen = _trial_world()
    st = w.status
    assert st.plan is not None and st.plan.trial and st.plan.instance_type == "g5.xlarge"
    assert "Trial" in seen and "Planned" not in seen
    planned = next(c for c in st.conditions if c.type == ConditionType.PLANNED)
    assert planned.reason == "Trial"
    _measure(w, job, st.plan.throughput, "TrialKept")
    st = w.status
    assert st.plan is not None and st.phase is Phase.RUNNING and not st.plan.trial and st.plan.instance_type == "g5.xlarge"
    kept = next(e for e in w.events if e.reason == "TrialKept")
    assert "<= maxDeadlineRisk 1.0%" in kept.message
    planned = next(c for c in st.conditions if c.type == ConditionType.PLANNED)
    assert planned.status == "True" and planned.reason == "TrialKept" and "trial kept: measured" in planned.message


def test_a_trial_measured_too_slow_goes_on_to_a_next_trial_on_a_gpu_type_not_tried() -> None:
    """g5.xlarge measured 30% slow would probably miss; p3.2xlarge (V100) has the deadline inside its band, so
    the job moves there, from the checkpoint it asks for, as the next trial, rather than stopping."""
    w, job, _ = _trial_world()
    st = w.status
    assert st.plan is not None and st.plan.trial and st.plan.instance_type == "g5.xlarge"
    slow = 0.7 * st.plan.throughput
    for t in range(5, 401, 5):
        w.annotate(**{rc.ANNOTATION_PROGRESS_SAMPLES: f"{slow * t:.0f}", rc.ANNOTATION_CHECKPOINT_STEP: "40"})
        w.step(job, 5)
        obs = w.status.observed
        if obs is not None and obs.replan_pending:
            break
    else:
        raise AssertionError(f"the trial never ended: {w.status.observed}")
    assert obs.next_trial_pending and not obs.stop_pending and obs.tried_gpu_types == ["A10G"], obs
    assert "a next trial on a GPU type not tried yet (A10G tried): 1 x p3.2xlarge" in obs.replan_reason
    asked = [(p["metadata"].get("annotations") or {}).get(rc.ANNOTATION_CHECKPOINT_REQUESTED) for p in w.workers.pods()]
    assert asked and all(asked), asked
    w.annotate(**{rc.ANNOTATION_CHECKPOINT_STEP: "41"})
    seen = w.step(job, 5)
    assert "Replanned" in seen and "DeadlineInfeasible" not in seen, seen
    st = w.status
    assert st.phase is Phase.RECOVERING and st.plan is not None and st.plan.instance_type == "p3.2xlarge"
    assert st.plan.trial, "the next plan is a trial too: judged by its own measurement"


def test_a_trial_measured_too_slow_with_no_plan_that_meets_the_risk_stops_at_a_checkpoint() -> None:
    w, job, _ = _trial_world(instances=("g5.xlarge",))  # no other GPU type for a next trial
    st = w.status
    assert st.plan is not None and st.plan.trial
    slow = 0.7 * st.plan.throughput
    for t in range(5, 401, 5):
        w.annotate(**{rc.ANNOTATION_PROGRESS_SAMPLES: f"{slow * t:.0f}", rc.ANNOTATION_CHECKPOINT_STEP: "40"})
        assert "DeadlineInfeasible" not in w.step(job, 5)
        assert w.status.observed is None or not w.status.observed.next_trial_pending
        if w.status.observed is not None and w.status.observed.stop_pending:
            break
    else:
        raise AssertionError(f"the trial never ended: {w.status.observed}")
    # it stops from a checkpoint it asks the workers for now, as a move for the deadline does
    asked = [(p["metadata"].get("annotations") or {}).get(rc.ANNOTATION_CHECKPOINT_REQUESTED) for p in w.workers.pods()]
    assert asked and all(asked), asked
    assert w.status.phase is Phase.RUNNING and not w.workers.deleted
    w.annotate(**{rc.ANNOTATION_PROGRESS_SAMPLES: f"{slow * (t + 5):.0f}"})
    assert "DeadlineInfeasible" not in w.step(job, 5)  # no newer checkpoint yet
    w.annotate(**{rc.ANNOTATION_CHECKPOINT_STEP: "41"})
    assert "DeadlineInfeasible" in w.step(job, 5)
    st = w.status
    assert st.phase is Phase.FAILED and st.completion_time is not None
    failed = next(c for c in st.conditions if c.type == ConditionType.FAILED)
    assert failed.status == "True" and failed.reason == "DeadlineInfeasible"
    assert "trial ended: measured" in failed.message and "no plan meets the limit under the corrected model" in failed.message
    assert "(the deadline would probably be missed" in failed.message
    assert "the rest takes " in failed.message and " h are left" in failed.message
    assert "To go on, extend the deadline" in failed.message and failed.message.endswith("stopped at checkpoint step 41")
    # the gang is stopped: its workers go (SIGTERM: the runtime checkpoints) and its nodes are released
    assert w.workers.deleted and w.provider.released


def test_a_trial_measured_on_time_but_not_yet_within_the_limit_measures_on_and_is_kept_later() -> None:
    """Measured 10% slow: the deadline would probably be met but P(miss) is over the 1% limit; stopping would
    make the miss certain, so it runs on, said once, and is kept when the measurement brings it within."""
    w, job, _ = _trial_world()
    st = w.status
    assert st.plan is not None and st.plan.trial
    rate = 0.9 * st.plan.throughput  # within the hysteresis (15%): the trial is judged by what it measured
    seen: list[str] = []
    continued_at = None
    for t in range(5, 401, 5):
        w.annotate(**{rc.ANNOTATION_PROGRESS_SAMPLES: f"{rate * t:.0f}", rc.ANNOTATION_CHECKPOINT_STEP: "40"})
        seen += w.step(job, 5)
        if continued_at is None and "TrialContinued" in seen:
            continued_at = t
            planned = next(c for c in w.status.conditions if c.type == ConditionType.PLANNED)
            assert planned.reason == "TrialContinued" and "trial measuring on: measured" in planned.message
            obs = w.status.observed
            assert obs is not None and TRIAL_RISK < (obs.deadline_miss_probability or 0.0) < PROBABLY_MEETS
            assert w.status.plan is not None and w.status.plan.trial and not obs.stop_pending
        if "TrialKept" in seen:
            break
    assert continued_at is not None, seen
    assert seen.count("TrialContinued") == 1 and "TrialKept" in seen and "DeadlineInfeasible" not in seen, seen
    st = w.status
    assert st.plan is not None and not st.plan.trial and st.phase is Phase.RUNNING
    kept = next(e for e in w.events if e.reason == "TrialKept")
    said = float(kept.message.split("measured ", 1)[1].split("/s", 1)[0].replace(",", ""))
    assert said == pytest.approx(rate, rel=0.03)  # the measured speed, not the plan's (0.9 x it)


# ------------------------------------------------------------------------------ decision scores


def test_trials_answer_refused_decisions_with_no_more_misses() -> None:
    d = decisions.scores()
    p = d["pooled"]["planner"]
    tried = p["trials"]
    assert sum(tried.values()) > 0 and tried["kept"] > 0
    # a trial that would miss goes on to a next trial on a GPU type not tried yet, and some of those make it
    assert tried["next"] > 0 and tried["next"] > tried["stopped"]
    assert p["no_plan_where_feasible_pct"] <= decisions.NO_PLAN_TARGET_PCT
    # the refusals fall well below the floor any planner that refuses at the risk limit has
    assert p["no_plan_where_feasible_pct"] < d["no_plan_floor"]["pooled"] / 1.5
    assert p["misses_pct"] <= decisions.MISSES_TARGET_PCT
    # a stopped trial is a "no plan" that spent its window: a few percent of the best plan's cost
    if tried["stopped"]:
        assert 0 < p["stopped_trial_mean_spend_pct"] < 20
    assert p["worst_regret_without_trials_pct"] <= decisions.WORST_TARGET_PCT
    # a window that reads one floor sigma fast (every trial's: the error that keeps what it should not)
    # still misses no more than the target: the floor in the measured P(miss) covers it
    fast = decisions.scores(trial_read=MEASURED_LOG_SIGMA_FLOOR)["pooled"]["planner"]
    assert fast["misses_pct"] <= decisions.MISSES_TARGET_PCT
    assert fast["trials"]["kept"] >= tried["kept"]


def test_trials_at_deadlines_nothing_can_meet_stop_and_add_no_misses() -> None:
    """Where no measured option meets the deadline, a trial must end stopped, at a bounded spend, and never
    turn into a run that misses: the misses there are the plans the model itself found feasible, the
    same with or without trials."""
    tried, refused = decisions.scores()["hopeless"], decisions.scores(trials=False)["hopeless"]
    assert tried["decisions"] == refused["decisions"] > 0
    assert tried["misses_pct"] == refused["misses_pct"]
    assert tried["trials_stopped_pct"] > 0 and refused["trials_stopped_pct"] == 0
    assert tried["refused_pct"] + tried["trials_stopped_pct"] + tried["misses_pct"] == pytest.approx(100.0, abs=0.05)
    assert 0 < tried["stopped_mean_spend_pct"] < 20


def test_the_objective_picks_the_trial() -> None:
    s = TrainingJobSpec.model_validate({**RESNET, "objective": "fastest", "budgetUsd": 1000})
    r = plan(s, CAT, deadline_h=TIGHT_H)
    assert r.trial and r.chosen is not None and "the fastest below 90%" in r.why
    near = [c for c in r.pareto if c.outlook.deadline_miss_probability < trial.PLAUSIBLY_MEETS]
    assert r.chosen.expected_hours == min(c.expected_hours for c in near)


def test_a_trial_whose_workers_report_no_progress_is_said_to_be_unmeasured_once() -> None:
    w, job, _ = _trial_world()
    assert w.status.plan is not None and w.status.plan.trial
    window = CFG.warmup_s + CFG.min_window_s
    seen: list[str] = []
    for _ in range(int(4 * window / 5)):
        seen += w.step(job, 5)
    assert seen.count("TrialUnmeasured") == 1, seen
    st = w.status
    planned = next(c for c in st.conditions if c.type == ConditionType.PLANNED)
    assert planned.reason == "TrialUnmeasured" and "report no progress" in planned.message
    assert st.phase is Phase.RUNNING and st.plan is not None and st.plan.trial


def test_a_policy_may_forbid_trials_and_one_no_at_a_level_wins() -> None:
    from gpuscaler.policy import Policy
    from gpuscaler.policy.evaluate import policy_for_namespace

    no = Policy(name="strict", allow_trials=False)
    r = plan(spec(), CAT, no, deadline_h=TIGHT_H)
    assert r.chosen is None and not r.trial and r.binding is not None and r.binding.kind is Kind.RISK
    merged = policy_for_namespace([Policy(name="a"), Policy(name="b", allow_trials=False)], "ns")
    assert merged.allow_trials is False
    # a namespace policy may give a namespace back what the cluster-wide one took
    back = policy_for_namespace([no, Policy(name="team", namespaces=["ns"], allow_trials=True)], "ns")
    assert back.allow_trials is True and plan(spec(), CAT, back, deadline_h=TIGHT_H).trial
