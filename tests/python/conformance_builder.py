"""The builder the conformance suite (test_conformance.py) writes its kernels with.

`Builder` is vkad.KernelBuilder. Where the installed package predates the builder's while_ /
break_ / continue_ (python/vkad/builder.py gained them in issue 50; vkad's IR and reverse mode
had them before), `Builder` is a subclass adding exactly those three, printing the same IR text
as the newer builder (`while %i (%c) max_trip(n) { test } do { body }`, `break`, `continue`), so
the suite runs on both. Nothing else is added: scalar inputs that need a gradient are rank-0
ndarrays (`x[None]`), which every version differentiates.
"""
from contextlib import contextmanager

import vkad

_NATIVE = hasattr(vkad.KernelBuilder, "while_") and hasattr(vkad.KernelBuilder, "break_")

if _NATIVE:
    Builder = vkad.KernelBuilder
else:
    from vkad.builder import _Block  # noqa: F401  (present in every version)

    class Builder(vkad.KernelBuilder):  # type: ignore[no-redef]
        """vkad.KernelBuilder with while_ / break_ / continue_ (the newer builder's)."""

        def __init__(self, name):
            super().__init__(name)
            self._open_loops = 0

        @contextmanager
        def for_range(self, begin, end, max_trip=None):
            self._open_loops += 1
            try:
                with super().for_range(begin, end, max_trip) as i:
                    yield i
            finally:
                self._open_loops -= 1

        @contextmanager
        def while_(self, cond, max_trip=None):
            index = self._fresh()
            test = _Block()
            self._stack.append(test)
            try:
                c = self._as_value(cond(), vkad.bool_)
            finally:
                self._stack.pop()
            if c.dtype != vkad.bool_:
                raise TypeError(f"while_: the condition is a bool Value, got {c.dtype.name}")
            head = f"while %{index} (%{c.id})"
            if max_trip is not None:
                head += f" max_trip({int(max_trip)})"
            body = _Block()
            self._cur().append([head, test, None, body])
            self._stack.append(body)
            self._open_loops += 1
            try:
                yield vkad.builder.Value(self, index, vkad.i32)
            finally:
                self._open_loops -= 1
                self._stack.pop()

        def break_(self):
            self._jump("break")

        def continue_(self):
            self._jump("continue")

        def _jump(self, op):
            if not self._open_loops:
                raise RuntimeError(f"{op}_() belongs inside a for_range or while_ loop")
            self._cur().append(op)

        def _print(self, block, depth, out):
            pad = "  " * depth
            for s in block:
                if isinstance(s, str):
                    out.append(pad + s)
                    continue
                head, body, orelse = s[:3]
                out.append(f"{pad}{head} {{")
                self._print(body, depth + 1, out)
                if len(s) == 4:  # while_: the test block, then `do` the body
                    out.append(f"{pad}}} do {{")
                    self._print(s[3], depth + 1, out)
                if orelse:
                    out.append(f"{pad}}} else {{")
                    self._print(orelse, depth + 1, out)
                out.append(pad + "}")
