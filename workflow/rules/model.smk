if STUDY.model.source == "tiny":

    localrules:
        tiny_model,

    rule tiny_model:
        output:
            model=directory(STUDY.model.path),
        log:
            "results/logs/model.log",
        params:
            cli=FILLEDFIRST,
            # the tiny model's shape, as `filledfirst model tiny` options
            shape=" ".join(
                f"--{key.replace('_', '-')} {int(value)}"
                for key, value in sorted(config["model"].get("tiny", {}).items())
            ),
        shell:
            "{params.cli} model tiny {output.model:q} {params.shape} > {log:q} 2>&1"


if STUDY.model.source == "hub":

    # On the machine that runs Snakemake (a cluster's login node, which has the network),
    # once, before any server starts: every server then reads the folder.
    localrules:
        fetch_model,

    rule fetch_model:
        output:
            model=directory(STUDY.model.folder),
        log:
            "results/logs/model.log",
        params:
            cli=FILLEDFIRST,
            repo=STUDY.model.path,
            revision=f"--revision {shlex.quote(STUDY.model.revision)}" if STUDY.model.revision else "",
        shell:
            "{params.cli} model fetch {params.repo:q} {output.model:q} {params.revision} > {log:q} 2>&1"


if STUDY.engine.launcher == "llamacpp" and not STUDY.model.folder.endswith(".gguf"):

    # llama.cpp's server reads the model as one GGUF file, written beside its folder.
    localrules:
        gguf_model,

    rule gguf_model:
        input:
            model=STUDY.model.folder,
        output:
            gguf=model_inputs(STUDY)[0],
        log:
            "results/logs/model-gguf.log",
        params:
            cli=FILLEDFIRST,
            pre="--pre-tokenizer qwen2" if STUDY.model.source == "tiny" else "",
            outtype=gguf_outtype(STUDY.model.dtype),
        shell:
            "{params.cli} model gguf {input.model:q} {output.gguf:q} --outtype {params.outtype} {params.pre} > {log:q} 2>&1"
