"""The one command line: every Snakemake rule calls one of these sub-commands."""

from __future__ import annotations

import argparse
import logging
import math
import shlex
import sys
from pathlib import Path

from filledfirst.errors import UserError
from filledfirst.interrupts import Interrupted, install_interrupt_handlers
from filledfirst.redact import redact_text
from filledfirst.schema import schema_property
from filledfirst.study import LOADGEN, SCRAPE, TraceWorkload, default_of

log = logging.getLogger("filledfirst")

INTERRUPTED_EXIT = 130


def _schema_number(*path: str):
    """An argparse type for an option that stands for the config key at `path`: a finite
    number (whole where the schema says integer) within the schema's bounds, so a flag
    and the key it stands for take the same values."""
    import jsonschema

    node = {k: v for k, v in schema_property(*path).items() if k in ("type", "minimum", "maximum",
                                                                      "exclusiveMinimum", "exclusiveMaximum")}
    whole = node.get("type") == "integer"
    check = jsonschema.Draft202012Validator(node)

    def parse(text: str) -> int | float:
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{'a whole number' if whole else 'a finite number'}, got {text!r}")
        error = jsonschema.exceptions.best_match(check.iter_errors(value))
        if error is not None:
            key = f"an endpoint's server.{path[-1]}" if path[0] == "$defs" else ".".join(path)
            raise argparse.ArgumentTypeError(f"{error.message} (as {key} in a config)")
        return value

    return parse


def _add_model(sub) -> None:
    p = sub.add_parser("model", help="build or fetch the model a config serves")
    msub = p.add_subparsers(dest="model_cmd", required=True)
    t = msub.add_parser("tiny", help="build the deterministic tiny random-weight model offline")
    t.add_argument("out_dir", type=Path)
    t.add_argument("--layers", type=int, default=None, help="decoder layers (default 2)")
    t.add_argument("--hidden-size", type=int, default=None, help="hidden size, a multiple of 64 (default 128)")
    t.set_defaults(func=_cmd_model_tiny)
    f = msub.add_parser("fetch", help="fetch a hub model into a local folder once (a gated one needs HF_TOKEN)")
    f.add_argument("repo", help="the hub id, e.g. Qwen/Qwen2.5-7B-Instruct (the config's model.path)")
    f.add_argument("out_dir", type=Path, help="the folder every server reads it from (model.download_to)")
    f.add_argument("--revision", help="a branch, tag or commit (model.revision; default: the hub's default branch)")
    f.set_defaults(func=_cmd_model_fetch)
    g = msub.add_parser("gguf", help="write a model folder as one GGUF file, for llama.cpp's server")
    g.add_argument("folder", type=Path, help="the model's folder (Hugging Face layout)")
    g.add_argument("out", type=Path, help="the .gguf file to write")
    g.add_argument("--outtype", default="f32", help="the weights' type in the file (default f32; the workflow "
                   "passes the model's dtype)")
    g.add_argument("--pre-tokenizer", help="the BPE pre-tokenizer's name where the converter does not recognise it "
                   "(the tiny model: qwen2)")
    g.set_defaults(func=_cmd_model_gguf)


def _cmd_model_gguf(args) -> int:
    from filledfirst.model.gguf import write_gguf

    print(write_gguf(args.folder, args.out, outtype=args.outtype, pre_tokenizer=args.pre_tokenizer))
    return 0


def _cmd_model_fetch(args) -> int:
    from filledfirst.model.fetch import fetch

    fetch(args.repo, args.out_dir, args.revision)
    return 0


def _cmd_model_tiny(args) -> int:
    from filledfirst.model.tiny import DEFAULT_HIDDEN, DEFAULT_LAYERS, build_tiny_model

    try:
        build_tiny_model(args.out_dir, args.layers or DEFAULT_LAYERS, args.hidden_size or DEFAULT_HIDDEN)
    except ValueError as e:
        raise UserError(str(e)) from e
    return 0


def _catalog_entry(configs: list[Path], section: str, name: str):
    """One named entry of a config's catalog (`traces`, `workloads`), typed."""
    from filledfirst.config import load_study

    catalog = getattr(load_study(configs), section)
    if name not in catalog:
        raise UserError(f"{section}: no {name!r} in the config ({sorted(catalog)})")
    return catalog[name]


def _add_trace(sub) -> None:
    p = sub.add_parser("trace", help="fetch and subsample Azure-format traces")
    tsub = p.add_subparsers(dest="trace_cmd", required=True)

    f = tsub.add_parser("fetch", help="copy a trace from the mirror folder, or download it")
    f.add_argument("--config", action="append", required=True, type=Path, dest="configs")
    f.add_argument("--trace", required=True, help="name of the trace in the config's catalog")
    f.add_argument("--out", required=True, type=Path)
    f.set_defaults(func=_cmd_trace_fetch)

    s = tsub.add_parser(
        "subsample", help="a time window, then every K-th request",
        description="A trace workload of the config (--config ... --workload NAME: its window, keep_every, "
        "time scale and the model's max_model_len), or a window given by the options below.")
    s.add_argument("csv", type=Path)
    s.add_argument("--config", action="append", type=Path, default=[], dest="configs",
                   help="with --workload: the study's config files (merged in order)")
    s.add_argument("--workload", default=None, help="a trace workload of the config: the window's every setting")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--start-offset", type=float, default=None,
                       help=f"seconds after the first row (default {default_of(TraceWorkload, 'start_offset_s')})")
    where.add_argument("--start", default=None, metavar="TIMESTAMP",
                       help="window start as a timestamp, e.g. '2024-05-12 13:00:00+00:00'")
    s.add_argument("--minutes", type=float, default=None, help="the window's length (required without --workload)")
    s.add_argument("--keep-every", type=int, default=None,
                   help=f"keep every K-th row (default {default_of(TraceWorkload, 'keep_every')})")
    s.add_argument("--phase", type=int, default=None,
                   help=f"keep rows phase, phase+K, ... (default {default_of(TraceWorkload, 'phase')})")
    scale = s.add_mutually_exclusive_group()
    scale.add_argument("--time-scale", type=float, default=None,
                       help="multiply arrival gaps (0.5 = twice as fast; default "
                       f"{default_of(TraceWorkload, 'time_scale')})")
    scale.add_argument("--search", type=Path, default=None, metavar="SEARCH_JSON",
                       help="instead of --time-scale: the time scale at which the window offers --times x the "
                       "knee (highest rate that held) of this search (its search.json; with --workload, the "
                       "workload's own relative rate names the search, read from the study's results)")
    s.add_argument("--times", type=float, default=None, help="with --search: the multiple of the knee's rate")
    s.add_argument("--max-model-len", type=int, default=None, help="clip prompt+output to this")
    s.add_argument("--length-scale", type=float, default=None,
                   help="prompt, output and prefix block sizes x this, for a small engine (default "
                   f"{default_of(TraceWorkload, 'length_scale')})")
    s.add_argument("--format", default=None, choices=("azure", "mooncake"),
                   help="the file's format (default azure; a format of your own: a trace in the config, "
                   "with --workload)")
    s.add_argument("--role", default="trace")
    s.add_argument("--skip-bad", action="store_true",
                   help="drop bad rows (unreadable, non-positive sizes, out of order) and count them")
    s.add_argument("--out", required=True, type=Path)
    s.set_defaults(func=_cmd_trace_subsample)

    st = tsub.add_parser("stats", help="whole-trace figures, streamed (low memory)")
    st.add_argument("csv", type=Path)
    st.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    st.add_argument("--format", default=None, choices=("azure", "mooncake"), help="the file's format (default azure)")
    st.set_defaults(func=_cmd_trace_stats)


def _cmd_trace_fetch(args) -> int:
    from filledfirst.trace.fetch import fetch_trace

    fetch_trace(_catalog_entry(args.configs, "traces", args.trace), args.out)
    return 0


def _cmd_trace_subsample(args) -> int:
    from filledfirst.trace.formats import Format
    from filledfirst.trace.subsample import subsample_to_parquet

    if args.workload is not None:
        spec = _trace_workload_spec(args)
    else:
        if args.configs:
            raise UserError("--config goes with --workload NAME")
        if args.minutes is None:
            raise UserError("give --minutes (or --config ... --workload NAME)")
        if (args.search is None) != (args.times is None):
            raise UserError("--search SEARCH_JSON and --times X go together")
        def given(value, key):
            return value if value is not None else default_of(TraceWorkload, key)

        relative = None
        if args.search is not None:
            from filledfirst.frontier.relative import load_knees, trace_scale_resolver

            knees = load_knees([args.search])
            relative = trace_scale_resolver(next(iter(knees)), args.times, knees)
        spec = dict(start_offset_s=given(args.start_offset, "start_offset_s"), start=args.start, minutes=args.minutes,
                    keep_every=given(args.keep_every, "keep_every"), phase=given(args.phase, "phase"),
                    max_model_len=args.max_model_len, skip_bad=args.skip_bad, relative=relative,
                    time_scale=given(args.time_scale, "time_scale"), fmt=Format.of(args.format),
                    length_scale=given(args.length_scale, "length_scale"))
    subsample_to_parquet(args.csv, args.out, role=args.role, **spec)
    return 0


_WINDOW_FLAGS = ("start", "start_offset", "minutes", "keep_every", "phase", "time_scale", "search", "times",
                 "max_model_len", "length_scale", "format")


def _trace_workload_spec(args) -> dict:
    """subsample_to_parquet's window from a trace workload of the config: the config is the
    one place its settings come from, so no window flag may be given beside it."""
    from filledfirst.config import load_study
    from filledfirst.run.schedules import trace_window

    given = [f"--{f.replace('_', '-')}" for f in _WINDOW_FLAGS if getattr(args, f) is not None]
    if given:
        raise UserError(f"--workload takes its window from the config: drop {', '.join(given)}")
    if not args.configs:
        raise UserError("--workload NAME needs the config: --config FILE")
    study = load_study(args.configs)
    if args.workload not in study.workloads:
        raise UserError(f"workloads: no {args.workload!r} in the config ({sorted(study.workloads)})")
    return trace_window(study, args.workload, _study_knees(study, args.workload), args.skip_bad)


def _study_knees(study, workload: str):
    """The knees a workload of the study is placed relative to, from the searches' results
    where the study's plan puts them (filledfirst.plan)."""
    from filledfirst.frontier.relative import load_knees
    from filledfirst.plan import schedule_knees

    paths = [Path(p) for p in schedule_knees(study, workload)]
    if missing := [str(p) for p in paths if not p.is_file()]:
        raise UserError(f"workload {workload} is placed relative to knees not searched yet: {', '.join(missing)} "
                        "missing (run the study's searches first: snakemake runs them before its schedules)")
    return load_knees(paths)


def _cmd_trace_stats(args) -> int:
    from filledfirst.trace.formats import Format
    from filledfirst.trace.stats import summary_text, trace_stats

    stats = trace_stats(args.csv, args.out, Format.of(args.format))
    print(summary_text(stats))
    return 0


def _add_workload(sub) -> None:
    p = sub.add_parser("workload", help="deterministic synthetic workloads")
    wsub = p.add_subparsers(dest="workload_cmd", required=True)
    s = wsub.add_parser("synth", help="write the schedule of a synthetic workload in the config")
    s.add_argument("--config", action="append", required=True, type=Path, dest="configs")
    s.add_argument("--workload", required=True)
    s.add_argument("--out", required=True, type=Path)
    s.set_defaults(func=_cmd_workload_synth)


def _cmd_workload_synth(args) -> int:
    from filledfirst.config import load_study
    from filledfirst.run.schedules import write_synthetic

    study = load_study(args.configs)
    if args.workload not in study.workloads:
        raise UserError(f"workloads: no {args.workload!r} in the config ({sorted(study.workloads)})")
    write_synthetic(study, args.workload, args.out, _study_knees(study, args.workload))
    return 0


def _add_run(sub) -> None:
    p = sub.add_parser(
        "run",
        help="start vLLM once, replay each experiment's schedule against it in turn, write a run folder each",
        description="One experiment: --experiment NAME --schedule P --out DIR. Several experiments "
        "with identical server settings, against one server start: repeat the three options, "
        "once per experiment, in the order to run them (the i-th of each go together).",
    )
    p.add_argument("--config", action="append", required=True, type=Path, dest="configs")
    p.add_argument("--experiment", action="append", required=True, dest="experiments", metavar="NAME")
    p.add_argument("--schedule", action="append", required=True, type=Path, dest="schedules", metavar="P",
                   help="the schedule of the experiment given at the same place")
    p.add_argument("--out", action="append", required=True, type=Path, dest="outs", metavar="DIR",
                   help="its run folder")
    p.add_argument("--no-progress", action="store_true", help="no live progress line")
    p.set_defaults(func=_cmd_run)


def _cmd_run(args) -> int:
    from filledfirst.config import load_study
    from filledfirst.run.runner import Job, run_experiments, warn_unfinished

    if not len(args.experiments) == len(args.schedules) == len(args.outs):
        raise UserError(
            f"give --experiment, --schedule and --out once per experiment (got {len(args.experiments)}, "
            f"{len(args.schedules)} and {len(args.outs)})"
        )
    jobs = [Job(*triple) for triple in zip(args.experiments, args.schedules, args.outs)]
    warn_unfinished(jobs, run_experiments(load_study(args.configs), jobs, progress=not args.no_progress))
    return 0


def _add_frontier(sub) -> None:
    p = sub.add_parser("frontier", help="capacity searches (the config's frontiers)")
    fsub = p.add_subparsers(dest="frontier_cmd", required=True)
    r = fsub.add_parser(
        "run", help="one search: a frontier's workload at one server setting, on a server of its own",
        description="Probe the frontier's workload at rising, then bisected rates until the search "
        "stops; each probe is a run folder DIR/pNN, the search DIR/search.json. An interrupted "
        "search resumes from its finished probes.",
    )
    r.add_argument("--config", action="append", required=True, type=Path, dest="configs")
    r.add_argument("--frontier", required=True, metavar="NAME")
    r.add_argument("--setting", required=True, metavar="S", help="one of the frontier's settings")
    r.add_argument("--out", required=True, type=Path, metavar="DIR")
    r.add_argument("--trace-csv", type=Path, default=None, help="a trace workload's CSV")
    r.add_argument("--shape-stats", type=Path, default=None,
                   help="a trace workload's schedule stats (<schedule>.stats.json): its density")
    r.add_argument("--no-progress", action="store_true", help="no live progress line")
    r.set_defaults(func=_cmd_frontier_run)
    pr = fsub.add_parser(
        "predict", help="an intervention's first rate, predicted from the searches that have run",
        description="Ingest and diagnose the searches given (in a scratch database), fit the engine's step time "
        "from their scrapes, and write the intervention's predicted start (its parent's knee moved by the "
        "shift the model predicts for the relaxation) as OUT, which its search in the same folder starts from.",
    )
    pr.add_argument("--config", action="append", required=True, type=Path, dest="configs")
    pr.add_argument("--frontier", required=True, metavar="NAME")
    pr.add_argument("--setting", required=True, metavar="S", help="one of the frontier's interventions")
    pr.add_argument("--out", required=True, type=Path, metavar="FILE", help="its prediction.json")
    pr.add_argument("searches", nargs="+", type=Path, metavar="SEARCH",
                    help="search.json files (or their folders), its parent's among them")
    pr.set_defaults(func=_cmd_frontier_predict)


def _cmd_frontier_run(args) -> int:
    from filledfirst.config import load_study, search_fingerprint
    from filledfirst.run.search import SearchTask, run_searches, warn_failed

    study = load_study(args.configs)
    task = SearchTask(args.frontier, args.setting, args.out, search_fingerprint(study, args.frontier, args.setting),
                      args.trace_csv, args.shape_stats)
    warn_failed([task], run_searches(study, [task], progress=not args.no_progress))
    return 0


def _cmd_frontier_predict(args) -> int:
    from filledfirst.analysis.predicted_start import predict_start
    from filledfirst.config import load_study

    predicted = predict_start(load_study(args.configs), args.frontier, args.setting, args.searches)
    predicted.write(args.out)
    print(f"{args.frontier}/{args.setting}: start at "
          + ("its parent's knee" if predicted.start_rps is None else f"{predicted.start_rps:.4g} req/s")
          + f" ({predicted.why})")
    return 0


def _add_job(sub) -> None:
    p = sub.add_parser(
        "job", help="one job of the study's plan: its server start, then its searches and experiments in order",
        description="The study's plan (which searches and experiments share a server start, in which order, with "
        "which files) is built from the config files; this runs the job of that name. The Snakemake workflow "
        "runs every job this way; `--list` shows them.")
    p.add_argument("--config", action="append", required=True, type=Path, dest="configs")
    p.add_argument("name", nargs="?", help="the job's name (Snakemake's rule name)")
    p.add_argument("--list", action="store_true", help="list the plan's jobs, in order, with their tasks")
    p.add_argument("--no-progress", action="store_true", help="no live progress line")
    p.set_defaults(func=_cmd_job)


def _cmd_job(args) -> int:
    from filledfirst.config import load_study
    from filledfirst.plan import build_plan

    study = load_study(args.configs)
    plan = build_plan(study)
    if args.list:
        for job in plan.jobs:
            tasks = ([f"search {s.key}" for s in job.searches] + [e.experiment for e in job.experiments]
                     + [f"paired check {c.key}" for c in job.checks])
            print(f"{job.name}: {', '.join(tasks)}")
        return 0
    if args.name is None:
        raise UserError("give a job's name (or --list)")
    from filledfirst.run.job import run_job

    run_job(study, plan.job(args.name), progress=not args.no_progress)
    return 0


def _add_replay(sub) -> None:
    p = sub.add_parser(
        "replay", help="replay a schedule against a server already running (bring your own endpoint)",
        description="The endpoint is asked first (GET /v1/models, with the key when one is given): one that "
        "cannot be reached or refuses the key is an error before the schedule starts (exit 2, nothing written). "
        "A run whose every request failed is written with status failed (exit 1).",
    )
    p.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000 (its /metrics is scraped)")
    p.add_argument("--schedule", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--token-ids", nargs=2, type=_schema_number("model", "prompt_token_ids", "low"),
                   metavar=("LOW", "HIGH"),
                   help="prompt token ids are drawn from [LOW, HIGH), clear of special tokens "
                   "(required unless --prompt text)")
    p.add_argument("--api", choices=("completions", "chat"), default=LOADGEN.api,
                   help="chat counts reasoning deltas apart from content (needs --prompt text)")
    p.add_argument("--prompt", choices=("token_ids", "text"), default=LOADGEN.prompt,
                   help="text: about one token per word, for servers that refuse token ids")
    p.add_argument("--name", default="replay", help="the run's name in the database and the report")
    p.add_argument("--api-key-env", help="name of the environment variable holding the API key")
    # The defaults are the config schema's (loadgen, scrape), as a study's run gets them.
    # Their bounds too (_schema_number).
    p.add_argument("--seed", type=_schema_number("loadgen", "seed"), default=LOADGEN.seed)
    p.add_argument("--request-timeout", type=_schema_number("loadgen", "request_timeout_s"),
                   default=LOADGEN.request_timeout_s, help="seconds for a whole request")
    p.add_argument("--connect-timeout", type=_schema_number("loadgen", "connect_timeout_s"),
                   default=LOADGEN.connect_timeout_s)
    p.add_argument("--first-token-timeout", type=_schema_number("loadgen", "first_token_timeout_s"),
                   default=LOADGEN.first_token_timeout_s)
    p.add_argument("--drain-timeout", type=_schema_number("loadgen", "drain_timeout_s"),
                   default=LOADGEN.drain_timeout_s)
    p.add_argument("--scrape-interval", type=_schema_number("scrape", "interval_s"), default=SCRAPE.interval_s)
    p.add_argument("--closed", type=_schema_number("loadgen", "concurrency"), metavar="N", default=None,
                   help="closed loop with N workers instead of the schedule's arrival times")
    p.add_argument("--workers", type=_workers, default=LOADGEN.workers, metavar="N|auto",
                   help="processes to split the replay across, each with its own connections, on one clock "
                   "(auto: enough for the schedule's token rate)")
    # The server's limits, as its owner knows them: vLLM's /metrics does not say them.
    p.add_argument("--max-num-seqs", type=_schema_number("$defs", "external_server", "max_num_seqs"), metavar="N",
                   help="the server's max_num_seqs (per engine): without it the diagnosis cannot tell a full cap")
    p.add_argument("--max-num-batched-tokens", metavar="N",
                   type=_schema_number("$defs", "external_server", "max_num_batched_tokens"),
                   help="the server's per-step token budget: without it the diagnosis cannot tell full steps")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_cmd_replay)


def _workers(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"a positive number or auto, got {value!r}")
    return n


def _cmd_replay(args) -> int:
    from filledfirst.loadgen.settings import ReplaySettings
    from filledfirst.run.runner import replay_endpoint
    from filledfirst.study import ExternalServer

    if args.prompt == "token_ids" and not args.token_ids:
        raise UserError("--token-ids LOW HIGH is required with token-id prompts (or give --prompt text)")
    if args.api == "chat" and args.prompt != "text":
        raise UserError("--api chat takes text prompts only: add --prompt text")
    low, high = args.token_ids or (0, 1)
    if high <= low:
        raise UserError(f"--token-ids LOW HIGH: ids are drawn from [LOW, HIGH), so HIGH must be above LOW "
                        f"(got {low} {high})")
    settings = ReplaySettings(
        model=args.model, token_low=low, token_high=high, seed=args.seed, api=args.api, prompt=args.prompt,
        request_timeout_s=args.request_timeout, drain_timeout_s=args.drain_timeout,
        scrape_interval_s=args.scrape_interval,
        mode="closed" if args.closed is not None else "open", concurrency=args.closed,
        connect_timeout_s=args.connect_timeout, first_token_timeout_s=args.first_token_timeout,
        workers=args.workers,
    )
    status = replay_endpoint(
        args.url, args.schedule, args.out, settings,
        name=args.name, api_key_env=args.api_key_env, progress=not args.no_progress,
        limits=ExternalServer(url=args.url, max_num_seqs=args.max_num_seqs,
                              max_num_batched_tokens=args.max_num_batched_tokens).limits,
    )
    return 0 if status != "failed" else 1


def _add_ingest(sub) -> None:
    p = sub.add_parser(
        "ingest", help="load run folders (a search.json: its probe folders) into the DuckDB file (idempotent)")
    p.add_argument("run_dirs", nargs="+", type=Path)
    p.add_argument("--db", required=True, type=Path)
    p.set_defaults(func=_cmd_ingest)


def _cmd_ingest(args) -> int:
    from filledfirst.store.ingest import ingest

    ids = ingest(args.run_dirs, args.db)
    log.info("ingested %d run(s) into %s", len(ids), args.db)
    return 0


def _add_diagnose(sub) -> None:
    p = sub.add_parser("diagnose", help="label each run with what filled first; stored as table `diagnosis` "
                       "(and the capacity searches' results as table `frontiers`)")
    p.add_argument("--db", required=True, type=Path)
    p.add_argument("--from", type=Path, dest="source", metavar="INGESTED",
                   help="label a copy of this database (what `ingest` wrote) and write it as --db, whole or not "
                   "at all; without it --db is labelled in place")
    p.add_argument("--config", action="append", type=Path, dest="configs", default=[],
                   help="thresholds from its `diagnosis` section, designed-for labels from its experiments")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when a run's label is not the one its experiment was designed for (`expect`), "
                   "one line per run")
    p.set_defaults(func=_cmd_diagnose)


def _cmd_diagnose(args) -> int:
    from filledfirst.config import load_study
    from filledfirst.study import DiagnosisRules

    if args.configs:
        study = load_study(args.configs)
        rules = study.diagnosis
        expect = {name: e.expect for name, e in study.experiments.items() if e.expect}
        parts = study.sections if isinstance(study.sections, dict) else None  # load_study reads a sections file
    else:
        rules, expect, parts = DiagnosisRules(), {}, None
    if args.source is not None:
        import shutil

        from filledfirst import atomic
        from filledfirst.store.lock import write_lock

        if not args.source.is_file():
            raise UserError(f"{args.source}: no such database (run `filledfirst ingest` first)")
        # --db's lock too: its rename must not drop what another writer put there meanwhile.
        with write_lock(args.db), atomic.atomic_path(args.db, suffix=".duckdb") as work:
            shutil.copyfile(args.source, work)
            code = _diagnose_in_place(work, rules, expect, parts, args.check)
        return code
    return _diagnose_in_place(args.db, rules, expect, parts, args.check)


def _diagnose_in_place(db: Path, rules, expect, parts, check: bool = False) -> int:
    from filledfirst.analysis.diagnosis import write_diagnosis

    df = write_diagnosis(db, rules, expect, parts)
    rows = [(d["run_id"], d["expect"] or "", d["label"], d["clue"], d["warnings"]) for d in df.to_dicts()]
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table("run", "designed for", "what filled first", "clue", "warnings")
        for row in rows:
            table.add_row(*map(Text, row))  # Text: a clue is never read as markup
        Console().print(table)
    else:  # a log file: one plain line per run
        for run, expect, label, clue, warnings in rows:
            print(f"{run}: {label}" + (f" (designed for {expect})" if expect else "") + f" - {clue}"
                  + (f" [{warnings}]" if warnings else ""))
    from filledfirst.analysis.frontiers import write_frontiers

    # The capacity searches' results need the probes' diagnosis: table `frontiers`.
    for f in write_frontiers(db).to_dicts():
        print(f"frontier {f['frontier']}/{f['setting']}: held {f['lo_rps']} req/s, broke {f['hi_rps']} req/s "
              f"({f['reason']}); at the knee: {f['knee_label']}")
    unmet = [(run, e, label) for run, e, label, *_ in rows if e and label != e]
    if check:
        for run, e, label in unmet:
            print(f"check: {run}: designed for {e}, labelled {label}", file=sys.stderr)
    return 1 if check and unmet else 0


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="render reports/report.qmd against a DuckDB file")
    p.add_argument("--db", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--source", type=Path, default=Path("reports/report.qmd"))
    p.add_argument("--engine", choices=["auto", "quarto", "fallback"], default="auto")
    p.add_argument("--title", help="the report's title (the config's report.title); default: the .qmd's own")
    p.add_argument("--compare", metavar="HREF",
                   help="link the report to this study's comparison with its baseline (`filledfirst compare`)")
    p.add_argument("--publish", action="store_true",
                   help="for a page others read: host names and server command lines left out (report.publish)")
    p.set_defaults(func=_cmd_report)


def _cmd_report(args) -> int:
    from filledfirst.report.render import render_report

    render_report(args.source, args.db, args.out, engine=args.engine, title=args.title, compare=args.compare,
                  publish=args.publish)
    return 0


def _add_compare(sub) -> None:
    p = sub.add_parser("compare", help="two studies side by side: setup, knees, runs, which differences are real; "
                       "exits 1 when the gate fails (a knee dropped, a label changed)")
    p.add_argument("base", type=Path, help="the baseline: a results database, or the results folder holding it")
    p.add_argument("candidate", type=Path, help="the study compared with it, the same way")
    p.add_argument("--out", required=True, type=Path, help="the comparison's HTML page")
    p.add_argument("--db", type=Path, help="also write the comparison as tables of this DuckDB file")
    p.add_argument("--config", action="append", type=Path, dest="configs", default=[],
                   help="thresholds and the gate from its `compare` section (flags below override it)")
    p.add_argument("--knee-min-shift", type=float, help="the least knee shift that counts (0.3: 30 %%)")
    p.add_argument("--run-min-change", type=float, help="the least relative change of a run's figure that counts")
    p.add_argument("--knee-drop", type=float, help="fail when a knee is significantly lower by this share")
    p.add_argument("--label-change", action=argparse.BooleanOptionalAction, default=None,
                   help="fail when what filled first changed at a knee or in a run")
    p.add_argument("--no-fail", action="store_true", help="write the comparison and exit 0 whatever the gate says")
    p.add_argument("--title", help="the page's title")
    p.add_argument("--publish", action="store_true", default=None,
                   help="host names and server command lines left out of the setup (the config's report.publish)")
    p.set_defaults(func=_cmd_compare)


def _cmd_compare(args) -> int:
    import msgspec

    from filledfirst import atomic
    from filledfirst.compare import compare, gate, page, store
    from filledfirst.study import Compare

    section, publish = Compare(), bool(args.publish)
    if args.configs:
        from filledfirst.config import load_study

        study = load_study(args.configs)
        section, publish = study.compare, study.report.publish if args.publish is None else args.publish
    section = msgspec.structs.replace(section, **{k: v for k, v in (
        ("knee_min_shift", args.knee_min_shift), ("run_min_change", args.run_min_change)) if v is not None})
    fail_on = msgspec.structs.replace(section.fail_on, **{k: v for k, v in (
        ("knee_drop", args.knee_drop), ("label_change", args.label_change)) if v is not None})
    comparison = compare(args.base, args.candidate, section, publish)
    reasons = gate.reasons(comparison, fail_on)
    if args.db is not None:
        store.write(comparison, args.db)
    atomic.write_text(page.page_html(comparison, reasons, args.title), args.out)
    counts = ", ".join(f"{n} {v}" for v, n in comparison.verdicts.items() if n)
    log.info("compared %d knees and %d run figures: %s; %s", len(comparison.knees), len(comparison.runs),
             counts or "nothing to compare", args.out)
    for line in comparison.warnings:
        log.warning("%s", line)
    for line in reasons:
        print(f"gate: {line}", file=sys.stderr)
    return 1 if reasons and not args.no_fail else 0


def _add_nightly(sub) -> None:
    p = sub.add_parser("nightly", help="the study measured into a fresh dated folder, compared with the last good "
                       "night and published; the baseline moves only on a pass (exit 1: the gate failed, 2: the "
                       "study did)")
    p.add_argument("--config", action="append", type=Path, dest="configs", required=True,
                   help="the study's config file (again for an overlay)")
    p.add_argument("--root", required=True, type=Path,
                   help="the nightly folder: nights/<UTC time>/ and last-good, the link to the baseline")
    p.add_argument("--publish", type=Path, help="copy the night's report.html and compare.html here")
    p.add_argument("--keep", type=int, default=14, help="nights kept (the baseline always is); default 14")
    p.add_argument("--cores", type=int, default=1, help="Snakemake's --cores; default 1")
    p.add_argument("--snakefile", type=Path, default=Path("workflow/Snakefile"),
                   help="the workflow (default: workflow/Snakefile, from the checkout); its checkout's data/ "
                   "(the model, the traces) is shared by every night")
    p.add_argument("--snakemake-args", default="", help="more Snakemake options, e.g. '--profile profiles/slurm'")
    p.set_defaults(func=_cmd_nightly)


def _cmd_nightly(args) -> int:
    from filledfirst import nightly

    if not args.snakefile.is_file():
        raise UserError(f"{args.snakefile}: no such workflow (run from the checkout, or give --snakefile)")
    snakefile = args.snakefile.resolve()
    measure = nightly.snakemake(snakefile, args.cores, shlex.split(args.snakemake_args))
    install_interrupt_handlers()
    return nightly.run(args.configs, args.root, measure, data=snakefile.parent.parent / "data",
                       publish=args.publish, keep=args.keep)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="filledfirst", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="cmd", required=True)
    for add in (_add_model, _add_trace, _add_workload, _add_job, _add_run, _add_frontier, _add_replay, _add_ingest,
                _add_diagnose, _add_report, _add_compare, _add_nightly):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        return args.func(args)
    except UserError as exc:
        # A message may quote a URL or a config value.
        print(f"filledfirst: error: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    except Interrupted:
        # What was measured is published and logged by now; 128 + SIGINT, the shell's code
        # for an interrupted command, so Snakemake sees the job as not done.
        return INTERRUPTED_EXIT


if __name__ == "__main__":
    sys.exit(main())
