"""Every job's command line stays what it was: its options (names, nargs, choices, defaults, help, groups), a
working --help, and the configs that representative command lines give.

The expected values are tests/data/cli_options.json and tests/data/cli_configs.json, written by
tests/cli_parsers.py from the jobs' hand-written parsers before their options moved onto the config dataclasses.
No job starts anything: the parsers are caught as they parse, and the work after parsing is replaced by stand-ins.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Tuple

import pytest
from cli_parsers import ARGV, CONFIGS, FILES, JOBS, SNAPSHOT, describe, job_config, job_parser

from edje.schemas.cli_options import add_options, from_args, given, option, sub_option

OPTIONS = json.loads(SNAPSHOT.read_text())
EXPECTED_CONFIGS = json.loads(CONFIGS.read_text())


@pytest.mark.parametrize("job", sorted(JOBS))
def test_option_names_are_the_snapshot(job):
    parser = job_parser(job)
    names = sorted(s for a in parser._actions for s in a.option_strings)
    assert names == sorted(s for o in OPTIONS[job]["options"].values() for s in o["option_strings"])


@pytest.mark.parametrize("job", sorted(JOBS))
def test_options_are_the_snapshot(job):
    parser = job_parser(job)
    assert parser.description.replace(str(Path(__file__).resolve().parent.parent), "<ROOT>") == OPTIONS[job]["description"]
    assert parser.formatter_class.__name__ == OPTIONS[job]["formatter"]
    got, want = describe(parser), OPTIONS[job]["options"]
    for flag in sorted(set(got) | set(want)):
        assert got.get(flag) == want.get(flag), flag


@pytest.mark.parametrize("job", sorted(JOBS))
def test_help_exits_0(job, capsys):
    import importlib

    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(JOBS[job]).main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and all(option in out for option in OPTIONS[job]["options"])


@pytest.fixture
def job_folder(tmp_path, monkeypatch):
    """A working folder holding the files the representative command lines name."""
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("job, index", [(job, i) for job, argvs in ARGV.items() for i in range(len(argvs))])
def test_config_is_the_snapshot(job, index, job_folder):
    assert job_config(job, ARGV[job][index]) == EXPECTED_CONFIGS[job][index], " ".join(ARGV[job][index])


def test_serve_flags_override_the_file_only_when_given(job_folder):
    from edje.jobs.serve import config_from_args, parse

    from_file = config_from_args(parse(["--config", "serve.yaml"]))
    assert (from_file.max_documents, from_file.reranker.num_replicas, from_file.miner.num_cpus) == (50, 2, 2)
    assert from_file.ingress.max_ongoing_requests == 20 and from_file.ingress.max_queued_requests is None
    cfg = config_from_args(parse(["--config", "serve.yaml", "--max-documents", "60", "--miner-gpus", "1",
                                  "--ingress-max-queued", "3", "--no-batching"]))
    assert (cfg.max_documents, cfg.miner.num_gpus, cfg.miner.num_cpus, cfg.dynamic_batching) == (60, 1.0, 2, False)
    assert (cfg.ingress.max_ongoing_requests, cfg.ingress.max_queued_requests) == (20, 3)
    assert cfg.reranker.num_replicas == 2 and cfg.token_tables == ("t.parquet",)


def test_training_flags_fill_nested_configs():
    from edje.training.launch import build_parser, config_from_args

    argv = ["--tables", "/t", "--storage-path", "/s", "--name", "n", "--cluster-fraction", "0.5",
            "--cluster-size", "3", "--num-queries", "16", "--random-bert", "num_hidden_layers=2", "hidden_size=8",
            "--loss-weight", "mlm", "0.5", "--mlm-group-weight", "relation", "4"]
    cfg = config_from_args(build_parser("d", 3e-4, ("itm", "mlm")).parse_args(argv))
    assert (cfg.curriculum.max_fraction, cfg.curriculum.cluster_size, cfg.model.num_queries) == (0.5, 3, 16)
    assert cfg.model.bert_config == (("hidden_size", 8), ("num_hidden_layers", 2))
    assert dict(cfg.loss_weights)["mlm"] == 0.5 and cfg.mlm_group_weights == (("relation", 4.0),)
    assert cfg.objectives == ("itm", "mlm") and cfg.lr == 3e-4


def test_encode_and_compress_flags_fill_their_configs():
    from edje.jobs.compress import config_from_args as compress_config
    from edje.jobs.encode_cc12m import config_from_args as encode_config

    cfg = encode_config(["--output", "o", "--input", "a.tsv", "--keep-columns", "x,y", "--random-weights"])
    assert (cfg.input, cfg.keep_columns, cfg.random_weights, cfg.pretrained) == (("a.tsv",), ("x", "y"), True, None)
    cfg = compress_config(["--tables", "a", "--adapter", "ck", "--output", "o", "--quant", "fp16"])
    assert (cfg.tables, cfg.quant, cfg.batch_size) == (("a",), "fp16", 256)



@dataclass(frozen=True)
class _Inner:
    size: int = 1
    rate: float = 0.5


@dataclass(frozen=True)
class _Toy:
    name: str = option(required=True, help="a name")
    count: int = option(3, help="how many (default %(default)s)")
    mode: Literal["a", "b"] = option("a")
    paths: Tuple[str, ...] = option((), flag="--path", nargs="+", convert=tuple)
    verbose: bool = option(False)
    first: float = option(1.0, flag="--both")
    second: float = option(1.0, flag="--both")  # one flag, two fields
    device: Optional[str] = option(None, cli_default="auto")
    inner: _Inner = option(_Inner(), nested={"size": sub_option("--inner-size")})
    hidden: int = 7  # no option


def test_options_written_on_fields():
    p = argparse.ArgumentParser()
    add_options(p, _Toy)
    actions = {a.option_strings[0]: a for a in p._actions}
    assert actions["--count"].type is int and actions["--mode"].choices == ["a", "b"]
    assert actions["--verbose"].const is True and actions["--path"].dest == "path"
    assert actions["--name"].required and actions["--device"].default == "auto"
    assert actions["--inner-size"].type is int and "--second" not in actions
    toy = from_args(_Toy, p.parse_args(["--name", "n", "--path", "x", "y", "--both", "2", "--inner-size", "4"]))
    assert toy == _Toy(name="n", paths=("x", "y"), first=2.0, second=2.0, device="auto", inner=_Inner(size=4))

    unset = argparse.ArgumentParser()
    add_options(unset, _Toy, unset=True)
    assert given(_Toy, unset.parse_args(["--name", "n", "--inner-size", "2"])) == {"name": "n", "inner": {"size": 2}}
