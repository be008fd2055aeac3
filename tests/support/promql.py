"""PromQL in tests, without a Prometheus server: parse, list the metrics an expression reads, and
evaluate instant expressions on one scrape.

Parsing is PyPI ``promql-parser`` (GreptimeDB's Rust port of Prometheus' own parser): a syntax
error raises ``ValueError`` as ``promtool check rules`` would report it. :func:`metrics` walks
the tree for every vector selector (also inside range selectors and function calls).

:func:`evaluate` computes an *instant* expression on a :class:`tests.support.prometheus.Scrape`
as Prometheus would at one evaluation: vector selectors with matchers (``=``, ``!=``, ``=~``,
``!~``; regexes anchored like Prometheus'), ``sum``/``max``/``min``/``count`` by or without
labels, comparisons and arithmetic with a scalar (a comparison filters), and ``and``/``or``/
``unless`` with ``on(...)``/``ignoring(...)``. Anything else (range selectors, functions) raises
``NotImplementedError``: such rules need a series over time, which one scrape is not. An alert's
``for:`` is not evaluated (the test states the condition, not its duration).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterator

import promql_parser as pp

from tests.support.prometheus import Labels, Scrape

Vector = dict[Labels, float]
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt,
    ">=": operator.ge, "<=": operator.le}
_ARITHMETIC: dict[str, Callable[[float, float], float]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_AGGREGATE: dict[str, Callable[[list[float]], float]] = {
    "sum": sum, "max": max, "min": min, "count": len}


def parse(expr: str) -> pp.Expr:
    return pp.parse(expr)


def metrics(expr: str) -> set[str]:
    """The metric names ``expr`` reads."""
    return {s.name for s in _selectors(parse(expr)) if s.name}


def _selectors(node) -> Iterator[pp.VectorSelector]:
    if isinstance(node, pp.VectorSelector):
        yield node
    elif isinstance(node, pp.MatrixSelector):
        yield node.vector_selector
    elif isinstance(node, pp.Call):
        for arg in node.args:
            yield from _selectors(arg)
    elif isinstance(node, pp.BinaryExpr):
        yield from _selectors(node.lhs)
        yield from _selectors(node.rhs)
    elif isinstance(node, pp.AggregateExpr | pp.ParenExpr | pp.UnaryExpr | pp.SubqueryExpr):
        yield from _selectors(node.expr)


def evaluate(expr: str, scrape: Scrape) -> Vector | float:
    """The instant value of ``expr`` on ``scrape`` (a vector: labels without ``__name__``)."""
    return _eval(parse(expr), scrape)


def _eval(node, scrape: Scrape) -> Vector | float:
    if isinstance(node, pp.NumberLiteral):
        return node.val
    if isinstance(node, pp.ParenExpr):
        return _eval(node.expr, scrape)
    if isinstance(node, pp.VectorSelector):
        return {labels: value for (name, labels), value in scrape.items()
                if name == node.name and all(_matches(m, dict(labels)) for m in node.matchers.matchers)}
    if isinstance(node, pp.AggregateExpr):
        return _aggregate(node, _vector(_eval(node.expr, scrape)))
    if isinstance(node, pp.BinaryExpr):
        return _binary(node, _eval(node.lhs, scrape), _eval(node.rhs, scrape))
    raise NotImplementedError(f"not an instant expression on one scrape: {node}")


def _vector(value: Vector | float) -> Vector:
    assert isinstance(value, dict), f"a vector was expected, not {value}"
    return value


def _matches(matcher, labels: dict[str, str]) -> bool:
    value, op = labels.get(matcher.name, ""), str(matcher.op)
    if op.endswith("NotEqual"):
        return value != matcher.value
    if op.endswith("Equal"):
        return value == matcher.value
    found = re.fullmatch(matcher.value, value) is not None
    return not found if op.endswith("NotRe") else found


def _aggregate(node, vector: Vector) -> Vector:
    op = str(node.op)
    if op not in _AGGREGATE or node.param is not None:
        raise NotImplementedError(f"aggregation {op}")
    keep = set(node.modifier.labels) if node.modifier is not None else set()
    by = node.modifier is None or str(node.modifier.type).endswith("By")
    groups: dict[Labels, list[float]] = {}
    for labels, value in vector.items():
        key = frozenset((k, v) for k, v in labels if (k in keep) == by)
        groups.setdefault(key, []).append(value)
    return {key: float(_AGGREGATE[op](values)) for key, values in groups.items()}


def _binary(node, lhs: Vector | float, rhs: Vector | float) -> Vector | float:
    op = str(node.op)
    if op in ("and", "or", "unless"):
        return _set_operation(op, node.modifier, _vector(lhs), _vector(rhs))
    if isinstance(lhs, dict) and isinstance(rhs, dict):
        raise NotImplementedError("vector-to-vector arithmetic or comparison")
    if op in _COMPARE:
        compare = _COMPARE[op]
        if isinstance(lhs, dict):
            return {k: v for k, v in lhs.items() if compare(v, float(rhs))}  # type: ignore[arg-type]
        if isinstance(rhs, dict):
            return {k: v for k, v in rhs.items() if compare(float(lhs), v)}
        return float(compare(lhs, rhs))
    apply = _ARITHMETIC[op]
    if isinstance(lhs, dict):
        return {k: apply(v, float(rhs)) for k, v in lhs.items()}  # type: ignore[arg-type]
    if isinstance(rhs, dict):
        return {k: apply(float(lhs), v) for k, v in rhs.items()}
    return apply(lhs, rhs)


def _set_operation(op: str, modifier, lhs: Vector, rhs: Vector) -> Vector:
    matching = modifier.matching if modifier is not None else None
    names = set(matching.labels) if matching is not None else set()
    on = matching is not None and str(matching.type).endswith("Include")

    def key(labels: Labels) -> Labels:
        return frozenset((k, v) for k, v in labels if (k in names) == on)

    right = {key(labels) for labels in rhs}
    if op == "and":
        return {k: v for k, v in lhs.items() if key(k) in right}
    if op == "unless":
        return {k: v for k, v in lhs.items() if key(k) not in right}
    left = {key(labels) for labels in lhs}
    return {**lhs, **{k: v for k, v in rhs.items() if key(k) not in left}}
