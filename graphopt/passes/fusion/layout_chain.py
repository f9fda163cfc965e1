"""Chains of Reshapes and Transposes that only split and merge axes, rewritten as at most
Reshape → Transpose → Reshape (a single Transpose where the net effect is one).

PyTorch's nn.MultiheadAttention works sequence-first and splits heads as [S, B·N, H]; after
FuseAttention its query reaches MultiHeadAttention [B, S, N·H] through

    q[S,B,E] ─Reshape─▶ [S,B·N,H] ─Transpose(1,0,2)─▶ [B·N,S,H] ─Reshape─▶ [B,N,S,H]
             ─Transpose(0,2,1,3)─▶ [B,S,N,H] ─Reshape─▶ [B,S,N·H]     ⇒    Transpose(q, (1,0,2))

Each value is tracked as a list of axes, each axis a run of atoms: the smallest pieces of the
chain's input x that no step cuts (S, B, N, H above; E is cut into N·H by the first Reshape).
A Transpose permutes the axes; a Reshape must regroup the atoms in order, each target dim the
product of consecutive atoms, or cut one atom into two (always possible in row-major order):
anything else and the chain is left alone. At the end the output is the atoms of x in another
order. Atoms adjacent in x and in the output form blocks; the output is then
Reshape(x, blocks) (unless x already has those dims), a Transpose of the blocks (unless they
stay in order) and a Reshape to the output's dims (unless the blocks already have them).

Target shapes are read symbolically (symbolic_dims), so a target built at run time from
Shape → Gather → Mul → Concat of symbolic dims is proven like a constant one. A Reshape only
runs when its element counts agree, so where they differ by one name against a number (a trace
that baked the sequence, 10, into a key's Reshape of [seq, batch, 64]) the name is that number
for the rest of the chain. Shapes for the new Reshapes are constants, with a 0 for a dim the
input has at the same place and a -1 for one other symbolic dim; where more dims are symbolic,
the target of a Reshape of the chain that made the same dims is reused. The rewrite fires only
when it makes fewer nodes than the chain had. Dims of a tensor with no elements are not
modelled: a chain over an empty batch may come out with other empty dims than before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphopt.ir import Node, Value
from graphopt.ir.pattern import Match, Miss
from graphopt.passes.edit import can_take_over
from graphopt.passes.rules import HandMatchedRule
from graphopt.passes.symbolic_dims import (ONE, Dim, as_entry, over, product, shape_tensor,
                                           solved, substituted, value_dims)

LAYOUT_OPS = ("Reshape", "Transpose")


@dataclass
class _Atoms:
    """The chain's input x as atoms: `size` of each, `source` (x's axes), `axes` (the current
    value's), `seen` (the axes of each value of the chain so far, by its index); atoms of size
    1 are dropped, an axis of size 1 has none."""

    size: dict[int, Dim] = field(default_factory=dict)
    source: list[list[int]] = field(default_factory=list)
    axes: list[list[int]] = field(default_factory=list)
    seen: dict[int, list[list[int]]] = field(default_factory=dict)
    known: dict[str, int] = field(default_factory=dict)

    def add(self, size: Dim) -> list[int]:
        if size == ONE:
            return []
        atom = len(self.size)
        while atom in self.size:
            atom += 1
        self.size[atom] = size
        return [atom]

    def dims(self, axes: list[list[int]]) -> list[Dim]:
        return [product(self.size[a] for a in axis) for axis in axes]

    def _everywhere(self):
        yield from (self.source, self.axes, *self.seen.values())

    def cut(self, atom: int, outer: Dim) -> None:
        """Cut `atom` into outer · inner in place, wherever it is."""
        parts = self.add(outer) + self.add(over(self.size[atom], outer))
        for axes in self._everywhere():
            for axis in axes:
                if atom in axis:
                    at = axis.index(atom)
                    axis[at:at + 1] = parts
        del self.size[atom]

    def learn(self, name: str, size: int) -> None:
        """Take `name` to be `size` from here on (a Reshape proved it)."""
        self.known[name] = size
        self.size = {a: substituted(d, self.known) for a, d in self.size.items()}
        for a in [a for a, d in self.size.items() if d == ONE]:
            del self.size[a]
            for axes in self._everywhere():
                for axis in axes:
                    if a in axis:
                        axis.remove(a)


def _regroup(atoms: _Atoms, target: list[Dim]) -> list[list[int]] | None:
    """The current axes regrouped into `target` dims, cutting atoms where a dim ends inside
    one; None when some dim is not a product of consecutive atoms."""
    flat = [a for axis in atoms.axes for a in axis]
    groups, k = [], 0
    for want in target:
        group, have = [], ONE
        while have != want:
            if k >= len(flat):
                return None
            atom = flat[k]
            if over(want, product([have, atoms.size[atom]])) is not None:
                group.append(atom)
                have = product([have, atoms.size[atom]])
                k += 1
                continue
            outer = over(want, have)
            if outer is None or over(atoms.size[atom], outer) is None:
                return None
            atoms.cut(atom, outer)
            flat = [a for axis in atoms.axes for a in axis]
            group.append(flat[k])
            have = want
            k += 1
        groups.append(group)
    return groups if k == len(flat) else None


def _reshape(atoms: _Atoms, node: Node, dims_of) -> str | None:
    """Apply Reshape `node` to the atoms, or say why it is no split or merge of the current
    axes."""
    got = shape_tensor(node.input(1), dims_of) if node.input(1) is not None else None
    if got is None or got[1]:
        return f"the target shape of '{node.name}' is computed in a way not followed"
    current = atoms.dims(atoms.axes)
    target, infer = [], None
    for i, d in enumerate(substituted(d, atoms.known) for d in got[0]):
        if d == (0, ()) and not node.attr("allowzero", 0) and i < len(current):
            d = current[i]
        elif d == (-1, ()) and infer is None:
            infer = i
        elif d[0] <= 0:
            return f"the target shape of '{node.name}' has {d[0]} at {i}"
        target.append(d)
    total = product(current)
    if infer is not None:
        rest = over(total, product(d for i, d in enumerate(target) if i != infer))
        if rest is None:
            return f"the -1 in the target shape of '{node.name}' is not a product of dims"
        target[infer] = rest
    elif product(target) != total:
        equal = solved(total, product(target))
        if equal is None:
            return f"'{node.name}' maps {current} to {target}: element counts not proven equal"
        atoms.learn(*equal)
        target = [substituted(d, atoms.known) for d in target]
    groups = _regroup(atoms, target)
    if groups is None:
        return f"'{node.name}' does not only split and merge axes"
    atoms.axes = groups
    return None


@dataclass
class _Plan:
    """The chain's output as Reshape(x, blocks) → Transpose(perm) → Reshape(out); `targets`
    holds the shape of each Reshape needed (a constant, or a target the chain computed) and
    its allowzero."""

    atoms: _Atoms
    x_dims: list[Dim]
    blocks: list[Dim]
    perm: list[int]
    out_dims: list[Dim]
    targets: tuple = (None, None)

    @property
    def moved(self) -> list[Dim]:
        return [self.blocks[p] for p in self.perm]

    @property
    def steps(self) -> tuple[bool, bool, bool]:
        return (self.x_dims != self.blocks, self.perm != sorted(self.perm),
                self.moved != self.out_dims)


def _follow(chain: list[Node]) -> _Plan | str:
    """How chain[0]'s input becomes the last node's output, or why it cannot be followed."""
    x = chain[0].input(0)
    dims = value_dims(x) if x is not None else None
    if dims is None or any(d[0] <= 0 for d in dims):
        return f"the rank of %{x.name if x else '?'} is unknown or it has a dim of 0"
    atoms = _Atoms()
    atoms.source = [atoms.add(d) for d in dims]
    atoms.axes = [list(axis) for axis in atoms.source]
    outputs = {id(node.output): i for i, node in enumerate(chain)}

    def dims_of(v: Value) -> list[Dim] | None:
        # A value of the chain has the dims tracked for it, others their inferred ones.
        if id(v) in outputs and outputs[id(v)] in atoms.seen:
            return atoms.dims(atoms.seen[outputs[id(v)]])
        found = value_dims(v)
        return None if found is None else [substituted(d, atoms.known) for d in found]

    for i, node in enumerate(chain):
        if node.op_type == "Transpose":
            perm = node.attr("perm")
            perm = list(perm) if perm is not None else list(range(len(atoms.axes)))[::-1]
            if sorted(perm) != list(range(len(atoms.axes))):
                return f"the perm of '{node.name}' does not fit rank {len(atoms.axes)}"
            atoms.axes = [atoms.axes[p] for p in perm]
        else:
            problem = _reshape(atoms, node, dims_of)
            if problem:
                return problem
        atoms.seen[i] = [list(axis) for axis in atoms.axes]
    return _best_plan(chain, atoms)


def _runs(atoms: _Atoms, order: list[int], place: dict[int, int], x_ends: bool,
          out_ends: bool) -> list[list[int]]:
    """Runs of atoms adjacent in x and in the output, also ended at the ends of x's axes
    and of the output's where asked."""
    ends = {axis[-1] for axis in atoms.source if axis and x_ends} \
        | {axis[-1] for axis in atoms.axes if axis and out_ends}
    runs: list[list[int]] = []
    for a in order:
        if runs and place[a] == place[runs[-1][-1]] + 1 and runs[-1][-1] not in ends:
            runs[-1].append(a)
        else:
            runs.append([a])
    return runs


def _best_plan(chain: list[Node], atoms: _Atoms) -> _Plan | str:
    """The plan with the fewest nodes, fewer than the chain's, whose Reshapes have shapes that
    can be written; or why there is none. Blocks may end where the atoms' order breaks only
    (fewest blocks), also at the ends of x's axes (no first Reshape where x's axes move
    whole), of the output's (no last Reshape where its axes come whole), or at both."""
    order = [a for axis in atoms.source for a in axis]
    final = [a for axis in atoms.axes for a in axis]
    x_dims, out_dims = atoms.dims(atoms.source), atoms.dims(atoms.axes)
    made: dict[int, list[Dim]] = {}

    def made_by(i: int) -> list[Dim]:
        if i not in made:
            made[i] = atoms.dims(atoms.seen[i])
        return made[i]

    if order == final:  # the atoms keep their order: one Reshape, or none
        plans = [_Plan(atoms, x_dims, x_dims, list(range(len(x_dims))), out_dims)]
    else:
        place = {a: i for i, a in enumerate(final)}
        distinct = {tuple(map(tuple, _runs(atoms, order, place, x_ends, out_ends))): None
                    for x_ends in (False, True) for out_ends in (False, True)}
        plans = []
        for runs in distinct:
            perm = sorted(range(len(runs)), key=lambda r: place[runs[r][0]])
            blocks = [product(atoms.size[a] for a in run) for run in runs]
            plans.append(_Plan(atoms, x_dims, blocks, perm, out_dims))
    for plan in sorted(plans, key=lambda plan: sum(plan.steps)):
        if sum(plan.steps) >= len(chain):
            return f"its {len(chain)} nodes would become {sum(plan.steps)}"
        reshape, _, final_reshape = plan.steps
        plan.targets = (_target(chain, made_by, x_dims, plan.x_dims, plan.blocks)
                        if reshape else None,
                        _target(chain, made_by, x_dims, plan.moved, plan.out_dims)
                        if final_reshape else None)
        if not (reshape and plan.targets[0] is None
                or final_reshape and plan.targets[1] is None):
            return plan
    return "a new Reshape would need more than one symbolic dim that its input does not " \
           "have at the same place, and no Reshape of the chain made those dims"


def _target(chain: list[Node], made_by, x_dims: list[Dim], given: list[Dim],
            wanted: list[Dim]) -> tuple[np.ndarray | Value, int] | None:
    """(shape, allowzero) for a Reshape from `given` dims to `wanted`, or None: a constant
    with a 0 for each dim `given` has at the same place and a -1 for one other symbolic dim,
    else the target of a Reshape of the chain that made `wanted` (a -1 in it resolves the
    same). A 0 there copies a dim of that Reshape's own input: its target is taken only when
    it holds no 0 (a constant one), or when that input had the `given` dims (one computed at
    run time may hold a 0 this does not see: Concat([0], …))."""
    entries, open_ = [], 0
    for i, d in enumerate(wanted):
        if not d[1]:
            entries.append(d[0])
        elif i < len(given) and given[i] == d:
            entries.append(0)
        else:
            entries.append(-1)
            open_ += 1
    if open_ <= 1:
        return np.array(entries, dtype=np.int64), 0
    inside = {id(node.output) for node in chain}
    for i, node in enumerate(chain):
        if node.op_type != "Reshape" or made_by(i) != wanted:
            continue
        data = node.input(1).constant()
        copies_nothing = node.attr("allowzero", 0) or (data is not None and not (data == 0).any())
        if (copies_nothing or (made_by(i - 1) if i else x_dims) == given) \
                and not _reads(node.input(1), inside):
            return node.input(1), node.attr("allowzero", 0)
    return None


def _reads(value: Value, outputs: set[int], limit: int = 32) -> bool:
    """Whether computing `value` reads one of `outputs` (or takes more than `limit` nodes to
    tell): a target read off the chain's own values (Shape of one) would keep the chain alive."""
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if id(v) in outputs:
            return True
        node = v.producer
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if len(seen) > limit:
            return True
        stack.extend(i for i in node.inputs if i is not None)
    return False


def best_tail(chain: list[Node]) -> tuple[int, _Plan] | str:
    """The longest tail of `chain` that can be followed and becomes fewer nodes: (where it
    starts, its plan), or why there is none."""
    reason = ""
    for start in range(len(chain) - 1):
        plan = _follow(chain[start:])
        if not isinstance(plan, str):
            return start, plan
        reason = reason or plan
    return reason


def _entry(plan: _Plan, d: Dim) -> int | str | None:
    return as_entry(substituted(d, plan.atoms.known))


def _emit(op, plan: _Plan, x: Value) -> Value:
    reshape, transpose, final = plan.steps
    y = x

    def reshaped(y: Value, target) -> Value:
        shape, allowzero = target
        shape = op.const(shape, "shape") if isinstance(shape, np.ndarray) else shape
        return op.Reshape(y, shape, **({"allowzero": 1} if allowzero else {}))

    if reshape:
        y = reshaped(y, plan.targets[0])
        y.dtype, y.shape = x.dtype, tuple(_entry(plan, d) for d in plan.blocks)
    if transpose:
        y = op.Transpose(y, perm=plan.perm)
        y.dtype, y.shape = x.dtype, tuple(_entry(plan, d) for d in plan.moved)
    if final:
        y = reshaped(y, plan.targets[1])
    return y


def _one_node_could_do(pair: list[Node]) -> bool:
    """Whether a Reshape and a Transpose (in either order) might become one node: a Reshape
    when the Transpose keeps its axes other than 1s in order, a Transpose when the Reshape only
    adds or drops 1s. A cheap test for the most common pairs (a conv net's, a batch-1 ViT's),
    which would otherwise be followed in full on every sweep for nothing; unknown shapes pass."""
    transpose, reshape = sorted(pair, key=lambda n: n.op_type != "Transpose")
    shape, perm = transpose.input(0).shape, transpose.attr("perm")
    before, after = reshape.input(0).shape, reshape.output.shape
    if shape is None or perm is None or before is None or after is None \
            or None in before or None in after:
        return True
    kept = [p for p in perm if p < len(shape) and shape[p] != 1]
    return kept == sorted(kept) or [d for d in before if d != 1] == [d for d in after if d != 1]


class _LayoutChain(HandMatchedRule):
    """A chain of Reshapes and Transposes ending at a node of `root_op`, each value between
    them read by the next node alone (see the module docstring)."""

    base = True

    def match(self, node: Node) -> Match | Miss:
        out = node.output
        readers = out.consumers() if out is not None and not out.is_graph_output else []
        if not node.is_onnx:
            return Miss(node, 0, f"not an ONNX {self.root_op}")
        if len(readers) == 1 and readers[0].op_type in LAYOUT_OPS and readers[0].is_onnx:
            return Miss(node, 1, f"the chain goes on to {readers[0].op_type} "
                                 f"'{readers[0].name}'")
        chain = [node]
        while True:
            x = chain[0].input(0)
            before = x.producer if x is not None else None
            if before is None or before.op_type not in LAYOUT_OPS or not before.is_onnx \
                    or x.is_graph_output or len(x.uses) != 1 or before.graph is not node.graph:
                break
            chain.insert(0, before)
        if len(chain) < 2:
            return Miss(node, 1, "no other Reshape or Transpose feeds it alone")
        if len(chain) == 2 and {n.op_type for n in chain} == set(LAYOUT_OPS) \
                and not _one_node_could_do(chain):
            return Miss(node, 2, "a Reshape and a Transpose that no single node can replace")
        found = best_tail(chain)
        if isinstance(found, str):
            return Miss(node, len(chain), found)
        start, plan = found
        return Match(node, {"x": chain[start].input(0), "plan": plan, "root": node},
                     chain[start:][::-1])

    def check(self, x, plan, root):
        if not any(plan.steps) and root.output.is_graph_output \
                and not can_take_over(x, root.output):
            return f"%{root.output.name} is a graph output and %{x.name} cannot take over its name"
        return None

    def rewrite(self, op, x, plan):
        return _emit(op, plan, x)


class ReshapeChain(_LayoutChain):
    """Reshapes and Transposes that end in a Reshape → at most Reshape, Transpose, Reshape."""

    root_op = "Reshape"


class TransposeChain(_LayoutChain):
    """Reshapes and Transposes that end in a Transpose → at most Reshape, Transpose, Reshape."""

    root_op = "Transpose"
