"""PromQL in tests, without a Prometheus server: parse, list the metrics an expression reads, and
evaluate instant expressions on one scrape.

Parsing is PyPI ``promql-parser`` (GreptimeDB's Rust port of Prometheus' own parser): a syntax
error raises ``ValueError`` as ``promtool check rules`` would report it. :func:`metrics` walks
the tree for every vector selector (also inside range selectors and function calls).

:func:`evaluate` computes an expression as Prometheus would at one evaluation, on a
:class:`tests.support.prometheus.Scrape` or on a :class:`Timeline` of scrapes (evaluated at the
time of its last one): vector selectors with matchers (``=``, ``!=``, ``=~``, ``!~``; regexes
anchored like Prometheus'), ``sum``/``max``/``min``/``count`` by or without labels, comparisons
and arithmetic with a scalar (a comparison filters), ``and``/``or``/``unless`` with
``on(...)``/``ignoring(...)``, and on a timeline range selectors (``x[5m]``: the samples of the
scrapes within the range before the evaluation time) under ``deriv`` (least-squares slope per
second, series with fewer than two samples dropped) and ``changes`` (how often the value changed).
Anything else raises ``NotImplementedError``. An instant selector reads the last scrape (no
lookback of older ones). An alert's ``for:`` is not evaluated (the test states the condition, not
its duration: ``for:`` is minutes and tests are seconds).
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Callable, Iterator

import promql_parser as pp

from tests.support.prometheus import Labels, Scrape

Vector = dict[Labels, float]
Matrix = dict[Labels, list[tuple[float, float]]]  # (time, value), oldest first


class Timeline(list[tuple[float, Scrape]]):
    """Scrapes with the (Unix) time each was taken, oldest first."""

    def take(self, scrape: Scrape, at: float) -> Scrape:
        """Append ``scrape`` taken at ``at``; returns it."""
        assert not self or at >= self[-1][0], "scrapes are taken in order"
        self.append((at, scrape))
        return scrape

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


def evaluate(expr: str, scrapes: Scrape | Timeline) -> Vector | float:
    """The value of ``expr`` on one scrape, or on a timeline at the time of its last scrape (a
    vector: labels without ``__name__``)."""
    timeline = scrapes if isinstance(scrapes, Timeline) else Timeline([(0.0, scrapes)])
    assert timeline, "nothing scraped"
    return _eval(parse(expr), timeline)


def _select(node: pp.VectorSelector, scrape: Scrape) -> Vector:
    return {labels: value for (name, labels), value in scrape.items()
            if name == node.name and all(_matches(m, dict(labels)) for m in node.matchers.matchers)}


def _eval(node, timeline: Timeline) -> Vector | float:
    if isinstance(node, pp.NumberLiteral):
        return node.val
    if isinstance(node, pp.ParenExpr):
        return _eval(node.expr, timeline)
    if isinstance(node, pp.VectorSelector):
        return _select(node, timeline[-1][1])
    if isinstance(node, pp.AggregateExpr):
        return _aggregate(node, _vector(_eval(node.expr, timeline)))
    if isinstance(node, pp.BinaryExpr):
        return _binary(node, _eval(node.lhs, timeline), _eval(node.rhs, timeline))
    if isinstance(node, pp.Call) and node.func.name in _RANGE_FUNCTIONS \
            and len(node.args) == 1 and isinstance(node.args[0], pp.MatrixSelector):
        function = _RANGE_FUNCTIONS[node.func.name]
        return {labels: value for labels, points in _range(node.args[0], timeline).items()
                if (value := function(points)) is not None}
    raise NotImplementedError(f"not supported on scrapes: {node}")


def _range(node: pp.MatrixSelector, timeline: Timeline) -> Matrix:
    """The samples of each series within ``node.range`` before the last scrape's time (its
    start excluded, as in Prometheus)."""
    now, span = timeline[-1][0], node.range.total_seconds()
    matrix: Matrix = {}
    for at, scrape in timeline:
        if now - span < at <= now:
            for labels, value in _select(node.vector_selector, scrape).items():
                matrix.setdefault(labels, []).append((at, value))
    return matrix


def _deriv(points: list[tuple[float, float]]) -> float | None:
    """Prometheus' ``deriv``: the slope of the least-squares line through the points."""
    if len(points) < 2:
        return None
    mean_t = sum(t for t, _ in points) / len(points)
    mean_v = sum(v for _, v in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread if spread else None


def _changes(points: list[tuple[float, float]]) -> float:
    return float(sum(1 for (_, a), (_, b) in itertools.pairwise(points) if a != b))


_RANGE_FUNCTIONS: dict[str, Callable[[list[tuple[float, float]]], float | None]] = {
    "deriv": _deriv, "changes": _changes}


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


def firing(alerts: dict[str, dict], name: str, scrape: Scrape, labels: Labels) -> dict:
    """Alert ``name``'s expression on one scrape, by labels (its ``for:`` is not evaluated); only
    series whose labels include ``labels`` (a test's ingestion) count."""
    value = evaluate(alerts[name]["expr"], scrape)
    assert isinstance(value, dict)
    return {found: v for found, v in value.items() if found >= labels}
