# filledfirst: what fills up first when an LLM server is pushed.
#   snakemake --cores 1 all                               # the GPU study (config/config.yaml)
#   snakemake --cores 1 all --configfile config/cpu.yaml  # the same study on a CPU
from snakemake.utils import min_version

min_version("9.0")


include: "workflow/rules/common.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/trace.smk"
include: "workflow/rules/experiment.smk"
include: "workflow/rules/frontier.smk"
include: "workflow/rules/store.smk"
include: "workflow/rules/report.smk"


# Every job that starts a vLLM server holds one `engine` (filledfirst.cluster.ENGINE), and
# the workflow profile makes one available: never two servers at once on this machine.
# Local: on a cluster each job has its node to itself, so jobs do not wait for each other.
resource_scopes:
    engine="local",


# On a cluster (--profile profiles/slurm) only the experiment jobs are submitted;
# model, traces, schedules, the DuckDB files (ingest, then diagnose) and the report are made
# where Snakemake runs.
localrules:
    all,
    fetch_trace,
    schedule_from_trace,
    schedule_synthetic,
    ingest,
    diagnose,
    report,


rule all:
    default_target: True
    input:
        "reports/report.html",
        FRONTIER_SEARCHES,
