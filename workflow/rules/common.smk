import json
import math
import os
import re
import shlex
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from filledfirst.cluster import job_request, runtime_minutes
from filledfirst.paths import RESULTS_DB, results_database
from filledfirst.config import (
    SCHEMA_PATH, fingerprint, group_fingerprint, hosted_experiments, schema_problem, search_groups, server_groups,
)
from filledfirst.study import Study, TraceWorkload


# Only when no --configfile is given: otherwise Snakemake would merge the GPU study's
# experiments into the one the user asked for.
if not workflow.overwrite_configfiles:

    configfile: f"{workflow.basedir}/config/config.yaml"


if workflow.config_settings.config:
    raise WorkflowError(
        "--config overrides are not passed on to the experiments; put them in a config file "
        "and give it with --configfile"
    )

try:
    validate(config, str(SCHEMA_PATH), set_default=True)
except WorkflowError as exc:
    # One line with the key path as the config spells it, instead of the schema dump.
    raise WorkflowError(f"invalid config: {schema_problem(config) or exc}") from None

# The config as types (filledfirst.study), for what the package reads of it.
STUDY = Study.from_dict(config)

CONFIGFILES = [str(f) for f in (workflow.overwrite_configfiles or workflow.configfiles)]
# The experiments re-read the same files through the package's validator.
CONFIG_ARGS = " ".join(f"--config {shlex.quote(f)}" for f in CONFIGFILES)
FILLEDFIRST = f"{shlex.quote(sys.executable)} -m filledfirst"

# An experiment stops its server when this process (the Snakemake running the job,
# here or on a cluster node) dies, even by SIGKILL. An environment variable, not a
# param: a param would make every new pid look like a changed job.
os.environ.update(FILLEDFIRST_WATCH_PID=str(os.getpid()))

EXPERIMENTS = sorted(config["experiments"])
# Experiments with identical server settings share one server start (one job each group).
SERVER_GROUPS = server_groups(config)
TRACE_WORKLOADS = sorted(n for n, w in config["workloads"].items() if w["kind"] == "trace")
SYNTHETIC_WORKLOADS = sorted(n for n, w in config["workloads"].items() if w["kind"] == "synthetic")
# What ingest measured, and the same with the diagnosis's tables (what the report reads).
INGESTED = "results/ingested.duckdb"
DB = f"results/{RESULTS_DB}"
# What the labels depend on besides the measurements: a change re-runs `diagnose` alone.
DIAGNOSIS_RULES = json.dumps(
    {"diagnosis": config.get("diagnosis", {}),
     "expect": {name: e.get("expect") for name, e in sorted(config["experiments"].items())}},
    sort_keys=True,
)
# The comparison with a baseline study (`compare.baseline`): `all` makes it when one is set.
COMPARE_BASELINE = str(results_database(STUDY.compare.baseline)) if STUDY.compare.baseline else None
COMPARE_HTML, COMPARE_DB = "reports/compare.html", "results/compare.duckdb"
# The report's source lives with the workflow, so --directory elsewhere still finds it.
REPORT_SOURCE = f"{workflow.basedir}/reports/report.qmd"


def one_of(names):
    """A wildcard constraint matching exactly these names (none: matches nothing)."""
    return "|".join(re.escape(n) for n in names) or "(?!)"


def tiny_model_args():
    """The tiny model's shape, as `filledfirst model tiny` options."""
    shape = config["model"].get("tiny", {})
    return " ".join(f"--{key.replace('_', '-')} {int(value)}" for key, value in sorted(shape.items()))


def model_inputs():
    """The locally built model folder, when the config serves one."""
    return [config["model"]["path"]] if config["model"]["source"] == "tiny" else []


def schedule_of(exp):
    return f"data/schedules/{config['experiments'][exp]['workload']}.parquet"


def run_dir(exp):
    return f"results/runs/{exp}"


def run_args(members):
    """`--experiment --schedule --out` for each member, in group order, from the job's
    own input and output lists (so they are the files Snakemake tracks)."""

    def args(wildcards, input, output):
        return " ".join(
            f"--experiment {shlex.quote(exp)} --schedule {shlex.quote(sched)} --out {shlex.quote(out)}"
            for exp, sched, out in zip(members, input.schedules, output)
        )

    return args


def cluster_resources(members):
    """A group job's GPUs, CPUs and memory from the config's `cluster` section, and its
    time limit from its schedules once they exist (filledfirst.cluster)."""

    def runtime(wildcards, input):
        return runtime_minutes(config, members, list(input.schedules))

    return {**job_request(config, members), "runtime": runtime}


def trace_csv_of(wildcards):
    return f"data/traces/{config['workloads'][wildcards.workload]['trace']}.csv"


def knee_inputs(wildcards):
    """The search.json of every capacity search the workload's rates are relative to: its
    schedule is made after those searches (filledfirst.frontier.relative)."""
    from filledfirst.frontier.relative import knee_searches, split_of

    return [frontier_search(*split_of(of)) for of in knee_searches(STUDY.workloads[wildcards.workload])]


def knee_args(wildcards, input):
    """`--knee SEARCH_JSON` for each of the job's knee inputs (a trailing space), else nothing."""
    return "".join(f"--knee {shlex.quote(path)} " for path in input.knees)


def workload_fingerprint(wildcards):
    return fingerprint(config["workloads"][wildcards.workload])


# Capacity searches (the config's `frontiers`): one job per frontier and setting, then
# one per intervention of a verified setting (filledfirst.frontier.interventions), after
# the search whose knee it starts from.
from filledfirst.frontier.plan import frontier_plan

FRONTIER_PLANS = {name: frontier_plan(STUDY, name) for name in STUDY.frontiers}
FRONTIER_SETTINGS = {name: list(plan.settings) for name, plan in FRONTIER_PLANS.items()}


def frontier_dir(frontier, setting):
    return f"results/frontiers/{frontier}/{setting}"


def frontier_search(frontier, setting):
    return f"{frontier_dir(frontier, setting)}/search.json"


def search_dir(wildcards, output):
    """Where a search job puts its probe folders: beside its search.json."""
    return os.path.dirname(output[0])


# Every search.json: ingest takes each for its probe folders (filledfirst.store.ingest).
FRONTIER_SEARCHES = [frontier_search(f, s) for f, settings in FRONTIER_SETTINGS.items() for s in settings]


# The searches that share one server start, by their job's first search
# (filledfirst.config.search_groups), and the experiments each search hosts on that
# server after the job's searches (filledfirst.config.hosted_experiments).
from filledfirst.frontier.relative import split_of

SEARCH_GROUPS = {split_of(lead): [split_of(m) for m in members] for lead, members in search_groups(config, STUDY).items()}
HOSTED = hosted_experiments(config, STUDY)


def group_searches(frontier, setting):
    """The (frontier, setting) searches of the job led by this one, in order."""
    return SEARCH_GROUPS[(frontier, setting)]


def hosted_by(frontier, setting):
    """The experiments the job led by this search runs after its searches."""
    return [e for f, s in group_searches(frontier, setting) for e in HOSTED.get(f"{f}/{s}", [])]


def search_trace(frontier):
    """A trace-shaped frontier's trace CSV and its schedule's stats (the trace's density,
    which each probe's time_scale is worked out from), else None."""
    workload = config["frontiers"][frontier]["workload"]
    wl = config["workloads"][workload]
    if wl["kind"] != "trace":
        return None
    return f"data/traces/{wl['trace']}.csv", f"data/schedules/{workload}.parquet.stats.json"


def frontier_inputs(frontier, setting):
    """The model; for a trace workload its CSV and schedule stats (the job's first search's
    as `trace` and `stats`, the others' in `then_traces`); for an intervention, the
    search.json of the setting it relaxes; for the experiments the job hosts, the
    search.json of every other search they are placed relative to and their traces' CSVs."""
    from filledfirst.frontier.relative import knee_searches, split_of

    members = group_searches(frontier, setting)
    inputs = {"model": model_inputs()}
    relaxed = FRONTIER_PLANS[frontier].interventions.get(setting)
    if relaxed is not None:
        inputs["after"] = frontier_search(frontier, relaxed.parent)
    if (trace := search_trace(frontier)) is not None:
        inputs["trace"], inputs["stats"] = trace
    inputs["then_traces"] = [path for f, _ in members[1:] for path in search_trace(f) or ()]
    own = {f"{f}/{s}" for f, s in members}
    hosted = [STUDY.workloads[config["experiments"][e]["workload"]] for e in hosted_by(frontier, setting)]
    knees = sorted({of for w in hosted for of in knee_searches(w)} - own)
    inputs["knees"] = [frontier_search(*split_of(of)) for of in knees]
    inputs["host_traces"] = sorted({f"data/traces/{w.trace}.csv" for w in hosted if isinstance(w, TraceWorkload)})
    return inputs


def frontier_outputs(frontier, setting):
    """The searches' search.json, the job's first search's first (search_dir reads it),
    then the hosted experiments' run folders."""
    members = group_searches(frontier, setting)
    return [*(frontier_search(f, s) for f, s in members), *(directory(run_dir(e)) for e in hosted_by(frontier, setting))]


def then_args(frontier, setting):
    """`--then FRONTIER SETTING DIR [TRACE_CSV SHAPE_STATS]` for each search after the
    job's first (a trailing space), from the job's own outputs and inputs."""
    members = group_searches(frontier, setting)

    def args(wildcards, input, output):
        traces = iter(input.then_traces)
        words = []
        for (f, s), out in zip(members[1:], output[1:len(members)]):
            trace = [next(traces), next(traces)] if search_trace(f) is not None else []
            words.append(" ".join(shlex.quote(w) for w in ["--then", f, s, os.path.dirname(out), *trace]))
        return "".join(f"{w} " for w in words)

    return args


def host_args(frontier, setting):
    """`--host EXPERIMENT DIR`, `--knee SEARCH_JSON` and `--host-trace TRACE CSV` for the
    experiments the job hosts (a trailing space), from the job's own inputs and outputs."""
    searches = len(group_searches(frontier, setting))

    def args(wildcards, input, output):
        hosted = hosted_by(frontier, setting)
        words = [f"--host {shlex.quote(e)} {shlex.quote(out)}" for e, out in zip(hosted, output[searches:])]
        words += [f"--knee {shlex.quote(k)}" for k in input.knees]
        words += [f"--host-trace {shlex.quote(os.path.basename(c)[:-len('.csv')])} {shlex.quote(c)}"
                  for c in input.host_traces]
        return "".join(f"{w} " for w in words)

    return args


def frontier_trace_args(wildcards, input):
    """`--trace-csv CSV --shape-stats JSON ` for a trace workload (a trailing space), else nothing."""
    if "trace" not in input.keys():
        return ""
    return f"--trace-csv {shlex.quote(input.trace)} --shape-stats {shlex.quote(input.stats)} "


def frontier_spec(frontier, setting):
    from filledfirst.config import search_fingerprint

    hosted = hosted_by(frontier, setting)
    own = " ".join(search_fingerprint(config, f, s) for f, s in group_searches(frontier, setting))
    return own if not hosted else f"{own} {group_fingerprint(config, hosted)}"


def frontier_resources(frontier, setting):
    """A search job's GPUs, CPUs and memory as an experiment job's, and a time limit of a
    start-up and `budget` probes with their drains per search (filledfirst.frontier.plan),
    then each hosted experiment's bound at the lowest knee it can meet (filledfirst.cluster)."""
    from filledfirst.cluster import hosted_seconds
    from filledfirst.frontier.plan import frontier_runtime_minutes

    search = sum(frontier_runtime_minutes(STUDY, f) for f, _ in group_searches(frontier, setting))
    hosted = hosted_by(frontier, setting)
    if not hosted:
        return {**job_request(config), "runtime": search}

    def runtime(wildcards, input):
        csvs = {os.path.basename(c)[: -len(".csv")]: c for c in input.host_traces}
        workloads = [STUDY.workloads[config["experiments"][e]["workload"]] for e in hosted]
        seconds = sum(hosted_seconds(STUDY, e, csvs.get(w.trace) if isinstance(w, TraceWorkload) else None)
                      for e, w in zip(hosted, workloads))
        return search + math.ceil(seconds / 60)

    return {**job_request(config), "runtime": runtime}
