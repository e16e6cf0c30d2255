"""Load, merge and validate a study config (the same files Snakemake was given)."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import msgspec
import yaml

from filledfirst.errors import UserError
from filledfirst.installed import engine_version
from filledfirst.paths import SCHEMA_PATH, SECTIONS_DIR
from filledfirst.schema import config_schema
from filledfirst.study import ExperimentSpec, ServerSpec, Study, expand_sweeps, renamed_keys

__all__ = ["SCHEMA_PATH", "Study", "load_config", "load_study", "validate_config"]


def deep_merge(base: dict, override: dict) -> dict:
    """Later files override earlier ones key by key, as Snakemake merges --configfile."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_config(paths: list[Path]) -> dict:
    cfg = config_files(paths)
    refuse_renamed(cfg)
    validate_config(cfg)
    return expand_sweeps(cfg)


def config_files(paths: list[Path] | list[str]) -> dict:
    """The config files merged in order, each over the study it extends, not yet checked."""
    cfg: dict = {}
    for path in paths:
        cfg = deep_merge(cfg, config_file(Path(path)))
    return cfg


def config_file(path: Path, layered: tuple[Path, ...] = ()) -> dict:
    """One config file as written, over the study it `extends` (a file named relative to
    it, itself read the same way): a machine's overlay over the study both machines run."""
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise UserError(f"config file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise UserError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(loaded, dict):
        return loaded
    if isinstance(loaded.get("sections"), str):
        loaded = {**loaded, "sections": _sections_file(loaded["sections"], path)}
    base = loaded.pop("extends", None)
    if base is None:
        return loaded
    if not isinstance(base, str):
        raise UserError(f"{path}: extends: the file of the study this one is layered over, got {base!r}")
    under, layered = path.parent / base, (*layered, path.resolve())
    if under.resolve() in layered:
        raise UserError(f"{path}: extends: {base} extends it in turn")
    return deep_merge(config_file(under, layered), loaded)


def _sections_file(name: str, named_in: Path) -> dict:
    """The `sections:` of the file a config's `sections` names: relative to that config,
    else one the package ships by that name (the original study's: a copy of a shipped
    config anywhere still finds them)."""
    candidates = [named_in.parent / name, SECTIONS_DIR / name]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise UserError(f"{named_in}: sections: {name} is in none of {', '.join(str(p.parent) for p in candidates)}")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{named_in}: sections: {path} is not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("sections"), dict):
        raise UserError(f"{named_in}: sections: {path} has no `sections:` mapping")
    return doc["sections"]


def refuse_renamed(cfg: dict[str, Any]) -> None:
    """An error naming every old key the config uses and what replaces it."""
    if renamed := renamed_keys(cfg):
        raise UserError("invalid config:\n  " + "\n  ".join(renamed))


def load_study(paths: list[Path]) -> Study:
    """`load_config`, then converted once into the typed study (filledfirst.study)."""
    return Study.from_dict(load_config(paths))


def validate_config(cfg: dict[str, Any]) -> None:
    """Schema (with defaults filled in, through Snakemake's validator) then cross-references."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    try:
        validate(cfg, str(SCHEMA_PATH), set_default=True)
    except WorkflowError as exc:
        raise UserError(f"invalid config: {schema_problem(cfg) or exc}") from None
    written = cfg["experiments"]
    cfg = expand_sweeps(cfg)  # a copy: the sweeps' runs are checked as written ones
    problems = []
    for name, wl in cfg["workloads"].items():
        if wl["kind"] == "trace" and wl["trace"] not in cfg.get("traces", {}):
            known = sorted(cfg.get("traces", {}))
            problems.append(f"workloads.{name}.trace: {wl['trace']!r} is not in traces ({known})")
        absolute = "time_scale" if wl["kind"] == "trace" else "interval_s"
        places = ([(f"workloads.{name}", wl)] if wl["kind"] == "trace"
                  else [(f"workloads.{name}.phases[{i}]", p) for i, p in enumerate(wl["phases"])])
        problems += [f"{where}: rate and {absolute} both set its rate: keep one"
                     for where, p in places if "rate" in p and absolute in p]
    sections = cfg.get("sections")
    known = sorted(sections) if isinstance(sections, dict) else "none: add `sections:`"
    for where, section in [*((f"experiments.{n}", e.get("section")) for n, e in written.items()),
                           *((f"sweeps.{n}", s.get("section")) for n, s in (cfg.get("sweeps") or {}).items())]:
        if section is not None and not (isinstance(sections, dict) and section in sections):
            problems.append(f"{where}.section: {section!r} is not in sections ({known})")
    for name, exp in cfg["experiments"].items():
        if exp["workload"] not in cfg["workloads"]:
            known = sorted(cfg["workloads"])
            problems.append(f"experiments.{name}.workload: {exp['workload']!r} is not in workloads ({known})")
    from filledfirst.engines import settings_problem

    for name, exp in cfg["experiments"].items():
        lg = deep_merge(cfg.get("loadgen", {}), exp.get("loadgen", {}))
        if lg.get("mode") == "closed" and not lg.get("concurrency"):
            problems.append(f"experiments.{name}.loadgen: mode closed needs concurrency")
        if lg.get("api") == "chat" and lg.get("prompt") != "text":
            problems.append(f"experiments.{name}.loadgen: api chat takes text prompts only (prompt: text)")
        own = exp.get("server") or {}
        merged = deep_merge(cfg["engine"].get("server", {}), own)
        if "url" not in own and (why := settings_problem(cfg["engine"]["launcher"], merged)):
            problems.append(f"experiments.{name}.server: {why}")
    from filledfirst.frontier.plan import frontier_problems

    problems += frontier_problems(Study.from_dict(cfg))
    ids = cfg["model"]["prompt_token_ids"]
    if ids["low"] >= ids["high"]:
        problems.append("model.prompt_token_ids: low must be below high")
    if not cfg["model"].get("path"):
        problems.append(f"model.path is required when model.source is {cfg['model']['source']}")
    unused = [k for k in ("revision", "download_to") if k in cfg["model"] and cfg["model"]["source"] != "hub"]
    if unused:
        problems.append(f"model.{unused[0]} is for a hub model (source hub), not source {cfg['model']['source']}")
    if problems:
        raise UserError("invalid config:\n  " + "\n  ".join(problems))


def external_server(study: Study, experiment: str) -> dict | None:
    """`server: {url: ...}`: an endpoint the study does not start (a deployed vLLM, a
    Kubernetes service); None for a server the study starts itself."""
    cfg = study.document
    server = cfg["experiments"][experiment].get("server", {})
    return server if "url" in server else None


def schema_problem(cfg: dict[str, Any]) -> str | None:
    """The schema's most relevant complaint in one line, with the key path as the config
    spells it (`experiments.seq_limit.server.max_num_seqs`), not Python's indexing; an old
    key's new name first (filledfirst.study.RENAMED)."""
    import jsonschema

    if renamed := renamed_keys(cfg):
        return renamed[0]

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(config_schema()).iter_errors(cfg))
    if error is None:
        return None
    error = _branch_of_kind(error)
    where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
    allowed = error.schema.get("enum") if isinstance(error.schema, dict) else None
    if allowed and error.validator == "enum":
        return f"{where}: {error.instance!r} is not one of the allowed values {allowed}"
    return f"{where}: {error.message}"


def _branch_of_kind(error):
    """For a workload (a oneOf of kinds), the complaint of the branch of its own `kind`
    (`workloads.w.time_scale: ...`), not that another kind was expected."""
    import jsonschema

    where = error
    while where is not None and not (where.validator == "oneOf" and isinstance(where.instance, dict)
                                     and "kind" in where.instance):
        where = where.parent
    if where is None or not where.context:
        return error
    branches: dict = {}
    for sub in where.context:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    own = [errs for errs in branches.values()
           if not any(e.validator == "const" and list(e.relative_path) == ["kind"] for e in errs)]
    return jsonschema.exceptions.best_match(own[0]) if len(own) == 1 else error


def server_settings(study: Study, experiment: str) -> dict:
    """The engine's defaults with the experiment's overrides on top (for an external
    endpoint, its url and key variable: the engine's defaults do not apply to it)."""
    cfg = study.document
    if (external := external_server(study, experiment)) is not None:
        return dict(external)
    base = cfg["engine"].get("server", {})
    return deep_merge(base, cfg["experiments"][experiment].get("server", {}))


def experiment_spec(study: Study, experiment: str) -> ExperimentSpec:
    """Everything that decides an experiment's outcome, typed (what the runner passes on)."""
    return ExperimentSpec.from_doc(spec_document(study, experiment))


def spec_document(study: Study, experiment: str) -> dict:
    """The experiment's spec as written to run.json: its hash (`fingerprint`) triggers
    re-runs, so it is built from the config as written (with the schema's defaults), not
    re-encoded from the types, whose encoding would add every unset key."""
    cfg = study.document
    exp = cfg["experiments"][experiment]
    return {
        "experiment": experiment,
        "description": exp.get("description", ""),
        "workload_name": exp["workload"],
        "workload": cfg["workloads"][exp["workload"]],
        "server": server_settings(study, experiment),
        "loadgen": deep_merge(cfg.get("loadgen", {}), exp.get("loadgen", {})),
        **_model_engine_scrape(study),
    }


# How the study handles a server between runs, not what a run on it measures: no identity has it.
_HANDLING = ("pause_between_blocks",)


def _measured(engine: dict) -> dict:
    """An engine's start as a run's identity has it (`_HANDLING` left out)."""
    return {k: v for k, v in engine.items() if k not in _HANDLING}


def _model_engine_scrape(study: Study) -> dict:
    cfg = study.document
    return {
        "model": cfg["model"],
        "engine": {k: v for k, v in cfg["engine"].items() if k != "server"},
        "scrape": cfg.get("scrape", {}),
    }


def search_fingerprint(study: Study, frontier: str, setting: str) -> str:
    """A capacity search's identity: changes when anything that decides a probe's outcome
    or the search's path does (Snakemake re-runs the search; its probes measured before
    are not reused). Hashed from the config as written, as spec_document is: a probe's
    server, model, engine, scrape, its loadgen (the study's, open loop), the shape, and
    the search's SLO, lengths and bounds; an intervention's, what it relaxes too; and the
    installed engine's version (spec_fingerprint)."""
    cfg = study.document
    from filledfirst.frontier.plan import search_plan, search_terms

    plan = search_plan(study, frontier, setting)
    f = cfg["frontiers"][frontier]
    loadgen = {k: v for k, v in cfg.get("loadgen", {}).items() if k != "concurrency"}
    relaxed = plan.interventions.get(setting)
    own = f["settings"][setting] if relaxed is None else deep_merge(f["settings"][relaxed.parent], relaxed.changes)
    return fingerprint({
        "server": deep_merge(cfg["engine"].get("server", {}), own),
        # whether it is paired or searched decides what follows or whether it probes, not what a
        # probe measures (the job's fingerprint has both)
        **({} if relaxed is None else {"intervention": {k: v for k, v in msgspec.to_builtins(relaxed).items()
                                                        if k not in ("paired", "search")}}),
        "loadgen": {**loadgen, "mode": "open"},
        **(common := _model_engine_scrape(study)),
        "engine": _measured(common["engine"]),
        "workload": cfg["workloads"][f["workload"]],
        **search_terms(plan),
        "engine_version": engine_version(study.engine.launcher),
    })


def workload_fingerprint(study: Study, workload: str) -> str:
    """A workload's identity, from the config as written: its schedule is made again when
    it changes."""
    return fingerprint(study.document["workloads"][workload])


def fingerprint(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def spec_fingerprint(spec: dict) -> str:
    """A run's identity (run.json's `spec_fingerprint`): its spec document, and for a
    server it starts the installed engine's version (filledfirst.installed): a new vLLM
    measures again. An endpoint's runs do not depend on what is installed here."""
    if "url" in spec["server"]:
        return fingerprint(spec)
    return fingerprint({**spec, "engine": _measured(spec["engine"]),
                        "engine_version": engine_version(spec["engine"]["launcher"])})


def server_identity(study: Study, experiment: str) -> dict:
    """What makes two experiments' servers the same process: model, engine, merged settings.
    The load generator and scrape settings are the client's and do not count."""
    spec = spec_document(study, experiment)
    return {"model": spec["model"], "engine": spec["engine"], "server": spec["server"]}


def server_groups(study: Study) -> dict[str, list[str]]:
    """Experiments that run one after the other against one server start, by group name.

    A group is named after its first experiment: readable in Snakemake's job list and log
    names, stable while that experiment stays first, and a group of one keeps the name its
    experiment had on its own (`results/logs/run-<experiment>.log`). A fingerprint would
    change with every settings tweak and tell a reader nothing.

    Inside a group experiments run in config order, so which one meets a freshly started
    server (first batches, allocator warm-up) is decided by the config, never by a sort:
    put the experiment that should see a cold server first, or give it `share_server: false`.
    An experiment a capacity search hosts is in no group.
    """
    hosted = host_of(study)  # they run on their search's server (filledfirst.config.hosted_experiments)
    # Canonical JSON, not a hash: equal exactly when the settings are. An external
    # endpoint has no server start to share.
    return _by_leader((name, None if not (exp.share_server and study.share_server) or exp.external is not None
                       else json.dumps(server_identity(study, name), sort_keys=True))
                      for name, exp in study.experiments.items() if name not in hosted)


def _by_leader(items) -> dict[str, list[str]]:
    """(name, key) pairs, in order -> the first name of each key -> the names with that
    key; a name whose key is None is alone."""
    groups: dict[str, list[str]] = {}
    leader: dict[str, str] = {}
    for name, key in items:
        if key is not None and key in leader:
            groups[leader[key]].append(name)
            continue
        if key is not None:
            leader[key] = name
        groups[name] = [name]
    return groups


def check_shareable(study: Study, experiments: list[str]) -> None:
    """Refuse to run `experiments` against one server unless their groups allow it."""
    unknown = [e for e in experiments if e not in study.experiments]
    if unknown:
        raise UserError(f"experiment(s) {unknown} not in the config ({sorted(study.experiments)})")
    if len(set(experiments)) != len(experiments):
        raise UserError(f"an experiment is given twice: {experiments}")
    if len(experiments) < 2:
        return
    alone = [e for e in experiments if not study.experiments[e].share_server]
    if alone:
        raise UserError(f"{alone} must have a server of their own (share_server: false)")
    external = [e for e in experiments if external_server(study, e)]
    if external:
        raise UserError(f"{external} replay against an external endpoint (server.url): run them separately")
    first = server_identity(study, experiments[0])
    differ = [e for e in experiments[1:] if server_identity(study, e) != first]
    if differ:
        raise UserError(
            f"{differ} need a different server from {experiments[0]!r} (model, engine or server "
            "settings differ): run them separately"
        )


def group_fingerprint(study: Study, experiments: list[str]) -> str:
    """Changes when any experiment of the group, or the group's membership or order, does."""
    return fingerprint([spec_fingerprint(spec_document(study, e)) for e in experiments])


def search_server(study: Study, frontier: str, setting: str) -> ServerSpec:
    """The server a search's probes run on."""
    from filledfirst.frontier.plan import frontier_plan, probe_spec

    plan = frontier_plan(study, frontier)
    return probe_spec(study, plan, setting, experiment="", description="", workload=plan.workload).server_spec


def hosted_experiments(study: Study) -> dict[str, list[str]]:
    """`<frontier>/<setting>` -> the experiments its job runs on its server once the search
    has ended, in config order; searches that host nothing are left out.

    An experiment placed relative to a search's knee waits for that search in any case;
    when it also needs exactly the server the search probed (same model, engine start and
    vLLM settings), the search's job runs it before stopping that server: one vLLM start
    fewer, which on a GPU is minutes of model loading. It then meets a server that has just
    served the search's probes and checks, as a server group's later experiments meet one
    that has served the earlier ones. It is hosted by the first search it is placed
    relative to (in the order its workload names them) whose server it needs.
    `share_server: false` (the experiment's or the study's) or an external endpoint keep
    it in a job of its own."""
    from filledfirst.frontier.relative import relative_refs, split_of

    if not study.frontiers or not study.share_server:
        return {}
    servers: dict[str, ServerSpec | None] = {}
    hosted: dict[str, list[str]] = {}
    for name, exp in study.experiments.items():
        if not exp.share_server or exp.external is not None:
            continue
        needs = experiment_spec(study, name).server_spec
        for _, of in relative_refs(study.workloads[exp.workload]):
            if of not in servers:
                frontier, setting = split_of(of)
                servers[of] = search_server(study, frontier, setting)
            if servers[of] == needs:
                hosted.setdefault(of, []).append(name)
                break
    return hosted


def search_groups(study: Study) -> dict[str, list[str]]:
    """`<frontier>/<setting>` of a job's first search -> the searches that job runs, one
    after the other on one server start, in config order (frontiers, then their settings).

    Searches that probe exactly the same server (the default settings of several
    frontiers, typically) share its start, as experiments do: on a GPU a start is minutes
    of model loading. Each search still starts from its own capacity estimate, a closed
    loop measured on the server as the earlier searches left it. An intervention waits for
    its parent's knee, so it keeps a job of its own; so does every search with
    `share_server: false`. An intervention judged side by side alone (`interventions.search`
    false) is no search: its parent's job judges it (`checks_of`)."""
    from filledfirst.frontier.plan import frontier_plan

    def searches():
        for frontier in study.frontiers:
            plan = frontier_plan(study, frontier)
            for setting in plan.settings:
                if (relaxed := plan.interventions.get(setting)) is not None and not relaxed.search:
                    continue
                alone = setting in plan.interventions or not study.share_server
                yield (f"{frontier}/{setting}",
                       None if alone else msgspec.json.encode(search_server(study, frontier, setting)).decode())

    return _by_leader(searches())


def checks_of(study: Study) -> dict[str, list[str]]:
    """`<frontier>/<setting>` of a search -> its interventions judged side by side alone
    (`interventions.search` false), in config order: its job checks them right after its
    search, while its server is up (filledfirst.run.paired)."""
    from filledfirst.frontier.plan import frontier_plan

    checks: dict[str, list[str]] = {}
    for frontier in study.frontiers:
        for setting, relaxed in frontier_plan(study, frontier).interventions.items():
            if not relaxed.search:
                checks.setdefault(f"{frontier}/{relaxed.parent}", []).append(f"{frontier}/{setting}")
    return checks


def host_of(study: Study) -> dict[str, str]:
    """Each hosted experiment -> `<frontier>/<setting>` of the search whose server it runs on."""
    return {exp: of for of, exps in hosted_experiments(study).items() for exp in exps}
