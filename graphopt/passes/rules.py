"""Rewrite rules: a declared `pattern`, an optional `check` that refuses with a reason, and a
`rewrite` that builds the replacement; `RulePass` applies a family of rules as one pass.

A rule never fires when a node it would delete has an output used outside the match or is a
graph output; data flows from `check` to `rewrite` only through the match bindings.
"""

from __future__ import annotations

import functools
import inspect
from collections import defaultdict
from typing import Any, ClassVar

import numpy as np

from graphopt.codegen.om_manifest import dtype_name
from graphopt.errors import one_line
from graphopt.ir import DType, Graph, Model, Node, Tensor, Value
from graphopt.ir.graph import read_values
from graphopt.ir.pattern import Match, Matcher, Miss, OpPattern, PatternBuilder, Var
from graphopt.opcheck import runtime_schemas
from graphopt.passes.base import Pass, PassContext, PassResult
from graphopt.passes.edit import replace_value

RULES: dict[str, type["Rule"]] = {}


class Rule:
    """Subclasses define `pattern(self, op, <vars>)` and `rewrite(self, op, <bindings>)`, and
    may define `check(self, <bindings>) -> str | None` (a reason to refuse). Bindings are passed
    by parameter name; declare `**_` to ignore the rest. `check` may also name `model` (opset
    decisions), `target` (None without one) and `options` (the compile's: its precision, say);
    `rewrite` reaches the model as `op.model`.
    `emits` lists the (domain, op_type) the rewrite creates, which must have a kernel in the
    runtime, and `dtypes` the element types of the root's output the kernels accept (empty:
    any); `device_dtypes` more that a device may take (float16): fused where the device that
    would run the match states a kernel for them, and for onnxruntime's CPU provider (a `cpu`
    target, or none), which runs its float32 kernel between Casts it inserts, fewer than it
    puts around the unfused ops (a float16 BERT's .om ran 0.81x the original, 0.92x unfused).
    `exposes` names pattern nodes (by their `_name`) whose output the fused op computes
    too, so that readers outside the match may keep it: `rewrite` may then name `exposed`,
    the set of those names whose output something outside still reads, and returns
    `(result, {name: value})` with a value for each."""

    name: ClassVar[str] = ""
    emits: ClassVar[tuple[tuple[str, str], ...]] = ()
    dtypes: ClassVar[tuple[DType, ...]] = ()
    device_dtypes: ClassVar[tuple[DType, ...]] = ()
    exposes: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Every concrete rule registers under its own name, also one that inherits its pattern
        # (a variant differing only in check or rewrite); abstract bases have no pattern.
        if cls.pattern is not Rule.pattern:
            cls.name = cls.__dict__.get("name") or cls.__name__
            assert cls.name not in RULES, f"rule {cls.name} defined twice"
            RULES[cls.name] = cls

    def pattern(self, op: PatternBuilder, *variables) -> OpPattern:
        raise NotImplementedError

    def check(self, **bindings) -> str | None:
        return None

    def rewrite(self, op: "RewriteBuilder", **bindings) -> Value | tuple[Value, ...]:
        raise NotImplementedError

    def plausible(self, root: Node) -> bool:
        """A necessary condition, read off the root and its neighbours, for a match at `root`
        to pass `check`: False lets the pass skip the full match (when misses are not traced).
        Worth defining for a refusal that is common and cheap to foresee."""
        return True

    def matcher(self, pattern: OpPattern):
        """What finds matches (`matches(node)`, then `miss(node)`): the declarative matcher,
        unless a rule states its structure by hand."""
        return Matcher(pattern)

    def build_pattern(self) -> OpPattern:
        params = list(inspect.signature(self.pattern).parameters)[1:]
        return self.pattern(PatternBuilder(), *(Var(p) for p in params))

    def unsupported(self, root: Value, target=None) -> str | None:
        """Why the runtime, or the device of `target` that would run the result, cannot run
        what this rule emits for `root` (None when it can)."""
        for domain, op_type in self.emits:
            if (domain, op_type) not in runtime_schemas():
                return f"onnxruntime has no {domain or 'ai.onnx'}::{op_type} kernel"
        taken = self.dtypes + self.device_dtypes
        if self.dtypes and root.dtype not in taken:
            kind = root.dtype.short if root.dtype is not None else "unknown"
            return f"the fused kernel does not take {kind} (only " \
                   f"{', '.join(d.short for d in taken)})"
        if any(domain not in ("", "ai.onnx") for domain, _ in self.emits) \
                and _in_sequence_map(root.graph):
            # onnxruntime expands the body, and a contrib op it has no kernel for at the
            # body's dtype (float16 QuickGelu) it expands in turn, nested: that fails to load.
            return "it is inside a SequenceMap body, which onnxruntime expands: contrib ops " \
                   "stay out of it"
        return target_refuses(target, self.emits, root, cast_by_onnxruntime(
            target, root) if root.dtype in self.device_dtypes else None)


def cast_by_onnxruntime(target, root: Value) -> str | None:
    """"float32" where the target's onnxruntime CPU provider would run the match, whose float32
    kernel it runs between Casts for a float16 `root` (its kernel table lists float32 alone for
    most contrib ops); None elsewhere (a compile without a target refuses no kernel)."""
    if target is None or placed_device(target, root).kernel_source != "onnxruntime":
        return None
    return "float32"


def _in_sequence_map(graph) -> bool:
    """Whether `graph` is the body of a SequenceMap, or nested in one."""
    while graph is not None and graph.parent is not None:
        if graph.parent.op_type == "SequenceMap" and graph.parent.is_onnx:
            return True
        graph = graph.parent.graph
    return False


class HandMatchedRule(Rule):
    """A rule whose structure `match(node) -> Match | Miss` states by hand, where a pattern
    cannot: a root of variadic inputs (Concat), a chain of any length. Patterns give an op a
    fixed list of inputs. `root_op` is the op type the pass dispatches it on; `check`,
    `rewrite` and the machinery's `deletable` and `apply` work on its bindings as for any Rule.
    Every subclass but those marked `base = True` registers as a rule."""

    base = True
    root_op = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("base", False):  # Rule registers classes with a pattern only
            cls.name = cls.__dict__.get("name") or cls.__name__
            assert cls.name not in RULES, f"rule {cls.name} defined twice"
            RULES[cls.name] = cls

    def build_pattern(self) -> OpPattern:  # the root alone: what the pass dispatches on
        return OpPattern(self.root_op, "", [], {})

    def match(self, node: Node) -> Match | Miss:
        raise NotImplementedError

    # The matcher protocol RulePass uses: this rule is its own matcher.
    def matcher(self, pattern: OpPattern) -> "HandMatchedRule":
        return self

    def matches(self, node: Node):
        self._outcome = self.match(node)
        if isinstance(self._outcome, Match):
            yield self._outcome

    def miss(self, node: Node) -> Miss:
        return self._outcome if isinstance(self._outcome, Miss) else Miss(node, 0, "")


def placed_device(target, root: Value):
    """The device of `target` that would run the match at `root`: the primary device (the NPU)
    when it has the op that computes the root, else the host."""
    device = target.device(target.primary)
    producer = root.producer
    if producer is not None and device.kernel(producer.op_type, producer.domain) is None:
        device = target.device(target.host)
    return device


def target_refuses(target, emits, root: Value, dtype: str | None = None) -> str | None:
    """Why the target's device for the match at `root` has no kernel for an op in `emits`.

    The device is the one the root would be placed on: the primary device (the NPU) when it has
    the root's op, else the host. A fusion the device cannot run would move the work off it
    (splitting its partition), so the unfused ops stay instead.
    """
    if target is None:
        return None
    device = placed_device(target, root)
    if dtype is None and root.dtype is not None:
        dtype = _dtype_name(int(root.dtype))
    for domain, op_type in emits:
        if not device.has_kernel(op_type, domain, dtype):
            return (f"target {target.shown}: its {device.name} has no {domain or 'ai.onnx'}::"
                    f"{op_type} kernel for {dtype or 'this type'}")
    return None


def target_attributes_refuse(target, root: Value, emitted: tuple[str, str],
                             attrs: dict) -> str | None:
    """Why the device that would run the match at `root` takes `emitted` (domain, op) but not
    with these attribute values (a profile's FusedConv that takes activation Relu only)."""
    if target is None:
        return None
    from graphopt.partition.placement import attribute_problem

    domain, op_type = emitted
    device = placed_device(target, root)
    dtype = _dtype_name(int(root.dtype)) if root.dtype is not None else None
    support = device.kernel(op_type, domain, dtype)
    problem = attribute_problem(attrs.get, support, op_type, domain) if support is not None \
        else None
    return f"target {target.shown}: its {device.name} {problem}" if problem else None


@functools.lru_cache(maxsize=None)
def _dtype_name(dtype: int) -> str | None:
    return dtype_name(dtype)  # asked once per candidate match: the enum lookup adds up


def call_with_bindings(fn, bindings: dict[str, Any], *args):
    """Call `fn(*args, **subset)` with the bindings its signature names (all with **kwargs)."""
    params = _parameters(fn)
    if params is None:
        return fn(*args, **bindings)
    return fn(*args, **{k: v for k, v in bindings.items() if k in params})


# Keyed by the plain function (a bound method is a new object on every attribute access) and
# whether it was bound, which drops `self` from the signature.
_PARAMETERS: dict[Any, frozenset[str] | None] = {}


def _parameters(fn) -> frozenset[str] | None:
    """The keyword names `fn` takes, None when it takes any (**kwargs). inspect.signature
    costs ~250 µs, paid once per function rather than once per match (1.6 s at 10k nodes)."""
    key = (getattr(fn, "__func__", fn), hasattr(fn, "__func__"))
    try:
        return _PARAMETERS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable callable: no caching
        key = None
    params = inspect.signature(fn).parameters
    names = None if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) \
        else frozenset(params)
    if key is not None:
        _PARAMETERS[key] = names
    return names


class RewriteBuilder:
    """Builds replacement nodes just before the match's root: `op.Gelu(x, _domain=
    "com.microsoft")`, `op.Split(x, _outputs=2, axis=0)`, `op.const(array)`; `_omit` lists
    optional outputs left out (None in the tuple returned)."""

    def __init__(self, model: Model, graph: Graph, root: Node, rule: str):
        self.model, self.graph, self.root, self.rule = model, graph, root, rule
        self.created: list[Node] = []

    def const(self, array, name_hint: str | None = None) -> Value:
        array = np.asarray(array)
        return self.graph.make_initializer(name_hint or f"{self.rule}_const", Tensor(array))

    def __getattr__(self, op_type: str):
        def make(*inputs: Value | None, _domain: str = "", _outputs: int = 1,
                 _omit: tuple[int, ...] = (), **attrs):
            outputs = [None if i in _omit else Value("") for i in range(_outputs)]
            node = Node(op_type, inputs, attrs, domain=_domain, outputs=outputs,
                        name=self._node_name(op_type))
            self.graph.insert_before(self.root, node)
            self.created.append(node)
            if _domain and _domain not in self.model.opset_imports:
                self.model.opset_imports[_domain] = 1
            return node.output if _outputs == 1 else node.outputs
        return make

    def _node_name(self, op_type: str) -> str:
        first = self.root.outputs[0]
        base = self.root.name or (first.name if first is not None else self.rule)
        return self.graph.fresh_node_name(f"{base}/{self.rule}/{op_type}")


class Tracer:
    """Collects, per traced rule, the closest near-misses and the refusals, for --trace-rule."""

    def __init__(self, rules: set[str]):
        self.rules = rules
        self.misses: dict[str, list[Miss]] = defaultdict(list)
        # Per rule, the nodes its own rewrites replaced (held, so that their ids stay theirs).
        self.taken: dict[str, dict[int, Node]] = defaultdict(dict)

    def add(self, rule: str, miss: Miss) -> None:
        if rule in self.rules:
            self.misses[rule].append(miss)

    def fired(self, rule: str, match: Match) -> None:
        if rule in self.rules:
            self.taken[rule].update((id(node), node) for node in match.nodes)

    def report(self, limit: int = 5, why_none: dict[str, str] | None = None,
               fired: dict[str, int] | None = None) -> list[str]:
        """The closest near-misses of each traced rule, after how often it `fired`; for a rule
        without any, `why_none`'s reason (its pass did not run, it was switched off) or the
        plain fact."""
        lines = []
        for rule in sorted(self.rules):
            # A root missed again in a later fixed-point round is one near-miss; a root the
            # rule itself then replaced (a Mul inside a GELU it fused) is none at all.
            taken = self.taken.get(rule, {})
            distinct = {(id(m.root), m.reason): m for m in self.misses.get(rule, [])
                        if id(m.root) not in taken}
            misses = sorted(distinct.values(), key=lambda m: -m.depth)[:limit]
            count = (fired or {}).get(rule, 0)
            if count:
                lines.append(f"trace {rule}: fired {count} time(s)"
                             + ("; the closest misses elsewhere:" if misses
                                else ", and no other candidate came close"))
            elif not misses:
                reason = (why_none or {}).get(rule, "no candidate root in the graph")
                lines.append(f"trace {rule}: {reason}")
            for miss in misses:
                # Names from the model, in the root's and the reason's text: one line, escaped.
                lines.append(one_line(f"trace {rule}: at {miss.root.qualified_op} "
                                      f"'{miss.root.name}' (matched {miss.depth} pattern "
                                      f"node(s)): {miss.reason}"))
        return lines


def deletable(match: Match, root_output: int, exposes: tuple[str, ...] = ()) -> str | None:
    """Why the matched nodes cannot all go (None when they can): an intermediate output read
    outside the match, a graph output, or another output of the root in use. The outputs of
    the nodes named in `exposes` may be read outside: the fused op computes them too."""
    members = {id(n) for n in match.nodes}
    exposed = {id(match.bindings[name]) for name in exposes if name in match.bindings}
    for node in match.nodes:
        for index, value in enumerate(node._outputs):
            if value is None or (node is match.root and index == root_output):
                continue
            if value.is_graph_output:
                return f"%{value.name} (from '{node.name}') is a graph output"
            if id(node) in exposed:
                continue
            for use in value._uses:
                if id(use.node) not in members:
                    return f"%{value.name} (from '{node.name}') is also read by " \
                           f"{use.node.qualified_op} '{use.node.name}'"
    return None


def broadcast_problem(match: Match) -> str | None:
    """Why the match cannot be fused as written (None when it can): a one-element constant of
    a higher rank than the tensor it meets in a matched node broadcasts that node's result to
    its rank ([2,3,8] · [1,1,1,1] is [1,2,3,8]), which the fused op, computing on the tensor
    alone, would not."""
    for node in match.nodes:
        computed = [v for v in node.inputs if v is not None and not v.is_constant]
        for value in node.inputs:
            # The tensor's shape, not its data: reading a weight here would load every
            # external one and keep a second copy of every inline one.
            tensor = value.const if value is not None and value.is_constant else None
            if tensor is None or tensor.size != 1 or not tensor.shape:
                continue
            rank = len(tensor.shape)
            for other in computed:
                if other.shape is None or len(other.shape) < rank:
                    what = "unknown rank" if other.shape is None else f"rank {len(other.shape)}"
                    return (f"the one-element constant %{value.name} of rank {rank} meets "
                            f"%{other.name} of {what} in '{node.name or node.op_type}': it "
                            "broadcasts the result to a rank the fused op would not give")
    return None


def apply(model: Model, graph: Graph, rule: Rule, match: Match, root_output: int) -> bool:
    """Run the rewrite for `match`, swap the root's output for the result, drop dead nodes."""
    builder = RewriteBuilder(model, graph, match.root, rule.name)
    exposed = _read_outside(match, rule.exposes)
    result = call_with_bindings(rule.rewrite, {**match.bindings, "exposed": exposed}, builder)
    kept = {}
    if rule.exposes:
        result, kept = result if isinstance(result, tuple) else (result, {})
        assert set(kept) == exposed, f"{rule.name} returned {sorted(kept)} for {sorted(exposed)}"
    new = result[0] if isinstance(result, tuple) else result
    old = match.root.outputs[root_output]
    new.dtype = new.dtype or old.dtype
    new.shape = new.shape if new.shape is not None else old.shape
    if not replace_value(old, new):  # the result cannot take over a graph output's name: undo
        for node in reversed(builder.created):
            graph.remove(node)
        return False
    # The new ops sit at the root: a node between an exposed node and the op that now makes
    # its value may read it too early. Only those nodes can, so only they are looked at.
    between = {name: _nodes_between(match.bindings[name], value.producer)
               for name, value in kept.items()}
    for name, value in kept.items():  # not graph outputs: deletable refuses those
        inner = match.bindings[name].output
        value.dtype, value.shape = inner.dtype, inner.shape
        replace_value(inner, value)
    removed = True
    while removed:  # repeat: a node shared inside the match (a diamond) dies after its readers
        removed = False
        for node in match.nodes:
            if node.graph is graph and not any(v is not None and (v._uses or v.is_graph_output)
                                               for v in node._outputs):
                graph.remove(node)
                removed = True
    # After the dead matched nodes are gone (they read the exposed value, and sorted a whole
    # transformer after each of its 2·L rewrites: quadratic, 5 minutes at 1000 layers).
    for name, value in kept.items():
        if not _made_in_time(graph, value, between[name], builder.created):
            graph.sort()
            break
    return True


def _made_in_time(graph: Graph, value: Value, between: list[Node], created: list[Node]) -> bool:
    """Whether `value` is made before every node of `between` that reads it, once its producer
    (a new op) has moved, where it can, to just before the first of them: its inputs are made
    before there (FlattenedGemm's flattening of x, onnxsim's shared by the Q, K and V Gemms
    that follow it). False when the graph needs sorting."""
    readers = [i for i, node in enumerate(between)
               if node.graph is graph and any(v is value for v in read_values(node))]
    if not readers:
        return True
    producer, later = value.producer, {id(node) for node in between[readers[0]:]}
    made_after = later | {id(node) for node in created if node is not producer}
    if any(v.producer is not None and id(v.producer) in made_after
           for v in read_values(producer)):
        return False
    graph.move_before(between[readers[0]], producer)
    return True


def _nodes_between(first: Node, last: Node | None) -> list[Node]:
    """The nodes after `first` and before `last` in graph order (none without `last`: a value
    no node makes is there from the start)."""
    if last is None:
        return []
    found, node = [], first._next
    while node is not None and node is not last:
        found.append(node)
        node = node._next
    return found


def _read_outside(match: Match, names: tuple[str, ...]) -> frozenset[str]:
    """Which of the nodes `names` binds have an output read by a node outside the match."""
    members = {id(n) for n in match.nodes}
    return frozenset(name for name in names if name in match.bindings and any(
        id(use.node) not in members for use in match.bindings[name].output._uses))


def _refused_anyway(rule: Rule, root: Node, output: int, target) -> bool:
    """Whether every match at `root` would be refused for what the root alone decides: the
    rule's `plausible` pre-check, or no kernel for what it emits (`unsupported` reads only
    the root's output, so it refuses each candidate alike; SkipLayerNormalization on a CPU
    matched every residual block before being refused, in every sweep)."""
    if not rule.plausible(root):
        return True
    value = root._outputs[output] if output < len(root._outputs) else None
    return value is not None and bool(rule.unsupported(value, target))


class RulePass(Pass):
    """A pass applying a family of rules; rewrites are counted per rule name."""

    rules: ClassVar[tuple[type[Rule], ...]] = ()

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        tracer = ctx.tracer
        active = [cls() for cls in self.rules if cls.name not in ctx.options.disabled_passes]
        compiled = [(rule, rule.build_pattern()) for rule in active]
        roots = {pattern.op_type for _, pattern in compiled}
        for graph in list(model.graph.all_graphs()):
            # Only the rules' root ops are indexed (a snapshot: the loop below skips nodes
            # removed meanwhile): most of a graph's nodes root no rule of a given pass.
            by_op: dict[str, list[Node]] = defaultdict(list)
            for node in graph.nodes():
                if node.op_type in roots:
                    by_op[node.op_type].append(node)
            for rule, pattern in compiled:
                matcher = rule.matcher(pattern)
                # Without a tracer asking why candidates missed, skip at once those a match
                # could not come from or that every match at them would be refused.
                quick = tracer is None
                prefilter = quick and type(matcher) is Matcher
                for node in by_op.get(pattern.op_type, []):
                    if node.graph is not graph or (prefilter and not matcher.could_match(node)):
                        continue
                    if quick and _refused_anyway(rule, node, pattern.output, ctx.target):
                        continue
                    match, refused = None, None
                    for candidate in matcher.matches(node):
                        reason = (deletable(candidate, pattern.output, rule.exposes)
                                  or broadcast_problem(candidate)
                                  or rule.unsupported(node.outputs[pattern.output], ctx.target)
                                  or call_with_bindings(rule.check,
                                                        {**candidate.bindings, "model": model,
                                                         "target": ctx.target,
                                                         "options": ctx.options}))
                        if not reason:
                            match = candidate
                            break
                        # The refusal worth reporting is the closest candidate's (most nodes;
                        # the first of those): a rule whose operands may also bind bare (an
                        # OneOf ending in the plain variable) would otherwise report its
                        # barest binding last.
                        if refused is None or len(candidate.nodes) > refused[0]:
                            refused = (len(candidate.nodes), reason)
                    if match is None:
                        if tracer is not None:
                            tracer.add(rule.name, matcher.miss(node) if refused is None else
                                       Miss(node, refused[0],
                                            f"pattern matched, refused: {refused[1]}"))
                        continue
                    if not ctx.allows(rule.name, node):
                        if tracer is not None:
                            tracer.add(rule.name, Miss(node, len(match.nodes),
                                                       "matched, held back by the rewrite gate"))
                        continue
                    if apply(model, graph, rule, match, pattern.output):
                        result.count(rule.name)
                        if tracer is not None:
                            tracer.fired(rule.name, match)
                    elif tracer is not None:
                        tracer.add(rule.name, Miss(node, len(match.nodes),
                                                   "rewritten, undone: the result cannot take over "
                                                   "the graph output's name"))
        return result


def rule_passes() -> dict[str, str]:
    """rule name -> the name of the pass that applies it: a rule pass's rules, and the named
    rewrites of a pass that has some (EliminateNoOps' ArgOfSoftmax…), which switch off alike."""
    from graphopt.passes.base import PASSES

    owners = {rule.name: name for name, cls in PASSES.items()
              for rule in getattr(cls, "rules", ())}
    owners.update({rewrite: name for name, cls in PASSES.items()
                   for rewrite in getattr(cls, "named_rewrites", ())})
    return owners


def quiet_rule_reasons(rules: set[str], ran: list[str], disabled: set[str],
                       level: int) -> dict[str, str]:
    """Why each of `rules` may have left no near-miss: its pass is not in the pipeline that
    ran (`ran`), or it or its pass was switched off."""
    owners = rule_passes()
    reasons = {}
    for rule in rules:
        owner = owners.get(rule)
        if rule in disabled or owner in disabled:
            reasons[rule] = f"switched off ({rule if rule in disabled else owner} is disabled)"
        elif owner is not None and owner not in ran:
            reasons[rule] = f"its pass {owner} does not run at -O{level}"
    return reasons


def idle_switches(disabled: set[str], ran: list[str]) -> list[str]:
    """The names of `disabled` (passes, rules) that switch off nothing in a compile whose
    pipeline is `ran`: a pass not in it, or a rule whose pass is not."""
    owners = rule_passes()
    return sorted(name for name in disabled
                  if name not in ran and owners.get(name, name) not in ran)


def rule_fire_counts(log) -> dict[str, int]:
    """How many times each rule fired, as the pass log counts it."""
    fired: dict[str, int] = defaultdict(int)
    for record in log.records:
        for name, count in record.stats.items():
            fired[name] += count
    return dict(fired)
