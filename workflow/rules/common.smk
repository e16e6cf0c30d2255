import json
import os
import re
import shlex
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from filledfirst.cluster import job_resources
from filledfirst.config import SCHEMA_PATH, config_files, schema_problem
from filledfirst.errors import UserError
from filledfirst.model.gguf import outtype as gguf_outtype
from filledfirst.paths import RESULTS_DB, results_database
from filledfirst.plan import build_plan, model_inputs
from filledfirst.study import Study, SyntheticWorkload, TraceWorkload

# Only when no --configfile is given: otherwise Snakemake would merge the GPU study's
# experiments into the one the user asked for.
if not workflow.overwrite_configfiles:

    configfile: f"{workflow.basedir}/../config/config.yaml"


if workflow.config_settings.config:
    raise WorkflowError(
        "--config overrides are not passed on to the jobs; put them in a config file " "and give it with --configfile"
    )

CONFIGFILES = [str(f) for f in (workflow.overwrite_configfiles or workflow.configfiles)]
# Snakemake reads each file as written; a machine's overlay extends the study it is layered
# over (config/cpu.yaml extends config/study.yaml), read here as every job reads it.
try:
    RESOLVED = config_files(CONFIGFILES)
except UserError as exc:
    raise WorkflowError(str(exc)) from None
config.clear()
config.update(RESOLVED)

try:
    validate(config, str(SCHEMA_PATH), set_default=True)
except WorkflowError as exc:
    # One line with the key path as the config spells it, instead of the schema dump.
    raise WorkflowError(f"invalid config: {schema_problem(config) or exc}") from None

STUDY = Study.from_dict(config)
# The jobs, their order and their files (filledfirst.plan): each job's command builds the
# same plan from the same config files and runs the job it is named after.
PLAN = build_plan(STUDY)

CONFIG_ARGS = " ".join(f"--config {shlex.quote(f)}" for f in CONFIGFILES)
FILLEDFIRST = f"{shlex.quote(sys.executable)} -m filledfirst"

# A job stops its server when this process (the Snakemake running the job, here or on a
# cluster node) dies, even by SIGKILL. An environment variable, not a param: a param
# would make every new pid look like a changed job.
os.environ.update(FILLEDFIRST_WATCH_PID=str(os.getpid()))

TRACE_WORKLOADS = sorted(n for n, w in STUDY.workloads.items() if isinstance(w, TraceWorkload))
SYNTHETIC_WORKLOADS = sorted(n for n, w in STUDY.workloads.items() if isinstance(w, SyntheticWorkload))
# What ingest measured, and the same with the diagnosis's tables (what the report reads).
INGESTED = "results/ingested.duckdb"
DB = f"results/{RESULTS_DB}"
# What the labels depend on besides the measurements: a change re-runs `diagnose` alone.
DIAGNOSIS_RULES = json.dumps(
    {
        "diagnosis": config.get("diagnosis", {}),
        "expect": {name: e.expect for name, e in sorted(STUDY.experiments.items())},
    },
    sort_keys=True,
)
# The comparison with a baseline study (`compare.baseline`): `all` makes it when one is set.
COMPARE_BASELINE = str(results_database(STUDY.compare.baseline)) if STUDY.compare.baseline else None
COMPARE_HTML, COMPARE_DB = "reports/compare.html", "results/compare.duckdb"
# The report's source lives with the workflow, so --directory elsewhere still finds it.
REPORT_SOURCE = f"{workflow.basedir}/../reports/report.qmd"


def one_of(names):
    """A wildcard constraint matching exactly these names (none: matches nothing)."""
    return "|".join(re.escape(n) for n in names) or "(?!)"


def schedule_knees(wildcards):
    """The search.json of every search the workload's rates are relative to: its schedule
    is made after those searches."""
    return PLAN.schedules[wildcards.workload].knees


def schedule_fingerprint(wildcards):
    return PLAN.schedules[wildcards.workload].fingerprint
