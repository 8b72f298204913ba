"""Module paths (`name_stack`): global module forward pre/post hooks keep a stack of
qualified names; a root module names its subtree once with `named_modules()`. The same
root modules name parameters (`params/<name>` of optimizer snapshots, `param=` of
`AccumulateGrad`); a module wrapped by `torch.compile` is named as in an eager run."""

import threading
import weakref

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
                for sub_name, sub in m.named_modules(remove_duplicate=False):
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
            self.mod_stack.append(self._mod_name(module))

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
                for n, p in root.named_parameters(remove_duplicate=False):
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
