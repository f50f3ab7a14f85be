"""vkad kernels as PyTorch autograd functions (`import vkad.torch`; needs PyTorch).

    sim = s.differentiate(kb)                 # a kernel with grad parameters
    Sim = vkad.torch.function(sim)            # a torch.autograd.Function subclass
    p = Sim.apply(steps, dt, v0, target, loss0)   # the kernel's arguments, in its order
    p.sum().backward()                        # launches the adjoint; v0.grad is filled

`apply` takes the kernel's arguments in its parameter order: a tensor for every ndarray
parameter (rank r, or shape (1,) for a rank-0 one; the kernel's dtype; on the session's device:
CPU tensors on host-visible devices such as lavapipe, CUDA tensors of the same GPU on NVIDIA) and
a number for every scalar. It returns the arrays the kernel writes, as new tensors (one tensor
when it writes one array, else a tuple in parameter order); the tensors given for those
parameters are their initial contents (a loss accumulated with atomic_add starts from them) and
are not modified. Gradients flow to the parameters the kernel marks grad and does not write;
the initial contents of written arrays get none.

Copies (docs/interop.md, "Sharing arrays with PyTorch, JAX and numpy"): each input tensor is copied
once into a vkad array (vkad arrays own their memory; on CUDA the copy is cuMemcpyDtoD, on the
host an upload; a non-contiguous tensor is made contiguous first); every output and every
gradient comes back without a copy (a DLPack view of vkad's memory). Backward seeds the adjoint
with a copy of each output's gradient and launches it on the forward's own arrays, which the
function keeps while torch keeps the graph (a graph kept with retain_graph=True may run
backward again).

Ordering: a forward returns as soon as the launch is recorded; reading an output in torch waits
for it (CPU: a host wait when the view is made; CUDA: torch's current stream waits for vkad's
timeline semaphore on the GPU). Inputs are copied after the work torch queued on its current
stream (the copy is waited for before vkad runs).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import torch as _torch
from torch.utils import dlpack as _torch_dlpack

from . import DType, Differentiated, InvalidArgumentError, Session, _OPEN_SESSIONS
from .frontend import KernelFunction

_DTYPES = {
    DType.f32: _torch.float32,
    DType.f64: _torch.float64,
    DType.i32: _torch.int32,
    DType.i64: _torch.int64,
}


def _session(session: Optional[Session]) -> Session:
    if session is not None:
        return session
    open_now = list(_OPEN_SESSIONS)
    if len(open_now) != 1:
        raise InvalidArgumentError(
            f"vkad.torch.function: {len(open_now)} vkad Sessions are open; pass the one that "
            "differentiated the kernel: vkad.torch.function(d, session=s)")
    return open_now[0]


def _torch_device(s: Session) -> _torch.device:
    probe = s.empty(1, DType.f32)
    kind, index = probe.__dlpack_device__()
    return _torch.device("cpu") if kind == 1 else _torch.device("cuda", index)


def function(differentiated: Differentiated, session: Optional[Session] = None) -> type:
    """A torch.autograd.Function subclass whose forward launches `differentiated`'s forward
    kernel and whose backward launches its adjoint (module docstring: arguments, copies,
    ordering). `session`: the Session that differentiated it (None: the one open Session).
    A @vkad.kernel function is differentiated on that session first."""
    if isinstance(differentiated, KernelFunction):
        differentiated = differentiated.differentiate(_session(session))
    if not isinstance(differentiated, Differentiated):
        raise InvalidArgumentError(
            "vkad.torch.function: expected what Session.differentiate returned, got "
            f"{type(differentiated).__name__}")
    s = _session(session)
    fwd, adj = differentiated.forward, differentiated.adjoint
    params = fwd.params  # (name, dtype, rank)
    arrays = set(fwd._array_params)
    written = list(fwd._written_params)
    grads = [p for p, _ in fwd.gradients]
    device = _torch_device(s)
    for p in arrays:
        if params[p][1] not in _DTYPES:
            raise InvalidArgumentError(
                f"vkad.torch.function('{fwd.name}'): parameter '{params[p][0]}' is "
                f"{params[p][1].name}, which PyTorch tensors do not hold here (f32, f64, i32, "
                "i64 do)")

    def to_vkad(i: int, x: Any):
        name, dtype, rank = params[i]
        where = f"{fwd.name}.apply, argument {i} ('{name}')"
        if i not in arrays:
            if isinstance(x, _torch.Tensor):
                if x.numel() != 1:
                    raise InvalidArgumentError(f"{where}: a scalar parameter, got a tensor of "
                                               f"shape {tuple(x.shape)}")
                return x.item()
            return x
        if not isinstance(x, _torch.Tensor):
            raise InvalidArgumentError(f"{where}: expected a torch.Tensor, got {type(x).__name__}")
        want = max(rank, 1)
        if x.dim() != want:
            raise InvalidArgumentError(
                f"{where}: expected a tensor of rank {want}"
                f"{' (shape (1,) for a rank-0 parameter)' if rank == 0 else ''}, got shape "
                f"{tuple(x.shape)}")
        if x.dtype != _DTYPES[dtype]:
            raise InvalidArgumentError(f"{where}: expected {_DTYPES[dtype]}, got {x.dtype}")
        if x.device != device and not (device.type == "cuda" and x.device.type == "cuda" and
                                       x.device.index in (None, device.index)):
            raise InvalidArgumentError(
                f"{where}: the tensor is on {x.device}; this session's arrays are on {device} "
                f"({s.device_name})")
        return s.from_dlpack(x.detach().contiguous(), name=f"{fwd.name}.{name}")

    def forward(ctx, *args):
        if len(args) != len(params):
            raise InvalidArgumentError(
                f"{fwd.name}.apply: {len(args)} arguments given, the kernel takes "
                f"{len(params)}: {fwd.signature}")
        vargs = [to_vkad(i, a) for i, a in enumerate(args)]
        s.launch(fwd, *vargs)
        outs = [_torch_dlpack.from_dlpack(vargs[p]) for p in written]
        ctx.vargs = vargs
        # Saved so that torch refuses a backward after an output was modified in place.
        ctx.save_for_backward(*outs)
        ctx.mark_non_differentiable(*[o for p, o in zip(written, outs) if p not in grads])
        return outs[0] if len(outs) == 1 else tuple(outs)

    def backward(ctx, *grad_outputs):
        ctx.saved_tensors  # noqa: B018 -- torch checks here that no output changed in place
        vargs = ctx.vargs
        gargs = []
        for p in grads:
            if p in written:  # the seed: a copy of the output's gradient
                g = grad_outputs[written.index(p)]
                g = _torch.zeros_like(g) if g is None else g
                gargs.append(s.from_dlpack(g.detach().contiguous().to(_DTYPES[params[p][1]]),
                                           name=f"{fwd.name}.{params[p][0]} seed"))
            else:
                gargs.append(s.zeros(vargs[p].shape, vargs[p].dtype,
                                     name=f"{fwd.name}.{params[p][0]} grad"))
        s.launch(adj, *vargs, *gargs)
        result: list = [None] * len(params)
        for p, g in zip(grads, gargs):
            if p not in written and ctx.needs_input_grad[p]:
                result[p] = _torch_dlpack.from_dlpack(g)
        return tuple(result)

    return type(f"vkad_{fwd.name}", (_torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "backward": staticmethod(backward),
        "__doc__": f"vkad kernel '{fwd.signature}' as a torch.autograd.Function "
                   "(vkad.torch.function).",
    })


__all__ = ["function"]
