"""Module paths (`name_stack`): global module forward pre/post hooks keep a stack of
qualified names; a root module names its subtree once with `named_modules()`. The same
root modules name parameters (`params/<name>` of optimizer snapshots, `param=` of
`AccumulateGrad`); a module wrapped by `torch.compile` is named as in an eager run.

A name is never the script's failure: where torch's `named_modules` / `named_parameters`
raise (a key that is not a str: `m._modules[0] = sub` runs plainly, and torch's naming
concatenates the key), the tree is walked here with each key as text (`skipped.text`)
or, where it has none, a stand-in `<Type>` counted in the manifest (`skipped_names`);
the module hook catches anything else. Before, the hook's TypeError broke the script's
forward, and the optimizer snapshot's stopped the torch capture."""

import threading
import weakref

from ..skipped import kind, text
from .values import _fsdp_possible


class _ModulePaths:
    """The module path of the op being recorded, and parameter names (a mixin of `TorchCapture`)."""

    def _mod_name(self, m):
        n = self.mod_names.get(m)
        if n is None:
            if not self.keep_resizable and _fsdp_possible():   # FSDP1 frees storages too
                self.keep_resizable = True
            if not self.mod_stack:
                self.roots.append(weakref.ref(m))
                try:
                    named = list(m.named_modules(remove_duplicate=False))
                except Exception:   # a key torch cannot name: our own walk names it
                    named = _named_modules(m, self.skipped_names)
                for sub_name, sub in named:
                    if sub not in self.mod_names:
                        self.mod_names[sub] = _strip_compiled(sub_name)
                n = self.mod_names[m]
            else:
                n = self.mod_names[m] = f"{self.mod_stack[-1]}.<{type(m).__name__}>".lstrip(".")
        return n

    def _mod_pre(self, module, args):
        # Dynamo traces global hooks into compiled graphs: they must add nothing there
        # (a compiled call names its ops from the graph's nn_module_stack instead).
        if self._is_compiling():
            return
        if threading.get_ident() == self.thread:
            try:
                name = self._mod_name(module)
            except Exception as exc:   # never the script's forward broken by a name
                name = f"{self.mod_stack[-1] if self.mod_stack else ''}.<{kind(module)}>"
                name = name.lstrip(".")
                self.skipped_names.add(f"module {name}", exc)
            self.mod_stack.append(name)

    def _mod_post(self, module, args, output):
        if self._is_compiling():
            return
        if threading.get_ident() == self.thread and self.mod_stack:
            self.mod_stack.pop()

    def _param_names(self, force=False):
        """id(parameter) -> qualified name, over the root modules seen (cached per step;
        `force`: read again, as after FSDP2 swapped a module's parameters)."""
        key = (self.step, len(self.roots))
        if self._names_key == key and not force:
            return self._names
        names, named = {}, []
        for r in self.roots:
            root = r()
            if root is not None:
                try:
                    pairs = list(root.named_parameters(remove_duplicate=False))
                except Exception:   # a key torch cannot name: our own walk names it
                    pairs = _named_parameters(root, self.skipped_names)
                for n, p in pairs:
                    n = _strip_compiled(n)
                    names.setdefault(id(p), n)
                    named.append((n, p))
        self.subclasses.note_params(named)
        self._names, self._names_key = names, key
        return names


def _strip_compiled(name):
    """`_orig_mod.fc1` -> `fc1`: a module wrapped by `torch.compile(module)` is named as in
    an eager run, so eager and compiled traces share module paths and parameter names."""
    if name == "_orig_mod":
        return ""
    return name.replace("_orig_mod.", "")


def _part(key, skipped):
    """One key of a module's `_modules` or `_parameters` as a name's part."""
    got = text(key)
    if got is None:
        got = f"<{kind(key)}>"
        skipped.add(f"key {got}")
    return got


def _named_modules(root, skipped, max_depth=64):
    """[(path, module)] as `named_modules(remove_duplicate=False)` gives them, for a tree
    with keys torch cannot name (`_part`); a cycle is not followed."""
    out = []

    def visit(m, prefix, above):
        out.append((prefix, m))
        if len(above) > max_depth:
            return
        for key, sub in list((getattr(m, "_modules", None) or {}).items()):
            if sub is not None and id(sub) not in above:
                part = _part(key, skipped)
                visit(sub, f"{prefix}.{part}" if prefix else part, above | {id(sub)})

    visit(root, "", frozenset((id(root),)))
    return out


def _named_parameters(root, skipped):
    """[(name, parameter)] as `named_parameters(remove_duplicate=False)` gives them, for a
    tree with keys torch cannot name."""
    out = []
    for prefix, m in _named_modules(root, skipped):
        for key, p in list((getattr(m, "_parameters", None) or {}).items()):
            if p is not None:
                part = _part(key, skipped)
                out.append((f"{prefix}.{part}" if prefix else part, p))
    return out
