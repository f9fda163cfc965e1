"""Declarative patterns written like the ops they match, and the matcher that binds them to IR.

    def pattern(self, op, x):
        return op.Mul(op.Mul(x, op.Add(op.Erf(op.Div(x, SQRT2)), 1.0)), 0.5)

`op.Name(...)` builds a pattern node; a parameter of `pattern` (here `x`) is a variable that binds
any value, the same value wherever it appears; a Python number matches a constant whose every
element is close to it; `Const(pred)` matches a constant the predicate accepts and binds it;
`Attr()` binds an attribute; `OneOf(a, b)` matches either spelling. Commutative ops are tried
in both operand orders. The matcher reports, for a failed candidate, how deep it got and why it
stopped (for --trace-rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from graphopt.ir.node import Node
from graphopt.ir.value import Value

COMMUTATIVE = {"Add", "Mul", "And", "Or", "Xor", "Equal", "Max", "Min", "Sum", "Mean",
               "BitwiseAnd", "BitwiseOr", "BitwiseXor"}


class Pattern:
    """Something that matches a value."""


@dataclass(eq=False)
class Var(Pattern):
    """Binds any value (or, with `const=True`, only a constant); the same name must bind the same
    value wherever it appears."""

    name: str
    const: bool = False


@dataclass(eq=False)
class Const(Pattern):
    """Matches a constant value: `value` (a scalar, or a one-element tensor of rank ≤ 1, equal
    to it within 4 ulps of the constant's own float type: an exporter's √2 rounded to float32
    or float16, not a 0.5004 for ½, which would change the result) or `pred(array)`; binds
    the array under `name` when given. `rtol`, when given, replaces the ulps; an exponent is
    matched with rtol 0 (x^2.0000002 is NaN for a negative x, x^2 is not)."""

    value: float | None = None
    pred: Callable[[np.ndarray], bool] | None = None
    name: str | None = None
    rtol: float | None = None

    def describe(self) -> str:
        return f"constant ≈ {self.value}" if self.value is not None else "constant (predicate)"


@dataclass(eq=False)
class Attr:
    """In an attribute position: binds the attribute's value (or `default` when it is absent)
    under `name`; with `pred`, the value must also satisfy it."""

    name: str
    default: Any = None
    pred: Callable[[Any], bool] | None = None


@dataclass(eq=False)
class Optional(Pattern):
    """An input that may be omitted (matches None too); `inner` binds when present."""

    inner: Pattern


class OneOf(Pattern):
    """Matches what any of its alternatives matches, tried in order: one rule covers an op that
    exporters spell several ways (`OneOf(op.Mul(s, c), op.Div(s, c), s)`)."""

    def __init__(self, *alternatives):
        if len(alternatives) < 2:
            raise TypeError("OneOf needs at least two alternatives")
        self.alternatives = tuple(_as_pattern(a) for a in alternatives)


@dataclass(eq=False)
class OpPattern(Pattern):
    op_type: str
    domain: str
    inputs: list[Pattern]
    attrs: dict[str, Any]
    output: int = 0          # which output of the matched node this pattern stands for
    name: str | None = None  # binds the matched node under this name

    def describe(self) -> str:
        return f"{self.domain + '::' if self.domain else ''}{self.op_type}"


class _OutputRef(Pattern):
    def __init__(self, node: OpPattern, index: int):
        self.node, self.index = node, index


class PatternBuilder:
    """`op.Relu(x)`, `op.Gelu(x, _domain="com.microsoft")`, `op.Split(x, _outputs=3)`,
    `op.Softmax(x, axis=-1)`, `op.Transpose(x, perm=Attr("perm"))`, `op.Add(a, b, _name="add")`."""

    def __getattr__(self, op_type: str) -> Callable[..., Any]:
        def make(*inputs, _domain: str = "", _outputs: int = 1, _name: str | None = None,
                 **attrs):
            node = OpPattern(op_type, _domain, [_as_pattern(i) for i in inputs], attrs, 0, _name)
            if _outputs == 1:
                return node
            return tuple(OpPattern(op_type, _domain, node.inputs, attrs, k, _name)
                         for k in range(_outputs))
        return make


def _as_pattern(item) -> Pattern | None:
    if item is None or isinstance(item, Pattern):
        return item
    if isinstance(item, (int, float)) and not isinstance(item, bool):
        return Const(float(item))
    raise TypeError(f"cannot use {item!r} in a pattern")


@dataclass
class Match:
    """A successful match: bindings by name, the matched nodes (root first)."""

    root: Node
    bindings: dict[str, Any]
    nodes: list[Node]


@dataclass
class Miss:
    """Why a candidate root did not match: how many pattern nodes matched before `reason`."""

    root: Node
    depth: int
    reason: str


@dataclass
class _State:
    bindings: dict[str, Any] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    roles: dict[int, Node] = field(default_factory=dict)  # id(OpPattern) -> the node it matched
    depth: int = 0


class Matcher:
    """Matches one pattern tree rooted at an OpPattern against candidate nodes."""

    def __init__(self, root: OpPattern):
        self.root = root
        self.best_miss: tuple[int, str] = (-1, "")
        self.best_score: tuple[int, bool] = (-1, False)
        # The op types expected of one value at the best failure so far, and what it came
        # from: alternatives (OneOf) that each fail on it are named together.
        self._expected: list[str] = []
        self._found: tuple[str, str] | None = None

    def match(self, node: Node) -> Match | Miss:
        """The first match at `node`, or why there is none."""
        for found in self.matches(node):
            return found
        return self.miss(node)

    def matches(self, node: Node, limit: int = 8) -> Iterator[Match]:
        """Matches at `node` (several when commutative operands bind differently), at most
        `limit`; after the last one, `miss(node)` tells why no further binding worked."""
        self.best_miss = (-1, "")
        self.best_score = (-1, False)
        self._expected, self._found = [], None
        out = node.outputs[self.root.output] if self.root.output < len(node.outputs) else None
        if out is None:
            self.best_miss = (0, f"{node} has no output {self.root.output}")
            return
        for count, state in enumerate(self._value(self.root, out, _State())):
            if count >= limit:
                return
            yield Match(node, state.bindings, state.nodes)

    def could_match(self, node: Node, depth: int = 3) -> bool:
        """A necessary condition for `matches(node)` to find anything, at a few dict lookups:
        `node` and the producers of its operands, `depth` levels down, have the pattern's op
        types. Most candidates fail there; a pass that does not trace misses skips them."""
        root = self.root
        if node.op_type != root.op_type or (node.domain or "") not in _domains(root.domain):
            return False
        return _operands_could_bind(root, node, depth - 1)

    def miss(self, node: Node) -> Miss:
        depth, reason = self.best_miss
        return Miss(node, max(depth, 0), reason)

    def _fail(self, state: _State, reason: str | Callable[[], str],
              structural: bool = False) -> None:
        # Deepest failure wins; at equal depth an op-type mismatch ("comes from Tanh") says
        # more than one against a constant met while trying the other operand order. A reason
        # may come as a callable: most failures are never reported, and formatting node names
        # for each was a third of the matcher's time.
        score = (state.depth, structural)
        if score > self.best_score:
            self.best_score = score
            self.best_miss = (state.depth, reason() if callable(reason) else reason)
            self._expected, self._found = [], None

    def _fail_op(self, state: _State, pattern: "OpPattern", value: Value, node: Node) -> None:
        """`value` comes from `node`, not from `pattern`'s op. At the depth of the best failure
        so far on the same value, the expected ops add up: "expected Where or Softmax"."""
        found = (value.name, f"{node.qualified_op} '{node.name}'")
        if (state.depth, True) == self.best_score and self._found == found:
            expected = pattern.describe()
            if expected not in self._expected:
                self._expected.append(expected)
                self.best_miss = (state.depth, self._op_reason())
            return
        before = self.best_score
        self._fail(state, lambda: f"expected {pattern.describe()}, %{value.name} comes from "
                                  f"{found[1]}", structural=True)
        if self.best_score != before:
            self._expected, self._found = [pattern.describe()], found

    def _op_reason(self) -> str:
        return (f"expected {' or '.join(self._expected)}, %{self._found[0]} comes from "
                f"{self._found[1]}")

    def _value(self, pattern: Pattern | None, value: Value | None, state: _State
               ) -> Iterator[_State]:
        if pattern is None:
            if value is None:
                yield state
            else:
                self._fail(state, f"expected an omitted input, got %{value.name}")
            return
        if isinstance(pattern, OneOf):
            for alternative in pattern.alternatives:
                yield from self._value(alternative, value, state)
            return
        if isinstance(pattern, Optional):
            if value is None:
                yield state
            else:
                yield from self._value(pattern.inner, value, state)
            return
        if value is None:
            self._fail(state, f"expected {_describe(pattern)}, the input is omitted")
            return
        if isinstance(pattern, Var):
            bound = state.bindings.get(pattern.name)
            if bound is not None and bound is not value:
                self._fail(state, lambda: f"variable '{pattern.name}' is %{bound.name} "
                                          f"elsewhere, here %{value.name}")
                return
            if pattern.const and not value.is_constant:
                self._fail(state, lambda: f"'{pattern.name}' must be a constant, "
                                          f"%{value.name} is not")
                return
            yield _bind(state, pattern.name, value)
            return
        if isinstance(pattern, Const):
            data = value.constant()
            if data is None:
                self._fail(state, lambda: f"expected {pattern.describe()}, %{value.name} is "
                                          "not constant")
                return
            if not _const_ok(pattern, data):
                shown = data.ravel()[:4].tolist() if data.dtype != object else "strings"
                self._fail(state, f"expected {pattern.describe()}, got {shown}")
                return
            yield _bind(state, pattern.name, data) if pattern.name else state
            return
        if isinstance(pattern, OpPattern):
            yield from self._op(pattern, value, state)
            return
        raise TypeError(f"unknown pattern {pattern!r}")

    def _op(self, pattern: OpPattern, value: Value, state: _State) -> Iterator[_State]:
        node = value.producer
        if node is None:
            self._fail(state, lambda: f"expected {pattern.describe()}, %{value.name} is a "
                                      "graph input or constant")
            return
        if node.op_type != pattern.op_type or (node.domain or "") not in _domains(pattern.domain):
            self._fail_op(state, pattern, value, node)
            return
        # Failure messages are built only when reported (lambdas): most never are.
        if value.index != pattern.output:
            self._fail(state, lambda: f"expected output {pattern.output} of "
                                      f"{pattern.describe()}, got {value.index}")
            return
        matched = state.roles.get(id(pattern))
        if matched is not None:
            # A pattern node reached again (a diamond, like x - mean(x) read twice in LayerNorm)
            # must be the very node it matched the first time; its inputs are matched already.
            if matched is node:
                yield state
            else:
                self._fail(state, lambda: f"{pattern.describe()} should be '{matched.name}' "
                                          f"again, got '{node.name}'")
            return
        if node in state.nodes:  # Node compares by identity
            self._fail(state, lambda: f"{pattern.describe()} '{node.name}' already plays "
                                      "another part of the pattern")
            return
        attr_bindings = self._attrs(pattern, node, state)
        if attr_bindings is None:
            return
        base = _State(dict(state.bindings), state.nodes + [node],
                      {**state.roles, id(pattern): node}, state.depth + 1)
        base.bindings.update(attr_bindings)
        if pattern.name:
            base.bindings[pattern.name] = node
        actual = node._inputs  # read only
        for inputs in _operand_orders(pattern):
            if len(actual) > len(inputs) and any(v is not None for v in actual[len(inputs):]):
                self._fail(base, lambda: f"{pattern.describe()} '{node.name}' has "
                                         f"{len(actual)} inputs, the pattern {len(inputs)}")
                continue
            padded = actual + [None] * (len(inputs) - len(actual))
            yield from self._inputs(list(zip(inputs, padded)), base)

    def _inputs(self, pairs: list[tuple[Pattern | None, Value | None]], state: _State
                ) -> Iterator[_State]:
        if not pairs:
            yield state
            return
        (pattern, value), rest = pairs[0], pairs[1:]
        for after in self._value(pattern, value, state):
            yield from self._inputs(rest, after)

    def _attrs(self, pattern: OpPattern, node: Node, state: _State) -> dict | None:
        bound = {}
        for key, want in pattern.attrs.items():
            have = node.attr(key)
            if isinstance(want, Attr):
                have = want.default if have is None else have
                if want.pred is not None and not _pred_ok(want.pred, have):
                    self._fail(state, f"{pattern.describe()} '{node.name}': attribute {key}="
                                      f"{have!r} refused")
                    return None
                bound[want.name] = have
            elif not _attr_equal(have, want):
                self._fail(state, f"{pattern.describe()} '{node.name}': attribute {key}={have!r}, "
                                  f"expected {want!r}")
                return None
        return bound


def _operand_orders(pattern: OpPattern) -> tuple[list, ...]:
    """The operand orders a match may take: both for a binary commutative op. Kept on the
    pattern once worked out: every candidate of every rule asks, several times."""
    orders = pattern.__dict__.get("_orders")
    if orders is None or orders[0] is not pattern.inputs:  # inputs replaced since: redo
        if pattern.op_type in COMMUTATIVE and len(pattern.inputs) == 2 and not pattern.domain:
            orders = (pattern.inputs, pattern.inputs[::-1])
        else:
            orders = (pattern.inputs,)
        pattern._orders = orders
    return orders


def _operands_could_bind(pattern: OpPattern, node: Node, depth: int) -> bool:
    """Whether `node`'s inputs fit `pattern`'s in some operand order, `depth` levels down."""
    if depth <= 0:
        return True
    actual = node._inputs  # read only
    have = len(actual)
    # Plain loops, not all() over a generator: this runs for every candidate of every rule.
    for inputs in _operand_orders(pattern):
        if have > len(inputs) and any(v is not None for v in actual[len(inputs):]):
            continue
        for i, p in enumerate(inputs):
            if not _could_bind(p, actual[i] if i < have else None, depth):
                break
        else:
            return True
    return False


def _could_bind(pattern: Pattern | None, value: Value | None, depth: int) -> bool:
    """What `Matcher._value` checks first: an op pattern's producer op type and output index
    (and, `depth` > 1, its operands'), an omitted input; variables and constants are left to
    the full match."""
    if pattern is None:
        return value is None
    kind = type(pattern)
    if kind is Var or kind is Const:  # the commonest leaves, before the isinstance chain
        return value is not None
    if isinstance(pattern, OpPattern):
        if value is None or value.index != pattern.output:
            return False
        node = value.producer
        return (node is not None and node.op_type == pattern.op_type
                and (node.domain or "") in _domains(pattern.domain)
                and _operands_could_bind(pattern, node, depth - 1))
    if isinstance(pattern, OneOf):
        return any(_could_bind(alternative, value, depth) for alternative in pattern.alternatives)
    if isinstance(pattern, Optional):
        return value is None or _could_bind(pattern.inner, value, depth)
    return value is not None


def _pred_ok(pred: Callable[[Any], bool], value: Any) -> bool:
    """A predicate that raises (e.g. on an absent attribute) is a refusal, not a crash."""
    try:
        return bool(pred(value))
    except (ValueError, TypeError, IndexError, KeyError, AttributeError):
        return False


def _domains(domain: str) -> tuple[str, ...]:
    return ("", "ai.onnx") if domain in ("", "ai.onnx") else (domain,)


def _bind(state: _State, name: str, value) -> _State:
    bindings = dict(state.bindings)
    bindings[name] = value
    return _State(bindings, state.nodes, state.roles, state.depth)


def _finfo(dtype):
    try:
        return np.finfo(dtype)
    except ValueError:  # bfloat16 and the float8s know their limits through ml_dtypes
        import ml_dtypes

        return ml_dtypes.finfo(dtype)


def _const_ok(pattern: Const, data: np.ndarray) -> bool:
    if data.dtype == object:
        return pattern.pred is not None and bool(pattern.pred(data))
    if pattern.pred is not None:
        try:
            return bool(pattern.pred(data))
        except (ValueError, TypeError, IndexError):
            return False
    # A literal stands for a scalar: a constant of several elements (or of rank > 1) would
    # broadcast the other operand to a new shape that the fused op does not produce.
    if data.size != 1 or data.ndim > 1:
        return False
    x = float(data.reshape(-1)[0])
    if data.dtype.kind in "biu":
        return x == float(pattern.value)
    # The literal as the constant's type holds it (√2 in float16 is 1.4140625), then within
    # 4 of that type's ulps, or `rtol`.
    with np.errstate(over="ignore"):  # a literal beyond the type's range rounds to inf
        y = float(np.asarray(pattern.value, dtype=np.float64).astype(data.dtype))
    eps = float(_finfo(data.dtype).eps)
    rtol = 4 * eps if pattern.rtol is None else pattern.rtol
    return x == y or (math.isfinite(y) and abs(x - y) <= rtol * abs(y))


def _attr_equal(have, want) -> bool:
    if isinstance(want, (list, tuple)):
        return have is not None and list(have) == list(want)
    if isinstance(want, float):
        return have is not None and abs(float(have) - want) <= 1e-6 * max(1.0, abs(want))
    return have == want


def _describe(pattern: Pattern) -> str:
    if isinstance(pattern, OpPattern):
        return pattern.describe()
    if isinstance(pattern, Const):
        return pattern.describe()
    if isinstance(pattern, Var):
        return f"'{pattern.name}'"
    if isinstance(pattern, OneOf):
        return " or ".join(_describe(a) for a in pattern.alternatives)
    return type(pattern).__name__


def pattern_nodes(root: Pattern) -> list[OpPattern]:
    """Every op pattern in the tree, root first."""
    seen, order, stack = set(), [], [root]
    while stack:
        item = stack.pop()
        if isinstance(item, Optional):
            stack.append(item.inner)
        if isinstance(item, OneOf):
            stack.extend(item.alternatives)
        if not isinstance(item, OpPattern) or id(item) in seen:
            continue
        seen.add(id(item))
        order.append(item)
        stack.extend(reversed(item.inputs))
    return order


__all__ = ["Attr", "COMMUTATIVE", "Const", "Match", "Matcher", "Miss", "OneOf", "OpPattern",
           "Optional", "Pattern", "PatternBuilder", "Var", "pattern_nodes"]
