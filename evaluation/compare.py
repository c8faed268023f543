"""One comparison table of reranker designs that share one first stage.

A small JSON spec names the rows: for each, the evaluation output it reads (the metrics.json that
jobs/evaluate.py writes, with its run.json beside it, or the one research/elip_eval.py writes) and
what no metrics file holds: its command, its training minutes, its backbone passes per query, how its
tokens are stored; or, for a row that was not measured, the reason. `build_table` reads them into
typed rows and refuses, with the rows' first stages side by side, unless every measured row reranked
the same first stage: the same annotations, the same number of queries, the same k and the same
first-stage R@1/5/10 (and the spec's expected figures when it gives them). That is the table's contract:
differences between rows are the rerankers', not the candidates'.

    python jobs/evaluate.py --compare benchmarks/comparison_seed57.json --output runs/compare57

Spec (paths relative to the working directory):
    {"title": "...",
     "expected_first_stage": {"t2i": {"r1": 22.6, "r5": 77.2, "r10": 94.6}, "queries_t2i": 1000},   # optional
     "rows": [{"name": "EDJE local", "metrics": "runs/x/metrics.json", "command": "...",
               "train_minutes": 88.5, "backbone_passes_per_query": 0,
               "storage": {"tokens": 64, "width": 128, "quant": "int8", "group_size": null},  # optional
               "stage": "reranked" | "first_stage", "note": "...", "loadavg": [..]},     # optional
              {"name": "EDJE compressed-64", "not_measured": "why", "command": "...", "train_minutes": 75}],
     "held_out": {"title": "...", "note": "..."}}                                              # optional

A row may also carry its held-out-combination twin: the same design trained on a world that never
shows some attribute combinations, evaluated on an in-distribution test world and on one made only of
those combinations (`sampleworld generate --held-out ... --held-out-mode exclude | only`):

    {"name": ..., "held_out": {"in_distribution": "runs/a/metrics.json", "held_out": "runs/b/metrics.json",
                               "command": "...", "train_minutes": 30, "note": "..."}}

Each of the two columns must share one first stage across rows, as the main table does.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from edje.model.ranking import RankingConfig
from edje.sampleworld.registry import world_kind
from edje.schemas.codecs import bytes_per_image

TWIN_KINDS = world_kind("shapes").twin_kinds  # the compared designs are measured on shapes worlds
KS = ("r1", "r5", "r10")


class FirstStageMismatch(ValueError):
    """Measured rows did not rerank the same first stage: the table would compare different candidates."""


@dataclass(frozen=True)
class Recall:
    """R@1/5/10 in percent."""

    r1: float
    r5: float
    r10: float

    @classmethod
    def of(cls, d: Mapping[str, float]) -> "Recall":
        return cls(float(d["r1"]), float(d["r5"]), float(d["r10"]))

    def cell(self) -> str:
        return f"{self.r1:.1f} / {self.r5:.1f} / {self.r10:.1f}"


@dataclass(frozen=True)
class FirstStage:
    """What every measured row must share."""

    annotations: str  # resolved path of the split
    queries_t2i: int
    k: int
    t2i: Recall
    i2t: Optional[Recall] = None  # None: the row's evaluation is text-to-image only (ELIP)
    queries_i2t: Optional[int] = None


@dataclass(frozen=True)
class Row:
    """One design in the table: its figures (None where not measured), its cost and where it came from."""

    name: str
    command: str
    not_measured: Optional[str] = None  # the reason, for a row without figures
    rule: Optional[str] = None  # how the reranked list is ordered
    t2i: Optional[Recall] = None
    i2t: Optional[Recall] = None
    t2i_itm_only: Optional[Recall] = None  # fused rules: the ITM logit alone
    within_family_t2i: Optional[float] = None  # % of T2I queries whose answer beats its family's twins in the top k
    within_family_queries: Optional[int] = None
    by_kind_t2i: Dict[str, float] = field(default_factory=dict)  # % of answer-vs-one-swap-twin pairs, by swap kind
    by_kind_pairs: Dict[str, int] = field(default_factory=dict)
    first_stage: Optional[FirstStage] = None
    backbone_passes_per_query: Optional[float] = None
    bytes_per_image: Optional[int] = None
    storage: Optional[str] = None  # e.g. "64 x 128 int8"
    pairs_per_s: Optional[float] = None  # text-to-image pairs reranked per second
    threads: Optional[int] = None
    loadavg: Optional[Tuple[float, ...]] = None  # 1, 5, 15 min load average around the measurement
    train_minutes: Optional[float] = None
    eval_minutes: Optional[float] = None
    note: str = ""
    source: Optional[str] = None  # the metrics.json read
    held_out: Optional["HeldOutTwin"] = None

    @property
    def measured(self) -> bool:
        return self.not_measured is None


@dataclass(frozen=True)
class HeldOutTwin:
    """A design trained without the held-out combinations: on a test world of seen combinations and on one
    made only of the withheld ones. The gap between the two is what memorised binding costs."""

    command: str
    in_distribution: Row
    held_out: Row
    train_minutes: Optional[float] = None
    note: str = ""


def _read_json(path: Path) -> Dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such evaluation output") from None


def _by_kind(within: Mapping[str, Any], stage: str) -> Tuple[Dict[str, float], Dict[str, int]]:
    kinds = within.get("by_kind", {}).get(stage, {})
    acc = {k: kinds[k]["accuracy"] for k in TWIN_KINDS if k in kinds and kinds[k]["accuracy"] is not None}
    pairs = {k: int(kinds[k]["pairs"]) for k in TWIN_KINDS if k in kinds}
    return acc, pairs


def _resolved(path: str) -> str:
    return str(Path(path).expanduser().resolve())


def _storage(spec: Mapping[str, Any]) -> Tuple[Optional[str], Optional[int]]:
    s = spec.get("storage")
    if not s:
        return None, None
    quant, group = s["quant"], s.get("group_size")
    label = f"{s['tokens']} x {s['width']} {quant}" + (f" (group {group})" if group else "")
    return label, bytes_per_image(int(s["tokens"]), int(s["width"]), quant, group)


def _stored_quant(run: Mapping[str, Any]) -> Optional[Tuple[str, Optional[int]]]:
    """How jobs/evaluate.py's tokens were stored: --quant on raw tables, or the compressed tables' codec."""
    cfg, table = run.get("config", {}), run.get("table", {})
    if cfg.get("quant"):
        return cfg["quant"], cfg.get("group_size")
    if table.get("kind") == "compressed":
        return table.get("quantization"), table.get("group_size")
    return None


def _rule(metrics: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    if run.get("config", {}).get("backbone_only"):
        return "first-stage cosine"
    rule = RankingConfig(**(metrics.get("ranking") or {}))
    if rule.switched:
        return (f"ITM + {rule.first_stage_weight:g} x cosine ({rule.low_confidence_weight:g} x below "
                f"{rule.confidence_threshold:.3g})")
    return f"ITM + {rule.first_stage_weight:g} x cosine" if rule.fuses else "ITM logit"


def _edje_row(spec: Mapping[str, Any], metrics: Mapping[str, Any], run: Mapping[str, Any], stage: str) -> Dict[str, Any]:
    """Fields of a row read from jobs/evaluate.py's metrics.json + run.json."""
    if not run:
        raise ValueError("a jobs/evaluate.py metrics.json needs its run.json beside it (queries, k, timings)")
    cfg, t2i, i2t = run["config"], metrics["t2i"], metrics["i2t"]
    q, n_img = int(run["queries"]["t2i"]), int(run["queries"]["i2t"])
    k = int(cfg["k"])
    within = t2i.get("within_family", {})
    acc, pairs = _by_kind(within, stage)
    timings = run.get("timings", {})
    pps = None
    if stage == "reranked" and timings.get("rerank_t2i_s"):
        pps = round(q * min(k, n_img) / timings["rerank_t2i_s"], 1)
    load = run.get("loadavg_1_5_15")
    wanted = spec.get("storage")
    stored = _stored_quant(run)
    if wanted and stored and (wanted["quant"], wanted.get("group_size")) != stored:
        raise ValueError(f"row {spec['name']!r}: the spec says tokens stored as {wanted['quant']} "
                         f"(group {wanted.get('group_size')}), the evaluation used {stored[0]} (group {stored[1]})")
    return dict(
        rule="first-stage cosine" if stage == "first_stage" else _rule(metrics, run),
        t2i=Recall.of(t2i[stage]), i2t=Recall.of(i2t[stage]),
        t2i_itm_only=Recall.of(t2i["reranked_itm_only"]) if stage == "reranked" and "reranked_itm_only" in t2i else None,
        within_family_t2i=within.get(stage, {}).get("accuracy"), within_family_queries=within.get(stage, {}).get("queries"),
        by_kind_t2i=acc, by_kind_pairs=pairs,
        first_stage=FirstStage(_resolved(cfg["annotations"]), q, k, Recall.of(t2i["first_stage"]),
                               Recall.of(i2t["first_stage"]), n_img),
        pairs_per_s=pps, threads=run.get("torch_threads"), loadavg=tuple(load) if load else None,
        eval_minutes=round(timings["total_s"] / 60, 1) if "total_s" in timings else None)


def _elip_row(metrics: Mapping[str, Any], stage: str) -> Dict[str, Any]:
    """Fields of a row read from research/elip_eval.py's metrics.json (text-to-image only; cost inside)."""
    t2i, cost, cfg = metrics["t2i"], metrics.get("cost", {}), metrics.get("config", {})
    within = t2i.get("within_family", {})
    acc, pairs = _by_kind(within, stage)
    load = cost.get("loadavg_1_5_15")
    return dict(
        rule="ELIP cosine (prompted backbone)" if stage == "reranked" else "first-stage cosine",
        t2i=Recall.of(t2i[stage]), within_family_t2i=within.get(stage, {}).get("accuracy"),
        within_family_queries=within.get(stage, {}).get("queries"), by_kind_t2i=acc, by_kind_pairs=pairs,
        first_stage=FirstStage(_resolved(cfg["annotations"]), int(metrics["queries"]), int(metrics["k"]),
                               Recall.of(t2i["first_stage"])),
        backbone_passes_per_query=cost.get("backbone_passes_per_query"),
        pairs_per_s=cost.get("pairs_per_s"), threads=cost.get("torch_threads"), loadavg=tuple(load) if load else None,
        eval_minutes=round(metrics["total_s"] / 60, 1) if "total_s" in metrics else None)


def load_row(spec: Mapping[str, Any]) -> Row:
    """A typed row from one spec entry: its evaluation output read, the spec's fields over what was read."""
    for key in ("name", "command"):
        if not spec.get(key):
            raise ValueError(f"every row needs {key!r}: {dict(spec)}")
    storage, nbytes = _storage(spec)
    common = dict(name=spec["name"], command=spec["command"], train_minutes=spec.get("train_minutes"),
                  note=spec.get("note", ""), storage=storage, bytes_per_image=nbytes)
    if spec.get("not_measured"):
        return Row(not_measured=spec["not_measured"], **common)
    if not spec.get("metrics"):
        raise ValueError(f"row {spec['name']!r}: give 'metrics' (an evaluation's metrics.json) or 'not_measured'")
    stage = spec.get("stage", "reranked")
    if stage not in ("reranked", "first_stage"):
        raise ValueError(f"row {spec['name']!r}: stage must be 'reranked' or 'first_stage', got {stage!r}")
    path = Path(spec["metrics"])
    metrics = _read_json(path)
    if "cost" in metrics and "queries" in metrics:  # research/elip_eval.py
        fields = _elip_row(metrics, stage)
    else:  # jobs/evaluate.py
        run_path = path.parent / "run.json"
        fields = _edje_row(spec, metrics, _read_json(run_path) if run_path.exists() else {}, stage)
    if stage == "first_stage":
        fields.update(pairs_per_s=None, backbone_passes_per_query=0)
    for key in ("backbone_passes_per_query", "eval_minutes", "pairs_per_s", "threads", "rule"):
        if spec.get(key) is not None:  # the spec knows better (e.g. a cost measured by a benchmark)
            fields[key] = spec[key]
    if spec.get("loadavg") is not None:
        fields["loadavg"] = tuple(spec["loadavg"])
    return Row(source=str(path), held_out=_held_out_twin(spec), **common, **fields)


def _held_out_twin(spec: Mapping[str, Any]) -> Optional[HeldOutTwin]:
    """The row's held-out twin (both test worlds read like the row itself), or None."""
    h = spec.get("held_out")
    if not h:
        return None
    for key in ("in_distribution", "held_out", "command"):
        if not h.get(key):
            raise ValueError(f"row {spec['name']!r}: held_out needs {key!r}")
    side = {k: spec[k] for k in ("name", "stage", "storage", "rule") if k in spec}
    return HeldOutTwin(command=h["command"], train_minutes=h.get("train_minutes"), note=h.get("note", ""),
                       in_distribution=load_row({**side, "command": h["command"], "metrics": h["in_distribution"]}),
                       held_out=load_row({**side, "command": h["command"], "metrics": h["held_out"]}))


def _fs_line(r: Row) -> str:
    f = r.first_stage
    i2t = f"I2T {f.i2t.cell()} ({f.queries_i2t} queries)" if f.i2t else "I2T not evaluated"
    return f"  {r.name}: {Path(f.annotations).name} ({f.annotations}), k {f.k}, T2I {f.t2i.cell()} ({f.queries_t2i} queries), {i2t}"


def _fmt(x: Any) -> str:
    return x.cell() if isinstance(x, Recall) else str(x)


def check_same_first_stage(rows: Sequence[Row], expected: Optional[Mapping[str, Any]] = None) -> FirstStage:
    """The first stage every measured row shares; FirstStageMismatch naming each row's otherwise."""
    measured = [r for r in rows if r.measured]
    if not measured:
        raise ValueError("no measured row: nothing to compare")
    ref = measured[0].first_stage
    problems = []
    for r in measured[1:]:
        f = r.first_stage
        for what, a, b in (("annotations", ref.annotations, f.annotations), ("T2I queries", ref.queries_t2i, f.queries_t2i),
                           ("k", ref.k, f.k), ("T2I first-stage recall", ref.t2i, f.t2i)):
            if a != b:
                problems.append(f"{r.name!r} vs {measured[0].name!r}: {what} {_fmt(b)} != {_fmt(a)}")
        if ref.i2t and f.i2t and (ref.i2t != f.i2t or ref.queries_i2t != f.queries_i2t):
            problems.append(f"{r.name!r} vs {measured[0].name!r}: I2T first stage {f.i2t.cell()} ({f.queries_i2t} queries) "
                            f"!= {ref.i2t.cell()} ({ref.queries_i2t} queries)")
    if expected:
        for r in measured:
            f = r.first_stage
            if "t2i" in expected and f.t2i != Recall.of(expected["t2i"]):
                problems.append(f"{r.name!r}: T2I first stage {f.t2i.cell()} != expected {Recall.of(expected['t2i']).cell()}")
            if "i2t" in expected and f.i2t and f.i2t != Recall.of(expected["i2t"]):
                problems.append(f"{r.name!r}: I2T first stage {f.i2t.cell()} != expected {Recall.of(expected['i2t']).cell()}")
            for key, got in (("queries_t2i", f.queries_t2i), ("k", f.k)):
                if key in expected and got != expected[key]:
                    problems.append(f"{r.name!r}: {key} {got} != expected {expected[key]}")
            if "annotations" in expected and f.annotations != _resolved(expected["annotations"]):
                problems.append(f"{r.name!r}: annotations {f.annotations} != expected {_resolved(expected['annotations'])}")
    if problems:
        raise FirstStageMismatch("refusing to compare rerankers over different first stages:\n" + "\n".join(problems)
                                 + "\nfirst stage of each measured row:\n" + "\n".join(_fs_line(r) for r in measured))
    return ref


@dataclass(frozen=True)
class Comparison:
    """The rows and the first stage they share."""

    title: str
    first_stage: FirstStage
    rows: List[Row]
    held_out_first_stages: Optional[Tuple[FirstStage, FirstStage]] = None  # in-distribution, held-out
    held_out_title: str = "Held-out combinations"
    held_out_note: str = ""

    def to_json(self) -> Dict[str, Any]:
        return {"title": self.title, "first_stage": asdict(self.first_stage), "rows": [asdict(r) for r in self.rows],
                "held_out_first_stages": [asdict(f) for f in self.held_out_first_stages or ()]}


def build_table(spec: Mapping[str, Any]) -> Comparison:
    """Read every row of a spec (a dict as in the module docstring) and check the contract."""
    if not spec.get("rows"):
        raise ValueError("the spec has no rows")
    rows = [load_row(r) for r in spec["rows"]]
    names = [r.name for r in rows]
    if len(set(names)) != len(names):
        raise ValueError(f"row names must be unique: {names}")
    twins = [r.held_out for r in rows if r.held_out]
    columns = None
    if twins:  # each test world of the twins is one first stage too
        columns = (check_same_first_stage([t.in_distribution for t in twins]),
                   check_same_first_stage([t.held_out for t in twins]))
    h = spec.get("held_out") or {}
    return Comparison(spec.get("title", "Reranker designs on one first stage"),
                      check_same_first_stage(rows, spec.get("expected_first_stage")), rows, columns,
                      h.get("title", "Held-out combinations"), h.get("note", ""))


def load_spec(path: str) -> Dict[str, Any]:
    return json.loads(Path(path).read_text())


def _shown(path: str) -> str:
    """A resolved path as the reader typed it: relative to the working directory when under it."""
    try:
        return str(Path(path).relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def _num(x: Optional[float], fmt: str = "{:.1f}") -> str:
    return "–" if x is None else fmt.format(x)


def _cost_cell(r: Row) -> str:
    if r.pairs_per_s is None:
        return "–"
    ctx = [f"{r.threads} thr" if r.threads else None, f"load {r.loadavg[0]:.1f}" if r.loadavg else None]
    return f"{r.pairs_per_s:.1f} ({', '.join(c for c in ctx if c)})" if any(ctx) else f"{r.pairs_per_s:.1f}"


def _minutes_cell(r: Row) -> str:
    if r.train_minutes is None and r.eval_minutes is None:
        return "–"
    return f"{_num(r.train_minutes)} + {_num(r.eval_minutes)}"


HEADER = ("| design | ranking rule | T2I R@1 / 5 / 10 | I2T R@1 / 5 / 10 | T2I R@1 ITM alone | within-family T2I "
          "| colour | shape | size | relation | backbone passes / query | stored tokens (bytes / image) "
          "| pairs/s T2I | minutes (train + eval) |")


def markdown(c: Comparison) -> str:
    """The table, what the rows share, and each row's command."""
    f = c.first_stage
    i2t = f"I2T {f.i2t.cell()} over {f.queries_i2t} images" if f.i2t else "I2T not evaluated"
    lines = [f"### {c.title}", "",
             f"Every measured row reranks the same first stage: `{_shown(f.annotations)}`, top {f.k} of {f.queries_t2i} "
             f"text queries; first stage T2I R@1/5/10 {f.t2i.cell()}, {i2t} (checked by `evaluation/compare.py`). "
             "Within-family: % of T2I queries whose answer is ranked above its family's twins (among queries where "
             "both are in the top k); per twin kind: % of answer-vs-twin pairs (one swap of that kind) won, T2I. "
             "pairs/s: text-to-image pairs reranked per second on this CPU, with the torch threads and the 1-min "
             "load average of the machine at the time (pairs/s moves several-fold with the load). Minutes: training, from "
             "the spec, + the evaluation's own total_s (process start and imports not counted).", "",
             HEADER, "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
    for r in c.rows:
        storage = f"{r.storage} ({r.bytes_per_image:,})" if r.storage else "–"
        if not r.measured:
            lines.append(f"| {r.name} | – | not measured: {r.not_measured} | – | – | – | – | – | – | – | "
                         f"{_num(r.backbone_passes_per_query, '{:g}')} | {storage} | – | {_minutes_cell(r)} |")
            continue
        kinds = [_num(r.by_kind_t2i.get(k)) for k in TWIN_KINDS]
        lines.append(
            f"| {r.name} | {r.rule} | {r.t2i.cell()} | {r.i2t.cell() if r.i2t else '– (T2I only)'} | "
            f"{_num(r.t2i_itm_only.r1) if r.t2i_itm_only else '–'} | {_num(r.within_family_t2i)} | "
            + " | ".join(kinds) + f" | {_num(r.backbone_passes_per_query, '{:g}')} | {storage} | {_cost_cell(r)} | "
            f"{_minutes_cell(r)} |")
    lines += ["", "Commands and notes:", ""]
    for r in c.rows:
        note = f" {r.note}" if r.note else ""
        lines.append(f"- **{r.name}**: `{r.command}`{note}")
    if c.held_out_first_stages:
        lines += ["", *held_out_markdown(c)]
    return "\n".join(lines) + "\n"


HELD_OUT_HEADER = ("| design (trained without the combinations) | seen: T2I R@1 | within-family | colour / shape / size / "
                   "relation | held-out: T2I R@1 | within-family | colour / shape / size / relation | held-out - seen: "
                   "T2I R@1 / within-family | train minutes |")


def _twin_cells(r: Row) -> List[str]:
    kinds = " / ".join(_num(r.by_kind_t2i.get(k)) for k in TWIN_KINDS)
    return [f"{r.first_stage.t2i.r1:.1f} -> {r.t2i.r1:.1f}" if r.rule != "first-stage cosine" else f"{r.t2i.r1:.1f}",
            _num(r.within_family_t2i), kinds]


def held_out_markdown(c: Comparison) -> List[str]:
    """The held-out table: every row's twin on seen and on withheld combinations, and the gap."""
    seen, held = c.held_out_first_stages
    lines = [f"### {c.held_out_title}", "",
             f"Seen: `{_shown(seen.annotations)}` (first stage T2I R@1 {seen.t2i.r1:.1f}); held-out: "
             f"`{_shown(held.annotations)}` (first stage T2I R@1 {held.t2i.r1:.1f}); top {held.k}, {held.queries_t2i} "
             "text queries each. " + c.held_out_note, "", HELD_OUT_HEADER,
             "| --- | --- | ---: | --- | --- | ---: | --- | --- | ---: |"]
    for r in c.rows:
        t = r.held_out
        if t is None:
            lines.append(f"| {r.name} | – | – | – | – | – | – | – | – |")
            continue
        a, b = t.in_distribution, t.held_out
        wf = ("–" if a.within_family_t2i is None or b.within_family_t2i is None
              else f"{b.within_family_t2i - a.within_family_t2i:+.1f}")
        lines.append(f"| {r.name} | " + " | ".join(_twin_cells(a) + _twin_cells(b))
                     + f" | {b.t2i.r1 - a.t2i.r1:+.1f} / {wf} | {_num(t.train_minutes)} |")
    lines += ["", "Held-out twins, commands and notes:", ""]
    lines += [f"- **{r.name}**: `{r.held_out.command}`" + (f" {r.held_out.note}" if r.held_out.note else "")
              for r in c.rows if r.held_out]
    return lines


def write(c: Comparison, output: str) -> Tuple[Path, Path]:
    """comparison.md and comparison.json under `output`."""
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "comparison.md", out / "comparison.json"
    md.write_text(markdown(c))
    js.write_text(json.dumps(c.to_json(), indent=2) + "\n")
    return md, js


def compare(spec_path: str, output: str) -> Comparison:
    """Build the table of a spec file, write it under `output` and return it."""
    c = build_table(load_spec(spec_path))
    write(c, output)
    return c
