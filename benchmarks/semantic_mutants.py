"""The hand-made semantic mutants of tests/MUTANTS.md, executable, and a time-boxed runner for CI.

Each mutant is one deliberate wrong semantics: an exact snippet ``old`` of the current source (it must
occur exactly once in ``file``) replaced by ``new``, and the tests that must go red.  The runner copies
the repository (every tracked and untracked, not ignored file, plus a link to ``../shared``) into a
temporary directory once, checks that the catalog's tests pass there unmutated, then for each mutant
applies it to the copy, runs ``python -m pytest -x -q -p no:cacheprovider <tests>`` in the copy and
restores the file.  The worktree itself is never modified.

    python benchmarks/semantic_mutants.py                 # every mutant
    python benchmarks/semantic_mutants.py --budget-s 90   # CI's sample (Makefile `test`)
    python benchmarks/semantic_mutants.py --only tpot-over-output p99-as-p95

Outcome per mutant, from pytest's exit code: 1 = killed (a test failed), 0 = survived, anything
else (2 interrupted, 3 internal error, 4 usage error, 5 nothing collected) or a run past the
per-mutant timeout = error: a mutant that breaks collection or hangs proves nothing about the tests.
Exit code 0 only if every mutant run was killed and every snippet of the catalog was found.

Order under a budget: mutants of files changed since the merge base with the last git tag (without
tags: in the last 20 commits, or uncommitted) first, then the rest, each group rotated by the HEAD
commit hash, so successive commits sample different mutants while a given commit always runs the same.  The
budget counts the whole run (copy, baseline, mutants); a mutant is started only if its estimated time
(its tests' durations in the baseline run plus the pytest start-up measured so far) still fits.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]


class Mutant(NamedTuple):
    id: str
    file: str           # relative to the repository root
    old: str            # exact snippet of the current source, occurring exactly once in file
    new: str            # the wrong semantics
    tests: tuple        # pytest node ids, each of which must go red (any one failing kills it)
    why: str


SEM = "tests/test_semantics.py::"
SLO = "tests/test_slo.py::"
SPEC = "tests/test_speculative.py::"
EN = "tests/test_energy.py::"
SWA = "tests/test_sliding_window.py::"
EM = "tests/test_error_margin.py::"

MUTANTS: list[Mutant] = [
    # --- metrics ---------------------------------------------------------------------------------
    Mutant("tpot-over-output", "pdsim/metrics.py",
           "(finish - first) / np.maximum(streamed - 1, 1)", "(finish - first) / np.maximum(streamed, 1)",
           (SEM + "test_lone_request_ttft_tpot_e2e_by_hand_linear_cost",),
           "TPOT divided by the output tokens instead of output - 1 (the first token is TTFT's)"),
    Mutant("p99-as-p95", "pdsim/metrics.py",
           "np.percentile(x, [50, 90, 99])", "np.percentile(x, [50, 90, 95])",
           (SLO + "test_summary_percentiles_on_a_known_sample",),
           "the p99 column computed as the 95th percentile"),
    Mutant("abandoned-given-e2e", "pdsim/metrics.py",
           '"e2e_s": np.where(fin, finish - arrival + rtt, np.nan)',
           '"e2e_s": np.where(status != REJECTED, finish - arrival + rtt, np.nan)',
           (SEM + "test_rejected_and_abandoned_requests_stay_out_of_latency_statistics",),
           "an abandoned request (finish_s = when its client gave up) given an end-to-end latency"),
    Mutant("unfinished-only-unserved", "pdsim/metrics.py",
           "fin_rows = status == FINISHED", "fin_rows = status != UNFINISHED",
           (SEM + "test_rejected_and_abandoned_requests_stay_out_of_latency_statistics",),
           "rejected and abandoned requests counted as served in the summary's latency and throughput"),
    Mutant("percentile-slo-ignored", "pdsim/metrics.py",
           'if getattr(slo, "mode", "attainment") == "percentile":', "if False:",
           (SLO + "test_percentile_mode_fails_where_attainment_mode_passes",),
           "slo.mode: percentile judged by attainment"),
    Mutant("unserved-dropped-from-percentile", "pdsim/metrics.py",
           "ttft = np.where(np.isnan(ttft), np.inf, ttft)", "ttft = ttft[~np.isnan(ttft)]",
           (SLO + "test_unserved_requests_count_as_infinitely_late_in_percentile_mode",),
           "requests never served left out of the TTFT percentile sample (rejecting work improves it)"),
    # --- topology --------------------------------------------------------------------------------
    Mutant("kv-link-capacity-2", "pdsim/topology.py",
           "self.res = simpy.Resource(env, capacity=1)", "self.res = simpy.Resource(env, capacity=2)",
           (SEM + "test_two_transfers_on_one_link_take_twice_as_long",),
           "a KV link carries two transfers at once, each at full bandwidth"),
    Mutant("layerwise-overlap-twice", "pdsim/topology.py",
           "return min(wire_s * (L - 1) / L, max(0.0, idle_s))",
           "return min(wire_s * (L - 1) / L, max(0.0, 2 * idle_s))",
           (SEM + "test_layerwise_overlap_hides_the_prefill_time_once",),
           "layer-wise KV transfer hides the prefill compute twice"),
    Mutant("admission-ignores-output-growth", "pdsim/topology.py",
           "if not kv.fits_ever(req.prompt_tokens + req.output_tokens - 1):",
           "if not kv.fits_ever(req.prompt_tokens):",
           (SEM + "test_admission_counts_the_output_growth",),
           "a colocated request admitted when its prompt fits but prompt + output never can"),
    Mutant("reservation-ignores-max-running", "pdsim/topology.py",
           "        if len(dec.running) + dec.reserved_count >= dec.limits.max_running:\n            return False",
           "        if False:\n            return False",
           (SEM + "test_decode_reservations_respect_max_running",),
           "decode-side KV reservations made beyond the decode instance's max_running"),
    Mutant("max-queue-off-by-one", "pdsim/topology.py",
           "if admit and q is not None and len(inst.waiting) >= q:",
           "if admit and q is not None and len(inst.waiting) > q:",
           (SEM + "test_max_queue_rejects_exactly_beyond_the_limit",),
           "max_queue lets one request more wait than the limit"),
    Mutant("kv-pool-ignores-tp-sharding", "pdsim/topology.py",
           "weights = model.weight_bytes_per_gpu(weight_dtype, pool.tp, pool.ep, pool.pp, pool.dp_attention, pool.pp_layers)",
           "weights = model.weight_bytes_per_gpu(weight_dtype, 1, pool.ep, pool.pp, pool.dp_attention, pool.pp_layers)",
           (SEM + "test_kv_pool_size_by_hand_with_tp_sharded_weights",),
           "the KV pool sized as if each GPU held all the weights (TP sharding ignored)"),
    Mutant("spec-pool-fast-path-left-on", "pdsim/topology.py",
           "inst.fast = False               # token counts", "inst.fast = inst.fast  # token counts",
           (SPEC + "test_output_tokens_conserved_and_fast_equals_step_by_step",),
           "multi-step fast-path windows left on in a speculative pool"),
    # --- PD hand-offs: link faults, client timeouts, lost copies (2026-12-07) ----------------------
    Mutant("link-fault-blind-restore", "pdsim/faults.py",
           "    window[4] = True\n    for link in topo.links:\n        link.degrade(env, link_factor(topo, env.now))",
           "    window[4] = True\n    for link in topo.links:\n        link.degrade(env, 1.0)",
           ("tests/test_faults_by_hand.py::test_back_to_back_link_faults_compose_whatever_their_order",
            "tests/test_topology_by_hand.py::test_back_to_back_link_faults_hand_over_at_the_shared_instant_by_hand"),
           "a link fault's end restores full speed although another fault is still active"),
    Mutant("transfer-rate-fixed-at-start", "pdsim/topology.py",
           "yield done | link.changed", "yield done",
           ("tests/test_topology_by_hand.py::test_a_link_that_goes_down_mid_transfer_pauses_it_until_it_is_back_by_hand",),
           "a transfer in flight keeps the rate it started at when the link degrades or goes down"),
    Mutant("pd-timeout-counts-the-prefill-token", "pdsim/topology.py",
           "if self.decode_first and req.output_tokens > 1:", "if False:",
           ("tests/test_topology_by_hand.py::test_a_timeout_abandons_a_hand_off_waiting_for_a_link_that_is_down_by_hand",),
           "behind a PD proxy the prefill's token counts as the client's first: a stuck hand-off is never abandoned"),
    Mutant("lost-hand-off-no-capacity-check", "pdsim/topology.py",
           "if not self.prefill.instances[0].kv.fits_ever(req.known):", "if False:",
           ("tests/test_topology_by_hand.py::"
            "test_a_prefill_copy_lost_that_no_longer_fits_a_prefill_instance_recomputes_on_decode_by_hand",),
           "a lost hand-off prefilled again where prompt + 1 token can never fit (a deadlock)"),
    Mutant("prefill-failure-spares-hand-offs", "pdsim/topology.py",
           'self.handoffs[rid][0].interrupt("lost")', "pass",
           ("tests/test_topology_by_hand.py::"
            "test_a_hand_off_waiting_for_the_link_is_lost_the_moment_its_prefill_instance_fails_by_hand",),
           "a hand-off notices its prefill copy is gone only when its wait or transfer ends"),
    # --- PD hand-offs and faults, review leftovers (2026-12-08, branch pdleft) -------------------------
    Mutant("decode-failure-spares-hand-offs", "pdsim/topology.py",
           'self.handoffs[rid][0].interrupt("decode lost")', "pass",
           ("tests/test_topology_by_hand.py::"
            "test_a_decode_failure_stops_its_transfers_at_once_and_frees_the_link_by_hand",),
           "a transfer into a decode instance that failed runs to its end and holds the link meanwhile"),
    Mutant("cut-transfer-bytes-uncounted", "pdsim/topology.py",
           "link.bytes += sent[0]        # what it had sent crossed the link", "pass",
           ("tests/test_topology_by_hand.py::test_prefill_lost_twice_during_its_kv_transfer_by_hand",),
           "a KV link's bytes leave out what transfers cut off by a fault or a timeout had sent"),
    Mutant("mtbf-as-mttf", "pdsim/faults.py",
           "mttf_s = mtbf_s - mttr_s - warmup_s", "mttf_s = mtbf_s",
           ("tests/test_faults_by_hand.py::test_random_faults_timeline_with_fixed_draws",),
           "random faults' mtbf_s taken as the up time, so failures come mtbf_s + repair + warm-up apart"),
    Mutant("decode-queue-from-first-prefill", "pdsim/metrics.py",
           'dq = fcols["decode_step_s"] - dstart', "dq = dstart - pend - kv_wait - kv_xfer",
           ("tests/test_topology_by_hand.py::test_decode_queue_takes_no_fault_recovery_time_by_hand",),
           "decode_queue_s measured from the first prefill's end: a fault's lost work and re-prefill count as queueing"),
    Mutant("decode-queue-ignores-the-step-in-flight", "pdsim/metrics.py",
           'dq = fcols["decode_step_s"] - dstart', "dq = dstart - dstart",
           ("tests/test_topology_by_hand.py::test_decode_queue_is_the_wait_for_the_step_in_flight_by_hand",),
           "decode_queue_s leaves out the wait for the decode step in flight when the KV arrives"),
    Mutant("fault-recompute-counts-preemptions", "pdsim/metrics.py",
           '"recomputed_tokens": int(_c(d, "fault_recomputed_tokens").sum()),',
           '"recomputed_tokens": int(_c(d, "recomputed_tokens").sum()),',
           ("tests/test_faults.py::test_fault_recompute_counts_only_what_a_fault_took",),
           "the fault summary's recomputed tokens include a preemption's recompute"),
    Mutant("sweep-judges-attainment-in-percentile-mode", "pdsim/sweep.py",
           'if r.get("slo_mode", "attainment") == "percentile":', "if False:",
           ("tests/test_sweep.py::test_percentile_mode_goodput_follows_each_runs_own_verdict_by_hand",),
           "pdsim sweep judges a percentile-mode SLO by attainment"),
    Mutant("host-load-left-to-the-window", "pdsim/instance.py",
           "(self.kv.prefix_on and (self.waiting or self.kv.load_s))", "(self.kv.prefix_on and self.waiting)",
           ("tests/test_topology_by_hand.py::test_a_decode_side_host_tier_hit_is_copied_before_the_next_step_by_hand",),
           "the fast path pays a decode reservation's host-tier copy after its window, not before the next step"),
    # --- scheduler -------------------------------------------------------------------------------
    Mutant("chunked-ignores-budget", "pdsim/scheduler.py",
           "            if chunk:\n                n = budget\n",
           "            if chunk:\n                pass\n",
           (SEM + "test_chunked_prefill_respects_its_token_budget_each_step",),
           "chunked prefill admits a whole prompt past its token budget"),
    Mutant("preempt-oldest", "pdsim/scheduler.py",
           "victim = next((r for r in reversed(running) if", "victim = next((r for r in running if",
           (SEM + "test_preemption_evicts_the_newest_running_request",),
           "preemption evicts the oldest running request instead of the newest"),
    Mutant("batch-ignores-max-running", "pdsim/scheduler.py",
           "while waiting and len(running) < limits.max_running and budget > 0:",
           "while waiting and budget > 0:",
           (SEM + "test_max_running_caps_the_batch",),
           "admission fills the batch past max_running"),
    Mutant("preempt-recompute-not-accumulated", "pdsim/scheduler.py",
           "victim.recomputed_tokens += victim.computed", "victim.recomputed_tokens = victim.computed",
           (SEM + "test_preemption_evicts_the_newest_running_request",),
           "a request preempted twice counts only its last recomputation"),
    Mutant("preempt-count-not-accumulated", "pdsim/scheduler.py",
           "victim.preemptions += 1", "victim.preemptions = 1",
           (SEM + "test_preemption_evicts_the_newest_running_request",),
           "a request preempted twice reports one preemption"),
    Mutant("self-evicted-still-scheduled", "pdsim/scheduler.py",
           "            _preempt(req, kv, running, waiting, plan)\n            return False\n",
           "            _preempt(req, kv, running, waiting, plan)\n            return True\n",
           (SEM + "test_a_request_already_in_the_step_is_never_the_victim",),
           "a request that had to evict itself is still put in the step"),
    Mutant("preempt-lost-not-accumulated", "pdsim/scheduler.py",
           "plan.lost_tokens += victim.computed", "plan.lost_tokens = victim.computed",
           (SEM + "test_one_growth_may_evict_two_and_both_losses_are_counted",),
           "a step that evicts two requests counts only the last one's lost KV"),
    Mutant("chunked-zero-budget-continues", "pdsim/scheduler.py",
           "        if left <= 0:\n            break\n", "        if left < 0:\n            break\n",
           (SEM + "test_chunked_budget_smaller_than_the_running_batch",),
           "chunked keeps scheduling decodes after the token budget is spent"),
    Mutant("victim-may-be-scheduled", "pdsim/scheduler.py",
           "if r is not req and id(r) not in scheduled\n", "if r is not req\n",
           (SEM + "test_a_request_already_in_the_step_is_never_the_victim",),
           "a request already placed in this step may be evicted by a later one's growth"),
    Mutant("ranked-kv-victim-any-rank", "pdsim/scheduler.py",
           "                       and (not kv.ranked or r.rank == req.rank)), None)",
           "                       ), None)",
           ("tests/test_dp_balance.py::test_a_rank_short_of_blocks_preempts_its_own_newest_request_by_hand",),
           "a DP-balanced rank short of KV preempts another rank's request, whose blocks it cannot use"),
    Mutant("ranked-kv-shortage-stops-every-rank", "pdsim/scheduler.py",
           "            if not kv.ranked:\n                break\n", "            if True:\n                break\n",
           ("tests/test_dp_balance.py::test_each_rank_admits_from_its_own_kv_pool_by_hand",),
           "one attention rank's KV shortage stops every rank's admissions"),
    Mutant("ranked-kv-preemption-stops-every-rank", "pdsim/scheduler.py",
           "if not waiting or (plan.preempted and not kv.ranked):", "if not waiting or plan.preempted:",
           ("tests/test_dp_balance.py::test_a_rank_short_of_blocks_preempts_its_own_newest_request_by_hand",),
           "a preemption on one attention rank stops every rank's admissions that step"),
    Mutant("dp-balance-counts-an-unstartable-prompt", "pdsim/scheduler.py",
           "            has[j] = kv.could_admit(", "            has[j] = True or kv.could_admit(",
           ("tests/test_dp_balance.py::"
            "test_a_rank_whose_pool_keeps_its_prompt_waiting_has_none_for_the_balance_by_hand",),
           "the DP balance counts a waiting prompt its rank's pool cannot start as that rank's context request"),
    Mutant("cut-latency-counts-whole", "pdsim/topology.py",
           "waited)\n            link.busy_s += env.now - t0\n", "waited)\n            link.busy_s += link.latency_s\n",
           ("tests/test_topology_by_hand.py::"
            "test_a_transfer_cut_in_its_latency_counts_only_the_latency_it_waited_by_hand",),
           "a transfer cut off in its latency counts the whole latency as link busy time (busy past the wall)"),
    Mutant("dp-decode-rank-replaced-each-try", "pdsim/topology.py",
           "        if dec.balanced and req.id not in dec.awaiting:", "        if dec.balanced:",
           ("tests/test_dp_balance.py::test_a_hand_off_waiting_for_decode_blocks_keeps_its_rank_and_counts_there_by_hand",),
           "a hand-off waiting for a DP-balanced decode instance's blocks is placed on a rank again at every try"),
    Mutant("dp-decode-waiting-hand-offs-uncounted", "pdsim/topology.py",
           "dec.running + dec.inbound + list(dec.awaiting.values())", "dec.running + dec.inbound",
           ("tests/test_dp_balance.py::test_a_hand_off_waiting_for_decode_blocks_keeps_its_rank_and_counts_there_by_hand",),
           "hand-offs waiting on a DP-balanced decode instance's ranks do not count when the next one is placed"),
    Mutant("decode-step-lost-on-preemption", "pdsim/instance.py",
           "            elif r in self.running or r in self.waiting:\n                keep.append(r)\n", "",
           ("tests/test_topology_by_hand.py::"
            "test_decode_queue_of_a_request_preempted_before_its_first_decode_step_by_hand",),
           "a request preempted before its first decode step never gets one recorded (decode_queue_s NaN)"),
    Mutant("ranked-kv-grows-from-the-instance", "pdsim/kvcache.py",
           "if need > self.rank_free[j] - (self.rank_watermark if admit else 0):",
           "if need > self.free_blocks - (self.rank_watermark if admit else 0):",
           ("tests/test_dp_balance.py::test_each_rank_admits_from_its_own_kv_pool_by_hand",),
           "a request takes KV blocks free on another attention rank"),
    Mutant("dp-balance-timeout-off-by-one", "pdsim/scheduler.py",
           "if self.waited >= self.timeout or not all_gen:", "if self.waited > self.timeout or not all_gen:",
           ("tests/test_dp_balance.py::test_a_prompt_on_one_rank_waits_for_the_step_count_by_hand",),
           "TensorRT-LLM's attention-DP balance holds prompts one step past timeout_iters"),
    Mutant("dp-balance-count-not-restarted", "pdsim/scheduler.py",
           "            self.waited = 0\n            if all_gen:", "            if all_gen:",
           ("tests/test_dp_balance.py::test_prompts_on_every_rank_restart_the_step_count_by_hand",),
           "the balance's step count goes on after every rank had a prompt"),
    Mutant("dp-balance-instance-budget", "pdsim/scheduler.py",
           "        left = [per] * R", "        left = [limits.max_batched_tokens] * R",
           ("tests/test_dp_balance.py::test_each_rank_schedules_its_own_budget_by_hand",),
           "a balanced DP rank admits prompts up to the whole instance's token budget"),
    Mutant("dp-balance-priced-by-least-loaded", "pdsim/instance.py",
           "self.balanced else busiest_rank(plan.items, self.attn_ranks)",
           "False else busiest_rank(plan.items, self.attn_ranks)",
           ("tests/test_dp_balance.py::test_a_balanced_instance_prices_a_step_by_its_requests_ranks",),
           "a balanced DP step priced with chunks on the least-loaded rank, not their own"),
    Mutant("dp-balance-ranks-by-generated-tokens", "pdsim/scheduler.py",
           "        toks[r.rank] += r.prompt_tokens\n    for r in waiting:",
           "        toks[r.rank] += r.prompt_tokens + r.generated\n    for r in waiting:",
           ("tests/test_dp_balance.py::test_assign_rank_by_hand",),
           "a DP-balanced request joins the rank with the fewest prompt + generated tokens (TensorRT-LLM: prompts)"),
    Mutant("dp-balance-full-rank-ignored", "pdsim/scheduler.py",
           "if held[j] < slots and (", "if (",
           ("tests/test_dp_balance.py::test_a_rank_with_no_free_slot_holds_every_ranks_prompts_by_hand",),
           "the balance lets prompts go while a rank's batch slots are full"),
    Mutant("batch-wait-held-victim-lost", "pdsim/scheduler.py",
           "        if held:\n            waiting.extendleft(reversed(held))\n", "",
           ("tests/test_batch_wait.py::test_a_held_step_that_preempts_keeps_the_victim_queued",),
           "a request preempted in a step that held prompts (batch waiting) drops out of the queue"),
    Mutant("batch-wait-count-not-restarted", "pdsim/scheduler.py",
           "            self.waited = 0\n            return self.base(running, waiting, kv, limits)",
           "            return self.base(running, waiting, kv, limits)",
           ("tests/test_batch_wait.py::test_the_count_restarts_when_prompts_go_by_hand",),
           "batch waiting's step count goes on after prompts went"),
    Mutant("fcfs-chunks-prompts", "pdsim/scheduler.py",
           "limits.max_batched_tokens, chunk=False)", "limits.max_batched_tokens, chunk=True)",
           (SEM + "test_fcfs_runs_a_prompt_longer_than_the_budget_whole",),
           "fcfs splits a prompt longer than the token budget into chunks"),
    # --- kvcache ---------------------------------------------------------------------------------
    Mutant("grow-ignores-watermark", "pdsim/kvcache.py",
           "spare = self.free_blocks - (self.watermark_blocks if admit else 0)", "spare = self.free_blocks",
           (SEM + "test_admission_keeps_the_watermark_spare",),
           "admission eats the watermark that running requests need to grow"),
    Mutant("fits-ever-ignores-watermark", "pdsim/kvcache.py",
           "        return self.total_blocks - self.watermark_blocks\n",
           "        return self.total_blocks\n",
           (SEM + "test_admission_counts_the_output_growth",),
           "a request that only fits by eating the watermark is admitted, and can never be re-admitted"),
    Mutant("decode-reserve-ignores-watermark", "pdsim/kvcache.py",
           "return self.grow(req, tokens, admit=True)", "return self.grow(req, tokens, admit=False)",
           (SEM + "test_decode_side_reservation_keeps_the_watermark",),
           "the decode side reserves blocks for arriving KV out of the watermark"),
    # --- costmodel -------------------------------------------------------------------------------
    Mutant("tp-one-allreduce-per-layer", "pdsim/costmodel.py",
           "n_ar = 2 * L + (1 if first else 0)\n", "n_ar = L + (1 if first else 0)\n",
           (SEM + "test_tensor_parallel_step_pays_two_allreduces_per_layer",),
           "TP pays one all-reduce per layer instead of two (attention out, MLP down)"),
    # --- plan ------------------------------------------------------------------------------------
    Mutant("worst-seed-takes-best-attainment", "pdsim/plan.py",
           'out["min_att"] = min(r["ok"] / r["n"] for r in results)',
           'out["min_att"] = max(r["ok"] / r["n"] for r in results)',
           (SEM + "test_plan_worst_seed_rule_takes_the_worst_seed",),
           "the plan's worst-seed rule takes the best seed's attainment"),
    Mutant("worst-seed-takes-best-percentile", "pdsim/plan.py",
           "out[k] = max(vals) if vals else None", "out[k] = min(vals) if vals else None",
           (SEM + "test_plan_worst_seed_rule_takes_the_worst_seed",),
           "the plan's worst-seed rule takes the best seed's latency percentile"),
    Mutant("guess-scaled-by-inverse-size", "pdsim/plan.py",
           "s.guess = mid * n / n0", "s.guess = mid * n0 / n",
           ("tests/test_plan_guess.py::test_guide_holds_a_family_until_its_smallest_is_done_then_scales_its_goodput",),
           "a held search starts from its reference's goodput scaled by the inverse size ratio"),
    Mutant("guide-releases-before-reference-done", "pdsim/plan.py",
           "            if not ref.done and not ref.stopped and (max_probes is None or ref.probes < max_probes):\n"
           "                s.waiting = True",
           "            if False:\n                s.waiting = True",
           ("tests/test_plan_guess.py::test_guide_holds_a_family_until_its_smallest_is_done_then_scales_its_goodput",
            "tests/test_plan_guess.py::test_run_plan_holds_the_larger_replicas_and_starts_them_from_the_scaled_goodput"),
           "a family's larger configs are not held for their smallest's search (no guess ever given)"),
    Mutant("guide-holds-past-a-stopped-reference", "pdsim/plan.py",
           "if not ref.done and not ref.stopped and (max_probes is None or ref.probes < max_probes):",
           "if not ref.done:",
           ("tests/test_plan_guess.py::test_a_reference_stopped_at_max_rounds_lets_its_family_search_unguided",),
           "a family stays held behind a reference that max_rounds stopped: its members are never probed"),
    Mutant("guided-walk-never-widens", "pdsim/plan.py",
           "math.log(first) * 2 ** k", "math.log(first) * 1",
           ("tests/test_plan_guess.py::test_a_poor_guess_steps_out_doubling_the_exponent_then_bisects",),
           "the guided walk steps one tolerance at a time (linear, not doubling exponents)"),
    Mutant("guided-walk-step-past-tolerance", "pdsim/plan.py",
           "first = max(1.0 / (1.0 - 0.999 * self.tol), GUESS_STEP)",
           "first = max(1.0 / (1.0 - 1.001 * self.tol), GUESS_STEP)",
           ("tests/test_plan_guess.py::test_guided_and_unguided_searches_end_on_the_same_rule",
            "tests/test_plan_guess.py::test_a_good_guess_closes_the_bracket_in_two_probes"),
           "the guided first step is a little wider than the tolerance: a pass and a fail one step apart do not "
           "close the bracket"),
    Mutant("guided-first-step-ignores-guess-step", "pdsim/plan.py",
           "first = max(1.0 / (1.0 - 0.999 * self.tol), GUESS_STEP)", "first = 1.0 / (1.0 - 0.999 * self.tol)",
           ("tests/test_plan_guess.py::test_a_guided_walk_that_would_leave_the_bracket_halves_it_and_never_outsteps_the_unguided",),
           "at a tolerance below 5% the guided walk starts with a tolerance-wide step, not GUESS_STEP"),
    Mutant("guided-step-uncapped", "pdsim/plan.py",
           "cap = 2.0 if up else 4.0", "cap = 1e300",
           ("tests/test_plan_guess.py::test_a_guided_walk_that_would_leave_the_bracket_halves_it_and_never_outsteps_the_unguided",),
           "the guided walk's steps grow past the unguided search's x 2 (f^(2^k) without a cap)"),
    Mutant("max-rounds-search-not-settled", "pdsim/plan.py",
           "                s.stopped = True\n                s.next_rate()", "                s.stopped = True",
           ("tests/test_plan_guess.py::test_a_search_whose_last_allowed_probe_closes_its_bracket_is_done_not_stopped",),
           "a search whose last allowed probe closed its bracket is reported stopped at max_rounds (and gives "
           "its family no guess)"),
    Mutant("guided-split-arithmetic", "pdsim/plan.py",
           "r = math.sqrt(self.lo * self.hi)", "r = 0.5 * (self.lo + self.hi)",
           ("tests/test_plan_guess.py::test_a_poor_guess_steps_out_doubling_the_exponent_then_bisects",),
           "the guided search halves its bracket arithmetically (a probe more where a geometric halving ends)"),
    Mutant("no-long-runs-ahead", "pdsim/plan.py",
           "spare = min((-(len(todo) - known)) % workers, g.confirm_top) if len(todo) > known else 0", "spare = 0",
           ("tests/test_plan_guess.py::test_long_runs_ahead_on_idle_workers_change_nothing_but_when_they_run",
            "tests/test_plan_by_hand.py::test_long_runs_ahead_take_only_shorter_candidates_never_double_and_are_used_when_asked"),
           "a batch of long runs leaves workers idle instead of running the next candidates' ahead"),
    Mutant("long-runs-ahead-beside-nothing", "pdsim/plan.py",
           "spare = min((-(len(todo) - known)) % workers, g.confirm_top) if len(todo) > known else 0",
           "spare = min((-len(todo)) % workers, g.confirm_top)",
           ("tests/test_plan_guess.py::test_long_runs_ahead_on_idle_workers_change_nothing_but_when_they_run",),
           "a batch whose long runs all ran ahead earlier still takes a rider, which then runs alone"),
    Mutant("long-runs-ahead-of-any-length", "pdsim/plan.py",
           "and size(x) <= longest", "and True",
           ("tests/test_plan_by_hand.py::test_long_runs_ahead_take_only_shorter_candidates_never_double_and_are_used_when_asked",),
           "a long run longer than the batch's longest goes along ahead (the batch waits for it)"),
    Mutant("pp-prefill-bound-at-all-micro-batches", "pdsim/plan.py",
           "spreads = range(1, mb + 1) if", "spreads = [mb] if",
           ("tests/test_pp.py::test_the_plans_prefill_bound_under_pp_takes_the_cheapest_micro_batch_count",),
           "the plan's prefill bound of a pipelined pool prices every step at micro_batches micro-batches "
           "(not a bound when fewer are cheaper)"),
    Mutant("pp-overlap-stages-ready-from-the-start", "pdsim/topology.py",
           "            a = req.prefill_start_s + c * tau\n", "            a = req.prefill_start_s\n",
           ("tests/test_topology_by_hand.py::test_layerwise_overlap_under_pipeline_sends_each_stages_layers_during_that_stage",
            "tests/test_topology_by_hand.py::test_layerwise_overlap_under_an_uneven_pipeline_waits_for_the_last_stage"),
           "under PP every stage's layers are taken as ready from the prefill's start (a later stage computes its "
           "layers only during its part of the prefill)"),
    Mutant("spec-draft-on-every-uneven-stage", "pdsim/speculative.py",
           "new = min(int(free // bb) for free, bb in stages[:-1])",
           "new = min(int((free - weights) // (bb + draft_bb)) for free, bb in stages[:-1])",
           ("tests/test_speculative.py::test_a_draft_under_an_uneven_pipeline_takes_memory_on_the_last_stage_only",),
           "with uneven stages the draft's weights and KV are charged on every stage, not the last only"),
    Mutant("alltoall-one-copy-per-token", "pdsim/costmodel.py",
           "(Ta * self.a2a_token_bytes * self.a2a_fanout, ep, Ta)", "(Ta * self.a2a_token_bytes * (ep - 1) / ep, ep, Ta)",
           ("tests/test_moe.py::test_alltoall_only_under_dp_attention_and_tp_attention_keeps_every_allreduce",
            "tests/test_dp_attention.py::test_a_decode_step_by_its_parts"),
           "the DP-attention all-to-all moves one copy of each token, not one per rank holding one of its experts"),
    Mutant("plan-bound-ignores-decode", "pdsim/plan.py",
           "per_req = p_mean * prefill_s_per_token(p) + d_mean * decode_s_per_token(p)",
           "per_req = p_mean * prefill_s_per_token(p)",
           (SEM + "test_plan_bound_counts_prefill_and_decode_time",),
           "the plan's capacity bound (fcfs) ignores decode time"),
    Mutant("plan-bound-ignores-speculation", "pdsim/plan.py",
           "return 1 if sd is None else sd.k + 1", "return 1",
           (SPEC + "test_plan_bounds_leave_room_for_speculation",),
           "plan bounds assume one token per decode step with speculation (spec configs pruned)"),
    # --- workload, faults, simulation ------------------------------------------------------------
    Mutant("gamma-shape-one-over-cv", "pdsim/workload.py",
           "shape = 1.0 / (cv * cv)", "shape = 1.0 / cv",
           (SEM + "test_gamma_interarrival_cv_and_rate",),
           "gamma inter-arrivals with shape 1/cv instead of 1/cv^2 (wrong burstiness)"),
    Mutant("fault-warmup-ignored", "pdsim/faults.py",
           "until = env.now + down_s + warmup_s", "until = env.now + down_s",
           (SEM + "test_fault_warmup_delays_service_by_exactly_warmup_s",),
           "a failed instance serves again right after down_s, skipping its warm-up"),
    Mutant("switch-ignores-repair", "pdsim/autoscaler.py",
           "repaired_s = inst.down_until if inst.failed else self.env.now", "repaired_s = self.env.now",
           ("tests/test_faults_autoscale.py::test_a_fault_on_an_instance_draining_to_switch_roles_delays_its_new_role_until_the_repair",),
           "an instance that fails while draining to switch roles serves in its new role switch_s later, "
           "before its repair ends"),
    Mutant("broken-instance-switches", "pdsim/autoscaler.py",
           "serving = src.healthy()", "serving = src.of(SERVING)",
           ("tests/test_faults_autoscale.py::test_a_failed_instance_is_not_switched_and_serves_again_in_its_role",),
           "role switching picks a failed instance (it holds nothing, so it looks least loaded)"),
    Mutant("spec-dp-whole-batch", "pdsim/costmodel.py",
           "self._attention_op(Ta, aw, kv, rb, prefill))",
           "self._attention_op(tokens, attn_work, kv_read_tokens, batch, prefill))",
           (SPEC + "test_verify_step_under_dp_attention_prices_the_busiest_ranks_attention",
            "tests/test_dp_attention.py::test_a_decode_step_by_its_parts"),
           "a step (a verify step included) under DP attention priced as if every rank did the whole batch's "
           "attention"),
    Mutant("sweep-reads-unsynced-window", "pdsim/plan.py",
           "topo.by_name[r.decode_instance].sync()", "pass",
           ("tests/test_plan_by_hand.py::test_counting_certain_misses_early_gives_the_same_counts_as_the_whole_run",),
           "the plan's early-miss sweep reads a decode instance's first token without syncing its open window "
           "(an on-time request counted as a TTFT miss)"),
    Mutant("sweep-miss-counted-twice", "pdsim/plan.py",
           "pre = self.premissed.pop(req.id, None) if self.premissed else None", "pre = None",
           ("tests/test_plan_by_hand.py::test_a_request_counted_early_is_not_counted_again_when_it_finishes",),
           "a request the sweep counted as a miss is counted again when it finishes"),
    # Instance has no reserved_blocks since 1563bbc (a hand-off's blocks are allocated in kv.used_blocks when
    # reserved): this mutant stands for counting them a second time, and only the test's stand-in instances carry
    # the field, so on real instances it would raise AttributeError rather than mis-route
    Mutant("least-loaded-reservations-twice", "pdsim/topology.py",
           "key=lambda i: (i.kv.used_blocks, len(i.running))",
           "key=lambda i: (i.kv.used_blocks + i.reserved_blocks, len(i.running))",
           ("tests/test_topology_by_hand.py::test_least_loaded_counts_reserved_blocks_once",),
           "the P->D least_loaded assignment counts blocks reserved for KV on the wire twice"),
    Mutant("think-time-ignored", "pdsim/simulation.py",
           "        if think_s:\n            yield env.timeout(think_s)", "        if False:\n            yield env.timeout(think_s)",
           (SEM + "test_closed_loop_think_time_separates_a_clients_requests",),
           "closed-loop clients send their next request without thinking"),
    # --- speculative decoding --------------------------------------------------------------------
    Mutant("spec-all-accepted-k-tokens", "pdsim/speculative.py",
           "        if p >= 1.0:\n            return self.k\n", "        if p >= 1.0:\n            return self.k - 1\n",
           (SPEC + "test_acceptance_one_gives_k_plus_one_tokens_per_step",),
           "an all-accepted verify step streams k tokens instead of k + 1"),
    Mutant("spec-last-step-overshoots", "pdsim/speculative.py",
           "d = min(k, req.output_tokens - req.generated - 1)", "d = min(k, req.output_tokens - req.generated)",
           (SPEC + "test_acceptance_one_last_step_truncates",),
           "the last verify step drafts past the requested output"),
    Mutant("spec-verify-one-query-token", "pdsim/speculative.py",
           "                    T += d\n", "                    T += 0\n",
           (SPEC + "test_verify_step_cost_by_hand_linear_model",),
           "a verify step priced with one query token per request instead of 1 + d"),
    Mutant("spec-accepted-not-leading-run", "pdsim/speculative.py",
           "np.argmin(ok, axis=1).tolist()", "ok[:, :-1].sum(axis=1).tolist()",
           (SPEC + "test_mean_tokens_per_step_matches_formula",),
           "accepted = every accepted draft, not the run before the first rejection"),
    Mutant("spec-draws-depend-on-history", "pdsim/speculative.py",
           "rng = np.random.default_rng([self.seed, SALT, req_id, chunk])",
           "rng = np.random.default_rng([self.seed, SALT, len(self._state), chunk])",
           (SPEC + "test_draws_depend_on_request_and_step_only",),
           "acceptance draws depend on how many requests the Speculator has seen, not on (request, step)"),
    Mutant("spec-draft-kv-ignored", "pdsim/speculative.py",
           "new = int((blocks * block_bytes - weights) // (block_bytes * (1.0 + ratio)))",
           "new = int((blocks * block_bytes - weights) // block_bytes)",
           (SPEC + "test_speculation_lowers_tpot_and_draft_takes_kv_memory",),
           "the draft's KV per token left out of the pool size"),
    Mutant("spec-draft-full-cost", "pdsim/speculative.py",
           "scale = self.fraction if self.draft is None else 1.0", "scale = 1.0",
           (SPEC + "test_acceptance_zero_gives_one_token_per_step",),
           "draft steps priced at a full target step (draft_cost_fraction ignored)"),
    Mutant("spec-draft-step-holds-all", "pdsim/speculative.py",
           "                if d >= j:\n", "                if d >= 1:\n",
           (SPEC + "test_mixed_draft_lengths_in_one_step_by_hand",),
           "draft step j holds every drafting request, not those drafting at least j tokens"),
    # --- energy ----------------------------------------------------------------------------------
    Mutant("idle-energy-over-busy-time", "pdsim/energy.py",
           "pm.idle_W * inst.alive_s(span_s) + (pm.max_W - pm.idle_W) * inst.active_s",
           "pm.idle_W * inst.busy_s + (pm.max_W - pm.idle_W) * inst.active_s",
           (EN + "test_idle_pool_energy_is_idle_power_times_time",),
           "idle power charged over busy time instead of the whole run"),
    Mutant("utilisation-min-mfu-mbu", "pdsim/instance.py",
           "min(c.time_s, max(c.flops * self.power[0], c.bytes * self.power[1]))",
           "min(c.time_s, min(c.flops * self.power[0], c.bytes * self.power[1]))",
           (EN + "test_busy_constant_cost_energy_by_hand", EN + "test_busy_energy_uses_the_busier_unit_and_fast_path_agrees"),
           "a step's utilisation taken from the less busy unit (min of MFU, MBU)"),
    Mutant("fast-path-utilisation-uncapped", "pdsim/instance.py",
           "np.minimum(times, np.maximum(flops * self.power[0], bytes_ * self.power[1]))",
           "np.maximum(flops * self.power[0], bytes_ * self.power[1])",
           (EN + "test_busy_energy_uses_the_busier_unit_and_fast_path_agrees",),
           "fast-path windows' utilisation not capped at 1"),
    Mutant("window-last-step-energy-left-out", "pdsim/instance.py",
           "self.active_s += min(dur, max(fj * self.power[0], bj * self.power[1]))",
           "self.active_s += 0.0",
           (EN + "test_busy_energy_uses_the_busier_unit_and_fast_path_agrees",),
           "a fast-path window's last step left out of the active energy"),
    Mutant("power-cap-linear-clock", "pdsim/energy.py",
           "return ((cap_W - idle_W) / (max_W - idle_W)) ** (1.0 / 3.0)", "return ((cap_W - idle_W) / (max_W - idle_W))",
           (EN + "test_clock_fraction_cube_law",),
           "clock fraction under a power cap linear in power instead of the cube law"),
    Mutant("power-cap-slows-memory", "pdsim/energy.py",
           "np.maximum(c / self.f, m) / np.where", "np.maximum(c / self.f, m / self.f) / np.where",
           (EN + "test_capped_cost_slows_compute_not_memory",),
           "a power cap slows HBM bandwidth as well as compute"),
    Mutant("power-cap-not-applied", "pdsim/topology.py",
           "self.cost = energy.CappedCost(self.cost, self.power)", "pass",
           (EN + "test_power_cap_in_a_run_lowers_power_and_slows_prefill",),
           "a pool's power cap lowers the power model but its steps run at full clock"),
    Mutant("report-energy-j-per-request", "pdsim/report.py",
           '("J per output token (est.)", num(e.get("J_per_output_token")))',
           '("J per output token (est.)", num(e.get("J_per_request")))',
           (EN + "test_report_shows_the_energy_of_summary_json",),
           "the report's J per output token card shows J per request"),
    # --- KV reservation, the prefix fast path, measured MoE tables ---------------------------------
    Mutant("full-reservation-ignored", "pdsim/scheduler.py",
           "    if limits.reserve_full and final_kv_tokens(req) > tokens:",
           "    if False and limits.reserve_full and final_kv_tokens(req) > tokens:",
           ("tests/test_reservation.py::test_full_reservation_serialises_what_would_not_fit_to_the_end_by_hand",),
           "kv_reservation full admits with blocks for the prompt only (grows and preempts like vLLM)"),
    Mutant("decode-reservation-incremental", "pdsim/topology.py",
           "total = max(req.computed, final_kv_tokens(req)) if dec.limits.reserve_full else req.computed",
           "total = req.computed",
           ("tests/test_reservation.py::test_full_decode_pool_reserves_the_whole_sequence_when_the_kv_arrives",),
           "a full-reservation decode pool reserves only the transferred KV"),
    Mutant("window-ignores-evictable-prefix", "pdsim/instance.py",
           "            free1 -= self.kv.lru_blocks", "            free1 -= 0",
           ("tests/test_prefix.py::test_fast_path_equals_step_by_step_known_counterexample_chunked_prefix_fault",),
           "a fast-path window runs through an eviction that lets the queue's head in under a token budget"),
    Mutant("moe-table-skewed-rows-used", "pdsim/profile_tables.py",
           'if t.distribution == "balanced":', "if True:",
           ("tests/test_profile_import.py::test_only_balanced_moe_tables_are_used_and_bad_ones_are_refused",),
           "power-law (skewed) MoE tables priced as uniform routing"),
    # --- uneven pipeline splits ------------------------------------------------------------------
    Mutant("pp-stage-attention-even", "pdsim/costmodel.py",
           "return [t + t_a * n for t, n in zip(t_s, self._split)]",
           "return [t + t_a * (self.model.layers // self.pp) for t in t_s]",
           ("tests/test_pp_uneven.py::test_lone_request_on_an_uneven_roofline_pipeline_is_the_sum_of_its_stages",),
           "every pipeline stage prices L // pp layers' attention under an uneven split"),
    Mutant("pp-kv-pool-max-weights-max-kv", "pdsim/topology.py",
           "    if pool.pp > 1 and not pool.dp_attention and len(set(",
           "    if False and pool.pp > 1 and not pool.dp_attention and len(set(",
           ("tests/test_pp_uneven.py::test_kv_pool_of_an_uneven_split_keeps_the_fewest_blocks_any_stage_fits_by_hand",),
           "an uneven pipeline's KV pool sized on the heaviest weights with the largest blocks, not per stage"),
    # --- sliding-window attention ----------------------------------------------------------------
    Mutant("swa-window-blocks-not-taken", "pdsim/kvcache.py",
           "take = need + (self.extra if req.blocks == 0 else 0)", "take = need",
           (SWA + "test_sliding_pool_takes_window_blocks_with_the_first_and_returns_them",
            SWA + "test_lone_request_holds_its_window_and_is_rejected_by_it"),
           "a request of a sliding-window model holds no blocks for its sliding layers' window"),
    Mutant("swa-window-no-written-block", "pdsim/models.py",
           "window_blocks = -(-self.sliding_window // block_size) + 1",
           "window_blocks = -(-self.sliding_window // block_size)",
           (SWA + "test_gpt_oss_kv_bytes_and_blocks_by_hand",),
           "the sliding window's KV without the block being written (vLLM keeps ceil(W / bs) + 1)"),
    Mutant("swa-transfer-whole-context", "pdsim/topology.py",
           "bytes_ += min(kv_tokens, self.window) * self.window_kv_bytes",
           "bytes_ += kv_tokens * self.window_kv_bytes",
           (SWA + "test_pd_transfer_sends_the_window_of_the_sliding_layers",),
           "PD sends the sliding layers' KV of the whole prompt, not their window"),
    Mutant("swa-plan-kv-unclipped", "pdsim/scheduler.py",
           "self.swa_kv += b if b < n + W - 1 else n + W - 1", "self.swa_kv += b",
           (SWA + "test_sliding_step_plan_sums_equal_brute_force",
            SWA + "test_lone_request_step_times_by_hand_linear"),
           "a sliding layer reads the whole context's KV"),
    Mutant("swa-window-sums-off-by-one", "pdsim/costmodel.py",
           "return pre[m] + m * (1 + j) + (B - m) * W", "return pre[m] + m * j + (B - m) * W",
           (SWA + "test_vectorised_window_sum_equals_brute_force",
            SWA + "test_fast_path_equals_step_by_step_sliding"),
           "the fast path's window sums one step behind the loop's"),
    Mutant("swa-stage-times-full-layers", "pdsim/costmodel.py",
           "per_layer = (t_f * full.count + t_w * sl.count) / L", "per_layer = t_f",
           (SWA + "test_pipeline_stages_share_full_and_sliding_attention_evenly",),
           "pipeline stages price every layer's attention as a full layer's"),
    Mutant("grouped-fp8-efficiency-ignored", "pdsim/kernels.py",
           'fc, fm, ov = (e.grouped_fp8_compute, e.grouped_fp8_memory, e.grouped_fp8_overhead_us) if dtype == "fp8"',
           'fc, fm, ov = (1.0, 1.0, e.grouped_fp8_overhead_us) if dtype == "fp8"',
           ("tests/test_costmodel_by_hand.py::test_fp8_grouped_gemm_efficiencies_by_hand",),
           "fp8 MoE grouped GEMMs priced at the dense GEMMs' efficiency (the fitted MoE efficiencies unused)"),
    Mutant("grouped-overhead-ignored", "pdsim/kernels.py",
           "return t + (e.kernel_overhead_us if ov is None else ov) * 1e-6",
           "return t + e.kernel_overhead_us * 1e-6",
           ("tests/test_costmodel_by_hand.py::test_fp8_grouped_gemm_efficiencies_by_hand",),
           "an fp8 grouped GEMM (MoE layer) launched at an ordinary GEMM's overhead, the fitted overhead unused"),
    Mutant("fp8-gemm-efficiency-ignored", "pdsim/kernels.py",
           "fc, fm, ov = (e.fp8_gemm_compute, e.fp8_gemm_memory, e.fp8_gemm_overhead_us) if dtype == \"fp8\"",
           "fc, fm, ov = (1.0, 1.0, e.fp8_gemm_overhead_us) if dtype == \"fp8\"",
           ("tests/test_costmodel_by_hand.py::test_fp8_dense_gemm_efficiencies_by_hand",),
           "fp8 dense GEMMs priced at twice bf16's speed (the fitted fp8 fractions unused): fp8 prefill ~1.35x too fast"),
    # --- verdicts at the measured error (2026-12-07) -------------------------------------------------
    Mutant("margin-not-judged", "pdsim/plan.py",
           "            sc[\"slo\"] = cfg.slo.model_dump()", "            pass",
           (EM + "test_every_simulation_is_judged_at_the_config_bounds_and_the_outputs_say_so",),
           "goodput.error_margin shown in the outputs but the simulations judged at the plan's own bounds"),
    Mutant("slo-at-error-nominal", "pdsim/metrics.py",
           "    v = slo_verdict(d, tight)", "    v = slo_verdict(d, slo)",
           (EM + "test_slo_at_error_judges_at_the_p90_bounds_by_hand",),
           "a run's verdict at the p90 error taken at the nominal bounds (it could never differ from the plain one)"),
    Mutant("percentile-lone-check-by-attainment", "pdsim/plan.py",
           '    if slo.mode == "percentile":\n        # each percentile', '    if False:\n        # each percentile',
           ("tests/test_plan_by_hand.py::test_percentile_mode_judges_lone_requests_by_each_percentile",),
           "percentile mode's lone-request check judged against attainment_target (prunes feasible p50 configs)"),
    Mutant("jitter-keeps-row-order", "pdsim/workload.py",
           "arrival, prompt, output = arrival[order], prompt[order], output[order]", "arrival = arrival[order]",
           ("tests/test_workload_by_hand.py::test_trace_jitter_moves_each_row_with_its_own_arrival",),
           "trace.jitter_s reorders arrivals but leaves lengths in row order (a request gets another row's lengths)"),
    Mutant("autoscaler-counts-preempted-hits", "pdsim/autoscaler.py",
           "                if req.preemptions == 0:", "                if True:",
           ("tests/test_autoscale.py::test_slo_planner_leaves_preempted_requests_out_of_the_cached_share",),
           "the slo planner's cached share counts a preempted request's re-admission hit (its own pages)"),
    Mutant("prefix-flops-first-admission-only", "pdsim/kvcache.py",
           "        if hit:\n            s.hits.append(req.known)", "        if hit and not req.generated:\n            s.hits.append(req.known)",
           ("tests/test_kvcache_by_hand.py::test_a_readmission_after_preemption_logs_its_known_tokens_and_its_new_hit",),
           "the prefill FLOPs saved leave out a re-admission's hit that the hit-token counts include"),
    Mutant("dp-attention-splits-prompts", "pdsim/instance.py",
           "self.attn_ranks = ranks if isinstance(ranks, int) and ranks > 1 else 1", "self.attn_ranks = 1",
           ("tests/test_dp_attention.py::test_a_prompt_arriving_among_decodes_waits_its_whole_prefill",),
           "DP attention shares a prompt chunk's tokens out over the ranks in proportion (one request split)"),
    Mutant("dp-rank-chunk-uncapped", "pdsim/topology.py",
           "-(-spec.token_budget // spec.tp) if spec.dp_attention and spec.tp > 1 else None",
           "None if spec.dp_attention and spec.tp > 1 else None",
           ("tests/test_dp_attention.py::test_a_dp_attention_rank_prefills_at_most_its_share_of_the_budget",),
           "a DP-attention rank prefills a whole budget's chunk of one request, not its budget / ranks share"),
    Mutant("dp-step-fastest-rank", "pdsim/costmodel.py",
           "t_max = max(t_max, t)",
           "t_max = min(t_max or 1e9, t)",
           ("tests/test_dp_attention.py::test_a_chunk_never_makes_a_decode_step_cheaper",),
           "a DP-attention step takes its fastest rank's time, not its slowest's"),
    Mutant("mla-mixed-one-kernel", "pdsim/instance.py",
           "elif self.mla and plan.tokens > len(plan.items):", "elif False and self.mla:",
           ("tests/test_dp_attention.py::test_a_prompt_among_mla_decodes_costs_at_most_both_alone",),
           "an MLA step mixing decodes and a prompt chunk prices all of it on one (decompressed) kernel"),
]


# --- the runner --------------------------------------------------------------------------------------

KILLED, SURVIVED, ERROR = "killed", "survived", "error"


def classify(returncode: int | None) -> str:
    """pytest's exit code -> outcome: 1 (tests failed) kills; 0 survives; anything else (2 interrupted,
    3 internal error, 4 usage error, 5 no tests collected, None = timed out) is an error."""
    if returncode == 1:
        return KILLED
    if returncode == 0:
        return SURVIVED
    return ERROR


def check_catalog(root: Path, mutants=MUTANTS) -> list[str]:
    """One message per broken entry: duplicate id, missing file, snippet absent or not unique, no-op."""
    errors, seen = [], set()
    for m in mutants:
        if m.id in seen:
            errors.append(f"mutant {m.id}: duplicate id")
        seen.add(m.id)
        path = root / m.file
        if not path.is_file():
            errors.append(f"mutant {m.id}: {m.file} does not exist; update the catalog")
            continue
        n = path.read_text().count(m.old)
        if n == 0:
            errors.append(f"mutant {m.id}: snippet not found in {m.file}; update the catalog")
        elif n > 1:
            errors.append(f"mutant {m.id}: snippet occurs {n} times in {m.file}; make it unique in the catalog")
        if m.old == m.new:
            errors.append(f"mutant {m.id}: old and new are the same")
        if not m.tests:
            errors.append(f"mutant {m.id}: no tests")
    return errors


def _git(*args) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def changed_files() -> tuple[set[str], str]:
    """(files changed since the base, what the base is): merge base with the last tag, else HEAD~20."""
    tag = _git("describe", "--tags", "--abbrev=0")
    if tag:
        base, what = _git("merge-base", "HEAD", tag), f"the commits since the merge base with tag {tag}"
    else:
        revs = (_git("rev-list", "--max-count=21", "HEAD") or "").split()
        base = revs[20] if len(revs) > 20 else (EMPTY_TREE if revs else None)
        what = "the last 20 commits or uncommitted"
    if not base:
        return set(), "no git history"
    out = _git("diff", "--name-only", base)          # against the working tree: uncommitted changes count
    return set((out or "").split()), what


def _rotate(xs: list, head: str) -> list:
    k = int(head[:12], 16) % len(xs) if xs and head else 0
    return xs[k:] + xs[:k]


def order(mutants, changed: set[str], head: str) -> list:
    """Mutants of changed files first, then the rest; each group rotated by the HEAD hash (the changed
    group too: twenty commits often touch most of the core, and a budget would otherwise always stop
    at the same entry)."""
    return _rotate([m for m in mutants if m.file in changed], head) + \
        _rotate([m for m in mutants if m.file not in changed], head)


def copy_repo(dst: Path) -> Path:
    """The repository's tracked and untracked (not ignored) files under dst/<name>, ../shared linked."""
    work = dst / REPO.name
    listed = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard")
    files = [f for f in (listed or "").split("\0") if f] if listed is not None else None
    if files is None:       # not a git checkout: the directories the tests read
        files = [str(p.relative_to(REPO)) for d in ("pdsim", "tests", "scenarios", "calibration", "benchmarks")
                 for p in (REPO / d).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        files += [f for f in ("pyproject.toml", "README.md") if (REPO / f).is_file()]
    for f in files:
        src = REPO / f
        if not src.is_file() or src.is_symlink() and src.resolve().is_dir():
            continue
        (work / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, work / f)
    shared = REPO.parent / "shared"
    if shared.is_dir():                   # tests/conftest.py and others read REPO.parent / "shared"
        (dst / "shared").symlink_to(shared)
    return work


def _env(work: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(work) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # no .pyc: a mutant and the restored file can have the same size and mtime second, and a stale
    # cached bytecode would then run the wrong source
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["COLUMNS"] = "250"                 # room for the failure reason in pytest's short summary
    return env


def run_pytest(work: Path, tests, timeout_s: float | None, junit: Path | None = None) -> tuple[int | None, float, str]:
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    if junit is not None:
        cmd.append(f"--junitxml={junit}")
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=work, env=_env(work), capture_output=True, text=True, timeout=timeout_s)
        rc, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = None, f"timed out after {timeout_s:.0f} s\n{e.stdout or ''}"
    return rc, time.perf_counter() - t0, out


def test_durations(junit: Path) -> dict[str, float]:
    """node id (without parameters) -> summed duration of its cases in a junit XML report."""
    out: dict[str, float] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        node = cls.replace(".", "/") + ".py::" + name.split("[")[0]
        out[node] = out.get(node, 0.0) + float(case.get("time") or 0.0)
    return out


def first_failure(out: str) -> str:
    """The first ``FAILED node - reason`` line of pytest's short summary, shortened: what killed it."""
    line = next((ln for ln in out.splitlines() if ln.startswith("FAILED ")), "")
    return line[len("FAILED "):].replace("tests/", "", 1)[:150]


def apply(work: Path, m: Mutant) -> str:
    """Apply m to the copy; returns the original text for restore()."""
    path = work / m.file
    text = path.read_text()
    if text.count(m.old) != 1:
        raise LookupError(f"mutant {m.id}: snippet not found exactly once in {m.file}; update the catalog")
    path.write_text(text.replace(m.old, m.new, 1))
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget-s", type=float, default=None, help="wall-time budget for the whole run")
    ap.add_argument("--all", action="store_true", help="run every mutant, ignoring the budget")
    ap.add_argument("--only", nargs="+", metavar="ID", help="run only these mutants")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="per-mutant pytest timeout (an error)")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()

    errors = check_catalog(REPO)
    if errors:
        for e in errors:
            print(e, file=sys.stderr)
        print(f"semantic mutants: the catalog is out of date ({len(errors)} entries); nothing run", file=sys.stderr)
        return 2
    mutants = list(MUTANTS)
    if a.only:
        unknown = set(a.only) - {m.id for m in mutants}
        if unknown:
            print(f"unknown mutant ids: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        mutants = [m for m in mutants if m.id in a.only]
    budget = None if a.all or a.only else a.budget_s
    changed, base = changed_files()
    head = _git("rev-parse", "HEAD") or ""
    mutants = order(mutants, changed, head)
    n_changed = sum(m.file in changed for m in mutants)
    print(f"semantic mutants: {len(mutants)} in the catalog run order ({n_changed} of them on files changed in "
          f"{base} first; each group rotated by HEAD {head[:8] or '?'}); budget "
          f"{'none' if budget is None else f'{budget:.0f} s'}", flush=True)

    with tempfile.TemporaryDirectory(prefix="pdsim-mutants-") as tmp:
        work = copy_repo(Path(tmp))
        where = subprocess.run([sys.executable, "-c", "import pdsim; print(pdsim.__file__)"], cwd=work,
                               env=_env(work), capture_output=True, text=True)
        if not where.stdout.strip().startswith(str(work)):
            print(f"the copy's pdsim is not the one imported ({where.stdout.strip() or where.stderr.strip()})",
                  file=sys.stderr)
            return 2
        tests = list(dict.fromkeys(t for m in mutants for t in m.tests))
        junit = Path(tmp) / "baseline.xml"
        rc, base_s, out = run_pytest(work, tests, None, junit)
        if rc != 0:
            print(out[-4000:], file=sys.stderr)
            print(f"semantic mutants: the catalog's {len(tests)} tests do not pass on the unmutated copy "
                  f"(pytest exit {rc}); nothing to judge", file=sys.stderr)
            return 2
        durations = test_durations(junit)
        startup = max(0.5, base_s - sum(durations.values()))      # one pytest process's start-up
        print(f"baseline: {len(tests)} tests pass unmutated in {base_s:.1f} s", flush=True)

        counts = {KILLED: 0, SURVIVED: 0, ERROR: 0}
        bad, skipped = [], 0
        for i, m in enumerate(mutants):
            est = startup + sum(durations.get(t.split("[")[0], 0.0) for t in m.tests)
            if budget is not None and time.perf_counter() - t_start + est > budget:
                skipped = len(mutants) - i
                break
            original = apply(work, m)
            try:
                # a mutant that hangs a simulation is an error, not a kill: cut it off at 5x its estimate
                rc, dt, out = run_pytest(work, m.tests, min(a.timeout_s, max(60.0, 5 * est)))
            finally:
                (work / m.file).write_text(original)
            outcome = classify(rc)
            counts[outcome] += 1
            print(f"{outcome.upper():8s} {m.id:36s} {m.file:22s} {dt:5.1f} s  "
                  + (first_failure(out) if outcome == KILLED else f"(pytest exit {rc})"), flush=True)
            if outcome != KILLED:
                bad.append((m, outcome, rc, out))

    for m, outcome, rc, out in bad:
        print(f"\n--- {outcome}: {m.id} ({m.file}): {m.why}\n    expected red: {' '.join(m.tests)}")
        if outcome == ERROR:
            print("\n".join("    " + ln for ln in out.strip().splitlines()[-15:]))
    ran = sum(counts.values())
    wall = time.perf_counter() - t_start
    score = f"{counts[KILLED] / ran:.0%}" if ran else "n/a"
    print(f"\nsemantic mutants: {ran} of {len(mutants)} run, {skipped} skipped by the budget: "
          f"{counts[KILLED]} killed, {counts[SURVIVED]} survived, {counts[ERROR]} errors; score {score}; "
          f"wall {wall:.0f} s")
    return 1 if counts[SURVIVED] or counts[ERROR] else 0


if __name__ == "__main__":
    sys.exit(main())
