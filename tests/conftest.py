"""Shared test helpers."""

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

from ctrlmem.experiments.papermill_cli import without_iri_grammars

# The test processes import papermill (and so jsonschema) as the sweep's processes do, without
# jsonschema's optional IRI checker: its import compiles Lark grammars, 1.5 s of every worker's
# collection, for a check no test makes.
without_iri_grammars()

settings.register_profile(
    "ctrlmem", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60
)
# scripts/test.sh --fast: a third of the examples (the full tier, what CI runs, draws all 60)
settings.register_profile("ctrlmem-fast", parent=settings.get_profile("ctrlmem"), max_examples=20)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ctrlmem"))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def python_exe():
    return sys.executable


# Tests that took 2 CPU seconds or more each in a `--fast` run (CTRLMEM_TEST_CPU_LOG, 2026-12-07,
# summed over their parameters): they run in the whole suite only, as the ones marked slow do, so
# that `--fast` stays a two-minute check (it took 3 min 4 s with them: 328 s of CPU on 2 workers).
# Each area keeps cheaper tests in `--fast`; the last six were added after a `--fast` run of 1 min
# 57 s–2 min 7 s (2026-12-07, later: 196 s of CPU; they took 14.8 s of it), the last two after one of
# 2 min 8 s (211 s of CPU; 9.6 s of it: the long climb of small pipelines made both heavier), the last
# seven after one of 2 min 25 s (236 s of CPU; 52 s of it: the patient climb on medium pipelines made
# them heavier, one is its own test). The one real multi-process run
# (test_one_small_run_is_exact_and_complete) and the one papermill run
# (test_schedule_figures_notebook_executes_one_figure) stay there on purpose.
HEAVY = frozenset(f"tests/{name}" for name in """
test_improve_levers.py::test_improve_reorders_recompute_passes_within_the_budget
test_improve_levers.py::test_a_fixed_recompute_under_a_budget_is_never_longer_than_the_budgets_order_recomputed
test_improve_levers.py::test_a_fixed_recompute_under_a_budget_uses_the_memory_it_frees
test_improve.py::test_valid_within_budget_never_longer
test_improve_offload.py::test_a_tighter_budget_is_kept
test_optimal_levers.py::test_recompute_never_loses_and_stays_within_the_budget
test_optimal_offload.py::test_bounds_with_offload_stay_below_proven_optima
test_adaptive.py::test_v_shape_respects_limit_and_improves_with_it
test_adaptive.py::test_v_shape_no_worse_than_fixed_v_schedules
test_adaptive.py::test_v_shape_zero_bubble_at_full_memory
test_simulate.py::test_a_second_simulation_times_every_pass_as_the_event_loop_does
test_search.py::test_results_do_not_depend_on_what_is_cached
test_search.py::test_families_every_candidate_is_a_valid_schedule
test_learned_families.py::test_families_monotone_in_the_cap
test_authors_dev.py::test_fixed_patterns_and_zb_within_one_percent_small
test_ui.py::test_a_plans_winner_opens_in_the_explorer_as_the_plan_simulated_it
test_ui.py::test_a_measured_run_is_drawn_under_its_simulation_and_kept_in_the_state
test_plan_cli.py::test_plan_prints_a_ranked_table_and_writes_csv_and_json
test_plan_cli.py::test_plan_form_command_line_reproduces_the_plan_and_emit_writes_its_files
test_plan_models.py::test_expert_parallelism_divides_the_experts_per_gpu
test_plan.py::test_memory_breakdown_adds_up
test_plan.py::test_a_second_plan_reuses_every_build
test_plan_recompute.py::test_budgeted_searches_order_with_every_forward_recomputed
test_reproduce.py::test_table4_marks_unregistered_methods_pending
test_reproduce_product.py::test_running_a_notebook_does_not_dirty_it
test_explorer_background.py::test_every_element_names_the_state_it_belongs_to
test_explorer_background.py::test_a_newer_edit_replaces_the_older_builds
test_explorer_background.py::test_state_file_round_trip_and_draw_state_is_identical
test_explorer_background.py::test_a_cost_edit_shows_the_previous_order_resimulated_then_the_adapted_one
test_explorer_background.py::test_bubble_vs_budget_streams_sampled_budgets_and_goes_past_one_where_a_bubble_is_left
test_background.py::test_stage_costs_are_learned_from_the_first_build
test_background.py::test_a_newer_submission_stops_what_it_no_longer_needs
test_background.py::test_a_background_build_is_the_build
test_explorer_background.py::test_comparisons_show_the_peak_memory_over_time_and_the_pareto_front
test_explorer_background.py::test_building_blocks_and_lifespans_are_comparisons_too
test_plan_cli.py::test_plan_form_replans_replace_both_figures_and_nothing_fits_clears_them
test_plan_recompute.py::test_full_recomputation_plans_split_backward_schedules_with_less_activation_and_r_time
test_cyclic.py::test_the_search_gets_shorter_where_memory_binds
test_optimal_offload.py::test_free_copies_at_one_microbatch_per_device
test_relax.py::test_between_the_closed_forms_and_the_optimum
test_improve_levers.py::test_a_deterministic_improve_that_settles_ends_within_its_budget
test_improve.py::test_explorer_optimizes_in_the_background_and_saves_the_order
test_adaptive.py::test_v_shape_never_beats_lower_bound
test_adaptive.py::test_v_shape_at_literal_half_is_below_v_half_memory
test_levers.py::test_auto_levers_that_offload_then_recompute_give_a_valid_schedule
test_levers.py::test_auto_levers_are_at_least_each_lever_alone_and_one_f1b_r
test_explorer_background.py::test_a_budgeted_schedule_with_no_order_yet_is_listed_as_building
test_explorer_background.py::test_stop_adapting_keeps_what_is_shown_and_says_so
test_learned_families.py::test_small_pipelines_on_many_devices_climb_long_too
test_plan.py::test_rows_marked_as_fitting_fit_and_the_others_do_not
test_learned_families.py::test_the_v_shape_searchs_long_climb_on_medium_pipelines_is_patient
test_learned_families.py::test_long_late_acceptance_climbs_on_from_the_medium_ones_at_eighths_and_is_monotone
test_plan_models.py::test_memory_breakdown_adds_up_with_receive_buffers_and_experts
test_cyclic.py::test_the_search_gets_shorter_with_blocks_of_two_microbatches
test_simulate.py::test_timeline_properties
test_plan.py::test_more_gb_never_gives_a_slower_best_plan
test_adaptive.py::test_v_shape_p8_m32_values
""".split())


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The tests of :data:`HEAVY` are marked slow (before ``-m`` selects). Test files with more
    slow tests run first, each file's tests in their own order (files of
    equal count keep theirs). With scripts/test.sh's workers (xdist --dist loadfile
    --no-loadscope-reorder: whole files handed out in this order) the long files start early and
    the many short fast-only files even out the end, instead of a long file (the browser's, the
    Slurm one) starting last while the other worker idles."""
    function = {item: item.nodeid.split("[")[0] for item in items}  # the id without parameters
    unknown = HEAVY - set(function.values())
    if unknown and len(items) > 1000:  # the whole suite collected: a renamed heavy test must be renamed here
        raise pytest.UsageError(f"tests/conftest.py HEAVY names tests that do not exist: {sorted(unknown)}")
    for item, name in function.items():
        if name in HEAVY and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
    slow: dict[str, int] = {}
    for item in items:
        slow[str(item.path)] = slow.get(str(item.path), 0) + (item.get_closest_marker("slow") is not None)
    rank = {path: i for i, path in enumerate(dict.fromkeys(str(item.path) for item in items))}
    items.sort(key=lambda item: (-slow[str(item.path)], rank[str(item.path)]))


# ---------------------------------------------------------------- where the suite's CPU time goes

_CPU_LOG = os.environ.get("CTRLMEM_TEST_CPU_LOG")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``CTRLMEM_TEST_CPU_LOG=FILE``: one line per test appended to ``FILE`` (every worker
    appends): the CPU seconds of the test's process, of the processes it started and waited for,
    the wall seconds (set-up and tear-down included), the test's id, the xdist worker and the
    clock time at its end (Unix seconds), tab-separated. On 2 cores the suite's wall time follows
    its CPU time, so this is where to look when it grows (``sort -rn FILE | head``); the last two
    columns show each worker's timeline (which file ran last, and how long one worker ran alone)."""
    if not _CPU_LOG:
        yield
        return
    import resource
    import time

    def cpu(who):
        r = resource.getrusage(who)
        return r.ru_utime + r.ru_stime

    own, kids, t0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
    yield
    line = (f"{cpu(resource.RUSAGE_SELF) - own:.2f}\t{cpu(resource.RUSAGE_CHILDREN) - kids:.2f}\t"
            f"{time.perf_counter() - t0:.2f}\t{item.nodeid}\t{os.environ.get('PYTEST_XDIST_WORKER', 'main')}\t"
            f"{time.time():.1f}\n")
    with open(_CPU_LOG, "a", encoding="utf-8") as fh:
        fh.write(line)


# ---------------------------------------------------------------- the suite leaves the checkout untouched

# Created by running the tests themselves (bytecode, pytest's and hypothesis's caches) or by the
# set-up: expected, and not what the product writes.
_EXPECTED = (".venv", ".git", "__pycache__", ".pytest_cache", ".hypothesis", ".ipynb_checkpoints", "ctrlmem.egg-info")


def checkout_state(root: str = ROOT) -> set[str] | None:
    """What the tests could have written: ``git status --porcelain --ignored`` lines for
    untracked and ignored paths, plus every untracked file (path, size, mtime) outside the
    expected folders, so a write inside an already-ignored folder counts too. (Tracked files are
    left to ``git diff``: editing the sources while the tests run is no fault of the tests.)
    ``None`` outside a git checkout."""
    import subprocess

    try:
        proc = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=root, capture_output=True,
                              text=True, timeout=60)
        tracked = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0 or tracked.returncode != 0:
        return None
    known = set(tracked.stdout.split("\0"))
    state = {ln for ln in proc.stdout.splitlines()
             if ln[:2] in ("??", "!!") and not any(part in ln for part in _EXPECTED)}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _EXPECTED]
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if rel in known or name.endswith(".pyc"):
                continue
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                continue
            state.add(f"file {rel} {st.st_size} {st.st_mtime_ns}")
    return state


@pytest.fixture(scope="session", autouse=True)
def checkout_untouched():
    """The whole test session writes nothing into the checkout (compared before and after)."""
    before = checkout_state()
    yield
    after = checkout_state()
    if before is None or after is None:
        return
    changed = sorted(after ^ before)
    assert not changed, f"the tests changed the checkout: {changed[:10]}"
