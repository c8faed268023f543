"""Command-line options written once, on the config dataclasses' fields: `option(...)` is a dataclass field that
also carries its flag, help and argparse keywords; `add_options` puts a config's options on an argparse parser and
`from_args` (or `given`, for options that override a file) builds the config back from the parsed namespace.

Why ours and not tyro, jsonargparse or simple-parsing: those derive flag names from field names and flatten nested
configs their own way (`--reranker.num-replicas`, `--max_documents`), turn booleans into `--x/--no-x` pairs or
`--x {true,false}`, and format `--help` themselves (tyro's boxed panels), while every job here must keep its flag
names (`--tokens` for `token_tables`, `--reranker-replicas` for `reranker.num_replicas`, `--no-batching`), its
`nargs`, `append` pairs, choices, argument groups, `%(default)s` help and exit codes exactly, and serve's `--config`
is a YAML file whose values a flag overrides only when given. Plain argparse with the option on the field keeps all
of that, in one small module of the standard library alone (this is the lowest layer).
"""
from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Tuple, Union

_KEY = "edje.cli_option"
_MISSING: Any = dataclasses.MISSING


def sub_option(flag: str, *, help: Optional[str] = None, group: Optional[str] = None,
               convert: Optional[Callable[[Any], Any]] = None, cli_default: Any = _MISSING,
               **argparse_kwargs: Any) -> dict:
    """An option's command-line side: flag, help, group, argparse keywords, value conversion, argparse default."""
    return dict(flag=flag, help=help, group=group, convert=convert, cli_default=cli_default, nested=None,
                kwargs=argparse_kwargs)


# `nested=True`: the field is a config whose own options are taken; a mapping {inner field: sub_option(...)}: the
# inner fields get flags of this field's own (one DeploymentResources class, a flag per deployment). `convert` turns
# the parsed value into the field's (a path made absolute, "--no-batching" into dynamic_batching=False);
# `cli_default` is an argparse default other than the field's ("auto" where the config says None).
def option(default: Any = _MISSING, *, flag: Optional[str] = None, help: Optional[str] = None,
           group: Optional[str] = None, convert: Optional[Callable[[Any], Any]] = None, cli_default: Any = _MISSING,
           default_factory: Any = _MISSING, nested: Union[bool, Mapping[str, dict], None] = None,
           **argparse_kwargs: Any) -> Any:
    """A dataclass field that is also a command-line option (flag default: --field-name)."""
    spec = sub_option(flag or "", help=help, group=group, convert=convert, cli_default=cli_default, **argparse_kwargs)
    spec["nested"] = nested
    return dataclasses.field(default=default, default_factory=default_factory, metadata={_KEY: spec})


def add_options(parser: argparse.ArgumentParser, cls: type, *, defaults: Optional[Mapping[str, Any]] = None,
                unset: bool = False) -> None:
    """Add `cls`'s options to `parser`, with the fields' defaults, `defaults` by field name, or None (`unset`)."""
    defaults = defaults or {}
    hints = typing.get_type_hints(cls)
    for f, spec in _options(cls):
        default = _field_default(f)
        if spec["nested"] is True:
            add_options(parser, _inner_class(hints[f.name]), defaults=defaults, unset=unset)
        elif spec["nested"]:
            inner_hints = typing.get_type_hints(type(default))
            for name, inner in spec["nested"].items():
                _add(parser, inner, inner_hints[name], None if unset else getattr(default, name))
        else:
            value = spec["cli_default"] if spec["cli_default"] is not _MISSING else default
            _add(parser, spec, hints[f.name], None if unset else defaults.get(f.name, value))


def from_args(cls: type, namespace: argparse.Namespace, **overrides: Any) -> Any:
    """`cls` built from a parsed namespace, `overrides` on top (fields that are no options keep their defaults)."""
    hints = typing.get_type_hints(cls)
    kwargs: Dict[str, Any] = {}
    for f, spec in _options(cls):
        if spec["nested"] is True:
            kwargs[f.name] = from_args(_inner_class(hints[f.name]), namespace)
        elif spec["nested"]:
            kwargs[f.name] = dataclasses.replace(_field_default(f), **{
                name: _value(inner, namespace) for name, inner in spec["nested"].items()})
        else:
            kwargs[f.name] = _value(spec, namespace)
    kwargs.update(overrides)
    return cls(**kwargs)


def given(cls: type, namespace: argparse.Namespace) -> Dict[str, Any]:
    """The options given (parsed with `unset`: not None) by field name, converted; a nested config's as a dict."""
    out: Dict[str, Any] = {}
    for f, spec in _options(cls):
        if spec["nested"] is True:
            inner = given(_inner_class(typing.get_type_hints(cls)[f.name]), namespace)
        elif spec["nested"]:
            inner = {name: _value(s, namespace) for name, s in spec["nested"].items()
                     if getattr(namespace, _dest(s)) is not None}
        else:
            if getattr(namespace, _dest(spec)) is not None:
                out[f.name] = _value(spec, namespace)
            continue
        if inner:
            out[f.name] = inner
    return out


def _options(cls: type) -> List[Tuple[dataclasses.Field, dict]]:
    """(field, its option with the flag filled in) for each field of `cls` that is an option."""
    return [(f, {**f.metadata[_KEY], "flag": f.metadata[_KEY]["flag"] or "--" + f.name.replace("_", "-")})
            for f in dataclasses.fields(cls) if _KEY in f.metadata]


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not _MISSING:
        return f.default
    if f.default_factory is not _MISSING:
        return f.default_factory()
    return None  # a required field: argparse's own default


def _dest(spec: dict) -> str:
    # argparse's own rule, so that the metavar in --help stays the flag's (TOKENS, not TOKEN_TABLES)
    return spec["kwargs"].get("dest") or spec["flag"].lstrip("-").replace("-", "_")


def _value(spec: dict, namespace: argparse.Namespace) -> Any:
    value = getattr(namespace, _dest(spec))
    return spec["convert"](value) if spec["convert"] is not None else value


def _add(parser: argparse.ArgumentParser, spec: dict, hint: Any, default: Any) -> None:
    if spec["flag"] in parser._option_string_actions:
        return  # two fields share a flag (one value for both): the first declares it
    kwargs = dict(spec["kwargs"])
    if spec["help"] is not None:
        kwargs["help"] = spec["help"]
    base, choices = _unwrap(hint)
    if "action" not in kwargs:
        if base is bool:
            kwargs["action"] = "store_true"
        elif "type" not in kwargs and base in (int, float):
            kwargs["type"] = base
        if choices is not None and "choices" not in kwargs:
            kwargs["choices"] = list(choices)
    _group(parser, spec["group"]).add_argument(spec["flag"], default=default, **kwargs)


def _group(parser: argparse.ArgumentParser, title: Optional[str]):
    if title is None:
        return parser
    for group in parser._action_groups:
        if group.title == title:
            return group
    return parser.add_argument_group(title)


def _unwrap(hint: Any) -> Tuple[Any, Optional[tuple]]:
    """(the type argparse converts to, the choices of a Literal), Optional removed."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else (None, None)
    if origin is Literal:
        values = typing.get_args(hint)
        return type(values[0]), values
    return hint, None


def _inner_class(hint: Any) -> type:
    base, _ = _unwrap(hint)
    if not dataclasses.is_dataclass(base):
        raise TypeError(f"nested=True needs a dataclass field, got {hint!r}")
    return base
